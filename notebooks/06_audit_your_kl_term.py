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
# # 6. Audit your library's KL term
#
# **What this shows.** How to find out which objective a loss with a KL term really follows, with
# `rpg_ref.audit`: it computes the loss's exact expected gradient on small tabular policies
# (every response enumerated) and names the divergence $D$ whose $\beta\nabla D$ the loss's KL
# gradient equals. Three ways libraries write the KL — $k_3$ with the importance weight $w$, $k_3$
# without it (GRPO as published), and $k_1$ in the reward (REINFORCE++, PPO-RLHF) — each in four
# settings: on- or off-policy ($\theta = \theta_{old}$ or not), and $\pi_{ref} = \pi_{old}$ (the
# paper's iterative reference) or a fixed $\pi_{ref} \neq \pi_{old}$.
#
# **Paper labels.** Eq. (3.2) (`eq:k3_func_estimators_main`) ($k_3$), Remark 3.5
# (`remark:k3_connection_main`) ($k_3$ is the unnormalized KL), Section 2.2 (`subsec:grpo_main`)
# (GRPO's term and its correction), Table 1 (`tab:off-policy-loss`). Paper:
# [arXiv:2505.17508](https://arxiv.org/abs/2505.17508).
#
# A loss is written as your library writes it, as a function of per-token log-probs:
# `loss(logp, old_logp, ref_logp, advantages, mask)` with `logp`, `old_logp`, `ref_logp`,
# `mask` of shape `[B, H]` (B responses of length H) and one advantage per response. The audit
# calls it on every response of a small vocabulary, weighted by the probability that $\pi_{old}$
# draws it, and differentiates.

# %%
import torch

from rpg_ref.audit import Adapter, audit, format_table

BETA = 0.1


def k3(ref_logp, logp):
    """k3(pi_ref / pi_theta) per token: r - 1 - log r with r = pi_ref / pi_theta (Eq. (3.2))."""
    return torch.exp(ref_logp - logp) - (ref_logp - logp) - 1


def k3_with_w(logp, old_logp, ref_logp, advantages, mask):
    """The paper's correction: the KL term carries the importance weight w = pi_theta / pi_old."""
    w = torch.exp(logp - old_logp)
    per_token = -w * advantages[:, None] + BETA * w * k3(ref_logp, logp)
    return (per_token * mask).sum(1).mean()


def k3_without_w(logp, old_logp, ref_logp, advantages, mask):
    """GRPO as published: k3 on samples from pi_old, no importance weight on the KL term."""
    w = torch.exp(logp - old_logp)
    per_token = -w * advantages[:, None] + BETA * k3(ref_logp, logp)
    return (per_token * mask).sum(1).mean()


def k1_in_reward(logp, old_logp, ref_logp, advantages, mask):
    """The KL in the reward: each response's reward less beta * sum_t log(pi_old / pi_ref), a
    constant of the sampled response (no gradient flows through it)."""
    w = torch.exp(logp - old_logp)
    k1 = ((old_logp - ref_logp) * mask).sum(1)
    return (-w * (advantages - BETA * k1)[:, None] * mask).sum(1).mean()


losses = {"k3 with w": k3_with_w, "k3 without w": k3_without_w, "k1 in reward": k1_in_reward}
results = audit([Adapter(name, fn, beta=BETA, library="notebook", own_code=True)
                 for name, fn in losses.items()])
print(format_table(results))


# %% [markdown]
# ## Reading the table
#
# One line per loss and setting. `θ` is where the gradient is taken (`= θ_old`: the first update
# after sampling); `π_ref` whether the reference is $\pi_{old}$. `reward part` compares the loss's
# reward gradient with $-\nabla\mathbb{E}[R]$ at response lengths $H = 1, 2, 3$ ("exact" within
# 1e-10, else the relative error). `KL part, H=…` names the $D$ of the objective
# $\mathbb{E}[R] - \beta D$ the KL gradient follows, `0 (every D: 0)` where every candidate's
# gradient vanishes (on-policy with $\pi_{ref} = \pi_{old}$: every divergence is at its
# minimum), and `none (closest …: e)` where no candidate fits (e: the relative error of the
# closest). What the three losses do:
#
# * **$k_3$ with $w$** follows $\sum_t \mathrm{KL}(\pi\|\pi_{ref})$ (the per-position reverse KL)
#   for every $\theta$ and either reference: the correction of Section 2.2 makes the KL part exact.
# * **$k_3$ without $w$** follows the *forward* KL $\mathrm{KL}(\pi_{ref}\|\pi)$ on-policy when
#   $\pi_{ref} \neq \pi_{old}$, and no divergence at all off-policy: its gradient
#   $\mathbb{E}_{\pi_{old}}[(1 - \pi_{ref}/\pi_\theta)\nabla\log\pi_\theta]$ does not change its
#   sampling distribution as $\theta$ moves (notebook 2 measures how far off).
# * **$k_1$ in the reward** follows the sequence-level $\mathrm{KL}(\pi\|\pi_{ref})$ on-policy with
#   a fixed reference (the classic RLHF penalty), nothing with $\pi_{ref} = \pi_{old}$ off-policy
#   ($\log \pi_{old}/\pi_{ref} = 0$: the term is gone), and no divergence off-policy with a fixed
#   reference: the penalty is frozen at $\pi_{old}$'s log-ratios.
#
# The reward part is the same for the three (the same $-w A$): exact on-policy, and off-policy
# exact only at $H = 1$ (per-token ratios over multi-token responses).

# %% [markdown]
# Each row is a dict (JSON-ready; `rpg-audit --json` writes them): `kl_matches` lists the
# candidates the KL part matches, `tok-rkl` being $\sum_t \mathrm{KL}(\pi\|\pi_{ref})$ and
# `seq-rkl` the KL of whole responses. The claims above, as checks:

# %%
def matches(loss, on_policy, ref_is_old, horizon=3):
    (row,) = [r for r in results if (r["loss"], r["on_policy"], r["ref_is_old"], r["horizon"])
              == (loss, on_policy, ref_is_old, horizon)]
    return row["kl_matches"]


for on_policy in (True, False):
    assert "tok-rkl" in matches("k3 with w", on_policy, ref_is_old=False)
assert "tok-fkl" in matches("k3 without w", True, ref_is_old=False)
assert matches("k3 without w", False, ref_is_old=False) == []
assert "seq-rkl" in matches("k1 in reward", True, ref_is_old=False)
assert matches("k1 in reward", False, ref_is_old=False) == []
print("checked: the table's cells for H = 3")

# %% [markdown]
# The same cells as a figure: for a fixed reference ($\pi_{ref} \neq \pi_{old}$) and $H = 3$,
# the relative error of each loss's KL gradient against $\beta\nabla$ of the two per-position
# KLs (`kl_errs`; round-off is about 1e-16, a match is below 1e-10).

# %%
import matplotlib.pyplot as plt
import numpy as np

from paper_figs import show

CANDIDATES = (("tok-rkl", "Σt KL(π‖ref)"), ("tok-fkl", "Σt KL(ref‖π)"))
fig, ax = plt.subplots(figsize=(7, 3))
labels, x = [], 0
for loss in losses:
    for on_policy in (True, False):
        (row,) = [r for r in results if (r["loss"], r["on_policy"], r["ref_is_old"], r["horizon"])
                  == (loss, on_policy, False, 3)]
        for k, (cand, name) in enumerate(CANDIDATES):
            ax.bar(x + 0.4 * k, max(row["kl_errs"][cand], 1e-17), width=0.4, color=f"C{k}",
                   label=name if x == 0 else None)
        labels.append(f"{loss}\n{'on' if on_policy else 'off'}-policy")
        x += 1
ax.set_yscale("log")
ax.axhline(1e-10, color="k", lw=0.6, ls=":")
ax.set_xticks(np.arange(x) + 0.2, labels, fontsize=7)
ax.set_ylabel("rel. error of the KL gradient")
ax.legend(fontsize=8)
ax.set_title("fixed reference, H = 3 (dotted: the audit's match threshold)", fontsize=9)
show(fig)

# %% [markdown]
# ## Your library
#
# `rpg-audit` runs the same check on the installed code of TRL, verl, OpenRLHF, SkyRL, AReaL and
# Oat (docs/audit.md holds the committed table); `rpg-audit --loss my_loss.py:loss --beta 0.1`
# audits a file of yours. The three functions above are what to compare against: a loss that
# reads like "$k_3$ without $w$" and runs with a fixed reference is, on-policy, a forward-KL
# regularizer, whatever its documentation calls it.

# %% [markdown]
# ## What we learned
#
# Where the KL sits (loss or reward), whether it carries the importance weight, and whether
# $\pi_{ref}$ is $\pi_{old}$ decide the objective: the same $k_3$ gives the reverse KL with $w$,
# the forward KL without it (on-policy, fixed reference), and no objective off-policy without it.
# The audit's table above shows every cell, computed exactly, not estimated, and the figure shows
# how far from each KL the others are (a match is round-off; a miss is tens of percent).

# %% [markdown]
# ## Exercises
#
# Solutions: `notebooks/solutions.py` (run by `tests/test_notebook_solutions.py`).
#
# 1. *Predict, then run.* Write $k_2 = \frac12(\log \pi_\theta/\pi_{ref})^2$ per token (verl's
#    `mse`), once without and once with the importance weight $w$. Which divergence does each KL
#    part follow on-policy with a fixed reference? (Hint: differentiate; at
#    $\theta = \theta_{old}$, $\mathbb{E}_\pi[\nabla\log\pi] = 0$.) (`ex06_1_k2_with_and_without_w`)
# 2. *Derive.* With $\pi_{ref} = \pi_{old}$ and $\theta = \theta_{old}$ every KL part above is 0.
#    Show why from the definition of a divergence (it is minimal, 0, at $\pi = \pi_{ref}$) and check
#    that the audit says `0 (every D: 0)` for all three losses.
#    (`ex06_2_on_policy_iterative_is_zero`)
