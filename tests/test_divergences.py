"""The one table of KL terms (rpg_ref/core/divergences.py) that the losses put in their formulas:
each unbiased row's estimate has expectation D under pi_old, exactly; each k3 row is kl.k3 of the
paper's ratio and equals the paper's expanded term (float64, 1e-12).
"""

import pytest
import torch

from rpg_ref.core.divergences import DIVERGENCES

pytestmark = pytest.mark.usefixtures("float64_default")
TOL = 1e-12


def _exact(kl: str, theta, old, ref):
    """(E_{x ~ pi_old}[d(x)], D(pi_theta, pi_ref)) over a finite support, as sums."""
    w, log_rho, u = theta / old, (theta / ref).log(), ref / old
    mean = (old * DIVERGENCES[kl].estimate(w, log_rho, u)).sum()
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


def test_k3_rows_are_the_papers_expanded_terms():
    """With w = u rho: ufkl = u k3(rho) = w - u - u log rho, urkl = w k3(1/rho) = u - w +
    w log rho (the paper's terms plus constants), k3 = 1/rho - 1 + log rho."""
    g = torch.Generator().manual_seed(4)
    log_rho, log_u = 2 * (2 * torch.rand(64, generator=g) - 1), 2 * torch.randn(64, generator=g)
    rho, u = log_rho.exp(), log_u.exp()
    w = u * rho
    want = {"ufkl": w - u - u * log_rho, "urkl": u - w + w * log_rho, "k3": 1 / rho - 1 + log_rho}
    for kl, d in want.items():
        got = DIVERGENCES[kl].estimate(w, log_rho, u)
        assert (got - d).abs().max() < TOL * (1 + d.abs().max()), kl
