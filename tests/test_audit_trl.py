"""rpg-audit on TRL 1.16's own GRPO loss (GRPOTrainer._compute_loss on a stand-in trainer,
rpg_ref/audit/adapters/trl.py): verdicts pinned (audit_expectations.py), agreement with the twin
written from TRL's docs, and the committed rows of docs/audit.md. TRL is in the dev extra.
"""

import pytest
import torch
from audit_expectations import assert_verdicts, committed_table, table_lines

from rpg_ref import audit
from rpg_ref.audit.adapters import docs_adapters, trl_adapters

pytest.importorskip("trl", reason="TRL is in the dev extra (the README's test command installs it)")
OWN, NOTES = trl_adapters()


@pytest.fixture(scope="module")
def rows():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield audit.audit(OWN)
    torch.set_num_threads(n)


def test_trl_version_and_settings():
    assert (
        not NOTES and len(OWN) == 4 and all(a.library == "TRL 1.16.0" and a.own_code for a in OWN)
    )


@pytest.mark.parametrize("ad", OWN, ids=lambda a: a.name)
def test_trl_verdict(rows, ad):
    """Token level: k3 follows sum_t KL(ref||pi) on-policy only; with use_bias_correction_kl sum_t
    KL(pi||ref) for every theta. Sequence level with the correction: on-policy the combination
    (1/H) KL(pi||ref) + (1 - 1/H) sum_t KL(ref||pi), off-policy nothing, at H >= 2."""
    assert_verdicts(rows, ad, len(audit.SETTINGS) * len(audit.HORIZONS))


@pytest.mark.parametrize("bc", [False, True])
def test_trl_own_code_equals_its_docs_twin(bc):
    """At token level TRL's _compute_loss and the twin written from its docs agree in value and
    gradient
    (float64) on a batch where PPO clipping binds."""
    own = next(a for a in OWN if a.level == "token" and a.name.endswith(f"={bc}"))
    twin = next(a for a in docs_adapters() if a.name == f"TRL GRPO use_bias_correction_kl={bc}")
    g = torch.Generator().manual_seed(5)
    logp = -torch.rand(6, 3, generator=g, dtype=torch.float64) * 2 - 0.05
    old = logp + 0.8 * torch.randn(6, 3, generator=g, dtype=torch.float64)
    ref = logp + 0.8 * torch.randn(6, 3, generator=g, dtype=torch.float64)
    adv, mask = (
        torch.randn(6, generator=g, dtype=torch.float64),
        torch.ones(6, 3, dtype=torch.float64),
    )
    out = []
    for a in (own, twin):
        x = logp.clone().requires_grad_(True)
        v = a.loss(x, old, ref, adv, mask)
        v.backward()
        out.append((v.detach(), x.grad))
    assert torch.allclose(out[0][0], out[1][0], rtol=1e-12, atol=0)
    assert torch.allclose(out[0][1], out[1][1], rtol=1e-12, atol=1e-15)
    w = torch.exp(logp - old)
    assert bool(((w < 0.8) | (w > 1.2)).any())


def test_committed_trl_rows_match_a_fresh_run(rows):
    old = {
        k: v for k, v in table_lines(committed_table()).items() if k[2] == "TRL 1.16.0: own code"
    }
    new = table_lines(audit.to_markdown(rows))
    assert set(old) == set(new) and len(new) == len(OWN) * len(audit.SETTINGS)
    for k in new:
        assert old[k] == new[k], f"\ncommitted {old[k]}\nfresh     {new[k]}"
