"""Loss shapes of the two clipped RPG families vs the importance weight w (the paper's
fig:ppo_dualclip_loss_vis and fig:offpolicy_rpg_rf_ppo_dualclip_v1), computed, not drawn.

Each grid point is one sample x with ell = -log pi_theta(x) = 1 and w = pi_theta(x)/pi_old(x)
on the grid, i.e. logp = -1 and old_logp = -1 - log w. The loss value and its autograd
gradient d L / d log pi_theta(x) come from ``rpg_ref.core.losses`` (B = T = 1 per point); a point is
drawn solid when that gradient is non-zero and dotted when it is exactly zero.

fig:ppo_dualclip_loss_vis (Algorithm alg:offpolicy_rpg_ppo_dualclip, fully differentiable):
    rpg-rkl with beta = 0, so A_hat = A is constant as in the figure:
        A_hat >= 0:  L = max(-w A, -clip(w) A)          flat (no gradient) for w > 1 + eps_high
        A_hat <  0:  L = min(max(...), -c A)            flat for w < 1 - eps_low and w > c
    With beta > 0, A_hat = A - beta g(rho) depends on theta and the clipped segments keep a
    gradient through A_hat (the caption's "potentially via A_hat"):
    ``dualclip_loss_data(beta=...)``.

fig:offpolicy_rpg_rf_ppo_dualclip_v1 (Algorithm alg:offpolicy_rpg_rf_ppo_dualclip_v1, RPG-Style
Clip):
    L = (A_R w + C_KL) ell, branching on psi = A' ell, A' = A_R + C_KL / w:
        psi >= 0:  gradient for w < 1 + eps_high; flat value (A_R (1+eps_high) + C_KL) ell beyond
        psi <  0:  flat (A_R (1-eps_low) + C_KL) ell for w <= 1 - eps_low; gradient for
                   1 - eps_low < w < c; flat (A_R c + C_KL) ell for w >= c
    The paper plots A_R = +-1 with a w-independent C_KL = +-0.1. In rpg_ref C_KL = -beta w h(rho)
    (rho = pi_theta/pi_ref), which is w-independent with pi_ref = pi_old only for FKL (C_KL = +beta,
    never negative). So the figure's exact setting is reached with rpg-reinforce-urkl
    (h = log rho), beta = 0.1 and, per grid point, a reference log-prob chosen so that
    -beta w log rho = C_KL, i.e. log rho = -C_KL / (beta w): ``rpg_style_clip_data()``.
    ``rpg_style_clip_natural_data()`` is the paper's own training setting instead (pi_ref = pi_old,
    all four divergences), where C_KL moves with w and the solid segments bend.

c: the paper's figures use c = 2.25 (their TikZ comments say 2.0); the algorithms only require
c > 1, verl's default clip_ratio_c is 3 and the paper's scripts use 10. We draw c = 3
(DEFAULT_C), inside the plotted range; see derivations/ERRATA.md (E9, E10).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from rpg_ref.core.losses import get_loss

from ._common import draw_masked, plt, save

DTYPE = torch.float64
DEFAULT_C = 3.0          # verl's clip_ratio_c default; the algorithms only ask for c > 1
EPS = (0.2, 0.2)         # (eps_low, eps_high) as in both of the paper's figures
ELL = 1.0                # ell = -log pi_theta(x) at every grid point (the paper's "ell_i = 1")


def w_grid(c: float = DEFAULT_C, n: int = 461, w_min: float = 0.5) -> np.ndarray:
    """The plotted range, the paper's [0.5, 2.8] stretched to show c."""
    return np.linspace(w_min, max(2.8, c + 0.6), n)


def _point(fn, w: float, A: float, *, beta: float, clip, ref_log_rho=None) -> tuple[float, float]:
    """Loss value and d loss / d log pi_theta of a single sample (B = T = 1) with ratio w."""
    logp = torch.full((1, 1), -ELL, dtype=DTYPE, requires_grad=True)
    old = torch.full((1, 1), -ELL - math.log(w), dtype=DTYPE)
    ref = None if ref_log_rho is None else torch.full((1, 1), -ELL - ref_log_rho, dtype=DTYPE)
    loss, _ = fn(logp, old, torch.tensor([A], dtype=DTYPE), torch.ones(1, 1, dtype=DTYPE),
                 beta=beta, ref_logp=ref, clip=clip)
    (g,) = torch.autograd.grad(loss, logp)
    return float(loss.detach()), float(g)


def _panel(fn, w, A, *, beta, clip, c_kl=None):
    vals, grads = np.empty(len(w)), np.empty(len(w))
    for i, wi in enumerate(w):
        # c_kl given: pick pi_ref(x) so that rpg-reinforce-urkl's C_KL = -beta w log rho equals it
        lr = None if c_kl is None else -c_kl / (beta * wi)
        vals[i], grads[i] = _point(fn, float(wi), A, beta=beta, clip=clip, ref_log_rho=lr)
    return {"A": A, "loss": vals, "grad": grads, "has_grad": grads != 0.0}


def dualclip_loss_data(loss: str = "rpg-rkl", beta: float = 0.0, eps=EPS, c: float = DEFAULT_C,
                       advantages=(1.0, -1.0), w=None) -> dict:
    """fig:ppo_dualclip_loss_vis: panels for A_hat >= 0 then A_hat < 0 (the paper's drawn order).

    Returns {w, eps, c, loss, beta, panels: [{A, loss, grad, has_grad}]}; with beta = 0 the
    regularized advantage A_hat equals A."""
    w = w_grid(c) if w is None else np.asarray(w, dtype=float)
    clip = (eps[0], eps[1], c)
    fn = get_loss(loss)
    return {"w": w, "eps": tuple(eps), "c": c, "loss": loss, "beta": beta,
            "panels": [_panel(fn, w, A, beta=beta, clip=clip) for A in advantages]}


def rpg_style_clip_data(beta: float = 0.1, eps=EPS, c: float = DEFAULT_C,
                        settings=((1.0, 0.1), (-1.0, -0.1)), w=None) -> dict:
    """fig:offpolicy_rpg_rf_ppo_dualclip_v1 in the paper's plotted setting: panels psi >= 0
    (A_R = 1, C_KL = 0.1) and psi < 0 (A_R = -1, C_KL = -0.1), ell = 1, through
    rpg-reinforce-urkl with a per-point pi_ref that makes C_KL exactly the given constant."""
    w = w_grid(c) if w is None else np.asarray(w, dtype=float)
    fn = get_loss("rpg-reinforce-urkl")
    panels = []
    for A, ckl in settings:
        p = _panel(fn, w, A, beta=beta, clip=(eps[0], eps[1], c), c_kl=ckl)
        p["C_KL"] = ckl
        panels.append(p)
    return {"w": w, "eps": tuple(eps), "c": c, "loss": "rpg-reinforce-urkl", "beta": beta,
            "ell": ELL, "panels": panels}


def rpg_style_clip_natural_data(beta: float = 0.1, eps=EPS, c: float = DEFAULT_C,
                                advantages=(1.0, -1.0), w=None) -> dict:
    """RPG-Style Clip in the paper's training setting pi_ref = pi_old, beta = 0.1, for all four
    rpg-reinforce divergences: panels[A][div] = {loss, grad, has_grad}."""
    w = w_grid(c) if w is None else np.asarray(w, dtype=float)
    clip = (eps[0], eps[1], c)
    panels = [
        {
            "A": A,
            "curves": {
                d: _panel(get_loss(f"rpg-reinforce-{d}"), w, A, beta=beta, clip=clip)
                for d in ("fkl", "ufkl", "rkl", "urkl")
            },
        }
        for A in advantages
    ]
    return {"w": w, "eps": tuple(eps), "c": c, "beta": beta, "ell": ELL, "panels": panels}


# ----------------------------------------------------------------------------------------------
# drawing
# ----------------------------------------------------------------------------------------------

def _bounds(ax, eps, c):
    for x, lab in ((1 - eps[0], r"$1-\epsilon_1$"), (1 + eps[1], r"$1+\epsilon_2$"), (c, "$c$")):
        ax.axvline(x, color="0.6", lw=0.8, zorder=0)
        ax.annotate(lab, (x, 0), xycoords=("data", "axes fraction"), xytext=(2, 3),
                    textcoords="offset points", fontsize=8, color="0.3")
    ax.grid(alpha=0.3)


def plot_dualclip_loss(data: dict, out_dir=None, name: str = "ppo_dualclip_loss_vis"):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    sym = r"\hat A" if data["beta"] == 0 else r"A"
    for ax, p in zip(axes, data["panels"]):
        draw_masked(ax, data["w"], p["loss"], p["has_grad"])
        _bounds(ax, data["eps"], data["c"])
        case = r"\geq 0" if p["A"] >= 0 else "< 0"
        ax.set_title(
            f"${sym} {case}$ (${sym} = {p['A']:g}$), {data['loss']}, $\\beta={data['beta']:g}$",
            fontsize=9,
        )
        ax.set_xlabel(r"$w(x) = \pi_\theta(x)/\pi_{old}(x)$")
        ax.legend(fontsize=8, loc="best")
    axes[0].set_ylabel(r"loss term $\mathcal{L}^{DualClip}(x,\theta)$")
    fig.tight_layout()
    return save(fig, out_dir, name)


def plot_rpg_style_clip(data: dict, out_dir=None, name: str = "offpolicy_rpg_rf_ppo_dualclip_v1"):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, p in zip(axes, data["panels"]):
        draw_masked(ax, data["w"], p["loss"], p["has_grad"], label_grad=r"gradient via $\ell$")
        _bounds(ax, data["eps"], data["c"])
        case = (
            r"\psi \geq 0" if p["A"] * data["ell"] + p["C_KL"] * data["ell"] >= 0 else r"\psi < 0"
        )
        ax.set_title(f"${case}$: $A_R={p['A']:g}$, $C_{{KL}}={p['C_KL']:g}$, $\\ell=1$", fontsize=9)
        ax.set_xlabel(r"$w_i = \pi_\theta(x_i)/\pi_{old}(x_i)$")
        ax.legend(fontsize=8, loc="best")
    axes[0].set_ylabel(r"loss $\mathcal{L}_i$ (rpg-reinforce-urkl)")
    fig.tight_layout()
    return save(fig, out_dir, name)


def plot_rpg_style_clip_natural(
    data: dict, out_dir=None, name: str = "rpg_style_clip_pi_ref_eq_pi_old"
):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    colors = {"fkl": "tab:blue", "ufkl": "tab:orange", "rkl": "tab:green", "urkl": "tab:red"}
    for ax, p in zip(axes, data["panels"]):
        for d, cur in p["curves"].items():
            draw_masked(ax, data["w"], cur["loss"], cur["has_grad"], color=colors[d], lw=1.5,
                        labels=False)
            ax.plot([], [], color=colors[d], label=f"rpg-reinforce-{d}")
        ax.plot([], [], color="k", label="gradient $\\neq 0$")
        ax.plot([], [], color="k", linestyle=(0, (1, 1.2)), label="gradient $= 0$")
        _bounds(ax, data["eps"], data["c"])
        ax.set_title(
            f"$A_R={p['A']:g}$, $\\beta={data['beta']:g}$, $\\pi_{{ref}}=\\pi_{{old}}$, $\\ell=1$",
            fontsize=9,
        )
        ax.set_xlabel(r"$w_i$")
        ax.legend(fontsize=7, loc="best")
    axes[0].set_ylabel(r"loss $\mathcal{L}_i$")
    fig.tight_layout()
    return save(fig, out_dir, name)
