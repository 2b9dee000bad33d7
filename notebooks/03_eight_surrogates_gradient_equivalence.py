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
# # 3. The eight surrogates and their gradient equivalence
#
# **What this shows.** All eight RPG surrogate losses (four divergences, each fully
# differentiable and REINFORCE-style) have exactly the gradient $-\nabla J$ of the objective they
# claim, off-policy and for an unnormalized $\pi_{old}$; the two styles agree sample by sample; and
# normalized and unnormalized variants, equal in mean, differ in gradient variance (a figure the
# paper lacks).
#
# **Paper labels.** Section 3 (`sec:offpolicy_policy_gradients`), Table 4
# (`tab:off-policy-loss-normalized`),
# Table 1 (`tab:off-policy-loss`), Table 2 (`tab:off-policy-loss-reinforce`), Proposition E.1
# (`prop:policy_gradient_forward_kl`),
# Proposition E.3 (`prop:policy_gradient_reverse_kl`), Proposition 3.2
# (`prop:policy_gradient_unormalized_forward_kl`),
# Proposition 3.6 (`prop:policy_gradient_unormalized_reverse_kl`), Proposition 4.1
# (`prop:equiv_rf_fd`), Appendix E (`app:normalized_kl`).
# Paper: [arXiv:2505.17508](https://arxiv.org/abs/2505.17508).
#
# The paper's objective (Section 3 (`sec:offpolicy_policy_gradients`)), with samples from a
# behaviour policy
# $\pi_{old}$ and $w = \pi_\theta/\pi_{old}$:
#
# $$J(\theta) = \mathbb{E}_{\pi_\theta}[R] - \beta\, D(\pi_\theta, \pi_{old}),$$
# $$D \in \{\mathrm{KL}(\pi_{old}\|\pi_\theta),\ \mathrm{KL}(\pi_\theta\|\pi_{old}),
# \ \mathrm{UKL}(\pi_{old}\|\pi_\theta),\ \mathrm{UKL}(\pi_\theta\|\pi_{old})\}$$
#
# (FKL, RKL, UFKL, URKL). For each it gives a **fully differentiable** surrogate
# (Table 4 (`tab:off-policy-loss-normalized`), Table 1 (`tab:off-policy-loss`)), e.g. RKL:
# $\mathcal L = \mathbb{E}_{old}[w(-R + \beta\log w)]$, and a **REINFORCE-style** one with a
# stop-gradient weight (Table 2 (`tab:off-policy-loss-reinforce`)), e.g. URKL:
# $\mathcal L = -\mathbb{E}_{old}[\mathrm{SG}(w(R - \beta\log w))\log\pi_\theta]$.
# The claim (the four `prop:policy_gradient_*` and Proposition 4.1 (`prop:equiv_rf_fd`)): all eight
# have
# $\nabla\mathcal L = -\nabla J$.
#
# `rpg_ref.core.losses` implements the eight (`rpg-{fkl,rkl,ufkl,urkl}`, `rpg-reinforce-{...}`);
# `rpg_ref.core.exact` sums a loss over every outcome of a softmax policy weighted by $\pi_{old}$
# (an exact expectation) and differentiates $J$ from its definition.

# %%
import os

import torch

torch.set_default_dtype(torch.float64)  # the exact gradients below are compared at round-off
CI = os.environ.get("RPG_NOTEBOOK_CI") == "1"  # the test suite sets this: fewer Monte Carlo samples

# %%
import math

from rpg_ref.core import exact

DIVERGENCES = ("fkl", "rkl", "ufkl", "urkl")
NAMES = [f"rpg-{d}" for d in DIVERGENCES] + [f"rpg-reinforce-{d}" for d in DIVERGENCES]
g = torch.Generator().manual_seed(0)
K, beta = 6, 0.3
th_old = torch.randn(K, generator=g)
theta = th_old + 0.7 * torch.randn(K, generator=g)        # off-policy: theta != theta_old
R = torch.rand(K, generator=g)

print(f"{'loss':22s} {'Z_old=1':>12s} {'Z_old=1.7':>12s}   max |E_old[grad L] + grad J|")
for name in NAMES:
    div = name.rsplit("-", 1)[1]
    errs = []
    for Z in (1.0, 1.7):                                   # the paper's unnormalized pi_old too
        old_logp = torch.log_softmax(th_old, 0) + math.log(Z)
        g_loss = exact.expected_loss_grad(name, theta, old_logp, R, beta)
        g_J = exact.objective_grad(div, theta, R, beta, old_logp)
        errs.append(float((g_loss + g_J).abs().max()))
    print(f"{name:22s} {errs[0]:12.1e} {errs[1]:12.1e}")

# %% [markdown]
# All eight are exact to float64 round-off, off-policy and for an unnormalized $\pi_{old}$ of mass
# $Z_{old}$ (the unnormalized tables' $Z_{old}$ factor).
#
# ## Stronger than in expectation: per-sample identity
#
# Differentiating $w A - \beta d(x)$ gives $w\,(A - \beta h)\nabla\log\pi_\theta$, and the REINFORCE
# loss $-\mathrm{SG}(w(A-\beta h))\log\pi_\theta$ gives exactly the same vector for **each sample**.
# So the two families differ only once clipping enters (notebook 4).

# %%
from rpg_ref.core.losses import get_loss

N = 8
old = -torch.rand(N, 1, generator=g) * 2                    # log pi_old of N sampled tokens
lp0 = old + 0.3 * torch.randn(N, 1, generator=g)           # log pi_theta: off-policy
A = torch.randn(N, generator=g)
for div in DIVERGENCES:
    grads = []
    for fam in ("rpg", "rpg-reinforce"):
        lp = lp0.clone().requires_grad_(True)
        loss, _ = get_loss(f"{fam}-{div}")(lp, old, A, torch.ones(N, 1), beta=0.5)
        grads.append(torch.autograd.grad(loss, lp)[0])
    gap = float((grads[0] - grads[1]).abs().max())
    print(f"{div:5s} max per-sample |grad rpg - grad rpg-reinforce| = {gap:.1e}")

# %% [markdown]
# ## Same mean, different variance (Appendix E (`app:normalized_kl`); a figure the paper lacks)
#
# For a normalized $\pi_\theta$, FKL and UFKL (RKL and URKL) differ by constants, so their expected
# gradients agree; per sample they differ by $\beta\,w\,\nabla\log\pi_\theta$, which has mean zero
# but not variance zero. `derivations.variance.variance_table` gives the exact per-sample gradient
# variance by enumeration; `paper_figs.grad_variance` estimates it by Monte Carlo through the
# losses.

# %%
from derivations.variance import variance_table

rows = variance_table()
var = {(r["policy"], r["loss"]): r["var_per_sample"] for r in rows}
print("total variance of one sample's gradient, beta=0.5")
print(f"{'policy':22s} " + " ".join(f"{d:>8s}" for d in DIVERGENCES))
for p in dict.fromkeys(r["policy"] for r in rows):
    print(f"{p:22s} " + " ".join(f"{var[(p, n)]:8.4f}" for n in NAMES[:4]))

# %%
from paper_figs import grad_variance

data = grad_variance.grad_variance_data(n=4_000 if CI else 20_000)
grad_variance.plot_grad_variance(data)

# %% [markdown]
# Near $\theta_{old}$ the unnormalized variants have the lower variance (the extra $\beta(w-1)$ acts
# as a control variate); far from $\theta_{old}$ the ordering can flip. With the paper's
# $\beta = 10^{-4}$ the difference is negligible. The claims, checked three ways:

# %%
from derivations import run_all
from derivations.__main__ import format_table

rows = run_all(fast=True, only=["prop-", "equiv-rf-fd", "reinforce-", "normalized-vs-unnormalized",
                                "token-vs-sequence"])
print(format_table(rows, timings=False))
assert all(r["passed"] for r in rows)

# %% [markdown]
# The last row is a caveat of practice, not of the paper's math: the paper's $x$ is a whole
# response, while verl (and `rpg_ref`'s default `level="token"`) applies the losses per token.
# `derivations` documents which token-level losses still give the sequence-level gradient.

# %% [markdown]
# ## What we learned
#
# The eight surrogates are eight ways to write the gradient of four objectives: each is exact
# against $-\nabla J$ (first table), and the fully differentiable and REINFORCE-style forms of a
# divergence give the same gradient for every single sample, so they can only part ways under
# clipping (notebook 4). What distinguishes a normalized divergence from its unnormalized twin is
# not the mean but the noise: the variance figure above shows the unnormalized variants with the
# lower per-sample gradient variance near $\theta_{old}$, an ordering that flips farther away for
# FKL vs UFKL (left panel) but not here for RKL vs URKL (right). The two differ by the term
# $\beta\,w\,\nabla\log\pi_\theta$, so at the paper's $\beta = 10^{-4}$ the difference is
# negligible.

# %% [markdown]
# ## Exercises
#
# Solutions: `notebooks/solutions.py` (run by `tests/test_notebook_solutions.py`).
#
# 1. *Run.* Off-policy ($\theta \neq \theta_{old}$), compare the exact expected gradients of
#    `rpg-D` and `rpg-reinforce-D` for the four divergences D (Proposition 4.1
#    (`prop:equiv_rf_fd`)). (`ex03_1_reinforce_and_fd_have_one_expected_gradient`)
# 2. *Predict, then run.* Do `rpg-rkl` and `rpg-urkl` (and `rpg-fkl`, `rpg-ufkl`) have the same
#    expected gradient? Hint: what is $\nabla\sum_x \pi_\theta(x)$?
#    (`ex03_2_rkl_and_urkl_share_a_gradient`)
