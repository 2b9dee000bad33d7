"""Item 4: the k3 estimator equals the unnormalized KL (Remark 3.5 (remark:k3_connection_main),
Appendix D (app:k3_ukl_connection)), in both directions:

    E_{x~q}[k3(p(x)/q(x))] = UKL(q || p),    k3(y) = y - 1 - log y   (Eq. (3.2)
    (eq:k3_func_estimators_main))

for positive measures p, q of any mass (E_{x~q}[f] := sum_x q(x) f(x), i.e. Z_q E_{q/Z_q}[f]).
Forward: q = pi_old, p = pi_theta; reverse: q = pi_theta, p = pi_old.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from rpg_ref.core import kl as rkl

from . import paper
from ._core import DTYPE, Checker, claim, mc_n


def k3_sym(y):
    return y - 1 - sp.log(y)


@claim(
    "k3-categorical",
    "remark:k3_connection_main",
    "E_{pi_old}[k3(pi_theta/pi_old)] = UKL(pi_old||pi_theta) and "
    "E_{pi_theta}[k3(pi_old/pi_theta)] = "
    "UKL(pi_theta||pi_old), for categoricals with unnormalized measures.",
)
def check_remark_k3_connection_main(ck: Checker, fast: bool) -> None:
    K = 3
    p = sp.symbols(f"p1:{K + 1}", positive=True)     # pi_theta, any mass
    o = sp.symbols(f"o1:{K + 1}", positive=True)     # pi_old, any mass
    total = lambda xs: sp.Add(*xs)
    fwd = sum(o[k] * k3_sym(p[k] / o[k]) for k in range(K)) - paper.divergence(
        "ufkl", p, o, sp.log, total
    )
    rev = sum(p[k] * k3_sym(o[k] / p[k]) for k in range(K)) - paper.divergence(
        "urkl", p, o, sp.log, total
    )
    ck.symbolic("forward E_old[k3(theta/old)] - UKL(old||theta)", fwd)
    ck.symbolic("reverse E_theta[k3(old/theta)] - UKL(theta||old)", rev)
    ck.note("symbolic: K=3, p, o arbitrary positive measures (both unnormalized)")

    # exact (K=6, float64) through rpg_ref.core.kl.k3 / rpg_ref.core.kl.ukl against the definitions
    g = torch.Generator().manual_seed(3)
    K = 6
    lp = torch.randn(K, generator=g, dtype=DTYPE) + math.log(0.8)      # pi_theta, mass ~0.8*K
    lo = torch.randn(K, generator=g, dtype=DTYPE) + math.log(0.3)  # pi_old, another mass
    ukl_fwd = paper.divergence(
        "ufkl", lp.exp(), lo.exp(), torch.log, lambda xs: torch.stack(xs).sum()
    )
    ukl_rev = paper.divergence(
        "urkl", lp.exp(), lo.exp(), torch.log, lambda xs: torch.stack(xs).sum()
    )
    # x ~ pi_old, log_ratio = log pi_theta - log pi_old
    e_fwd = (lo.exp() * rkl.k3(lp - lo)).sum()
    e_rev = (lp.exp() * rkl.k3(lo - lp)).sum()
    ck.exact("forward: sum pi_old k3 == UKL(old||theta) (definition)", e_fwd, ukl_fwd)
    ck.exact("reverse: sum pi_theta k3 == UKL(theta||old) (definition)", e_rev, ukl_rev)
    ck.exact("rpg_ref.core.kl.ukl(old, theta) == definition", rkl.ukl(lo, lp), ukl_fwd)
    ck.exact("rpg_ref.core.kl.ukl(theta, old) == definition", rkl.ukl(lp, lo), ukl_rev)

    # Monte Carlo: x ~ q / Z_q, Z_q * mean k3
    n = mc_n(fast, scalar=True)
    for tag, lq, lpp, exact, seed in (
        ("forward", lo, lp, ukl_fwd, 5),
        ("reverse", lp, lo, ukl_rev, 6),
    ):
        zq = float(lq.exp().sum())
        idx = torch.multinomial(
            lq.exp() / zq, n, replacement=True, generator=torch.Generator().manual_seed(seed)
        )
        ck.mc(f"{tag} Z_q mean k3", rkl.k3(lpp[idx] - lq[idx])[:, None], exact.view(1), scale=zq)


def gaussian_ukl_closed_form(a, m1, s1, b, m2, s2, log=sp.log):
    """UKL(a N(m1, s1^2) || b N(m2, s2^2)) = a [log(a/b) + log(s2/s1) + (s1^2 + (m1-m2)^2)/(2 s2^2)
    - 1/2] + b - a."""
    return (
        a * (log(a / b) + log(s2 / s1) + (s1**2 + (m1 - m2) ** 2) / (2 * s2**2) - sp.Rational(1, 2))
        + b
        - a
    )


@claim("k3-gaussian", "app:k3_ukl_connection",
       "For scaled Gaussians p = a N(mu1, s1^2), q = b N(mu2, s2^2): E_p[k3(q/p)] = UKL(p||q) = "
       "a[log(a/b) + log(s2/s1) + (s1^2 + (mu1-mu2)^2)/(2 s2^2) - 1/2] + b - a, and symmetrically.")
def check_app_k3_ukl_connection(ck: Checker, fast: bool) -> None:
    x = sp.Symbol("x", real=True)
    m, s, c = (
        sp.Symbol("m", real=True),
        sp.Symbol("s", positive=True),
        sp.Symbol("c", positive=True),
    )
    dens = lambda c_, m_, s_: (
        c_ * sp.exp(-((x - m_) ** 2) / (2 * s_**2)) / sp.sqrt(2 * sp.pi * s_**2)
    )
    # moments int x^n c N(m, s^2) dx, n = 0, 1, 2, by sympy integration (once, then substituted)
    moments = [
        sp.simplify(sp.integrate(x**n * dens(c, m, s), (x, -sp.oo, sp.oo))) for n in range(3)
    ]
    a, b = sp.symbols("a b", positive=True)
    m1, m2 = sp.symbols("mu1 mu2", real=True)
    s1, s2 = sp.symbols("sigma1 sigma2", positive=True)
    for tag, (ca, ma, sa), (cb, mb, sb) in (("forward", (a, m1, s1), (b, m2, s2)),
                                            ("reverse", (b, m2, s2), (a, m1, s1))):
        # int p k3(q/p) = int q - int p - int p log(q/p); log(q/p) is a quadratic in x
        log_ratio = sp.Poly(
            sp.expand(sp.expand_log(sp.log(dens(cb, mb, sb) / dens(ca, ma, sa)), force=True)), x
        )
        sub = {c: ca, m: ma, s: sa}
        int_p_log = sum(log_ratio.coeff_monomial(x ** n) * moments[n].subs(sub) for n in range(3))
        lhs = moments[0].subs({c: cb}) - moments[0].subs(sub) - int_p_log
        ck.symbolic(
            f"{tag}: E_p[k3(q/p)] - closed-form UKL(p||q)",
            lhs - gaussian_ukl_closed_form(ca, ma, sa, cb, mb, sb),
        )
    ck.note("symbolic: Gaussian moments by sympy integration; a, b, sigma > 0, mu real")

    # exact: the closed form against float64 quadrature (trapezoid on a fine grid)
    A, M1, S1, B, M2, S2 = 1.3, 0.2, 0.9, 0.7, -0.4, 1.4
    grid = torch.linspace(-14, 14, 400001, dtype=DTYPE)
    lpdf = lambda z, cc, mm, ss: (
        math.log(cc) - (z - mm) ** 2 / (2 * ss**2) - math.log(math.sqrt(2 * math.pi) * ss)
    )
    lp_, lq_ = lpdf(grid, A, M1, S1), lpdf(grid, B, M2, S2)
    quad = torch.trapezoid(lp_.exp() * (torch.expm1(lq_ - lp_) - (lq_ - lp_)), grid)
    closed = float(gaussian_ukl_closed_form(A, M1, S1, B, M2, S2, log=math.log))
    ck.exact("forward: quadrature of E_p[k3(q/p)] == closed form", quad, closed, tol=1e-9)

    # Monte Carlo: x ~ N(M1, S1^2), a * mean k3(q/p)
    n = mc_n(fast, scalar=True)
    z = M1 + S1 * torch.randn(n, generator=torch.Generator().manual_seed(9), dtype=DTYPE)
    lr = lpdf(z, B, M2, S2) - lpdf(z, A, M1, S1)
    ck.mc(
        "gaussian forward a * mean k3(q/p)",
        rkl.k3(lr)[:, None],
        torch.tensor([closed], dtype=DTYPE),
        scale=A,
    )
