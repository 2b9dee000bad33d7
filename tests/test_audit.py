"""rpg-audit (rpg_ref/audit.py): the enumeration, the candidate objectives, every built-in adapter's
verdict (pinned against the hand derivations in audit_expectations.py), the committed table in
docs/audit.md, the command line and the README example.

verl's own-code adapters are tested in tests/test_audit_verl.py (verl's environment).
"""

import contextlib
import io
import itertools
import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from audit_expectations import (
    ALL_KEYS,
    assert_verdicts,
    committed_table,
    predicted_matches,
    table_lines,
    tie_class,
)

from rpg_ref import audit
from rpg_ref.audit import adapters as audit_adapters
from rpg_ref.audit import cli as audit_cli
from rpg_ref.core.advantages import kl_return_to_go, reinforce_pp
from rpg_ref.core.exact import Autoregressive
from rpg_ref.core.losses import LOSSES

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = audit_adapters.rpg_ref_adapters() + audit_adapters.docs_adapters()
TOL = 1e-10


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The audit's tensors are tiny: a second thread only adds synchronization (10-100x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def rows(one_thread):
    return audit.audit(ADAPTERS)


def _by_adapter(rows, ad):
    return [
        r for r in rows if r["loss"] == ad.name and r["code"] == ad.code and r["level"] == ad.level
    ]


# ---------------------------------------------------------------------------
# enumeration and candidates
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("V,L", [(2, 1), (3, 2), (3, 3), (4, 2)])
def test_autoregressive_enumeration(V, L):
    """Every response once, probabilities summing to 1, and prefix probabilities equal to the mass
    of the responses that start with the prefix (marginalized by hand)."""
    ar = Autoregressive(V, L)
    logits = torch.randn(
        ar.n_prefix, V, generator=torch.Generator().manual_seed(V * 10 + L), dtype=torch.float64
    )
    assert len({tuple(y) for y in ar.seqs.tolist()}) == V ** L == len(ar.seqs)
    p = ar.token_logp(logits).sum(1).exp()
    assert abs(float(p.sum()) - 1) < TOL
    prefix_p = ar.prefix_logp(logits).exp()
    for t in range(L):
        for y, pid in zip(ar.seqs.tolist(), ar.prefix[:, t].tolist()):
            starts = [i for i, z in enumerate(ar.seqs.tolist()) if z[:t] == y[:t]]
            assert abs(float(p[starts].sum() - prefix_p[pid])) < TOL


def test_prefix_numbering_is_the_documented_one():
    """V=3: () -> 0, (a) -> 1 + a, (a, b) -> 4 + 3a + b (what derivations/token_sequence.py relied
    on)."""
    ar = Autoregressive(3, 3)
    want = torch.stack(
        [
            torch.zeros(27, dtype=torch.long),
            1 + ar.seqs[:, 0],
            4 + 3 * ar.seqs[:, 0] + ar.seqs[:, 1],
        ],
        1,
    )
    assert torch.equal(ar.prefix, want) and ar.n_prefix == 13


def test_sequence_kl_is_the_prefix_weighted_sum_of_conditional_kls():
    """Chain rule, checked on values: KL(pi||ref) over whole responses = sum over prefixes p of
    pi(p) KL(pi(.|p)||ref(.|p)), and KL(ref||pi) = sum_p ref(p) KL(ref(.|p)||pi(.|p)). This is the
    identity the per-position candidates are built on (with prefixes from pi_old instead)."""
    prob = audit.make_problem(audit.Setting(False, False), 3)
    seq, seq_ref = prob.tokens(prob.theta).sum(1), prob.ref_tok.sum(1)
    cond, cond_ref = torch.log_softmax(prob.theta, -1), torch.log_softmax(prob.ref, -1)
    rkl = (seq.exp() * (seq - seq_ref)).sum()
    fkl = (seq_ref.exp() * (seq_ref - seq)).sum()
    by_prefix_r = (
        prob.ar.prefix_logp(prob.theta).exp() * (cond.exp() * (cond - cond_ref)).sum(1)
    ).sum()
    by_prefix_f = (
        prob.ar.prefix_logp(prob.ref).exp() * (cond_ref.exp() * (cond_ref - cond)).sum(1)
    ).sum()
    assert abs(float(rkl - by_prefix_r)) < TOL and abs(float(fkl - by_prefix_f)) < TOL


@pytest.mark.parametrize("setting", audit.SETTINGS[1:], ids=lambda s: f"{s.theta} {s.ref}")
@pytest.mark.parametrize("horizon", audit.HORIZONS)
def test_candidate_ties_are_exactly_the_predicted_ones(setting, horizon):
    """Which candidates share a gradient: UKL = KL always (normalized policies); per-position sum =
    sequence divergence at H = 1, and for KL(ref||pi) whenever pi_ref = pi_old; nothing else. Every
    nonzero candidate gradient is > 1e-2, far above audit.ZERO_NORM."""
    prob = audit.make_problem(setting, horizon)
    cands = audit.candidate_grads(prob)
    signed = dict(cands) | {f"-{k}": -v for k, v in cands.items() if k != "no-kl"}
    for key in ALL_KEYS:
        ties = {k for k, v in signed.items() if audit.rel_err(v, signed[key]) <= TOL}
        assert ties == tie_class(key, setting.ref_is_old, horizon), key
    assert min(float(v.norm()) for k, v in cands.items() if k != "no-kl") > 1e-2


def test_every_candidate_vanishes_on_policy_with_ref_old():
    prob = audit.make_problem(audit.Setting(True, True), 3)
    assert all(float(g.norm()) < 1e-14 for g in audit.candidate_grads(prob).values())


# ---------------------------------------------------------------------------
# verdicts, pinned
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("ad", ADAPTERS, ids=lambda a: f"{a.name}[{a.level},{a.code}]")
def test_verdict(rows, ad):
    """The KL part follows exactly the candidates derived by hand (audit_expectations.kl_primary and
    its ties; [] = none), and the reward part is exact exactly where predicted, for every setting
    and horizon (seed 0: the committed table)."""
    assert_verdicts(rows, ad, len(audit.SETTINGS) * len(audit.HORIZONS))


def test_verdicts_do_not_depend_on_the_seed():
    """The verdicts are structural: another draw of the policies gives the same matches."""
    for r in audit.audit(ADAPTERS, horizons=(2, 3), seed=1, fit=False):
        assert r["kl_matches"] == predicted_matches(
            r["loss"], r["level"], r["on_policy"], r["ref_is_old"], r["horizon"]
        ), r["loss"]


def test_no_match_is_far_from_every_candidate(rows):
    """A 'none' verdict is not a near miss: the closest candidate is at least 1% away."""
    misses = [r for r in rows if not r["kl_matches"]]
    assert misses and min(r["kl_closest_err"] for r in misses) > 1e-2


def test_closest_candidate_is_named_with_its_whole_tie_class(rows):
    """A 'none' verdict names the closest candidate together with every candidate of the same
    gradient (the hand-derived tie class): which member is nearest is float rounding, and it
    differs between CPUs (UKL(ref||pi) on one, KL(ref||pi) on another)."""
    misses = [r for r in rows if not r["kl_matches"] and not r["kl_all_zero"]]
    assert misses
    for r in misses:
        cls = tie_class(r["kl_closest"][0], r["ref_is_old"], r["horizon"])
        assert r["kl_closest"] == sorted(cls), (r["loss"], r["kl_closest"])


@pytest.mark.parametrize("key", ["seq-fkl", "tok-rkl", "-seq-urkl"])
def test_closest_class_does_not_depend_on_rounding(key):
    """Errors of one tie class that differ only in the last bits, in either order, give the same
    closest class (a plain argmin picks whichever rounding favours)."""
    setting = audit.Setting(False, True)
    prob = audit.make_problem(setting, 1)
    cands = audit.candidate_grads(prob)
    targets = dict(cands) | {f"-{k}": -v for k, v in cands.items() if k != "no-kl"}
    cls = tie_class(key, setting.ref_is_old, 1)
    assert len(cls) > 1
    got = []
    for order in (1, -1):
        errs = dict.fromkeys(targets, 0.5)
        errs |= {k: 0.12 * (1 + order * i * 2e-16) for i, k in enumerate(sorted(cls))}
        got.append(audit.closest_class(errs, targets))
    assert got[0] == got[1] == sorted(cls)


def test_k1_loss_off_policy_raises_the_forward_kl_to_pi_old():
    """verl's kl (k1) as a loss: E_old[grad log pi] = -grad sum_t KL(pi_old||pi), whatever pi_ref
    is:
    off-policy it pushes pi_theta away from pi_old."""
    k1 = next(a for a in ADAPTERS if a.name == "verl kl_loss_type=kl")
    for h in audit.HORIZONS:
        prob = audit.make_problem(audit.Setting(False, False), h)
        g_kl = audit.expected_grad(k1, prob, torch.zeros_like(prob.R))
        as_if_ref_old = audit.Problem(prob.ar, prob.theta, prob.old, prob.old, prob.R)
        assert (
            audit.rel_err(g_kl, -k1.beta * audit.candidate_grads(as_if_ref_old)["tok-fkl"]) <= TOL
        )


def test_the_same_grpo_term_from_three_sources():
    """rpg-ref's grpo, GRPO as published, TRL without the correction and verl's low_var_kl twin have
    the same expected KL gradient; TRL with use_bias_correction_kl has grpo-corrected's."""
    by = {(a.name, a.own_code): a for a in ADAPTERS}
    prob = audit.make_problem(audit.Setting(False, False), 3)
    zero = torch.zeros_like(prob.R)
    kl_part = lambda name, own: audit.expected_grad(by[(name, own)], prob, zero)
    ref = kl_part("grpo", True)
    for name in (
        "GRPO (published)",
        "TRL GRPO use_bias_correction_kl=False",
        "verl kl_loss_type=low_var_kl",
    ):
        assert audit.rel_err(kl_part(name, False), ref) <= TOL, name
    assert (
        audit.rel_err(
            kl_part("TRL GRPO use_bias_correction_kl=True", False), kl_part("grpo-corrected", True)
        )
        <= TOL
    )


def test_low_var_kl_clamp_does_not_bind_in_the_settings():
    """verl clamps k3 to [-10, 10]; the settings keep k3 below 10, so the clamp changes nothing
    here."""
    worst = max(float(audit_adapters.k3(p.tokens(p.theta), p.ref_tok).max())
                for p in (audit.make_problem(s, h) for s in audit.SETTINGS for h in audit.HORIZONS))
    assert 0 < worst < 10


def test_every_library_loss_has_an_adapter():
    """All 13 rpg-ref losses are audited (reinforce++-baseline through the reinforce++ row)."""
    names = {a.name for a in ADAPTERS if a.own_code}
    covered = names | {"reinforce++-baseline"}
    assert set(LOSSES) <= covered
    levels = {(a.name, a.level) for a in ADAPTERS if a.name.startswith("rpg-")}
    assert len(levels) == 16


def test_kl_return_to_go_by_hand_and_reinforce_pp_whitens_it():
    """r_t = R [t last] - beta (log pi_old - log pi_ref)_t, A_t = sum_{s>=t} r_s; reinforce_pp
    whitens A."""
    R = torch.tensor([2.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, -9.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -0.1, -9.0]], dtype=torch.float64)
    # k1 = old - ref = [[0.5, -1, 0], [0, -0.2, 0]]
    b = 0.1
    want = torch.tensor([[2 - b * (0.5 - 1 + 0), 2 - b * (-1 + 0), 2.0],
                         [-1 - b * (0 - 0.2), -1 - b * -0.2, 0.0]], dtype=torch.float64)
    assert torch.allclose(kl_return_to_go(R, mask, old, ref, b), want, atol=1e-15, rtol=0)
    ret = want[mask.bool()]
    whitened = (want - ret.mean()) / (ret.var(unbiased=False).sqrt() + 1e-8) * mask
    assert torch.allclose(reinforce_pp(R, mask, old, ref, b), whitened, atol=1e-12, rtol=0)


def test_token_mean_divides_the_expected_gradient_by_the_horizon():
    """The convention's claim: with fixed-length responses, token-mean aggregation gives the
    seq-mean-token-sum expected gradient divided by H (same verdicts, same beta)."""
    fn = LOSSES["rpg-urkl"]
    mean = audit.Adapter(
        "urkl token-mean",
        lambda lp, o, r, a, m: fn(lp, o, a, m, beta=0.5, ref_logp=r, agg="token-mean")[0],
        0.5,
        "t",
        True,
    )
    tsum = audit.Adapter(
        "urkl token-sum",
        lambda lp, o, r, a, m: fn(lp, o, a, m, beta=0.5, ref_logp=r, agg="seq-mean-token-sum")[0],
        0.5,
        "t",
        True,
    )
    prob = audit.make_problem(audit.Setting(False, False), 3)
    assert (
        audit.rel_err(
            3 * audit.expected_grad(mean, prob, prob.R), audit.expected_grad(tsum, prob, prob.R)
        )
        <= TOL
    )


def test_a_batch_coupled_loss_is_refused():
    """A loss whose batch value is not the mean of its responses' losses (here: advantages whitened
    over the batch) has no batch-size-free expected gradient: audit() names it and stops."""
    def whitened(logp, old, ref, adv, mask):
        a = (adv - adv.mean()) / (adv.std() + 1e-8) if len(adv) > 1 else adv
        return (-torch.exp(logp - old) * a[:, None]).sum(1).mean()
    with pytest.raises(ValueError, match="not the mean of its responses' losses"):
        audit.audit([audit.Adapter("whitened", whitened, 0.5, "test", True)], horizons=(2,))


# ---------------------------------------------------------------------------
# the committed table, the command line, the README example
# ---------------------------------------------------------------------------

def test_committed_table_matches_a_fresh_run(rows):
    """docs/audit.md's table (generated with verl installed) has exactly this run's lines for every
    adapter that runs here; regenerate it with `python -m rpg_ref.audit --markdown FILE`."""
    committed = committed_table()
    fresh = audit.to_markdown(rows)
    assert fresh.split("\n\n")[0] in committed                             # the legend
    assert fresh.splitlines()[-len(table_lines(fresh)) - 2] in committed  # the header
    old, new = table_lines(committed), table_lines(fresh)
    here = {k for k in old if (k[0], k[2]) in {(a.name, a.code) for a in ADAPTERS}}
    assert here == set(new)
    for k in new:
        assert old[k] == new[k], f"\ncommitted {old[k]}\nfresh     {new[k]}"


def test_cli_writes_table_markdown_and_json(tmp_path):
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = audit.main(
            ["--only", "rpg-urkl", "--horizons", "1", "2", "--markdown", str(md), "--json", str(js)]
        )
    assert rc == 0
    assert "rpg-urkl | token" in out.getvalue() and "Σt KL(π‖ref)" in out.getvalue()
    data = json.loads(js.read_text(encoding="utf-8"))
    assert len(data) == 2 * 4 * 2 and {r["horizon"] for r in data} == {1, 2}
    assert md.read_text(encoding="utf-8").count("\n| rpg-urkl |") == 2 * 4


@pytest.mark.parametrize("args,msg", [
    (["--horizons", "0"], "--horizons must be >= 1"),
    (["--horizons", "9"], "V^H <= 4096"),
    (["--vocab", "1"], "--vocab must be in 2..8"),
    (["--beta", "0"], "--beta must be a finite number > 0"),
    (["--max-ratio", "1"], "--max-ratio must be a finite number > 1"),
    (["--off-step", "nan"], "--off-step must be a finite number > 0"),
    (["--loss", "missing_file.py:fn"], "does not exist"),
    (["--loss", "no_colon"], "expected PATH.py:NAME"),
    (["--loss", "rpg_ref.core.losses:no_such_fn"], "has no attribute 'no_such_fn'"),
    (["--loss", "rpg_ref.core.losses:LOSSES"], "is not callable"),
    (["--loss", "rpg_ref.core.losses:check_beta"], "raised TypeError"),
    (["--loss", "no_such_pkg.mod:fn"], "importing no_such_pkg.mod failed"),
    (["--objective", "rpg_ref.core.losses:no_such_fn"], "has no attribute"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--only", "no-such-loss"], "no adapter name contains"),
    (["--json", "missing-dir/x.json"], "does not exist"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, msg):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        audit.main(args + ["--markdown", "t.md"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and msg in err and len(err.splitlines()) == 1
    assert not (tmp_path / "t.md").exists()


def test_readme_example_runs():
    """The README's "Audit your own loss" example runs as printed and finds the importance-weighted
    k3 term's objective: the per-position sum of KL(pi||ref), for every theta."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- audit-example -->\n```python\n(.*?)```", text, re.DOTALL)
    assert m, "README lost its <!-- audit-example --> block"
    code = m.group(1)
    assert len(code.strip().splitlines()) <= 12
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, PYTHONIOENCODING="utf-8"),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    ends = [
        x.rstrip().rsplit(" | ", 1)[1] for x in run.stdout.splitlines() if x.startswith("my-loss")
    ]
    assert sorted(ends) == ["0 (every D: 0)"] + ["Σt KL(π‖ref)"] * 3      # H = 3, the four settings


def test_every_relative_error_is_finite(rows):
    assert all(
        math.isfinite(e)
        for r in rows
        for e in itertools.chain([r["reward_rel_err"]], r["kl_errs"].values())
    )


# ---------------------------------------------------------------------------
# precision, combinations, user objectives, user losses from the command line, policies
# ---------------------------------------------------------------------------

def _urkl(lp, o, r, a, m):
    return LOSSES["rpg-urkl"](lp, o, a, m, beta=0.5, ref_logp=r, agg="seq-mean-token-sum")[0]


def _as(dtype):
    """The same loss computed in another precision (inputs cast, as `.float()` code does)."""
    return lambda lp, o, r, a, m: _urkl(
        lp.to(dtype), o.to(dtype), r.to(dtype), a.to(dtype), m.to(dtype)
    )


def test_float32_twin_is_judged_at_its_precision():
    """A float32 twin of a correct loss gets the float64 loss's verdicts, labelled with its
    precision and error (below the 1.2e-5 tolerance, above 1e-10), and passes the
    mean-over-responses check at
    that
    precision: no false diagnosis."""
    exact = audit.audit([audit.Adapter("f64", _urkl, 0.5, "t", True)], horizons=(1, 2), fit=False)
    low = audit.audit(
        [audit.Adapter("f32", _as(torch.float32), 0.5, "t", True)], horizons=(1, 2), fit=False
    )
    for r64, r32 in zip(exact, low):
        assert r32["precision"] == "float32" and r64["precision"] == "float64"
        assert r32["kl_matches"] == r64["kl_matches"] and r32["reward_exact"] == r64["reward_exact"]
        if r32["kl_matches"] and not r32["kl_all_zero"]:
            assert 1e-10 < r32["kl_match_err"] < 1.2e-5
            assert audit.kl_cell(r32).endswith(" at float32 precision")


def test_16bit_loss_is_refused_not_misdiagnosed():
    with pytest.raises(ValueError, match=r"computes in bfloat16.*too coarse"):
        audit.audit([audit.Adapter("bf16", _as(torch.bfloat16), 0.5, "t", True)], horizons=(1,))


def _k3_in_reward(lp, o, r, a, m):
    """k3(pi_ref/pi_old) in the reward, return-to-go, REINFORCE with per-token ratios (no clip)."""
    k3_old = torch.expm1(r - o) - (r - o)                                   # [B, H], constants
    # R - beta sum_{s>=t} k3_s
    a_tok = a[:, None] - 0.5 * (k3_old.flip(1).cumsum(1).flip(1))
    return (-torch.exp(lp - o) * a_tok * m).sum(1).mean()


def test_k3_in_the_reward_is_found_as_a_combination():
    """On-policy, E[sum_t grad log pi(y_t) sum_{s>=t} k3_s] with k3 frozen is grad E_pi[sum_t k3_t]
    = grad KL(pi||ref) - grad sum_t KL(ref||pi) (derived in audit_expectations.py): the fit finds
    exactly these coefficients (1, -1), the same on every draw, and no single candidate matches."""
    ad = audit.Adapter("k3-in-reward", _k3_in_reward, 0.5, "t", True)
    for r in audit.audit([ad], horizons=(2, 3)):
        if r["on_policy"] and not r["ref_is_old"]:
            assert not r["kl_matches"] and r["kl_combination"]["draws"] >= 4
            terms = r["kl_combination"]["terms"]
            assert set(terms) == {"seq-rkl", "tok-fkl"}
            assert abs(terms["seq-rkl"] - 1) < 1e-8 and abs(terms["tok-fkl"] + 1) < 1e-8
            assert r["kl_combination"]["equations"] >= 10 * r["kl_combination"]["unknowns"]


def _entropy_bonus(lp, o, r, a, m):
    """0.5 w log pi per token (w differentiable): E_old[w (1 + log pi) grad log pi] = grad sum_t
    E_{h ~ pi_old} sum_x pi log pi = -grad sum_t H(pi(.|h)): not a divergence from pi_ref."""
    return (0.5 * torch.exp(lp - o) * lp * m).sum(1).mean()


def _abs_k1(lp, o, r, a, m):
    """|log pi/pi_ref| per token (verl's abs): gradient sign(log rho) grad log pi, a divergence of
    no kind."""
    return (0.5 * (lp - r).abs() * m).sum(1).mean()


@pytest.mark.parametrize("fn", [_entropy_bonus, _abs_k1])
def test_a_non_kl_objective_is_never_a_combination(fn):
    """At V = 3, H = 1 the KL gradient of one draw has 2 dimensions, so one draw fits ANY vector
    with two candidates (checked below: the test can fail); with the same coefficients required on
    many draws
    the
    entropy bonus and |log rho| are reported as no combination in every setting and horizon."""
    ad = audit.Adapter(fn.__name__, fn, 0.5, "t", True)
    rows = audit.audit([ad], horizons=(1, 2, 3))
    assert all(
        r["kl_combination"] is None and not r["kl_matches"]
        for r in rows
        if r["kl_grad_norm"] > 1e-4
    )
    prob = audit.make_problem(audit.Setting(False, False), 1)
    cands = audit.candidate_grads(prob)
    A = torch.stack([0.5 * cands["seq-rkl"], 0.5 * cands["seq-fkl"]], 1)
    g = audit.expected_grad(ad, prob, torch.zeros_like(prob.R))
    coef = torch.linalg.lstsq(A, g[:, None]).solution
    # one draw: a spurious "fit"
    assert audit.rel_err(A @ coef[:, 0], g) < 1e-10


def _neg_entropy(logp, old, ref):
    """-sum_t E_{h ~ pi_old} H(pi(.|h)) over every response: sum_t sum_y pi_old(y without t)
    pi(y_t|h) log pi(y_t|h)."""
    # [N, H] log pi_old of the other tokens
    rest = old.sum(1, keepdim=True) - old
    return (rest.exp() * logp.exp() * logp).sum()


def test_user_objective_is_matched_for_every_theta():
    """The entropy bonus follows E[R] - beta * (-sum_t H) exactly, for every theta, once the user
    names it."""
    ad = audit.Adapter("entropy", _entropy_bonus, 0.5, "t", True)
    rows = audit.audit([ad], horizons=(1, 2, 3), objectives={"-Σt H(π)": _neg_entropy})
    assert all("user:-Σt H(π)" in r["kl_matches"] for r in rows)
    assert all(audit.kl_cell(r).startswith("-Σt H(π)") for r in rows if not r["kl_all_zero"])


def test_max_ratio_is_reached_exactly():
    """--max-ratio W: the largest per-token pi_theta/pi_old of the off-policy draws is W."""
    pol = audit.Policies(max_ratio=20.0, logit_scale=2.0)
    for h in (2, 3):
        p = audit.make_problem(audit.Setting(False, False), h, 0, pol)
        assert abs(audit.max_token_ratio(p.theta, p.old) - 20.0) < 1e-9
    with pytest.raises(
        ValueError, match=r"not reached by these policies \(at most 5.83 = 1 / the smallest"
    ):
        # one prefix: min pi_old = 0.17
        audit.make_problem(audit.Setting(False, False), 1, 0, pol)


def test_cli_audits_a_loss_file_and_a_module(tmp_path, monkeypatch, capsys):
    """`rpg-audit --loss FILE.py:NAME` and `--loss module:NAME` in one call each; --beta reaches the
    verdict; the JSON rows carry the expected-gradient vectors (KL part = beta grad D where
    matched)."""
    (tmp_path / "mine.py").write_text(
        "import torch\n"
        "def loss(logp, old_logp, ref_logp, advantages, mask):\n"
        "    w = torch.exp(logp - old_logp)\n"
        "    k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1\n"
        "    return ((-w * advantages[:, None] + 0.1 * w * k3) * mask).sum(1).mean()\n",
        encoding="utf-8",
    )
    js = tmp_path / "rows.json"
    assert audit.main(["--loss", f"{tmp_path / 'mine.py'}:loss", "--beta", "0.1", "--horizons", "2",
                       "--json", str(js)]) == 0
    rows = json.loads(js.read_text(encoding="utf-8"))
    assert [r["kl_matches"] for r in rows if not r["kl_all_zero"]] == [["tok-rkl"]] * 3
    for r in rows:
        if r["kl_matches"] == ["tok-rkl"]:
            assert (
                audit.rel_err(
                    torch.tensor(r["grad_kl_part"]), torch.tensor(r["kl_targets"]["tok-rkl"])
                )
                < 1e-10
            )
        assert len(r["grad_reward_part"]) == len(r["grad_reward_target"]) == 4 * 3
    monkeypatch.syspath_prepend(str(tmp_path))
    capsys.readouterr()
    assert audit.main(["--loss", "mine:loss", "--beta", "0.2", "--horizons", "2"]) == 0
    # told beta 0.2, the loss uses 0.1:
    out = capsys.readouterr().out
    assert "| Σt KL(π‖ref) |" not in out and "0.5·Σt KL(π‖ref) (same coefficients on" in out


NO_GRADIENT = {
    "no_grad": "import torch\n@torch.no_grad()\n"
               "def loss(logp, old_logp, ref_logp, advantages, mask):\n"
               "    return (-(logp - old_logp).exp() * advantages[:, None]).sum(1).mean()\n",
    "detached": "def loss(logp, old_logp, ref_logp, advantages, mask):\n"
                "    return (-logp.detach() * advantages[:, None]).sum(1).mean()\n",
    "zero": "def loss(logp, old_logp, ref_logp, advantages, mask):\n"
            "    return (0 * logp).sum(1).mean()\n",
}


@pytest.mark.parametrize("kind", sorted(NO_GRADIENT))
def test_cli_loss_without_gradient_is_one_line(tmp_path, capsys, kind):
    """A loss with no gradient with respect to logp (no_grad, detached, or multiplied by 0) is
    said to have none, in one line (exit 2), instead of a verdict table."""
    (tmp_path / "nograd.py").write_text(NO_GRADIENT[kind], encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        audit.main(["--loss", f"{tmp_path / 'nograd.py'}:loss", "--horizons", "1"])
    err = capsys.readouterr()
    assert e.value.code == 2 and err.out == ""
    assert "the loss has no gradient with respect to logp" in one_line_of(err.err)


# user losses that fail on some batch only: each must end in one line naming the loss, the batch's
# shape and what came back (3 tokens, H = 3: the first batch is all 27 responses; then one response
# at a time, the mean-over-responses check)
HEAD = "import torch\ndef loss(logp, old_logp, ref_logp, advantages, mask):\n"
PG = "    out = -(torch.exp(logp - old_logp) * advantages[:, None] * mask).sum(1).mean()\n"
FAILING = {
    "nan-on-larger-batches": (PG + "    return out * float('nan') if len(logp) > 2 else out\n",
                              r"returned nan on a \[27, 3\] batch"),
    "nan-on-one-response": (PG + "    return out * float('nan') if len(logp) == 1 else out\n",
                            r"returned nan on a \[1, 3\] batch"),
    "raises-on-longer": ("    if logp.shape[1] > 2:\n"
                         "        raise ValueError('only short sequences supported')\n" + PG
                         + "    return out\n",
                         r"raised ValueError on a \[27, 3\] batch .*: only short sequences "
                         r"supported$"),
    "infinite-gradient": (PG + "    return out + torch.sqrt(logp - logp.detach()).sum(1).mean()\n",
                          r"returned -?\d\S* but its gradient holds -?inf on a \[27, 3\] batch"),
    "nan-on-the-probe": ("    return (logp * float('nan')).sum(1).mean()\n",
                         r": returned nan on a finite \[2, 2\] batch$"),
}


@pytest.mark.parametrize("kind", sorted(FAILING))
def test_cli_loss_failing_on_some_batch_is_one_line(tmp_path, capfd, kind):
    """A user's loss that returns NaN or a non-finite gradient, or raises, on some batch only: one
    line naming --loss, the batch's shape and what it returned (exit 2, nothing on stdout), and
    neither a torch warning nor a linear-algebra library's error on the way."""
    body, want = FAILING[kind]
    (tmp_path / "mine.py").write_text(HEAD + body, encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as e:
            audit.main(["--loss", f"{tmp_path / 'mine.py'}:loss"])
    err = capfd.readouterr()
    assert e.value.code == 2 and err.out == "" and not caught, (err, caught)
    line = one_line_of(err.err).strip()
    assert line.startswith(f"rpg-audit: error: --loss {tmp_path / 'mine.py'}:loss"), line
    assert re.search(want, line), line
    assert not re.search("torch|oneMKL|INTERNAL|report a bug", line, re.IGNORECASE), line


# a loss that changes an input in place: named as such, not as a batch-coupled aggregation
MUTATING = {"advantages": "    advantages += 1\n", "ref_logp": "    ref_logp.add_(0.1)\n",
            "mask": "    mask.mul_(2)\n"}


@pytest.mark.parametrize("name", sorted(MUTATING))
def test_cli_loss_changing_an_input_in_place_is_named(tmp_path, capsys, name):
    """A --loss that changes one of its inputs in place is told so in one line naming the input and
    the fix (exit 2), not that it aggregates wrongly."""
    (tmp_path / "mine.py").write_text(HEAD + MUTATING[name] + PG + "    return out\n",
                                      encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        audit.main(["--loss", f"{tmp_path / 'mine.py'}:loss", "--horizons", "1"])
    err = capsys.readouterr()
    line = one_line_of(err.err).strip()
    assert e.value.code == 2 and err.out == "", err
    assert f"changed {name} in place" in line and f"`{name} = {name} + 1`" in line, line
    assert "aggregat" not in line and "mean of its responses" not in line, line


def test_audit_names_a_loss_that_changes_its_inputs_on_some_batch_only():
    """From Python (no probe call first): a loss changing the advantages in place on batches of
    more than 2 responses only raises LossFailed naming the input, before any verdict."""
    def loss(logp, old_logp, ref_logp, advantages, mask):
        if len(logp) > 2:
            advantages += 1
        return -(torch.exp(logp - old_logp) * advantages[:, None] * mask).sum(1).mean()

    with pytest.raises(audit.LossFailed, match=r"^mine: changed advantages in place on a \[9, 2\]"):
        audit.audit([audit.Adapter("mine", loss, 0.1, "mine", True)], horizons=(2,))


def test_audit_names_the_adapter_whose_loss_fails():
    """From Python: audit() raises LossFailed (a ValueError) naming the adapter and the shape."""
    def loss(logp, old_logp, ref_logp, advantages, mask):
        out = -(torch.exp(logp - old_logp) * advantages[:, None] * mask).sum(1).mean()
        return out * float("nan") if len(logp) > 2 else out

    with pytest.raises(audit.LossFailed, match=r"^mine: returned nan on a \[9, 2\] batch"):
        audit.audit([audit.Adapter("mine", loss, 0.1, "mine", True)], horizons=(2,))


def test_cli_slow_loss_prints_where_it_is(tmp_path, capsys, monkeypatch):
    """A slow loss: the audit names the stage it is at (stderr) every Ticker.EVERY seconds; here
    0.3 s, with a loss taking 0.05 s a call."""
    (tmp_path / "slow.py").write_text(
        "import time\n"
        "def loss(logp, old_logp, ref_logp, advantages, mask):\n"
        "    time.sleep(0.05)\n"
        "    return (-(logp - old_logp).exp() * advantages[:, None]).sum(1).mean()\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(audit_cli.Ticker, "EVERY", 0.3)
    assert audit.main(["--loss", f"{tmp_path / 'slow.py'}:loss", "--horizons", "1", "2",
                       "--no-fit"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    stage = r"(case [1-8] of 8 \(θ [=≠] θ_old, π_ref [=≠] π_old, H=[12]\)|checking that .*)"
    # at least one: the mean-over-responses check alone sleeps 10 x 0.05 s before the first case
    assert lines and all(re.fullmatch(f"rpg-audit: loss: {stage}; \\d+ s so far", x)
                         for x in lines), lines


def one_line_of(err: str) -> str:
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_cli_unreachable_ratio_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        audit.main(["--only", "rpg-urkl", "--horizons", "1", "--max-ratio", "1e6"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "is not reached" in err and len(err.splitlines()) == 1


def test_worked_example_in_docs():
    """docs/audit.md's single-token example: pi = (1/2, 1/2) on-policy, pi_ref = (0.8, 0.2), beta =
    1/2. k3 as a loss: beta (pi - pi_ref) = (-0.15, 0.15) = beta grad KL(ref||pi); w k3: beta grad
    KL(pi||ref) = (-0.173287, 0.173287); k1: (0, 0). Numbers computed by hand in the doc, checked to
    1e-6."""
    theta = torch.zeros(1, 2, dtype=torch.float64)
    ref = torch.log(torch.tensor([[0.8, 0.2]], dtype=torch.float64))
    prob = audit.Problem(
        Autoregressive(2, 1), theta, theta, ref, torch.zeros(2, dtype=torch.float64)
    )
    by = {a.name: a for a in ADAPTERS}
    want = {
        "verl kl_loss_type=low_var_kl": [-0.15, 0.15],
        "DeepSeek-V3.2 KL term": [-0.173287, 0.173287],
        "verl kl_loss_type=kl": [0.0, 0.0],
    }
    for name, w in want.items():
        g = audit.expected_grad(by[name], prob, torch.zeros(2, dtype=torch.float64))
        assert torch.allclose(g, torch.tensor(w, dtype=torch.float64), atol=1e-6, rtol=0), (name, g)
    cands = audit.candidate_grads(prob)
    assert torch.allclose(
        0.5 * cands["seq-fkl"], torch.tensor([-0.15, 0.15], dtype=torch.float64), atol=1e-12
    )
    assert torch.allclose(
        0.5 * cands["seq-rkl"], torch.tensor([-0.173287, 0.173287], dtype=torch.float64), atol=1e-6
    )
