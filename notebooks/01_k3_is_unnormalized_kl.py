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
# # 1. k3 is the unnormalized KL
#
# **What this shows.** GRPO's KL penalty $k_3$ is an exact, unbiased estimator of the
# *unnormalized* KL for measures of any mass, and how $k_1$, $k_2$, $k_3$ compare in bias and
# spread (a figure the paper does not have).
#
# **Paper labels.** Eq. (3.2) (`eq:k3_func_estimators_main`), Remark 3.5
# (`remark:k3_connection_main`),
# Appendix D (`app:k3_ukl_connection`).
# Paper: [arXiv:2505.17508](https://arxiv.org/abs/2505.17508).
#
# Schulman's three per-sample KL estimators take $x \sim q$ and $r = p(x)/q(x)$:
#
# $$k_1 = -\log r, \qquad k_2 = \tfrac12 (\log r)^2, \qquad k_3 = r - 1 - \log r .$$
#
# GRPO's KL penalty is $k_3$ (Eq. (3.2) (`eq:k3_func_estimators_main`)). The paper's
# Remark 3.5 (`remark:k3_connection_main`) (proved in Appendix D (`app:k3_ukl_connection`)) reads
# it as an *unnormalized* KL:
# for positive measures $p, q$ of **any** total mass,
#
# $$\mathbb{E}_{x\sim q}\big[k_3(p(x)/q(x))\big]
# = \sum_x q\,\tfrac{p}{q} - \sum_x q - \sum_x q \log\tfrac{p}{q}
# = \underbrace{\sum_x q \log\tfrac{q}{p} + \sum_x (p - q)}_{\mathrm{UKL}(q\,\|\,p)} .$$
#
# The mass-correction term $\sum(p-q)$ vanishes when both are normalized, so then $k_3$ is an
# unbiased estimate of the ordinary KL. Here $\mathbb{E}_{x\sim q}[f]$ means $\sum_x q(x) f(x)$,
# which for an unnormalized $q$ is $Z_q$ times an expectation under $q/Z_q$.
#
# Everything below calls `rpg_ref.core.kl` (the estimators and divergences), `paper_figs` (the
# figure's numbers) and `derivations` (the same claim checked symbolically, exactly and by Monte
# Carlo).

# %%
import numpy as np
import torch

torch.set_default_dtype(torch.float64)  # the checks below are exact up to float64 round-off

# %% [markdown]
# ## Two unnormalized measures
#
# `rpg_ref.core.kl.k3(log_ratio)` takes $\log r = \log p(x) - \log q(x)$; `rpg_ref.core.kl.ukl(logp,
# logq)` is $\mathrm{UKL}(p\|q)$ and `rpg_ref.core.kl.kl` the ordinary sum $\sum p \log(p/q)$.

# %%
from rpg_ref.core import kl

g = torch.Generator().manual_seed(0)
log_q = torch.randn(5, generator=g) + np.log(0.3)  # q: mass ~ 0.3 * 5
log_p = torch.randn(5, generator=g) + np.log(0.5)  # p: another mass
print(f"mass of q = {log_q.exp().sum():.4f}, mass of p = {log_p.exp().sum():.4f}")

e_k3 = (log_q.exp() * kl.k3(log_p - log_q)).sum()  # E_{x~q}[k3(p/q)] = sum_x q(x) k3(...)
mass_gap = (log_p.exp() - log_q.exp()).sum()
print(f"E_q[k3]          = {e_k3:.12f}")
print(f"UKL(q || p)      = {kl.ukl(log_q, log_p):.12f}")
print(f"sum q log(q/p)   = {kl.kl(log_q, log_p):.12f}   (differs by sum(p - q) = {mass_gap:.12f})")

# %% [markdown]
# With normalized distributions the three numbers coincide: $k_3$ is then unbiased for KL, as is
# $k_1$ (whose mean is $\sum q\log(q/p)$ for any masses), while $k_2$ is biased.

# %%
lq, lp = torch.log_softmax(log_q, 0), torch.log_softmax(log_p, 0)
q = lq.exp()
for name, f in (("k1", kl.k1), ("k2", kl.k2), ("k3", kl.k3)):
    print(f"E_q[{name}] = {(q * f(lp - lq)).sum():.12f}")
print(f"KL(q||p)  = {kl.kl(lq, lp):.12f}")

# %% [markdown]
# ## Bias and spread (the paper has no such figure)
#
# Schulman's example: $q = \mathcal N(0,1)$, $p = \mathcal N(\mu,1)$, $\mathrm{KL}(q\|p) = \mu^2/2$.
# $k_1$ is unbiased but its standard deviation is $|\mu|$, huge relative to a small KL; $k_2$ has
# low variance but a bias that grows with the KL; $k_3$ has both: no bias and low variance near
# $p = q$. At large KL $k_3$'s spread grows fastest ($e^{\mu^2} - 1 - \mu^2$), the price of the
# exponential. `paper_figs.kl_estimators` computes these numbers by Monte Carlo (fixed seed)
# through `rpg_ref.core.kl` and exactly by enumeration for a categorical family.

# %%
from paper_figs import kl_estimators

d = kl_estimators.gaussian_data(mus=(0.1, 0.5, 1.0, 2.0), n=100_000)
print(" mu    KL     " + "   ".join(f"{k}: bias/KL  std/KL" for k in ("k1", "k2", "k3")))
for i, mu in enumerate(d["mu"]):
    cells = "   ".join(
        f"   {d[k]['mean'][i] / d['kl'][i] - 1:+8.3f} {d[k]['std'][i] / d['kl'][i]:7.2f}"
        for k in ("k1", "k2", "k3")
    )
    print(f"{mu:4.1f} {d['kl'][i]:6.3f}  {cells}")

# %%
kl_estimators.plot_kl_estimators(kl_estimators.kl_estimators_data())

# %% [markdown]
# ## The same claim in `derivations`
#
# `derivations` checks Remark 3.5 (`remark:k3_connection_main`) for categoricals (both measures
# unnormalized)
# and Appendix D (`app:k3_ukl_connection`) for scaled Gaussians $a\,\mathcal N(\mu_1,\sigma_1^2)$,
# $b\,\mathcal N(\mu_2,\sigma_2^2)$, whose UKL has the closed form
# $a[\log\frac ab + \log\frac{\sigma_2}{\sigma_1} +
# \frac{\sigma_1^2 + (\mu_1-\mu_2)^2}{2\sigma_2^2} - \frac12] + b - a$:
# symbolically (sympy), exactly (float64) and by Monte Carlo.

# %%
from derivations import run_all
from derivations.__main__ import format_table

rows = run_all(fast=True, only=["k3"])
print(format_table(rows, timings=False))
assert all(r["passed"] for r in rows)

# %% [markdown]
# ## What we learned
#
# $k_3$ is not "an approximation of KL" with an unknown error: it is an exact, unbiased estimator
# of the unnormalized KL $\mathrm{UKL}(q\|p)$, for measures of any mass (the first printout, and
# `derivations` above). The bias-and-spread figure above shows what makes it the usual choice: in
# both bias panels it sits on zero with $k_1$ while $k_2$'s bias grows with the KL, and in both
# spread panels it is as quiet as $k_2$ near $p = q$, where $k_1$'s relative spread explodes (only
# for the Gaussian at large KL does $k_3$'s exponential make it the noisiest). Reading $k_3$ as UKL
# is what lets the paper treat GRPO's penalty as a UKL regularizer (notebook 2) and build the UFKL
# and URKL losses (notebook 3).

# %% [markdown]
# ## Exercises
#
# Solutions: `notebooks/solutions.py` (run by `tests/test_notebook_solutions.py`).
#
# 1. *Derive, then run.* For measures $q$, $p$ of masses 0.7 and 1.9, predict by how much
#    $\mathbb{E}_{x\sim q}[k_3(p/q)]$ differs from the plain sum $\sum_x q\log(q/p)$; check it.
#    (`ex01_1_k3_mean_is_ukl_for_any_mass`)
# 2. *Predict, then run.* For $p$ close to $q$ (logits 0.1 apart), $k_1$ and $k_3$ have the same
#    mean, the KL. Which has the smaller variance, and by roughly what power of the distance?
#    (`ex01_2_k1_is_noisier_near_ref`)
