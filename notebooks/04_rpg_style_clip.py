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
# # 4. RPG-Style Clip: shapes and gradients
#
# **What this shows.** The paper's two clipped loss shapes redrawn from `rpg_ref`'s own losses, with
# each segment's line style read off the autograd gradient; where the paper's figure, caption and
# algorithms disagree; and what clipping costs: exact at $\theta_{old}$, biased beyond.
#
# **Paper labels.** Appendix G (`sec:more_on_algorithms`), Section 3.3 (`subsec:rpg_style_clip`),
# Section 4.1 (`subsec:rpg_style_clip_reinforce`), Algorithm 1 (`alg:offpolicy_rpg_ppo_dualclip`),
# Algorithm 2 (`alg:offpolicy_rpg_rf_ppo_dualclip_v1`), Figure 2 (`fig:ppo_dualclip_loss_vis`),
# Figure 3 (`fig:offpolicy_rpg_rf_ppo_dualclip_v1`).
# Paper: [arXiv:2505.17508](https://arxiv.org/abs/2505.17508).
#
# Two clipped families (Appendix G (`sec:more_on_algorithms`)):
#
# * **Algorithm 1 (`alg:offpolicy_rpg_ppo_dualclip`)** (fully differentiable): a regularized
#   advantage
#   $\hat A$ inside the dual clip,
#   $\max(-w\hat A, -\mathrm{clip}(w, 1-\epsilon_1, 1+\epsilon_2)\hat A)$ for $\hat A\ge 0$ and
#   additionally $\min(\cdot, -c\hat A)$ for $\hat A < 0$ (Figure 2 (`fig:ppo_dualclip_loss_vis`)).
# * **Algorithm 2 (`alg:offpolicy_rpg_rf_ppo_dualclip_v1`)** (RPG-Style Clip, REINFORCE-style): with
#   $\ell = -\log\pi_\theta$, $A' = A_R + C_{KL}/w$ and $\psi = A'\ell$, the loss is
#   $(A_R w + C_{KL})\,\ell$ with $w$ under a stop-gradient; on the clipped segments $\ell$ is
#   detached too, so the gradient is exactly 0 (Figure 3 (`fig:offpolicy_rpg_rf_ppo_dualclip_v1`)).
#
# `paper_figs.clip_shapes` evaluates `rpg_ref`'s losses on a grid of $w$ (one sample per grid
# point, $\ell = 1$) and differentiates them with autograd. The line style is **read off the
# computed gradient**: solid where it is non-zero, dotted where it is exactly zero.

# %%
import torch

torch.set_default_dtype(torch.float64)  # gradients are tested for exact zeros

# %%
from paper_figs import clip_shapes
from paper_figs._common import runs_of


def segments(w, has_grad):
    """The w-intervals on which the computed gradient is non-zero or exactly zero (FLAT)."""
    return ", ".join(f"[{w[a]:.3f}, {w[b - 1]:.3f}] {'gradient' if g else 'FLAT'}"
                     for a, b, g in runs_of(has_grad))


d = clip_shapes.dualclip_loss_data()           # rpg-rkl, beta = 0: A_hat = A is constant
print(f"eps = {d['eps']}, c = {d['c']}")
for p in d["panels"]:
    print(f"A_hat = {p['A']:+g}: {segments(d['w'], p['has_grad'])}")
clip_shapes.plot_dualclip_loss(d)

# %% [markdown]
# The flat segments found from the gradient are exactly the algorithm's: $w > 1+\epsilon_2$ for
# $\hat A\ge0$; $w < 1-\epsilon_1$ and $w > c$ for $\hat A<0$. (The paper's caption swaps "left" and
# "right"; we follow the drawing and the algorithm. The paper draws $c = 2.25$; the algorithms only
# need $c > 1$, and we use verl's default $c = 3$, as the `seq` and `carry` presets do; the paper
# states no $c$ for its runs, and its released scripts use $c = 10$, as the `qwen3-4b-h100`
# presets do.)
#
# **But $\hat A$ depends on $\theta$.** For Algorithm 1 with $\beta > 0$,
# $\hat A = A - \beta\log w$ (RKL in `rpg_ref`), and the clipped value $-\mathrm{clip}(w)\hat A$
# still has gradient $\beta\,\mathrm{clip}(w)$ through $\hat A$ — the caption's "though it might
# flow via $\hat A$". Computed:

# %%
d = clip_shapes.dualclip_loss_data(beta=0.5)
for p in d["panels"]:
    print(f"A = {p['A']:+g}: {segments(d['w'], p['has_grad'])}")
clip_shapes.plot_dualclip_loss(d)

# %% [markdown]
# ## RPG-Style Clip (Algorithm 2) in the paper's plotted setting
#
# The figure uses $A_R = \pm1$, $C_{KL} = \pm 0.1$, $\ell = 1$. In `rpg_ref`,
# $C_{KL} = -\beta w\,h(\rho)$ with $\rho = \pi_\theta/\pi_{ref}$ — for URKL $h = \log\rho$ — so
# choosing, per grid point, a reference with $\log\rho = -C_{KL}/(\beta w)$ reproduces the figure's
# constant $C_{KL}$ exactly with `rpg-reinforce-urkl`.

# %%
d = clip_shapes.rpg_style_clip_data()
for p in d["panels"]:
    print(f"A_R = {p['A']:+g}, C_KL = {p['C_KL']:+g}: {segments(d['w'], p['has_grad'])}")
clip_shapes.plot_rpg_style_clip(d)

# %% [markdown]
# **Why the two figures slope in opposite directions for $A > 0$.** Algorithm 1's loss
# $-w\hat A$ is differentiated through $w = \pi_\theta/\pi_{old}$, so its value falls as $w$
# grows. Algorithm 2's loss $(A_R w + C_{KL})\,\ell$ holds $w$ under a stop-gradient and is
# differentiated through $\ell = -\log\pi_\theta$ only: plotted against $w$ (with $\ell$ fixed
# at 1) its value rises with $w$, but $w$ is not what the gradient moves. Without the KL part
# ($\beta = 0$) the two gradients in $\log\pi_\theta$ are the same on the unclipped segments,
# $-A\,w$; with it their expectations agree (Proposition 4.1 (`prop:equiv_rf_fd`), notebook 3).
# So compare the two figures by their flat segments, read off the gradient, not by their slopes.
#
# In the paper's *training* setting $\pi_{ref} = \pi_{old}$, $C_{KL}$ moves with $w$ (it is constant
# only for FKL, where it equals $+\beta$). The clipped segments then have zero gradient but a
# sloping value: the value depends on $\theta$ only through stop-gradient quantities
# (derivations/ERRATA.md, E9).

# %%
d = clip_shapes.rpg_style_clip_natural_data()
clip_shapes.plot_rpg_style_clip_natural(d)

# %% [markdown]
# ## The paper's descriptions of RPG-Style Clip are not one update
#
# `derivations.clipping.clip_descriptions_table` lists the per-sample gradient coefficient
# ($\nabla = \mathrm{coef}\cdot\nabla\log\pi_\theta$) of each description in the paper next to
# `rpg_ref`'s losses (URKL, $\beta = 0.1$, clip $(0.2, 0.28, 3)$). They agree where nothing is
# clipped up to the $\beta w$ offset of the differentiable $\hat A$ (ERRATA E1) and disagree on
# clipped segments (ERRATA E2, E3).

# %%
from IPython.display import Markdown, display

from derivations.clipping import clip_descriptions_table

rows = clip_descriptions_table()
cols = [k for k in rows[0] if k not in ("A_R", "w", "A_hat", "segment")]
table = ["| A_R | w | segment | " + " | ".join(cols) + " |", "|---" * (3 + len(cols)) + "|"]
for r in rows:
    cells = [f"{r['A_R']:+.0f}", f"{r['w']:.2f}", r["segment"]] + [f"{r[c]:.4f}" for c in cols]
    table.append("| " + " | ".join(cells) + " |")
display(Markdown("\n".join(table)))

# %% [markdown]
# ## What clipping costs: exact at $\theta_{old}$, biased beyond
#
# At $\theta = \theta_{old}$ every $w = 1$ and nothing is clipped, so the clipped losses still have
# expected gradient $-\nabla J$. As the policy moves away from $\theta_{old}$ (here along the
# advantage, as training moves it), clipping removes samples from the gradient — the trust-region
# trade-off. The two families clip different samples: Algorithm 1's $\hat A$ and Algorithm 2's $A'$
# are different functions of $w$ when $\beta > 0$.

# %%
from rpg_ref.core import exact

g = torch.Generator().manual_seed(0)
th_old = torch.randn(6, generator=g)
R = torch.rand(6, generator=g)
old_logp = torch.log_softmax(th_old, 0)
A = R - (old_logp.exp() * R).sum()  # the advantage: reward minus its mean under pi_old
for t in (0.0, 0.5, 1.0, 2.0):
    theta = th_old + t * A / A.norm()
    w = (torch.log_softmax(theta, 0) - old_logp).exp()
    outside = float((old_logp.exp() * ((w < 0.8) | (w > 1.28))).sum())
    gJ = exact.objective_grad("urkl", theta, A, 0.1, old_logp)
    out = []
    for name in ("rpg-urkl", "rpg-reinforce-urkl"):
        gl = exact.expected_loss_grad(name, theta, old_logp, A, 0.1, clip=(0.2, 0.28, 3.0))
        out.append(f"{name}: {float((gl + gJ).norm() / gJ.norm()):.2e}")
    print(f"t={t}: pi_old-mass with w outside [0.8, 1.28] = {outside:.2f};  "
          "rel. error of E[grad clipped loss] vs -grad J:  " + "  ".join(out))

# %%
from derivations import run_all
from derivations.__main__ import format_table

rows = run_all(fast=True, only=["dualclip-fd", "alg1-ahat-rkl", "rpg-style-clip"])
print(format_table(rows, timings=False))
assert all(r["passed"] for r in rows)

# %% [markdown]
# ## What we learned
#
# Clipping is where the fully differentiable and REINFORCE-style losses stop being the same update.
# The loss-shape figures above, drawn from the computed gradients, confirm the paper's flat segments
# for Algorithm 1 with a constant $\hat A$ and for Algorithm 2 in its plotted setting, but show two
# things the paper's figures hide: with $\beta > 0$ Algorithm 1's "flat" segments still carry a
# gradient through $\hat A$ (the second figure), and in the training setting
# $\pi_{ref} = \pi_{old}$ Algorithm 2's clipped segments have zero gradient under a sloping value
# (the last figure). The table says the paper's several descriptions of RPG-Style Clip are different
# updates on clipped samples, and the last printout gives the price of clipping: exact at
# $\theta_{old}$, a bias that grows with the $\pi_{old}$-mass outside the clip range.

# %% [markdown]
# ## Exercises
#
# Solutions: `notebooks/solutions.py` (run by `tests/test_notebook_solutions.py`).
#
# 1. *Predict, then run.* For $A > 0$ and RPG-Style Clip at $(0.2, 0.28, 3)$, what is the gradient
#    of one token's loss with respect to $\log\pi_\theta$ at $w = 1.1$, and at $w = 1.5$?
#    (`ex04_1_no_gradient_beyond_the_clip`)
# 2. *Predict, then run.* For $A < 0$: at $w = 2$ and at $w = 5$ (beyond $c = 3$)?
#    (`ex04_2_dual_clip_caps_a_negative_advantage`)
