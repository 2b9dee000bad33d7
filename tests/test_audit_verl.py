"""rpg-audit's verl adapters: verl 0.9.1's own actor loss (verl.workers.utils.losses.ppo_loss with
the vanilla policy loss and use_kl_loss=True) for every kl_loss_type, its verdicts pinned, its
agreement with the twins written from verl's docs, and its rows of docs/audit.md.

Needs verl (CI runs this file in .venv-verl); skipped otherwise.
"""

import pytest
import torch

verl = pytest.importorskip(
    "verl",
    reason="verl is not installed in this environment: the verl audit "
    "adapters run in their own venv (.ci/run creates .venv-verl)",
)

from audit_expectations import (
    assert_verdicts,
    committed_table,
    table_lines,
)

from rpg_ref import audit
from rpg_ref.audit import adapters as audit_adapters

OWN, NOTES = audit_adapters.verl_adapters()
TWINS = {a.name: a for a in audit_adapters.docs_adapters() if a.library.startswith("verl")}


@pytest.fixture(scope="module")
def rows():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield audit.audit(OWN)
    torch.set_num_threads(n)


def test_verl_version_and_every_kl_type():
    assert verl.__version__ == "0.9.1" and not NOTES
    assert [a.name for a in OWN] == [f"verl kl_loss_type={k}" for k in audit_adapters.VERL_KL_TYPES]
    assert all(a.own_code for a in OWN)


@pytest.mark.parametrize("ad", OWN, ids=lambda a: a.name)
def test_verl_own_code_equals_its_docs_twin(ad):
    """verl's ppo_loss and the twin written from verl's docs give the same loss and gradient
    (float64) on a random batch with ratios far from 1 (PPO clip and the dual clip both bind)."""
    g = torch.Generator().manual_seed(3)
    B, H = 8, 3
    logp = -torch.rand(B, H, generator=g, dtype=torch.float64) * 2 - 0.05
    old = logp + 0.8 * torch.randn(B, H, generator=g, dtype=torch.float64)
    ref = logp + 0.8 * torch.randn(B, H, generator=g, dtype=torch.float64)
    adv, mask = (
        torch.randn(B, generator=g, dtype=torch.float64),
        torch.ones(B, H, dtype=torch.float64),
    )
    grads = []
    for a in (ad, TWINS[ad.name]):
        x = logp.clone().requires_grad_(True)
        value = a.loss(x, old, ref, adv, mask)
        value.backward()
        grads.append((value.detach(), x.grad))
    (v1, g1), (v2, g2) = grads
    assert torch.allclose(v1, v2, rtol=1e-12, atol=0) and torch.allclose(
        g1, g2, rtol=1e-12, atol=1e-15
    )
    w = torch.exp(logp - old)
    assert bool(((w < 0.8) | (w > 1.2)).any()) and bool(((w > 3) & (adv[:, None] < 0)).any())


@pytest.mark.parametrize("ad", OWN, ids=lambda a: a.name)
def test_verl_verdict(rows, ad):
    """verl's own code gets the verdicts derived by hand in audit_expectations.py."""
    assert_verdicts(rows, ad, len(audit.SETTINGS) * len(audit.HORIZONS))


def test_committed_verl_rows_match_a_fresh_run(rows):
    """docs/audit.md's 'verl 0.9.1: own code' lines are this run's."""
    old = {
        k: v for k, v in table_lines(committed_table()).items() if k[2] == "verl 0.9.1: own code"
    }
    new = table_lines(audit.to_markdown(rows))
    assert set(old) == set(new) and len(new) == len(OWN) * len(audit.SETTINGS)
    for k in new:
        assert old[k] == new[k], f"\ncommitted {old[k]}\nfresh     {new[k]}"
