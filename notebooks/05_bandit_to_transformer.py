# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5. From bandit to transformer with the trainer
#
# **What this shows.** The paper's training loop run by `rpg_ref`'s trainer: on a bandit with a
# fixed reference each RPG loss converges to the analytic optimum of *its own* KL-regularized
# objective; on a tiny transformer the same loop and losses learn digit addition; and the committed
# small-scale runs of every algorithm drawn in the shape of the paper's main figure and table.
#
# **Paper labels.** Section 5 (`sec:experiments`), Algorithm 2
# (`alg:offpolicy_rpg_rf_ppo_dualclip_v1`) (its outer loop),
# Section 2.1 (`subsec:kl_regularization_main`), Figure 4 (`fig:main_8k`), Table 5
# (`tab:main_table_4k`).
# Paper: [arXiv:2505.17508](https://arxiv.org/abs/2505.17508).
#
# `rpg_ref.trainer.train` (`rpg-train`) runs the paper's loop (Section 5 (`sec:experiments`), the
# outer loop of
# Algorithm 2 (`alg:offpolicy_rpg_rf_ppo_dualclip_v1`)):
#
#     for step:
#         sample a batch with pi_old (= the current policy), score it, compute advantages,
#         then a few optimizer steps on LOSSES[algo](log pi_theta, old_logp, A, mask, beta, clip)
#
# With the *iterative reference* (the paper's choice, `--ref iterative`) $\pi_{ref} = \pi_{old}$ is
# reset every step, so the KL only limits each step. With a *fixed reference* (`--ref init`) the
# objective $J(\pi) = \mathbb{E}_\pi[R] - \beta D(\pi, \pi_{ref})$ is fixed and, for a bandit, its
# maximizer is known:
#
# * RKL / URKL: $\pi^*(x) \propto \pi_{ref}(x)\,e^{R(x)/\beta}$;
# * FKL / UFKL: $\pi^*(x) = \beta\,\pi_{ref}(x)/(\lambda - R(x))$ with $\lambda > \max R$ fixed by
#   $\sum\pi^* = 1$.
#
# The trainer's bandit task reports the total-variation distance between the final policy and
# this optimum (`summary.json`). `RPG_NOTEBOOK_CI=1` (set by the test suite) shortens every run.

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from paper_figs import show, training
from rpg_ref.cli import parse_config  # command-line arguments -> a validated Config
from rpg_ref.trainer.train import train  # the loop: Config -> a run (metrics, checkpoints, summary)

CI = os.environ.get("RPG_NOTEBOOK_CI") == "1"  # the test suite sets this: shorter training runs
RUN_DIR = Path(tempfile.mkdtemp(prefix="rpg-nb5-"))  # the runs' logs and checkpoints

# %% [markdown]
# ## The bandit: each loss finds its own optimum
#
# Five arms with rewards $(1, 0.8, 0.5, 0.2, 0)$, a random initial policy that is also the fixed
# reference, and three of the eight RPG losses (one per divergence family and style).

# %%
bandit_steps = 60 if CI else 300

results = {}
for algo in ("rpg-reinforce-urkl", "rpg-fkl", "rpg-reinforce-ufkl"):
    cfg = parse_config(["--preset", "bandit", "--algo", algo, "--ref", "init",
                        "--steps", str(bandit_steps), "--eval-every", "10",
                        "--out", str(RUN_DIR / algo), "--no-progress", "--seed", "0"])
    s = train(cfg)
    results[algo] = s
    print(f"{algo:20s} TV(final policy, optimum) = {s['tv_distance']:.4f}   ({s['optimum_note']})")
    print(f"{'':20s} policy  = {np.round(s['policy'], 3)}")
    print(f"{'':20s} optimum = {np.round(s['optimum'], 3)}")

# %%
fig, ax = plt.subplots(figsize=(6, 3))
for algo, s in results.items():
    rows = [r for r in training.read_jsonl(RUN_DIR / algo / "metrics.jsonl")
            if "eval_expected_reward" in r]
    (line,) = ax.plot(
        [r["step"] for r in rows], [r["eval_expected_reward"] for r in rows], label=algo
    )
    reward_at_optimum = float(np.dot(s["optimum"], s["rewards"]))
    ax.axhline(reward_at_optimum, ls=":", lw=0.8, color=line.get_color())
ax.set_xlabel("step")
ax.set_ylabel("E[R] under the policy")
ax.legend(fontsize=8)
ax.set_title("bandit, fixed reference (dotted: E[R] at the analytic optimum)", fontsize=9)
show(fig)

# %% [markdown]
# Each run converges to its own divergence's optimum: the RKL-family optimum tilts $\pi_{ref}$
# exponentially towards reward, the FKL-family optimum keeps more mass on poor arms (it must cover
# $\pi_{ref}$). Different divergences are different objectives, not different estimators of one.
#
# ## The transformer: the `seq` task
#
# The same loop and the same loss functions train a tiny Qwen3 (`transformers`, random init, 2
# layers) on digit addition `a+b=` with reward 1 for the exact answer followed by EOS. The policy
# is first warm-started by a short supervised phase so that RL has something to improve; ratios
# are per token (`level="token"`, as verl applies the losses) and RPG-Style Clip uses the preset's
# $(\epsilon_1,\epsilon_2,c) = (0.2, 0.28, 3)$, with the paper's $\beta = 10^{-4}$.

# %%
seq_args = ["--preset", "seq", "--algo", "rpg-reinforce-urkl", "--beta", "1e-4", "--no-progress",
            "--seed", "0", "--cache-dir", str(RUN_DIR / "cache"), "--out", str(RUN_DIR / "seq")]
if CI:  # a smoke-sized run: a weaker warm start, a few steps
    seq_args += ["--steps", "3", "--eval-every", "3", "--seq-warm-steps", "30",
                 "--prompts-per-step", "4", "--seq-eval-size", "32"]
else:   # ~10 s of training after a ~15 s warm start on 2 CPU cores
    seq_args += ["--steps", "40", "--eval-every", "10"]
s = train(parse_config(seq_args))
rows = training.read_jsonl(RUN_DIR / "seq" / "metrics.jsonl")
greedy = s["eval"].get("eval_greedy_accuracy", float("nan"))
print(f"steps: {len(rows)}, first batch accuracy {rows[0]['accuracy']:.3f}, "
      f"last {rows[-1]['accuracy']:.3f}, greedy eval {greedy:.3f}")

# %%
fig, axes = plt.subplots(1, 3, figsize=(11, 2.8))
for ax, key in zip(axes, ("accuracy", "entropy", "kl_old")):
    ax.plot([r["step"] for r in rows], [r[key] for r in rows], marker="o", ms=3)
    ax.set_title(key, fontsize=9)
    ax.set_xlabel("step")
show(fig)

# %% [markdown]
# ## Every algorithm, several seeds
#
# `small_scale/run_experiments.py --exp seq` runs GRPO, DAPO, REINFORCE++ and the eight RPG
# variants with 3 seeds each; `paper_figs.training` draws the curves and the Last/Best table in the
# shape of the paper's Figure 4 (`fig:main_8k`) and Table 5 (`tab:main_table_4k`) from the logs
# committed in
# `small_scale/logs/` (`small_scale/RESULTS.md` has the reading; `rpg-figs --only main_seq` writes
# the same figure and table to files).

# %%
seq_runs = training.dynamics_data("seq", panels=training.SEQ_PANELS)
training.plot_dynamics(seq_runs, title="seq task: training dynamics (fig:main_8k's shape)")
display(Markdown(training.to_markdown(training.last_best_data("seq"))))

# %% [markdown]
# ## What we learned
#
# One loop and one loss table cover the whole range. On the bandit (the first figure) each loss
# climbs to the expected reward of its own divergence's optimum, the dotted line of its colour, and
# the printed TV distances say it lands on that optimum: the choice of divergence is a choice of
# objective. On the transformer (the second figure) the same loss, with RPG-Style Clip and the
# paper's $\beta = 10^{-4}$, raises the sampled accuracy while the per-step KL to $\pi_{old}$ stays
# small. The last figure and table put every algorithm side by side at this laptop scale; which of
# the paper's rankings replicate here, and which do not, is discussed in `small_scale/RESULTS.md`.

# %% [markdown]
# ## Exercises
#
# Solutions: `notebooks/solutions.py` (run by `tests/test_notebook_solutions.py`).
#
# 1. *Derive, then compute.* From $\pi^* \propto \pi_{ref}\,e^{R/\beta}$, predict how the total
#    variation between $\pi^*$ and $\pi_{ref}$ moves as $\beta$ grows; compute it for
#    $\beta = 0.1, 0.5, 2, 10$. (`ex05_1_larger_beta_stays_closer_to_ref`)
# 2. *Run.* With the iterative reference (`--ref iterative`, $\pi_{ref} = \pi_{old}$ every step),
#    where does the bandit end? (`ex05_2_iterative_reference_ends_at_the_best_arm`)
