"""The paper's formulas, transcribed literally, for checking (not for training: the losses used
by rpg-ref live only in rpg_ref/core/losses.py).

Every expression is a plain function of the per-sample quantities

    w = pi_theta(x) / pi_old(x)   (pi_old possibly unnormalized)     lw = log w
    lp = log pi_theta(x)          R = R(x)      b = beta      Z = Z_old = sum pi_old

built with + - * only, so the same lambda evaluates on sympy symbols and on torch tensors.
Line numbers refer to the paper's LaTeX source, rpg_paper.tex (not part of this repository;
derivations/paper_tables.py says where it is looked for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy as sp
import torch


@dataclass(frozen=True)
class PaperForm:
    """One divergence's off-policy gradient and losses as printed in the paper.

    sampling: "tilde" -> the expectation is over x ~ pi_old / Z_old (Table 1 (tab:off-policy-loss));
              "old"   -> over x ~ pi_old, stated for normalized pi_old (Table 4
              (tab:off-policy-loss-normalized)).
    grad_weight: W(x) in grad J = E[W(x) grad log pi_theta(x)]          (the proposition)
    loss:        l(x) in L = E[l(x)]                                    (the table / proposition)
    rf_weight:   V(x) in L_RF = -E[SG(V(x)) log pi_theta(x)]             (REINFORCE-style)
    """
    div: str
    label: str
    rf_label: str
    sampling: str
    grad_weight: Callable
    loss: Callable
    rf_weight: Callable
    where: str


PAPER = {
    "ufkl": PaperForm(
        "ufkl",
        "prop:policy_gradient_unormalized_forward_kl",
        "prop:offpolicy_reinforce_loss_ufkl",
        "tilde",
        grad_weight=lambda w, lw, lp, R, b, Z: Z * (w * R - b * (w - 1)),
        loss=lambda w, lw, lp, R, b, Z: Z * (-w * R + b * (w - lw - 1)),
        rf_weight=lambda w, lw, lp, R, b, Z: Z * (w * R - b * (w - 1)),
        where="tab:off-policy-loss l.345, prop l.368-377, tab:off-policy-loss-reinforce l.573, "
              "prop l.1327-1333",
    ),
    "urkl": PaperForm(
        "urkl",
        "prop:policy_gradient_unormalized_reverse_kl",
        "prop:offpolicy_reinforce_loss_urkl",
        "tilde",
        grad_weight=lambda w, lw, lp, R, b, Z: Z * w * (R - b * lw),
        loss=lambda w, lw, lp, R, b, Z: Z * (-w * R + b * (w * lw - w)),
        rf_weight=lambda w, lw, lp, R, b, Z: Z * w * (R - b * lw),
        where="tab:off-policy-loss l.346, prop l.413-421, tab:off-policy-loss-reinforce l.574, "
              "prop l.1352-1358",
    ),
    "fkl": PaperForm(
        "fkl",
        "prop:policy_gradient_forward_kl",
        "prop:offpolicy_reinforce_loss_fkl",
        "old",
        grad_weight=lambda w, lw, lp, R, b, Z: w * R + b,
        loss=lambda w, lw, lp, R, b, Z: -w * R - b * lp,
        rf_weight=lambda w, lw, lp, R, b, Z: w * R + b,
        where="tab:off-policy-loss-normalized l.1240, prop l.1253-1262, prop l.1311-1316",
    ),
    "rkl": PaperForm(
        "rkl",
        "prop:policy_gradient_reverse_kl",
        "prop:offpolicy_reinforce_loss_rkl",
        "old",
        grad_weight=lambda w, lw, lp, R, b, Z: w * (R - b * (lw + 1)),
        loss=lambda w, lw, lp, R, b, Z: w * (-R + b * lw),
        rf_weight=lambda w, lw, lp, R, b, Z: w * (R - b * lw - b),
        where="tab:off-policy-loss-normalized l.1241, prop l.1275-1284, "
              "eq:loss_rkl_offpolicy_reinforce l.1341-1345",
    ),
}


# ---------------------------------------------------------------------------
# the objectives, from the definitions (subsec:offpolicy_ufkl/urkl, eq:FKL, eq:rkl)
# ---------------------------------------------------------------------------

def divergence(div: str, p, o, log, total):
    """D(pi_theta, pi_old) from the paper's definitions, for lists/tensors p (pi_theta) and o
    (pi_old, a measure). ``log`` and ``total`` (sum) are backend functions. With unnormalized
    o, KL is the generalized KL  sum p log(p/q)  (no mass correction)."""
    if div == "fkl":        # KL(pi_old || pi_theta)
        return total([oi * log(oi / pi) for pi, oi in zip(p, o)])
    if div == "rkl":        # KL(pi_theta || pi_old)
        return total([pi * log(pi / oi) for pi, oi in zip(p, o)])
    if div == "ufkl":       # UKL(pi_old || pi_theta) = sum o log(o/p) + sum (p - o)
        return total([oi * log(oi / pi) + pi - oi for pi, oi in zip(p, o)])
    if div == "urkl":       # UKL(pi_theta || pi_old) = sum p log(p/o) + sum (o - p)
        return total([pi * log(pi / oi) + oi - pi for pi, oi in zip(p, o)])
    raise ValueError(f"unknown divergence {div!r}")


def objective_sym(div: str, S) -> sp.Expr:
    """J = E_{pi_theta}[R] - beta D  on a derivations._core.SymSoftmax."""
    er = sum(S.p[k] * S.R[k] for k in range(S.K))
    return er - S.beta * divergence(div, S.p, S.o, sp.log, lambda xs: sp.Add(*xs))


def objective_torch(
    div: str,
    logits: torch.Tensor,
    old_logp: torch.Tensor,
    R: torch.Tensor,
    beta: float,
    ref_logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """J(theta) = sum_x pi_theta(x) R(x) - beta D(pi_theta, pi_ref); pi_ref = pi_old by default."""
    return objective_logp(
        div, torch.log_softmax(logits, -1), old_logp if ref_logp is None else ref_logp, R, beta
    )


def objective_logp(
    div: str, logp: torch.Tensor, lref: torch.Tensor, R: torch.Tensor, beta: float
) -> torch.Tensor:
    """J = sum_x pi(x) R(x) - beta D(pi, pi_ref) for log-probabilities logp over all outcomes x."""
    p, q = logp.exp(), lref.exp()
    if div == "fkl":
        d = (q * (lref - logp)).sum()
    elif div == "rkl":
        d = (p * (logp - lref)).sum()
    elif div == "ufkl":
        d = (q * (lref - logp) + p - q).sum()
    elif div == "urkl":
        d = (p * (logp - lref) + q - p).sum()
    else:
        raise ValueError(f"unknown divergence {div!r}")
    return (p * R).sum() - beta * d


# ---------------------------------------------------------------------------
# clipping: the three descriptions of RPG-Style Clip, and the PPO dual clip they build on
# ---------------------------------------------------------------------------

def clip_w(w, lo, hi):
    return torch.clamp(w, lo, hi)


def dualclip_loss(w, A, eps1, eps2, c):
    """Appendix G (sec:more_on_algorithms) l.1380-1384 (and Section 3.3 (subsec:rpg_style_clip)
    l.439-447): A >= 0: max(-w A, -clip(w) A);  A < 0: min(max(-w A, -clip(w) A), -c A)."""
    lclip = torch.maximum(-w * A, -clip_w(w, 1 - eps1, 1 + eps2) * A)
    return torch.where(A >= 0, lclip, torch.minimum(lclip, -c * A))


def dualclip_objective(w, A, eps1, eps2, c):
    """C(w, A) = L^DualClip (the objective, l.1372-1375): the weight replacing w A."""
    return -dualclip_loss(w, A, eps1, eps2, c)


def ahat_paper(div: str, A_R, lw, b):
    """The regularized advantage examples of Section 3.3 (subsec:rpg_style_clip) l.433 and
    Algorithm 1 (alg:offpolicy_rpg_ppo_dualclip) l.1423, Appendix G (sec:more_on_algorithms) l.1397,
    Appendix G.2 (subsec:offpolicy_reinforce_stabilization) l.1465-1467."""
    if div == "urkl":
        return A_R - b * lw
    if div == "rkl":
        return A_R - b * (lw + 1)
    raise ValueError(f"the paper gives A_hat examples only for urkl and rkl, not {div!r}")


def kl_component(div: str, w, lw, b):
    """C_KL of Algorithm 2 (alg:offpolicy_rpg_rf_ppo_dualclip_v1): the KL part of the REINFORCE
    weight, so that w A_R + C_KL = Weight (prop:offpolicy_reinforce_loss_*; Z_old dropped as in
    l.1466)."""
    return {"fkl": b + 0 * w, "ufkl": -b * (w - 1), "rkl": -b * w * (lw + 1), "urkl": -b * w * lw}[
        div
    ]


def alg2_loss(logpi, old_logp, A_R, div, b, eps1, eps2, c):
    """Algorithm 2 (alg:offpolicy_rpg_rf_ppo_dualclip_v1) (l.1517-1541), line by line, for one
    sample. logpi is differentiable; SG = detach."""
    SG = lambda t: t.detach()
    w = torch.exp(logpi - old_logp)
    ell = -logpi
    C_KL = kl_component(div, w, logpi - old_logp, b)
    A1 = A_R + SG(C_KL) / SG(w)
    psi = A1 * ell
    if psi >= 0:
        w_high = 1 + eps2
        if w < w_high:
            return psi * SG(w)
        A_high = A_R + SG(C_KL) / w_high
        return A_high * SG(ell) * w_high
    w_low = 1 - eps1
    if w <= w_low:
        A_low = A_R + SG(C_KL) / w_low
        return A_low * SG(ell) * w_low
    if w < c:
        return psi * SG(w)
    return A_R * SG(ell) * c + SG(C_KL) * SG(ell)
