"""rpg_ref.core.kl: estimators' expectations and exact divergences (remark:k3_connection_main)."""

import math

import pytest
import torch

from rpg_ref.core import kl

pytestmark = pytest.mark.usefixtures("float64_default")


def _measures(seed, K=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(K, generator=g), torch.randn(K, generator=g)


def test_estimator_expectations_exact():
    """x ~ q, r = p/q: E_q[k1] = E_q[k3] = KL(q||p) for normalized p, q; E_q[k2] is not."""
    a, b = _measures(0)
    logq, logp = torch.log_softmax(a, 0), torch.log_softmax(b, 0)
    q = logq.exp()
    want = (q * (logq - logp)).sum()
    lr = logp - logq
    assert abs((q * kl.k1(lr)).sum() - want) < 1e-12
    assert abs((q * kl.k3(lr)).sum() - want) < 1e-12
    assert abs((q * kl.k2(lr)).sum() - want) > 1e-3
    assert abs(kl.kl(logq, logp) - want) < 1e-12
    assert abs(kl.kl(a, b, logits=True) - want) < 1e-12


def test_k3_equals_ukl_for_unnormalized_measures():
    """app:k3_ukl_connection: E_q[k3(p/q)] = UKL(q||p) = sum q log(q/p) + sum(p - q), any masses."""
    a, b = _measures(1)
    logq, logp = a - 0.3, b + 0.2                    # unnormalized measures
    q, p = logq.exp(), logp.exp()
    want = (q * (logq - logp)).sum() + (p - q).sum()
    assert abs((q * kl.k3(logp - logq)).sum() - want) < 1e-12
    assert abs(kl.ukl(logq, logp) - want) < 1e-12
    # both directions of the paper: forward UKL(old||theta), reverse UKL(theta||old)
    assert abs(kl.forward_ukl(logp, logq) - want) < 1e-12
    assert abs(kl.reverse_ukl(logq, logp) - want) < 1e-12


def test_kl_zero_mass_convention_and_nonnegativity():
    """0 log 0 = 0; KL >= 0 and UKL >= 0 with equality iff equal."""
    logp = torch.log(torch.tensor([0.5, 0.5, 0.0]))
    logq = torch.log(torch.tensor([0.25, 0.25, 0.5]))
    assert abs(kl.kl(logp, logq) - math.log(2)) < 1e-12
    a, _ = _measures(2)
    assert abs(kl.ukl(a, a)) < 1e-12 and kl.ukl(a, a + 0.1) > 0
    assert abs(kl.reverse_kl(a, a, logits=True)) < 1e-12
