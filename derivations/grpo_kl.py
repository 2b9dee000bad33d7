"""Item 5: GRPO's KL term (Section 2.2 (subsec:grpo_main)).

Published per-token term, x ~ pi_old, no importance weight:   beta * k3(pi_ref(x)/pi_theta(x))
Its exact expected gradient (derived and checked symbolically below):

    g_pub(theta) = E_old[(1 - pi_ref/pi_theta) grad log pi_theta]

(a) g_pub vs grad UKL(pi_theta || pi_ref) (the divergence the paper says the term is meant to
    estimate), off-policy and on-policy;
(b) at theta = theta_old: g_pub = sum (pi_theta - pi_ref) grad log pi_theta = -sum pi_ref grad log
    pi_theta = grad KL(pi_ref || pi_theta) -- the forward KL (the literature's claim), checked, and
    not the reverse KL;
(c) the corrected term w * k3(pi_ref/pi_theta) has E_old = UKL(pi_theta || pi_ref) as a value for
    every theta, hence expected gradient grad UKL(pi_theta || pi_ref) for every theta.

``error_curve`` quantifies the published term's gradient error as theta moves away from theta_old.
"""

from __future__ import annotations

import sympy as sp
import torch

from rpg_ref.core.losses import get_loss

from . import paper
from ._core import (
    ASSUMPTIONS,
    DTYPE,
    Checker,
    SymSoftmax,
    claim,
    cosine,
    expected_loss_grad,
    mc_n,
    mc_through_loss,
    rel_err,
)


def _grad(f, logits: torch.Tensor) -> torch.Tensor:
    th = logits.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(th), th)
    return g


def divergence_grads(logits, ref_logp) -> dict:
    """grad_theta of the candidate divergences between pi_theta = softmax(logits) and pi_ref."""
    out = {}
    zero = torch.zeros_like(logits)
    for name, div in (("UKL(theta||ref)", "urkl"), ("KL(theta||ref)", "rkl"),
                      ("KL(ref||theta)", "fkl"), ("UKL(ref||theta)", "ufkl")):
        # objective_torch returns E[R] - beta D; with R = 0, beta = -1 it is D itself
        out[name] = _grad(
            lambda th, d=div: paper.objective_torch(d, th, ref_logp, zero, -1.0), logits
        )
    return out


def kl_term_grad(name: str, logits, old_logp, ref_logp):
    """Exact E_old[grad of the KL term] of loss ``name`` (grpo / grpo-corrected) through
    rpg_ref.core.losses with advantages 0 and beta 1 (the PPO part then has zero gradient)."""
    zero = torch.zeros_like(logits)
    return expected_loss_grad(get_loss(name), logits, old_logp, zero, beta=1.0, ref_logp=ref_logp)


def _setup(K=6, seed=0, ref_dist: float | None = 0.8):
    g = torch.Generator().manual_seed(seed)
    th_old = torch.randn(K, generator=g, dtype=DTYPE)
    d = torch.randn(K, generator=g, dtype=DTYPE)
    # unit direction, no softmax-null part
    d = (d - d.mean()) / (d - d.mean()).norm()
    ref = th_old + (0.0 if ref_dist is None else ref_dist) * torch.randn(
        K, generator=g, dtype=DTYPE
    )
    return th_old, d, torch.log_softmax(th_old, -1), torch.log_softmax(ref, -1)


def error_curve(distances=(0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0), K: int = 6, seed: int = 0,
                ref_dist: float | None = 0.8) -> list[dict]:
    """Error of GRPO's published KL gradient vs grad UKL(pi_theta || pi_ref) along
    theta = theta_old + t * d (d a fixed random unit direction). ref_dist=None: pi_ref = pi_old
    (the RPG setting; both gradients vanish at t = 0, so rel_err/cosine are None there).

    Returns rows {distance, kl_theta_old (KL(pi_theta||pi_old)), rel_err (||g_pub - g_true|| /
    ||g_true||), cosine, g_pub_norm, g_true_norm, corrected_rel_err}."""
    th_old, d, old_logp, ref_logp = _setup(K, seed, ref_dist)
    rows = []
    for t in distances:
        th = th_old + t * d
        g_pub, _ = kl_term_grad("grpo", th, old_logp, ref_logp)
        g_cor, _ = kl_term_grad("grpo-corrected", th, old_logp, ref_logp)
        g_true = divergence_grads(th, ref_logp)["UKL(theta||ref)"]
        lp = torch.log_softmax(th, -1)
        degenerate = float(g_true.norm()) < 1e-14
        rows.append({
            "distance": float(t),
            "kl_theta_old": float((lp.exp() * (lp - old_logp)).sum()),
            "rel_err": None if degenerate else rel_err(g_pub, g_true),
            "cosine": None if degenerate else cosine(g_pub, g_true),
            "g_pub_norm": float(g_pub.norm()), "g_true_norm": float(g_true.norm()),
            "corrected_rel_err": None if degenerate else rel_err(g_cor, g_true),
        })
    return rows


CLAIM = (
    "GRPO's per-token beta*k3(pi_ref/pi_theta) under pi_old sampling: (a) its expected gradient is "
    "not grad UKL(pi_theta||pi_ref) off-policy; (b) at theta = theta_old it equals grad "
    "KL(pi_ref||pi_theta) (forward KL); (c) the corrected w*k3 gives grad UKL(pi_theta||pi_ref) "
    "for every theta."
)


@claim("grpo-kl", "subsec:grpo_main", CLAIM)
def check_subsec_grpo_main(ck: Checker, fast: bool) -> None:
    S = SymSoftmax(3)
    r = sp.symbols("r1:4", positive=True)                # pi_ref, any positive measure
    k3 = lambda y: y - 1 - sp.log(y)
    pub = sum(S.o[k] * k3(r[k] / S.p[k]) for k in range(3))             # E_old[k3(ref/theta)]
    cor = sum(S.o[k] * S.w[k] * k3(r[k] / S.p[k]) for k in range(3))    # E_old[w k3(ref/theta)]
    ukl = sum(S.p[k] * sp.log(S.p[k] / r[k]) + r[k] - S.p[k] for k in range(3))   # UKL(theta||ref)
    # KL(ref||theta), generalized
    fkl = sum(r[k] * sp.log(r[k] / S.p[k]) for k in range(3))
    for j in range(3):
        ck.symbolic(
            f"grad E_old[k3] == E_old[(1 - ref/theta) grad log pi] (d/dtheta_{j + 1})",
            S.d(pub, j) - sum(S.o[k] * (1 - r[k] / S.p[k]) * S.dlogp(k, j) for k in range(3)),
        )
        ck.symbolic(
            f"(c) grad E_old[w k3] == grad UKL(theta||ref) (d/dtheta_{j + 1})",
            S.d(cor, j) - S.d(ukl, j),
        )
        on_policy = {S.o[k]: S.p[k] for k in range(3)}
        ck.symbolic(
            f"(b) at theta=theta_old: grad E_old[k3] == grad KL(ref||theta) (d/dtheta_{j + 1})",
            (S.d(pub, j) - S.d(fkl, j)).subs(on_policy),
        )
    ck.symbolic("(c) value: E_old[w k3(ref/theta)] == UKL(theta||ref)", cor - ukl)
    ck.note(f"symbolic: {ASSUMPTIONS}; pi_ref any positive measure")

    th_old, d, old_logp, ref_logp = _setup()
    # (b) on-policy: which divergence's gradient is it?
    g_pub, G_pub = kl_term_grad("grpo", th_old, old_logp, ref_logp)
    cands = divergence_grads(th_old, ref_logp)
    errs = {k: rel_err(g_pub, v) for k, v in cands.items()}
    ck.exact(
        "(b) theta=theta_old: E_old[grad grpo KL term] == grad KL(ref||theta)",
        g_pub,
        cands["KL(ref||theta)"],
    )
    ck.fact("(b) at theta=theta_old it is NOT grad KL(theta||ref) / UKL(theta||ref)",
            errs["KL(theta||ref)"] > 1e-2 and errs["UKL(theta||ref)"] > 1e-2,
            "rel. errors vs " + ", ".join(f"{k}: {v:.3g}" for k, v in errs.items()))
    mc_through_loss(
        ck,
        "(b) grpo KL term at theta_old",
        get_loss("grpo"),
        th_old,
        old_logp,
        torch.zeros_like(th_old),
        cands["KL(ref||theta)"],
        G_pub,
        beta=1.0,
        ref_logp=ref_logp,
        n=mc_n(fast),
        seed=21,
    )
    # (a) vs grad UKL(theta||ref): on-policy (pi_ref != pi_old) and off-policy
    for t in (0.0, 0.5, 1.5):
        th = th_old + t * d
        g_pub, _ = kl_term_grad("grpo", th, old_logp, ref_logp)
        g_true = divergence_grads(th, ref_logp)["UKL(theta||ref)"]
        e = rel_err(g_pub, g_true)
        ck.fact(f"(a) |theta-theta_old|={t}: published != grad UKL(theta||ref)", e > 1e-2,
                f"rel err {e:.3g}, cosine {cosine(g_pub, g_true):.4f}")
    # (c) corrected, every theta (including far from theta_old), MC at one off-policy point
    for t in (0.0, 0.5, 1.5, 4.0):
        th = th_old + t * d
        g_cor, G_cor = kl_term_grad("grpo-corrected", th, old_logp, ref_logp)
        g_true = divergence_grads(th, ref_logp)["UKL(theta||ref)"]
        ck.exact(
            f"(c) |theta-theta_old|={t}: E_old[grad w k3] == grad UKL(theta||ref)", g_cor, g_true
        )
        if t == 0.5:
            mc_through_loss(
                ck,
                "(c) grpo-corrected KL term off-policy",
                get_loss("grpo-corrected"),
                th,
                old_logp,
                torch.zeros_like(th),
                g_true,
                G_cor,
                beta=1.0,
                ref_logp=ref_logp,
                n=mc_n(fast),
                seed=22,
            )
    # pi_ref = pi_old (the RPG setting): error grows with distance, vanishes as t -> 0
    curve = error_curve(ref_dist=None)
    ck.note(
        "error curve, pi_ref = pi_old: "
        + "; ".join(
            f"t={r['distance']}: rel {r['rel_err']:.3g} cos {r['cosine']:.3f}"
            for r in curve
            if r["rel_err"] is not None
        )
    )
    small = [r for r in curve if r["rel_err"] is not None]
    ck.fact(
        "pi_ref = pi_old: error -> 0 as theta -> theta_old and grows with distance",
        small[0]["rel_err"] < 0.1 and small[-1]["rel_err"] > small[0]["rel_err"],
        f"rel err {small[0]['rel_err']:.3g} at t={small[0]['distance']}, "
        f"{small[-1]['rel_err']:.3g} at t={small[-1]['distance']}",
    )
