"""Write the five walkthrough notebooks (stored without outputs) from the cells below.

    python notebooks/make_notebooks.py          # rewrite notebooks/*.ipynb
    python notebooks/make_notebooks.py --check  # exit 1 if a stored notebook differs from this file

The notebooks import rpg_ref, derivations and paper_figs; they hold prose and calls, no math code
of their own. tests/test_notebooks.py executes them (with RPG_NOTEBOOK_CI=1, which shortens the
training runs of notebook 5).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """\
import os, tempfile
import numpy as np
import torch
from IPython.display import Image, display
torch.set_default_dtype(torch.float64)
FIG_DIR = tempfile.mkdtemp(prefix="rpg-nb-")      # figures are written here and displayed inline
CI = os.environ.get("RPG_NOTEBOOK_CI") == "1"      # the test suite sets this: shorter training runs
"""

# notebook 5 trains models: keep torch's default float32 (the trainer's models are float32)
SETUP_TRAIN = SETUP.replace("torch.set_default_dtype(torch.float64)\n", "")


def md(s: str):
    return new_markdown_cell(s.strip())


def code(s: str):
    return new_code_cell(s.strip())


# ------------------------------------------------------------------------------------------------
NB1 = [
    md(r"""
# 1. k3 is the unnormalized KL

Schulman's three per-sample KL estimators take $x \sim q$ and $r = p(x)/q(x)$:

$$k_1 = -\log r, \qquad k_2 = \tfrac12 (\log r)^2, \qquad k_3 = r - 1 - \log r .$$

GRPO's KL penalty is $k_3$ (the paper's `eq:k3_func_estimators_main`). The paper's
`remark:k3_connection_main` (proved in `app:k3_ukl_connection`) reads it as an *unnormalized* KL:
for positive measures $p, q$ of **any** total mass,

$$\mathbb{E}_{x\sim q}\big[k_3(p(x)/q(x))\big] = \sum_x q\,\tfrac{p}{q} - \sum_x q - \sum_x q \log\tfrac{p}{q}
= \underbrace{\sum_x q \log\tfrac{q}{p} + \sum_x (p - q)}_{\mathrm{UKL}(q\,\|\,p)} .$$

The mass-correction term $\sum(p-q)$ vanishes when both are normalized, so then $k_3$ is an unbiased
estimate of the ordinary KL. Here $\mathbb{E}_{x\sim q}[f]$ means $\sum_x q(x) f(x)$, which for an
unnormalized $q$ is $Z_q$ times an expectation under $q/Z_q$.

Everything below calls `rpg_ref.kl` (the estimators and divergences), `paper_figs` (the figure's
numbers) and `derivations` (the same claim checked symbolically, exactly and by Monte Carlo).
"""),
    code(SETUP),
    md(r"""
## Two unnormalized measures

`rpg_ref.kl.k3(log_ratio)` takes $\log r = \log p(x) - \log q(x)$; `rpg_ref.kl.ukl(logp, logq)` is
$\mathrm{UKL}(p\|q)$ and `rpg_ref.kl.kl` the ordinary sum $\sum p \log(p/q)$.
"""),
    code("""
from rpg_ref import kl

g = torch.Generator().manual_seed(0)
log_q = torch.randn(5, generator=g) + np.log(0.3)   # q: mass ~ 0.3 * 5
log_p = torch.randn(5, generator=g) + np.log(0.5)   # p: another mass
print(f"mass of q = {log_q.exp().sum():.4f}, mass of p = {log_p.exp().sum():.4f}")

e_k3 = (log_q.exp() * kl.k3(log_p - log_q)).sum()      # E_{x~q}[k3(p/q)]
print(f"E_q[k3]          = {e_k3:.12f}")
print(f"UKL(q || p)      = {kl.ukl(log_q, log_p):.12f}")
print(f"sum q log(q/p)   = {kl.kl(log_q, log_p):.12f}   (differs by sum(p - q) = {(log_p.exp() - log_q.exp()).sum():.12f})")
"""),
    md(r"""
With normalized distributions the three numbers coincide: $k_3$ is then unbiased for KL, as is $k_1$
(whose mean is $\sum q\log(q/p)$ for any masses), while $k_2$ is biased.
"""),
    code("""
lq, lp = torch.log_softmax(log_q, 0), torch.log_softmax(log_p, 0)
q = lq.exp()
for name, f in (("k1", kl.k1), ("k2", kl.k2), ("k3", kl.k3)):
    print(f"E_q[{name}] = {(q * f(lp - lq)).sum():.12f}")
print(f"KL(q||p)  = {kl.kl(lq, lp):.12f}")
"""),
    md(r"""
## Bias and spread (the paper has no such figure)

Schulman's example: $q = \mathcal N(0,1)$, $p = \mathcal N(\mu,1)$, $\mathrm{KL}(q\|p) = \mu^2/2$.
$k_1$ is unbiased but its standard deviation is $|\mu|$, huge relative to a small KL; $k_2$ has low
variance but a bias that grows with the KL; $k_3$ has both: no bias and low variance near $p = q$.
At large KL $k_3$'s spread grows fastest ($e^{\mu^2} - 1 - \mu^2$), the price of the exponential.
`paper_figs.kl_estimators` computes these numbers by Monte Carlo (fixed seed) through `rpg_ref.kl`
and exactly by enumeration for a categorical family.
"""),
    code("""
from paper_figs import kl_estimators

d = kl_estimators.gaussian_data(mus=(0.1, 0.5, 1.0, 2.0), n=100_000)
print(" mu    KL     " + "   ".join(f"{k}: bias/KL  std/KL" for k in ("k1", "k2", "k3")))
for i, mu in enumerate(d["mu"]):
    cells = "   ".join(f"   {d[k]['mean'][i] / d['kl'][i] - 1:+8.3f} {d[k]['std'][i] / d['kl'][i]:7.2f}" for k in ("k1", "k2", "k3"))
    print(f"{mu:4.1f} {d['kl'][i]:6.3f}  {cells}")
"""),
    code("""
paths = kl_estimators.plot_kl_estimators(kl_estimators.kl_estimators_data(), FIG_DIR)
display(Image(str(paths[0])))
"""),
    md(r"""
## The same claim in `derivations`

`derivations` checks `remark:k3_connection_main` for categoricals (both measures unnormalized) and
`app:k3_ukl_connection` for scaled Gaussians $a\,\mathcal N(\mu_1,\sigma_1^2)$, $b\,\mathcal N(\mu_2,\sigma_2^2)$,
whose UKL has the closed form $a[\log\frac ab + \log\frac{\sigma_2}{\sigma_1} + \frac{\sigma_1^2 + (\mu_1-\mu_2)^2}{2\sigma_2^2} - \frac12] + b - a$:
symbolically (sympy), exactly (float64) and by Monte Carlo.
"""),
    code("""
from derivations import run_all
from derivations.__main__ import format_table
rows = run_all(fast=True, only=["k3"])
print(format_table(rows))
assert all(r["passed"] for r in rows)
"""),
    md(r"""
**Takeaway.** $k_3$ is not "an approximation of KL" with an unknown error: it is an exact, unbiased
estimator of the unnormalized KL, $\mathrm{UKL}(q\|p)$. This is what lets the paper treat GRPO's
penalty as a UKL regularizer (notebook 2) and build the UFKL/URKL losses (notebook 3).
"""),
]

# ------------------------------------------------------------------------------------------------
NB2 = [
    md(r"""
# 2. GRPO's KL term and its correction

GRPO (DeepSeekMath; the paper's `subsec:grpo_main`) samples tokens from $\pi_{old}$ and adds, per token,

$$\beta\,k_3\!\Big(\frac{\pi_{ref}(x)}{\pi_\theta(x)}\Big), \qquad k_3(y) = y - 1 - \log y ,$$

with no importance weight. By notebook 1, $\mathbb{E}_{x\sim\pi_\theta}[k_3(\pi_{ref}/\pi_\theta)] =
\mathrm{UKL}(\pi_\theta\|\pi_{ref})$ — but the samples come from $\pi_{old}$, not $\pi_\theta$. The
expected gradient of the published term is

$$g_{pub}(\theta) = \mathbb{E}_{x\sim\pi_{old}}\Big[\Big(1 - \frac{\pi_{ref}(x)}{\pi_\theta(x)}\Big)\nabla_\theta\log\pi_\theta(x)\Big],$$

which is **not** $\nabla_\theta\,\mathrm{UKL}(\pi_\theta\|\pi_{ref})$ once $\pi_\theta \neq \pi_{old}$. The
paper's correction multiplies by $w = \pi_\theta/\pi_{old}$ (differentiable):
$\mathbb{E}_{\pi_{old}}[w\,k_3(\pi_{ref}/\pi_\theta)] = \mathrm{UKL}(\pi_\theta\|\pi_{ref})$ as a *value*
for every $\theta$, so its gradient is exact for every $\theta$. In `rpg_ref` these are the losses
`grpo` and `grpo-corrected`.

One more finding (derivations/ERRATA.md, E4): even at $\theta = \theta_{old}$ the published term's
gradient is $-\sum_x \pi_{ref}\nabla\log\pi_\theta = \nabla\mathrm{KL}(\pi_{ref}\|\pi_\theta)$, the
**forward** KL — not the reverse UKL — whenever $\pi_{ref}\neq\pi_{old}$. The importance weight
matters even where its value is 1, because its gradient is not 0.
"""),
    code(SETUP),
    md(r"""
## Exact gradients, through the library's own losses

`derivations.grpo_kl.kl_term_grad(name, logits, old_logp, ref_logp)` enumerates every outcome of a
6-outcome softmax and differentiates `rpg_ref.losses.get_loss(name)` with advantages 0 and
$\beta = 1$ (so only the KL term has a gradient). `divergence_grads` differentiates the candidate
divergences from their definitions.
"""),
    code("""
from derivations.grpo_kl import divergence_grads, kl_term_grad

g = torch.Generator().manual_seed(1)
th_old = torch.randn(6, generator=g)
ref_logits = th_old + 0.8 * torch.randn(6, generator=g)        # a fixed reference != pi_old
old_logp, ref_logp = torch.log_softmax(th_old, -1), torch.log_softmax(ref_logits, -1)

def rel(a, b):
    return float((a - b).norm() / b.norm())

for label, th in (("theta = theta_old", th_old), ("theta off-policy", th_old + 0.7 * torch.randn(6, generator=g))):
    cands = divergence_grads(th, ref_logp)
    g_pub, _ = kl_term_grad("grpo", th, old_logp, ref_logp)
    g_cor, _ = kl_term_grad("grpo-corrected", th, old_logp, ref_logp)
    print(label)
    for name, v in cands.items():
        print(f"   published term vs grad {name:16s}: rel. error {rel(g_pub, v):.2e}")
    print(f"   corrected term vs grad UKL(theta||ref)   : rel. error {rel(g_cor, cands['UKL(theta||ref)']):.2e}")
"""),
    md(r"""
At $\theta = \theta_{old}$ the published term matches $\nabla\mathrm{KL}(\pi_{ref}\|\pi_\theta)$ to
round-off; off-policy it matches none of the candidates. The corrected term is exact in both places.

## How fast does the error grow? (a figure the paper lacks)

Along $\theta = \theta_{old} + t\,d$ for a fixed unit direction $d$, in the RPG setting
$\pi_{ref} = \pi_{old}$ (iterative reference; both gradients vanish at $t = 0$) and in GRPO's
setting of a fixed $\pi_{ref} \neq \pi_{old}$. The numbers come from
`derivations.grpo_kl.error_curve`; the figure from `paper_figs.grpo_kl_error`.
"""),
    code("""
from paper_figs import grpo_kl_error

data = grpo_kl_error.grpo_kl_error_data()
for label, s in data["settings"].items():
    print(label)
    for i in range(0, len(s["distance"]), 4):
        print(f"   t={s['distance'][i]:5.2f}  KL(theta||old)={s['kl_theta_old'][i]:.2e}  "
              f"published rel.err={s['rel_err'][i]:.3g}  corrected={s['corrected_rel_err'][i]:.1e}")
display(Image(str(grpo_kl_error.plot_grpo_kl_error(data, FIG_DIR)[0])))
"""),
    md(r"""
With $\pi_{ref} = \pi_{old}$ the relative error is small near $\theta_{old}$ and grows roughly like
$\sqrt{\mathrm{KL}(\pi_\theta\|\pi_{old})}$; with a fixed reference it is large (~0.27 here) from the
first step, because of the forward/reverse mix-up above.

## Monte Carlo: the autograd gradient of the actual loss on sampled tokens

The exact statements are about expectations. A batch of $N$ samples from $\pi_{old}$, pushed through
the library losses once, shows the same thing in the way a trainer sees it.
"""),
    code("""
from rpg_ref.losses import get_loss

th = th_old + 0.7 * torch.randn(6, generator=torch.Generator().manual_seed(5))
N = 200_000
x = torch.multinomial(old_logp.exp(), N, replacement=True, generator=torch.Generator().manual_seed(2))
target = divergence_grads(th, ref_logp)["UKL(theta||ref)"]
for name in ("grpo", "grpo-corrected"):
    theta = th.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)[x].view(N, 1)
    loss, _ = get_loss(name)(logp, old_logp[x].view(N, 1), torch.zeros(N), torch.ones(N, 1),
                             beta=1.0, ref_logp=ref_logp[x].view(N, 1))
    (grad,) = torch.autograd.grad(loss, theta)
    print(f"{name:15s} MC gradient vs grad UKL(theta||ref): rel. error {rel(grad, target):.3f}  (N={N})")
"""),
    md(r"""
The corrected term's Monte-Carlo error is sampling noise ($O(N^{-1/2})$); the published term's is bias.
The same claims, checked three ways in `derivations`:
"""),
    code("""
from derivations import run_all
from derivations.__main__ import format_table
rows = run_all(fast=True, only=["grpo-kl"])
print(format_table(rows))
assert all(r["passed"] for r in rows)
"""),
]

# ------------------------------------------------------------------------------------------------
NB3 = [
    md(r"""
# 3. The eight surrogates and their gradient equivalence

The paper's objective (sec:offpolicy_policy_gradients), with samples from a behaviour policy
$\pi_{old}$ and $w = \pi_\theta/\pi_{old}$:

$$J(\theta) = \mathbb{E}_{\pi_\theta}[R] - \beta\, D(\pi_\theta, \pi_{old}), \qquad
D \in \{\mathrm{KL}(\pi_{old}\|\pi_\theta),\ \mathrm{KL}(\pi_\theta\|\pi_{old}),\ \mathrm{UKL}(\pi_{old}\|\pi_\theta),\ \mathrm{UKL}(\pi_\theta\|\pi_{old})\}$$

(FKL, RKL, UFKL, URKL). For each it gives a **fully differentiable** surrogate
(tab:off-policy-loss-normalized, tab:off-policy-loss), e.g. RKL: $\mathcal L = \mathbb{E}_{old}[w(-R + \beta\log w)]$,
and a **REINFORCE-style** one with a stop-gradient weight (tab:off-policy-loss-reinforce),
e.g. URKL: $\mathcal L = -\mathbb{E}_{old}[\mathrm{SG}(w(R - \beta\log w))\log\pi_\theta]$.
The claim (prop:policy_gradient_* and prop:equiv_rf_fd): all eight have $\nabla\mathcal L = -\nabla J$.

`rpg_ref.losses` implements the eight (`rpg-{fkl,rkl,ufkl,urkl}`, `rpg-reinforce-{...}`);
`rpg_ref.exact` sums a loss over every outcome of a softmax policy weighted by $\pi_{old}$ (an exact
expectation) and differentiates $J$ from its definition.
"""),
    code(SETUP),
    code("""
import math
from rpg_ref import exact

NAMES = [f"rpg-{d}" for d in ("fkl", "rkl", "ufkl", "urkl")] + [f"rpg-reinforce-{d}" for d in ("fkl", "rkl", "ufkl", "urkl")]
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
"""),
    md(r"""
All eight are exact to float64 round-off, off-policy and for an unnormalized $\pi_{old}$ of mass
$Z_{old}$ (the unnormalized tables' $Z_{old}$ factor).

## Stronger than in expectation: per-sample identity

Differentiating $w A - \beta d(x)$ gives $w\,(A - \beta h)\nabla\log\pi_\theta$, and the REINFORCE loss
$-\mathrm{SG}(w(A-\beta h))\log\pi_\theta$ gives exactly the same vector for **each sample**. So the
two families differ only once clipping enters (notebook 4).
"""),
    code("""
from rpg_ref.losses import get_loss

N = 8
old = -torch.rand(N, 1) * 2                                 # log pi_old of N sampled tokens
lp0 = old + 0.3 * torch.randn(N, 1, generator=g)           # log pi_theta: off-policy
A = torch.randn(N, generator=g)
for div in ("fkl", "rkl", "ufkl", "urkl"):
    grads = []
    for fam in ("rpg", "rpg-reinforce"):
        lp = lp0.clone().requires_grad_(True)
        loss, _ = get_loss(f"{fam}-{div}")(lp, old, A, torch.ones(N, 1), beta=0.5)
        grads.append(torch.autograd.grad(loss, lp)[0])
    print(f"{div:5s} max per-sample |grad rpg - grad rpg-reinforce| = {float((grads[0] - grads[1]).abs().max()):.1e}")
"""),
    md(r"""
## Same mean, different variance (app:normalized_kl; a figure the paper lacks)

For a normalized $\pi_\theta$, FKL and UFKL (RKL and URKL) differ by constants, so their expected
gradients agree; per sample they differ by $\beta\,w\,\nabla\log\pi_\theta$, which has mean zero but not
variance zero. `derivations.variance.variance_table` gives the exact per-sample gradient variance
by enumeration; `paper_figs.grad_variance` estimates it by Monte Carlo through the losses.
"""),
    code("""
from derivations.variance import variance_table

rows = variance_table()
var = {(r["policy"], r["loss"]): r["var_per_sample"] for r in rows}
print(f"{'policy':22s} " + " ".join(f"{n.replace('rpg-', ''):>8s}" for n in NAMES[:4]) + "   (total variance of one sample's gradient, beta=0.5)")
for p in dict.fromkeys(r["policy"] for r in rows):
    print(f"{p:22s} " + " ".join(f"{var[(p, n)]:8.4f}" for n in NAMES[:4]))
"""),
    code("""
from paper_figs import grad_variance
data = grad_variance.grad_variance_data(n=4_000 if CI else 20_000)
display(Image(str(grad_variance.plot_grad_variance(data, FIG_DIR)[0])))
"""),
    md(r"""
Near $\theta_{old}$ the unnormalized variants have the lower variance (the extra $\beta(w-1)$ acts as a
control variate); far from $\theta_{old}$ the ordering can flip. With the paper's $\beta = 10^{-4}$ the
difference is negligible. The claims, checked three ways:
"""),
    code("""
from derivations import run_all
from derivations.__main__ import format_table
rows = run_all(fast=True, only=["prop-", "equiv-rf-fd", "reinforce-", "normalized-vs-unnormalized", "token-vs-sequence"])
print(format_table(rows))
assert all(r["passed"] for r in rows)
"""),
    md(r"""
The last row is a caveat of practice, not of the paper's math: the paper's $x$ is a whole response,
while verl (and `rpg_ref`'s default `level="token"`) applies the losses per token. `derivations`
documents which token-level losses still give the sequence-level gradient.
"""),
]

# ------------------------------------------------------------------------------------------------
NB4 = [
    md(r"""
# 4. RPG-Style Clip: shapes and gradients

Two clipped families (sec:more_on_algorithms):

* **Algorithm alg:offpolicy_rpg_ppo_dualclip** (fully differentiable): a regularized advantage $\hat A$
  inside the dual clip, $\max(-w\hat A, -\mathrm{clip}(w, 1-\epsilon_1, 1+\epsilon_2)\hat A)$ for $\hat A\ge 0$ and
  additionally $\min(\cdot, -c\hat A)$ for $\hat A < 0$ (fig:ppo_dualclip_loss_vis).
* **Algorithm alg:offpolicy_rpg_rf_ppo_dualclip_v1** (RPG-Style Clip, REINFORCE-style): with
  $\ell = -\log\pi_\theta$, $A' = A_R + C_{KL}/w$ and $\psi = A'\ell$, the loss is $(A_R w + C_{KL})\,\ell$ with $w$
  under a stop-gradient; on the clipped segments $\ell$ is detached too, so the gradient is exactly 0
  (fig:offpolicy_rpg_rf_ppo_dualclip_v1).

`paper_figs.clip_shapes` evaluates `rpg_ref`'s losses on a grid of $w$ (one sample per grid point,
$\ell = 1$) and differentiates them with autograd. The line style is **read off the computed
gradient**: solid where it is non-zero, dotted where it is exactly zero.
"""),
    code(SETUP),
    code("""
from paper_figs import clip_shapes
from paper_figs._common import runs_of

def segments(w, has_grad):
    return ", ".join(f"[{w[a]:.3f}, {w[b - 1]:.3f}] {'gradient' if g else 'FLAT'}" for a, b, g in runs_of(has_grad))

d = clip_shapes.dualclip_loss_data()           # rpg-rkl, beta = 0: A_hat = A is constant
print(f"eps = {d['eps']}, c = {d['c']}")
for p in d["panels"]:
    print(f"A_hat = {p['A']:+g}: {segments(d['w'], p['has_grad'])}")
display(Image(str(clip_shapes.plot_dualclip_loss(d, FIG_DIR)[0])))
"""),
    md(r"""
The flat segments found from the gradient are exactly the algorithm's: $w > 1+\epsilon_2$ for
$\hat A\ge0$; $w < 1-\epsilon_1$ and $w > c$ for $\hat A<0$. (The paper's caption swaps "left" and
"right"; we follow the drawing and the algorithm. The paper draws $c = 2.25$; the algorithms only
need $c > 1$, and we use verl's default $c = 3$.)

**But $\hat A$ depends on $\theta$.** For Algorithm 1 with $\beta > 0$, $\hat A = A - \beta\log w$ (RKL
in `rpg_ref`), and the clipped value $-\mathrm{clip}(w)\hat A$ still has gradient $\beta\,\mathrm{clip}(w)$
through $\hat A$ — the caption's "though it might flow via $\hat A$". Computed:
"""),
    code("""
d = clip_shapes.dualclip_loss_data(beta=0.5)
for p in d["panels"]:
    print(f"A = {p['A']:+g}: {segments(d['w'], p['has_grad'])}")
display(Image(str(clip_shapes.plot_dualclip_loss(d, FIG_DIR, "dualclip_beta")[0])))
"""),
    md(r"""
## RPG-Style Clip (Algorithm 2) in the paper's plotted setting

The figure uses $A_R = \pm1$, $C_{KL} = \pm 0.1$, $\ell = 1$. In `rpg_ref`, $C_{KL} = -\beta w\,h(\rho)$ with
$\rho = \pi_\theta/\pi_{ref}$ — for URKL $h = \log\rho$ — so choosing, per grid point, a reference with
$\log\rho = -C_{KL}/(\beta w)$ reproduces the figure's constant $C_{KL}$ exactly with `rpg-reinforce-urkl`.
"""),
    code("""
d = clip_shapes.rpg_style_clip_data()
for p in d["panels"]:
    print(f"A_R = {p['A']:+g}, C_KL = {p['C_KL']:+g}: {segments(d['w'], p['has_grad'])}")
display(Image(str(clip_shapes.plot_rpg_style_clip(d, FIG_DIR)[0])))
"""),
    md(r"""
In the paper's *training* setting $\pi_{ref} = \pi_{old}$, $C_{KL}$ moves with $w$ (it is constant only for
FKL, where it equals $+\beta$). The clipped segments then have zero gradient but a sloping value:
the value depends on $\theta$ only through stop-gradient quantities
(derivations/ERRATA.md, E9).
"""),
    code("""
d = clip_shapes.rpg_style_clip_natural_data()
display(Image(str(clip_shapes.plot_rpg_style_clip_natural(d, FIG_DIR)[0])))
"""),
    md(r"""
## The paper's descriptions of RPG-Style Clip are not one update

`derivations.clipping.clip_descriptions_table` lists the per-sample gradient coefficient
($\nabla = \mathrm{coef}\cdot\nabla\log\pi_\theta$) of each description in the paper next to `rpg_ref`'s losses
(URKL, $\beta = 0.1$, clip $(0.2, 0.28, 3)$). They agree where nothing is clipped up to the $\beta w$
offset of the differentiable $\hat A$ (ERRATA E1) and disagree on clipped segments (ERRATA E2, E3).
"""),
    code("""
from derivations.clipping import clip_descriptions_table

rows = clip_descriptions_table()
cols = [k for k in rows[0] if k not in ("A_R", "w", "A_hat", "segment")]
print(f"{'A_R':>4s} {'w':>5s} {'segment':24s} " + " ".join(f"{c[:14]:>14s}" for c in cols))
for r in rows:
    print(f"{r['A_R']:+4.0f} {r['w']:5.2f} {r['segment']:24s} " + " ".join(f"{r[c]:14.4f}" for c in cols))
"""),
    md(r"""
## What clipping costs: exact at $\theta_{old}$, biased beyond

At $\theta = \theta_{old}$ every $w = 1$ and nothing is clipped, so the clipped losses still have
expected gradient $-\nabla J$. As the policy moves away from $\theta_{old}$ (here along the advantage,
as training moves it), clipping removes samples from the gradient — the trust-region trade-off. The
two families clip different samples: Algorithm 1's $\hat A$ and Algorithm 2's $A'$ are different
functions of $w$ when $\beta > 0$.
"""),
    code("""
from rpg_ref import exact

g = torch.Generator().manual_seed(0)
th_old = torch.randn(6, generator=g)
R = torch.rand(6, generator=g)
old_logp = torch.log_softmax(th_old, 0)
A = R - (old_logp.exp() * R).sum()
for t in (0.0, 0.5, 1.0, 2.0):
    theta = th_old + t * A / A.norm()
    w = (torch.log_softmax(theta, 0) - old_logp).exp()
    outside = float((old_logp.exp() * ((w < 0.8) | (w > 1.28))).sum())
    gJ = exact.objective_grad("urkl", theta, A, 0.1, old_logp)
    out = []
    for name in ("rpg-urkl", "rpg-reinforce-urkl"):
        gl = exact.expected_loss_grad(name, theta, old_logp, A, 0.1, clip=(0.2, 0.28, 3.0))
        out.append(f"{name}: {float((gl + gJ).norm() / gJ.norm()):.2e}")
    print(f"t={t}: pi_old-mass with w outside [0.8, 1.28] = {outside:.2f};  rel. error of E[grad clipped loss] "
          f"vs -grad J:  " + "  ".join(out))
"""),
    code("""
from derivations import run_all
from derivations.__main__ import format_table
rows = run_all(fast=True, only=["dualclip-fd", "alg1-ahat-rkl", "rpg-style-clip"])
print(format_table(rows))
assert all(r["passed"] for r in rows)
"""),
]

# ------------------------------------------------------------------------------------------------
NB5 = [
    md(r"""
# 5. From bandit to transformer with the trainer

`rpg_ref/train.py` (`rpg-train`) runs the paper's loop (sec:experiments, Algorithm 2's outer loop):

    for step: sample a batch with pi_old (= the current policy), score it, compute advantages,
              then a few optimizer steps on LOSSES[algo](log pi_theta, old_logp, A, mask, beta, clip)

With the *iterative reference* (the paper's choice, `--ref iterative`) $\pi_{ref} = \pi_{old}$ is reset
every step, so the KL only limits each step. With a *fixed reference* (`--ref init`) the objective
$J(\pi) = \mathbb{E}_\pi[R] - \beta D(\pi, \pi_{ref})$ is fixed and, for a bandit, its maximizer is known:

* RKL / URKL: $\pi^*(x) \propto \pi_{ref}(x)\,e^{R(x)/\beta}$;
* FKL / UFKL: $\pi^*(x) = \beta\,\pi_{ref}(x)/(\lambda - R(x))$ with $\lambda > \max R$ fixed by $\sum\pi^* = 1$.

The trainer's bandit task reports the total-variation distance between the final policy and this
optimum (`summary.json`). `RPG_NOTEBOOK_CI=1` (set by the test suite) shortens every run.
"""),
    code(SETUP_TRAIN),
    code("""
import json
from pathlib import Path
from rpg_ref.cli import parse_config
from rpg_ref.train import train
from paper_figs.training import read_jsonl
from paper_figs._common import plt

RUN_DIR = Path(tempfile.mkdtemp(prefix="rpg-nb5-"))
bandit_steps = 60 if CI else 300

results = {}
for algo in ("rpg-reinforce-urkl", "rpg-fkl", "rpg-reinforce-ufkl"):
    cfg = parse_config(["--preset", "bandit", "--algo", algo, "--ref", "init", "--steps", str(bandit_steps),
                        "--eval-every", "10", "--out", str(RUN_DIR / algo), "--no-progress", "--seed", "0"])
    s = train(cfg)
    results[algo] = s
    print(f"{algo:20s} TV(final policy, optimum) = {s['tv_distance']:.4f}   ({s['optimum_note']})")
    print(f"{'':20s} policy  = {np.round(s['policy'], 3)}")
    print(f"{'':20s} optimum = {np.round(s['optimum'], 3)}")
"""),
    code("""
fig, ax = plt.subplots(figsize=(6, 3))
for algo in results:
    rows = [r for r in read_jsonl(RUN_DIR / algo / "metrics.jsonl") if "eval_expected_reward" in r]
    ax.plot([r["step"] for r in rows], [r["eval_expected_reward"] for r in rows], label=algo)
    opt = results[algo]
    ax.axhline(float(np.dot(opt["optimum"], opt["rewards"])), ls=":", lw=0.8, color=ax.lines[-1].get_color())
ax.set_xlabel("step"); ax.set_ylabel("E[R] under the policy"); ax.legend(fontsize=8)
ax.set_title("bandit, fixed reference (dotted: E[R] at the analytic optimum)", fontsize=9)
fig.tight_layout(); fig.savefig(Path(FIG_DIR) / "bandit.png", dpi=120); plt.close(fig)
display(Image(str(Path(FIG_DIR) / "bandit.png")))
"""),
    md(r"""
Each run converges to its own divergence's optimum: the RKL-family optimum tilts $\pi_{ref}$
exponentially towards reward, the FKL-family optimum keeps more mass on poor arms (it must cover
$\pi_{ref}$). Different divergences are different objectives, not different estimators of one.

## The transformer: the `seq` task

The same loop and the same loss functions train a tiny Qwen3 (`transformers`, random init, 2 layers)
on digit addition `a+b=` with reward 1 for the exact answer followed by EOS. The policy is first
warm-started by a short supervised phase so that RL has something to improve; ratios are per token
(`level="token"`, as verl applies the losses) and RPG-Style Clip uses the preset's $(\epsilon_1,\epsilon_2,c) =
(0.2, 0.28, 3)$, with the paper's $\beta = 10^{-4}$.
"""),
    code("""
seq_args = ["--preset", "seq", "--algo", "rpg-reinforce-urkl", "--beta", "1e-4", "--no-progress", "--seed", "0", "--cache-dir", str(RUN_DIR / "cache"),
            "--out", str(RUN_DIR / "seq")]
if CI:   # a smoke-sized run: a weaker warm start, a few steps
    seq_args += ["--steps", "3", "--eval-every", "3", "--seq-warm-steps", "30", "--prompts-per-step", "4",
                 "--seq-eval-size", "32"]
else:
    seq_args += ["--steps", "40", "--eval-every", "10"]      # ~10 s of training after a ~15 s warm start
s = train(parse_config(seq_args))
rows = read_jsonl(RUN_DIR / "seq" / "metrics.jsonl")
print(f"steps: {len(rows)}, first batch accuracy {rows[0]['accuracy']:.3f}, last {rows[-1]['accuracy']:.3f}, "
      f"greedy eval {s['eval'].get('eval_greedy_accuracy', float('nan')):.3f}")
"""),
    code("""
fig, axes = plt.subplots(1, 3, figsize=(11, 2.8))
for ax, key in zip(axes, ("accuracy", "entropy", "kl_old")):
    ax.plot([r["step"] for r in rows], [r[key] for r in rows], marker="o", ms=3)
    ax.set_title(key, fontsize=9); ax.set_xlabel("step")
fig.tight_layout(); fig.savefig(Path(FIG_DIR) / "seq.png", dpi=120); plt.close(fig)
display(Image(str(Path(FIG_DIR) / "seq.png")))
"""),
    md(r"""
## Every algorithm, several seeds

`small_scale/run_experiments.py --exp seq` runs GRPO, DAPO, REINFORCE++ and the eight RPG variants
with 3 seeds each; `rpg-figs` draws the curves and the Last/Best table in the shape of the paper's
fig:main_8k and tab:main_table_4k from the logs committed in `small_scale/logs/`
(see `small_scale/RESULTS.md` for the reading).
"""),
    code("""
from paper_figs import render
from paper_figs.training import DEFAULT_LOGS
if (DEFAULT_LOGS / "seq" / "experiment.json").exists():
    paths = render("main_seq", FIG_DIR)
    display(Image(str(paths[0])))
    print(Path(paths[2]).read_text())
else:
    print(f"no committed logs in {DEFAULT_LOGS}: run python small_scale/run_experiments.py --exp seq")
"""),
]

NOTEBOOKS = {
    "01_k3_is_unnormalized_kl.ipynb": NB1,
    "02_grpo_kl_and_its_correction.ipynb": NB2,
    "03_eight_surrogates_gradient_equivalence.ipynb": NB3,
    "04_rpg_style_clip.ipynb": NB4,
    "05_bandit_to_transformer.ipynb": NB5,
}


def build(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, c in enumerate(nb.cells):        # stable ids: regenerating gives identical files
        c["id"] = f"c{i:02d}"
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if a stored notebook differs from this script")
    a = ap.parse_args(argv)
    stale = []
    for name, cells in NOTEBOOKS.items():
        text = nbformat.writes(build(cells))
        path = HERE / name
        if a.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale notebooks (run python notebooks/make_notebooks.py): {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
