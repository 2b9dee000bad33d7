"""Item 6: normalized vs unnormalized KL (Appendix E (app:normalized_kl)) for a normalized policy.

For normalized pi_theta, UKL(pi_old||pi_theta) = KL(pi_old||pi_theta) + 1 - Z_old and
UKL(pi_theta||pi_old) = KL(pi_theta||pi_old) + Z_old - 1: the objectives differ by constants, so
FKL/UFKL (and RKL/URKL) have the same gradient. Their per-sample estimators differ by
beta * w * grad log pi_theta, which has mean zero (sum_x grad pi_theta(x) = 0) but not zero
variance. ``variance_table`` gives each estimator's exact per-sample gradient variance.
"""

from __future__ import annotations

import torch

from rpg_ref.core.losses import get_loss

from . import paper
from ._core import ASSUMPTIONS, DTYPE, Checker, SymSoftmax, claim, expected_loss_grad, mc_n

LOSS_NAMES = ("rpg-fkl", "rpg-ufkl", "rpg-rkl", "rpg-urkl",
              "rpg-reinforce-fkl", "rpg-reinforce-ufkl", "rpg-reinforce-rkl", "rpg-reinforce-urkl")
# theta = theta_old + dist * N(0, I)
POLICIES = (("on-policy", 0.0), ("near (dist 0.3)", 0.3), ("far (dist 1.0)", 1.0))


def _policy(K: int, seed: int, dist: float):
    g = torch.Generator().manual_seed(seed)
    th_old = torch.randn(K, generator=g, dtype=DTYPE)
    th = th_old + dist * torch.randn(K, generator=g, dtype=DTYPE)
    R = (torch.rand(K, generator=g, dtype=DTYPE) < 0.5).to(DTYPE)     # 0/1 rewards
    old_logp = torch.log_softmax(th_old, -1)
    adv = R - (old_logp.exp() * R).sum()                              # baseline: E_old[R]
    return th, old_logp, adv


def per_sample_stats(name: str, th, old_logp, adv, beta: float):
    """(mean gradient, total variance sum_j Var_old[g_j(x)], G [K, K]) of one sample's gradient."""
    g, G = expected_loss_grad(get_loss(name), th, old_logp, adv, beta=beta)
    p_old = old_logp.exp()
    var = float((p_old[:, None] * (G - g) ** 2).sum())
    return g, var, G


def variance_table(K: int = 6, seed: int = 0, beta: float = 0.5, policies=POLICIES) -> list[dict]:
    """Rows {policy, loss, grad_norm, var_per_sample, kl_theta_old}: the exact total variance of one
    sample's gradient (Var of the N-sample mean = var_per_sample / N), pi_old normalized."""
    rows = []
    for pname, dist in policies:
        th, old_logp, adv = _policy(K, seed, dist)
        lp = torch.log_softmax(th, -1)
        kl = float((lp.exp() * (lp - old_logp)).sum())
        for name in LOSS_NAMES:
            g, var, _ = per_sample_stats(name, th, old_logp, adv, beta)
            rows.append({"policy": pname, "loss": name, "beta": beta, "kl_theta_old": kl,
                         "grad_norm": float(g.norm()), "var_per_sample": var})
    return rows


@claim(
    "normalized-vs-unnormalized",
    "app:normalized_kl",
    "For normalized pi_theta, the normalized and unnormalized variants of each direction "
    "(FKL/UFKL, "
    "RKL/URKL) have the same expected gradient; their estimators' variances differ (table).",
)
def check_app_normalized_kl(ck: Checker, fast: bool) -> None:
    S = SymSoftmax(3)
    for a, b in (("fkl", "ufkl"), ("rkl", "urkl")):
        diff = paper.objective_sym(a, S) - paper.objective_sym(b, S)
        for j in range(3):
            ck.symbolic(f"d/dtheta_{j + 1} (J_{a} - J_{b})", S.d(diff, j))
    ck.note(
        f"symbolic: {ASSUMPTIONS} (any Z_old: the objectives differ by beta (Z_old - 1) constants)"
    )

    for pname, dist in POLICIES:
        th, old_logp, adv = _policy(6, 0, dist)
        for a, b in (("fkl", "ufkl"), ("rkl", "urkl")):
            for fam in ("rpg", "rpg-reinforce"):
                ga, _ = expected_loss_grad(get_loss(f"{fam}-{a}"), th, old_logp, adv, beta=0.5)
                gb, _ = expected_loss_grad(get_loss(f"{fam}-{b}"), th, old_logp, adv, beta=0.5)
                ck.exact(f"{pname}: E[grad {fam}-{a}] == E[grad {fam}-{b}]", ga, gb)

    rows = variance_table()
    by = {(r["policy"], r["loss"]): r["var_per_sample"] for r in rows}
    for pname, _ in POLICIES:
        ck.note(
            f"{pname}: var per sample "
            + ", ".join(f"{n.replace('rpg-', '')} {by[(pname, n)]:.4g}" for n in LOSS_NAMES[:4])
        )
        for n in LOSS_NAMES[:4]:      # the REINFORCE twin has identical per-sample gradients
            ck.exact(f"{pname}: var {n} == var of its REINFORCE twin", by[(pname, n)],
                     by[(pname, n.replace("rpg-", "rpg-reinforce-"))])
    ck.fact("on-policy, the unnormalized variants have lower variance (control variate beta(w-1))",
            by[("on-policy", "rpg-ufkl")] < by[("on-policy", "rpg-fkl")]
            and by[("on-policy", "rpg-urkl")] < by[("on-policy", "rpg-rkl")])

    # Monte Carlo: the sample mean of ||g(x) - E g||^2 estimates the exact total variance
    th, old_logp, adv = _policy(6, 0, 1.0)
    n = mc_n(fast)
    idx = torch.multinomial(
        old_logp.exp(), n, replacement=True, generator=torch.Generator().manual_seed(31)
    )
    for name in ("rpg-ufkl", "rpg-rkl"):
        g, var, G = per_sample_stats(name, th, old_logp, adv, 0.5)
        ck.mc(f"{name} total variance (far)", ((G[idx] - g) ** 2).sum(1, keepdim=True),
              torch.tensor([var], dtype=DTYPE))
