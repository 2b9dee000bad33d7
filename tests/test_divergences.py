"""The one table of KL terms (rpg_ref/core/divergences.py) that the reference losses and the fast
kernel share: each row's closed-form columns are the derivatives of its estimate (autograd,
float64, 1e-12), and each unbiased row's estimate has expectation D under pi_old, exactly.
"""

import pytest
import torch

from rpg_ref.core.divergences import DIVERGENCES

pytestmark = pytest.mark.usefixtures("float64_default")
TOL = 1e-12


def _ratios(seed: int, n: int = 64):
    """log pi_theta (the variable), log pi_old, log pi_ref per unit: ratios from ~e^-2 to ~e^2."""
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(n, generator=g) * 3
    old = lp - 2 * (2 * torch.rand(n, generator=g) - 1)
    return lp, old, lp - 2 * (2 * torch.rand(n, generator=g) - 1)


@pytest.mark.parametrize("kl", list(DIVERGENCES))
def test_score_is_the_gradient_of_the_estimate_over_w(kl):
    """score(w, lr, u_w) = (d d / d log pi_theta) / w, with w = pi_theta/pi_old and
    rho = pi_theta/pi_ref both moving with log pi_theta and u = pi_ref/pi_old constant."""
    D = DIVERGENCES[kl]
    lp, old, ref = _ratios(seed=1)
    x = lp.clone().requires_grad_(True)
    w, lr, u = (x - old).exp(), x - ref, (ref - old).exp()
    (grad,) = torch.autograd.grad(D.estimate(w, lr, u).sum(), x)
    w, lr = w.detach(), lr.detach()
    got = D.score(w, lr, u / w) * w
    assert (got - grad).abs().max() < TOL * (1 + grad.abs().max())


@pytest.mark.parametrize("kl", [k for k, D in DIVERGENCES.items() if D.per_ratio is not None])
def test_per_ratio_is_the_estimate_over_w_and_its_log_rho_derivative(kl):
    """per_ratio(lr, u_w) = (g, g'): g = d / w depends on rho alone (the same g for any pi_old
    at a given rho), and g' = dg / d log rho."""
    D = DIVERGENCES[kl]
    lp, old, ref = _ratios(seed=2)
    lr = (lp - ref).requires_grad_(True)
    rho = lr.exp()
    for log_u in (ref - old, torch.zeros_like(old)):           # two behaviour policies
        u = log_u.exp()
        d = D.estimate(u * rho, lr, u)                          # w = u rho
        g, g_prime = D.per_ratio(lr, 1 / rho)
        assert (d / (u * rho) - g).abs().max() < TOL
        (dg,) = torch.autograd.grad(g.sum(), lr, retain_graph=True)
        assert (dg - torch.as_tensor(g_prime)).abs().max() < TOL * (1 + dg.abs().max())


def _exact(kl: str, theta, old, ref):
    """(E_{x ~ pi_old}[d(x)], D(pi_theta, pi_ref)) over a finite support, as sums."""
    w, lr, u = theta / old, (theta / ref).log(), ref / old
    mean = (old * DIVERGENCES[kl].estimate(w, lr, u)).sum()
    kl_ = {"fkl": (ref * (ref / theta).log()).sum(),
           "rkl": (theta * (theta / ref).log()).sum(),
           "ufkl": (ref * (ref / theta).log() - ref + theta).sum(),
           "urkl": (theta * (theta / ref).log() - theta + ref).sum()}
    return mean, kl_.get(kl)


@pytest.mark.parametrize("kl", list(DIVERGENCES))
def test_unbiased_rows_have_expectation_D_under_pi_old(kl):
    """E_old[d] = D(pi_theta, pi_ref) exactly for every row marked unbiased, with pi_theta,
    pi_old, pi_ref three different distributions (UKL rows: unnormalized measures too). The k3
    row (GRPO's penalty) is not: its expectation misses UKL(pi_theta || pi_ref) off-policy."""
    g = torch.Generator().manual_seed(3)
    old, ref = torch.rand(7, generator=g) + 0.1, torch.rand(7, generator=g) + 0.1
    old, ref = old / old.sum(), ref / ref.sum()
    theta = torch.rand(7, generator=g) + 0.1
    theta = theta / theta.sum() * (1.0 if kl in ("fkl", "rkl") else 1.3)
    mean, D = _exact(kl, theta, old, ref)
    if DIVERGENCES[kl].unbiased:
        assert abs(mean - D) < 1e-12
    else:
        _, ukl = _exact("urkl", theta, old, ref)
        assert abs(mean - ukl) > 1e-3


@pytest.mark.parametrize("kl", [k for k, D in DIVERGENCES.items() if D.unweighted is not None])
def test_unweighted_form_is_the_estimate_and_its_gradient(kl):
    """unweighted(lr, 1/rho) = (d, dd / d log pi_theta): the kernel's form of a term added with no
    importance weight (GRPO's k3) equals the row's estimate and autograd's derivative of it, for
    1/rho given either way the kernel computes it (exp(-lr), or 1/w when pi_ref = pi_old)."""
    D = DIVERGENCES[kl]
    lp, old, ref = _ratios(seed=4)
    for ref_ in (ref, old):                                     # pi_ref apart, pi_ref = pi_old
        x = lp.clone().requires_grad_(True)
        w, lr, u = (x - old).exp(), x - ref_, (ref_ - old).exp()
        d = D.estimate(w, lr, u)
        (grad,) = torch.autograd.grad(d.sum(), x)
        w, lr = w.detach(), lr.detach()
        for inv_rho in (torch.exp(-lr), u / w):
            got_d, got_grad = D.unweighted(lr, inv_rho)
            assert (got_d - d.detach()).abs().max() < TOL * (1 + d.abs().max())
            assert (got_grad - grad).abs().max() < TOL * (1 + grad.abs().max())
