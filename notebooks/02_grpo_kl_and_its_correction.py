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
# # 2. GRPO's KL term and its correction
#
# **What this shows.** GRPO's published KL term, sampled from $\pi_{old}$ without an importance
# weight, does not have the gradient of the divergence it is meant to penalize once
# $\pi_\theta \neq \pi_{old}$ (and with a fixed $\pi_{ref}$ not even at $\theta = \theta_{old}$);
# the paper's importance-weighted correction does, exactly. A figure the paper lacks shows how fast
# the error grows with the distance from $\theta_{old}$.
#
# **Paper labels.** Section 2.2 (`subsec:grpo_main`), Eq. (3.2) (`eq:k3_func_estimators_main`),
# Remark 3.5 (`remark:k3_connection_main`).
# Paper: [arXiv:2505.17508](https://arxiv.org/abs/2505.17508).
#
# GRPO (DeepSeekMath; the paper's Section 2.2 (`subsec:grpo_main`)) samples tokens from $\pi_{old}$
# and adds, per
# token,
#
# $$\beta\,k_3\!\Big(\frac{\pi_{ref}(x)}{\pi_\theta(x)}\Big), \qquad k_3(y) = y - 1 - \log y ,$$
#
# with no importance weight. By notebook 1,
# $\mathbb{E}_{x\sim\pi_\theta}[k_3(\pi_{ref}/\pi_\theta)] = \mathrm{UKL}(\pi_\theta\|\pi_{ref})$ —
# but the samples come from $\pi_{old}$, not $\pi_\theta$. The expected gradient of the published
# term is
#
# $$g_{pub}(\theta) = \mathbb{E}_{x\sim\pi_{old}}\Big[
# \Big(1 - \frac{\pi_{ref}(x)}{\pi_\theta(x)}\Big) \nabla_\theta\log\pi_\theta(x)\Big],$$
#
# which is **not** $\nabla_\theta\,\mathrm{UKL}(\pi_\theta\|\pi_{ref})$ once
# $\pi_\theta \neq \pi_{old}$. The paper's correction multiplies by $w = \pi_\theta/\pi_{old}$
# (differentiable):
# $\mathbb{E}_{\pi_{old}}[w\,k_3(\pi_{ref}/\pi_\theta)] = \mathrm{UKL}(\pi_\theta\|\pi_{ref})$ as a
# *value* for every $\theta$, so its gradient is exact for every $\theta$. In `rpg_ref` these are
# the losses `grpo` and `grpo-corrected`.
#
# One more finding (derivations/ERRATA.md, E4): even at $\theta = \theta_{old}$ the published term's
# gradient is $-\sum_x \pi_{ref}\nabla\log\pi_\theta = \nabla\mathrm{KL}(\pi_{ref}\|\pi_\theta)$,
# the **forward** KL — not the reverse UKL — whenever $\pi_{ref}\neq\pi_{old}$. The importance
# weight matters even where its value is 1, because its gradient is not 0.

# %%
import torch

torch.set_default_dtype(torch.float64)  # the exact gradients below are compared to 1e-10

# %% [markdown]
# ## Exact gradients, through the library's own losses
#
# `derivations.grpo_kl.kl_term_grad(name, logits, old_logp, ref_logp)` enumerates every outcome of a
# 6-outcome softmax and differentiates `rpg_ref.core.losses.get_loss(name)` with advantages 0 and
# $\beta = 1$ (so only the KL term has a gradient). `divergence_grads` differentiates the candidate
# divergences from their definitions.

# %%
from derivations.grpo_kl import divergence_grads, kl_term_grad

g = torch.Generator().manual_seed(1)
th_old = torch.randn(6, generator=g)
ref_logits = th_old + 0.8 * torch.randn(6, generator=g)        # a fixed reference != pi_old
old_logp, ref_logp = torch.log_softmax(th_old, -1), torch.log_softmax(ref_logits, -1)
th_off = th_old + 0.7 * torch.randn(6, generator=g)  # an off-policy theta


def rel(a, b):
    """Relative error of the vector a against the reference b."""
    return float((a - b).norm() / b.norm())


for label, th in (("theta = theta_old", th_old), ("theta off-policy", th_off)):
    cands = divergence_grads(th, ref_logp)
    g_pub, _ = kl_term_grad("grpo", th, old_logp, ref_logp)
    g_cor, _ = kl_term_grad("grpo-corrected", th, old_logp, ref_logp)
    print(label)
    for name, v in cands.items():
        print(f"   published term vs grad {name:16s}: rel. error {rel(g_pub, v):.2e}")
    err_cor = rel(g_cor, cands["UKL(theta||ref)"])
    print(f"   corrected term vs grad UKL(theta||ref)   : rel. error {err_cor:.2e}")

# %% [markdown]
# At $\theta = \theta_{old}$ the published term matches $\nabla\mathrm{KL}(\pi_{ref}\|\pi_\theta)$
# to round-off; off-policy it matches none of the candidates. The corrected term is exact in both
# places.
#
# ## How fast does the error grow? (a figure the paper lacks)
#
# Along $\theta = \theta_{old} + t\,d$ for a fixed unit direction $d$, in the RPG setting
# $\pi_{ref} = \pi_{old}$ (iterative reference; both gradients vanish at $t = 0$) and in GRPO's
# setting of a fixed $\pi_{ref} \neq \pi_{old}$. The numbers come from
# `derivations.grpo_kl.error_curve`; the figure from `paper_figs.grpo_kl_error`.

# %%
from paper_figs import grpo_kl_error

data = grpo_kl_error.grpo_kl_error_data()
for label, s in data["settings"].items():
    print(label)
    for i in range(0, len(s["distance"]), 4):
        print(f"   t={s['distance'][i]:5.2f}  KL(theta||old)={s['kl_theta_old'][i]:.2e}  "
              f"published rel.err={s['rel_err'][i]:.3g}  corrected={s['corrected_rel_err'][i]:.1e}")

# %%
grpo_kl_error.plot_grpo_kl_error(data)

# %% [markdown]
# With $\pi_{ref} = \pi_{old}$ the relative error is small near $\theta_{old}$ and grows roughly
# like $\sqrt{\mathrm{KL}(\pi_\theta\|\pi_{old})}$; with a fixed reference it is large (~0.27 here)
# from the first step, because of the forward/reverse mix-up above.
#
# ## Monte Carlo: the autograd gradient of the actual loss on sampled tokens
#
# The exact statements are about expectations. A batch of $N$ samples from $\pi_{old}$, pushed
# through the library losses once, shows the same thing in the way a trainer sees it.

# %%
from rpg_ref.core.losses import get_loss

th = th_old + 0.7 * torch.randn(6, generator=torch.Generator().manual_seed(5))
N = 200_000
x = torch.multinomial(old_logp.exp(), N, replacement=True,
                      generator=torch.Generator().manual_seed(2))  # N tokens sampled from pi_old
target = divergence_grads(th, ref_logp)["UKL(theta||ref)"]
for name in ("grpo", "grpo-corrected"):
    theta = th.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)[x].view(N, 1)
    loss, _ = get_loss(name)(logp, old_logp[x].view(N, 1), torch.zeros(N), torch.ones(N, 1),
                             beta=1.0, ref_logp=ref_logp[x].view(N, 1))
    (grad,) = torch.autograd.grad(loss, theta)
    print(f"{name:15s} MC gradient vs grad UKL(theta||ref): rel. error {rel(grad, target):.3f}"
          f"  (N={N})")

# %% [markdown]
# The corrected term's Monte-Carlo error is sampling noise ($O(N^{-1/2})$); the published term's is
# bias. The same claims, checked three ways in `derivations`:

# %%
from derivations import run_all
from derivations.__main__ import format_table

rows = run_all(fast=True, only=["grpo-kl"])
print(format_table(rows, timings=False))
assert all(r["passed"] for r in rows)

# %% [markdown]
# ## What we learned
#
# The published GRPO term is a biased gradient of the KL penalty it is named after. At
# $\theta = \theta_{old}$ with $\pi_{ref} = \pi_{old}$ it agrees with $\nabla\mathrm{UKL}$ only
# because both are zero there (every candidate divergence is at its minimum), which says nothing
# about the step; off-policy its error grows with the distance from $\theta_{old}$; with a fixed
# reference it follows the *forward* KL even on-policy. The error-growth figure above shows both
# regimes: in the RPG setting ($\pi_{ref} = \pi_{old}$) the error starts near zero and grows with
# $\mathrm{KL}(\pi_\theta\|\pi_{old})$, in GRPO's fixed-reference setting it is large from the
# first step, and the corrected term $w\,k_3$ (dashed) stays at float64 round-off everywhere.
# The Monte Carlo cell shows that a trainer sees the same: noise for the corrected term, bias for
# the published one.

# %% [markdown]
# ## Exercises
#
# Solutions: `notebooks/solutions.py` (run by `tests/test_notebook_solutions.py`).
#
# 1. *Derive, then run.* At $\theta = \theta_{old}$ with $\pi_{ref} = \pi_{old}$, show that the
#    expected gradients of the published and of the corrected term are both 0 (so their agreement
#    there says nothing); check it. (`ex02_1_both_gradients_vanish_on_policy_iterative`)
# 2. *Run.* Make GRPO's $k_3$ reach the reverse-KL optimum on the bandit: the importance weight
#    (`--algo grpo-corrected`), group-mean advantages, a frozen reference; measure the total
#    variation to both optima. (`ex02_2_grpo_corrected_reaches_the_reverse_kl_optimum`)
