"""rpg-audit on the peers' own code, each pinned to the version it was run on: OpenRLHF 0.11.2,
SkyRL 0.3.1 (skyrl-train) and 0.4.0 (skyrl), AReaL 1.0.4, Oat 0.2.4
(rpg_ref/audit/adapters/peers.py). Verdicts pinned against the hand derivations in
audit_expectations.py; the committed rows of
docs/audit.md; the defects the audit finds.

Needs the peers installed with --no-deps (CI builds .venv-audit and sets RPG_AUDIT_PEERS=1, which
turns a missing peer into a failure); skipped elsewhere.
"""

import os

import pytest
import torch
from audit_expectations import assert_verdicts, committed_table, table_lines

from rpg_ref import audit
from rpg_ref.audit.adapters import peers
from rpg_ref.audit.adapters.source import load_defs

ADAPTERS, NOTES = peers.peer_adapters()
if NOTES and not os.environ.get("RPG_AUDIT_PEERS"):
    pytest.skip(f"peers not installed here ({NOTES[0]}); CI runs this file in .venv-audit",
                allow_module_level=True)


@pytest.fixture(scope="module")
def rows():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield audit.audit(ADAPTERS)
    torch.set_num_threads(n)


def test_every_pinned_peer_is_installed():
    assert not NOTES, NOTES
    assert {a.library for a in ADAPTERS} == {
        "OpenRLHF 0.11.2",
        "SkyRL 0.3.1",
        "SkyRL 0.4.0",
        "AReaL 1.0.4",
        "Oat 0.2.4",
    }


@pytest.mark.parametrize("ad", ADAPTERS, ids=lambda a: a.name)
def test_peer_verdict(rows, ad):
    """The peer's own code gets the verdicts derived by hand (audit_expectations.py): single
    candidates, combinations (AReaL's k3 in the reward: KL(pi||ref) - sum_t KL(ref||pi) on-policy)
    and reward parts."""
    assert_verdicts(rows, ad, len(audit.SETTINGS) * len(audit.HORIZONS))


def test_float32_peers_are_judged_at_float32(rows):
    """OpenRLHF and AReaL cast to float32 (`.float()`): judged at that precision, never refused."""
    prec = {r["library"]: r["precision"] for r in rows}
    assert prec["OpenRLHF 0.11.2"] == prec["AReaL 1.0.4"] == "float32"
    assert prec["SkyRL 0.4.0"] == prec["Oat 0.2.4"] == "float64"


def test_skyrl_031_kl_loss_has_no_gradient():
    """SkyRL 0.3.1's compute_approx_kl runs under @torch.no_grad(): its KL value carries no
    gradient;
    0.4.0's does."""
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    old = load_defs(
        "skyrl-train",
        "0.3.1",
        "skyrl_train/utils/ppo_utils.py",
        ["compute_approx_kl"],
        peers.TORCH_ENV,
    )
    new = load_defs(
        "skyrl",
        "0.4.0",
        "skyrl/backends/skyrl_train/utils/ppo_utils.py",
        ["compute_approx_kl"],
        peers.TORCH_ENV,
    )
    assert not old["compute_approx_kl"](logp, ref, kl_estimator_type="k3").requires_grad
    assert new["compute_approx_kl"](logp, ref, kl_estimator_type="k3").requires_grad


def test_openrlhf_unbiased_gradient_is_biased_where_its_clamp_binds():
    """OpenRLHF's unbiased_gradient weights k1 grad log pi by w = pi/pi_old clamped at 10: with
    ratios up to 5 it follows sum_t KL(pi||ref) off-policy; with ratios up to 30 (the clamp binds)
    it
    follows
    no candidate (relative error > 0.1), while on-policy (w = 1) it still does."""
    ad = next(a for a in ADAPTERS if a.name == "OpenRLHF kl_estimator=k3 unbiased_gradient=True")
    for ratio, binds in ((5.0, False), (30.0, True)):
        pol = audit.Policies(max_ratio=ratio, logit_scale=2.0)
        for r in audit.audit([ad], horizons=(2, 3), policies=pol, fit=False):
            if not r["on_policy"]:
                assert (r["kl_matches"] == []) == binds and (
                    not binds or r["kl_closest_err"] > 0.1
                ), r
            elif not r["ref_is_old"]:
                assert r["kl_matches"] == ["tok-rkl"]


def test_committed_peer_rows_match_a_fresh_run(rows):
    """docs/audit.md's rows of the peers' own code are this run's."""
    libs = {a.code for a in ADAPTERS}
    old = {k: v for k, v in table_lines(committed_table()).items() if k[2] in libs}
    new = table_lines(audit.to_markdown(rows))
    assert set(old) == set(new)
    for k in new:
        assert old[k] == new[k], f"\ncommitted {old[k]}\nfresh     {new[k]}"
