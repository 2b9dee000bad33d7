"""Rules about a loss's options, each stated once (rpg_ref/core/loss_spec.py: parse_clip,
check_beta; rpg_ref.core.losses.resolve_options, the one entry point) and called by the losses
themselves, the trainer's config and the verl and TRL plugins. One test per rule; every refusal is a
one-line ValueError that names the bad value. A trainer resolves the options once and passes the
LossOptions to every call; a library call's keywords are resolved on each call."""

import math
import re

import pytest
import torch

import rpg_ref.core.losses as L
from rpg_ref.core.advantages import reinforce_pp

RPG = [n for n in L.LOSSES if L.SPECS[n].family != "baseline"]
PPO = [n for n in L.LOSSES if L.SPECS[n].family == "baseline"]


def _refused(match, fn, *args, **kw):
    with pytest.raises(ValueError, match=match) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value), "messages are one line (a CLI prints them as is)"
    return str(e.value)


def test_parse_clip_normalizes_numbers_and_strings():
    """(eps_low, eps_high[, c]) as numbers or strings -> floats; c None, 'inf' or absent -> None."""
    assert L.parse_clip(None) is None
    assert L.parse_clip((0.2, 0.28)) == (0.2, 0.28, None)
    assert L.parse_clip([0.2, 0.28, 3]) == (0.2, 0.28, 3.0)
    assert L.parse_clip(["0.1", "0.3", "10"]) == (0.1, 0.3, 10.0)
    for c in (None, "inf", float("inf"), math.inf):
        assert L.parse_clip((0.2, 0.28, c)) == (0.2, 0.28, None)
    assert all(type(v) is float for v in L.parse_clip(("0.1", 1, 2)))


@pytest.mark.parametrize("clip,match", [
    ((0.2,), r"clip must be \(eps_low, eps_high\) or \(eps_low, eps_high, c\), got \(0.2,\)"),
    ((0.2, 0.2, 3, 4), "clip must be"),
    ("0.2 0.28", "clip must be"),
    (0.2, "clip must be"),
    (("abc", 0.2), "clip eps_low must be a number .*got 'abc'"),
    ((0.2, None), "clip eps_high must be a number .*got None"),
    ((0.2, 0.2, "x"), "clip c must be a number .*got 'x'"),
])
def test_parse_clip_refuses_malformed_clip(clip, match):
    """A clip that is not 2 or 3 numbers is refused, naming the bad value."""
    _refused(match, L.parse_clip, clip)


@pytest.mark.parametrize("eps_low", [0.0, -0.1, 1.0, 1.5, float("nan")])
def test_parse_clip_eps_low_in_open_unit_interval(eps_low):
    """0 < eps_low < 1: the lower ratio bound 1 - eps_low must be positive."""
    _refused(rf"clip eps_low must be in \(0, 1\).*got {eps_low}", L.parse_clip, (eps_low, 0.2))


@pytest.mark.parametrize("eps_high", [0.0, -0.1, float("inf"), float("nan")])
def test_parse_clip_eps_high_positive_finite(eps_high):
    """0 < eps_high < inf."""
    _refused(
        rf"clip eps_high must be > 0 and finite, got {eps_high}", L.parse_clip, (0.2, eps_high)
    )


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0, float("nan")])
def test_parse_clip_dual_bound_above_one(c):
    """c > 1 (None or inf: no dual bound)."""
    _refused(
        rf"dual-clip c must be > 1 \(None or inf: no dual bound\), got {c}",
        L.parse_clip,
        (0.2, 0.2, c),
    )


def test_resolve_options_unknown_loss_lists_valid_names():
    msg = _refused("unknown loss 'ppo-foo'; valid names: ", L.resolve_options, "ppo-foo", beta=0.0)
    assert all(n in msg for n in L.LOSSES)


@pytest.mark.parametrize("beta", [-0.1, float("nan"), float("inf"), True, "0.1", None])
def test_resolve_options_beta_finite_nonnegative_number(beta):
    _refused(r"beta must be a finite number >= 0, got", L.resolve_options, "rpg-urkl", beta=beta)


def test_resolve_options_beta_zero_for_dapo():
    """dapo has no KL term: a beta > 0 is refused instead of ignored."""
    _refused("dapo has no KL term; got beta=0.1: use beta=0", L.resolve_options, "dapo", beta=0.1)
    L.resolve_options("dapo", beta=0.0)


@pytest.mark.parametrize("name", ["reinforce++", "reinforce++-baseline"])
def test_resolve_options_beta_zero_for_kl_in_reward(name):
    """reinforce++ puts the KL into the reward: the loss takes beta = 0, beta goes to the
    advantage."""
    _refused(
        re.escape(
            f"{name} puts its k1 KL penalty into the reward: pass beta to "
            "rpg_ref.core.advantages.reinforce_pp and call the loss with beta=0; got beta=0.1"
        ),
        L.resolve_options,
        name,
        beta=0.1,
    )
    L.resolve_options(name, beta=0)


def test_resolve_options_checks_clip():
    """resolve_options refuses what parse_clip refuses (the same message)."""
    _refused("clip eps_low must be in", L.resolve_options, "rpg-urkl", beta=0.1, clip=(0.0, 0.2))
    L.resolve_options("rpg-urkl", beta=0.1, clip=("0.2", "0.28", "inf"))


def test_resolve_options_no_clip_with_clip():
    _refused(r"clip \(0.2, 0.2\) and no_clip together: give one of them", L.resolve_options,
             "rpg-urkl", beta=0.1, clip=(0.2, 0.2), no_clip=True)


@pytest.mark.parametrize("name", PPO)
def test_resolve_options_no_clip_refused_for_ppo_losses(name):
    """PPO-type losses always clip (clip=None means their default clip): no_clip is refused."""
    assert L.SPECS[name].always_clips
    _refused(
        re.escape(f"no_clip: {name} is a PPO-type loss that always clips"),
        L.resolve_options,
        name,
        beta=0.0,
        no_clip=True,
    )


@pytest.mark.parametrize("name", RPG)
def test_resolve_options_no_clip_allowed_for_rpg_losses(name):
    assert not L.SPECS[name].always_clips
    L.resolve_options(name, beta=0.1, no_clip=True)


def test_resolve_options_level_and_agg_in_their_lists():
    _refused(r"level must be one of \('token', 'sequence'\), got 'word'", L.resolve_options,
             "rpg-urkl", beta=0.1, level="word")
    _refused(r"agg must be one of \('token-mean', .*got 'mean'", L.resolve_options, "rpg-urkl",
             beta=0.1, agg="mean")
    for level in L.LEVELS:
        for agg in L.AGGREGATIONS:
            L.resolve_options("rpg-urkl", beta=0.1, level=level, agg=agg)


@pytest.mark.parametrize("name", L.LOSSES)
def test_resolve_options_sequence_level_refused_for_token_advantages(name):
    """Losses with token-level advantages (KL in the reward) cannot run at level='sequence'."""
    if L.SPECS[name].kl_in_reward:
        _refused(re.escape(f"{name} has token-level advantages and cannot run at level='sequence'"),
                 L.resolve_options, name, beta=0.0, level="sequence")
    else:
        L.resolve_options(name, beta=0.1 if L.SPECS[name].has_kl else 0.0, level="sequence")


def test_losses_call_resolve_options():
    """The losses refuse their bad options with resolve_options' messages, before any work."""
    z, one = torch.zeros(1, 1), torch.ones(1, 1)
    for name, kw in [("reinforce++", dict(level="sequence")), ("dapo", dict(beta=0.1)),
                     ("rpg-rkl", dict(clip=(0.2, 0.2, 1.0))), ("grpo", dict(agg="sum"))]:
        want = _refused(".", L.resolve_options, name, **{"beta": 0.0, **kw})
        assert _refused(".", L.get_loss(name), z, z, torch.zeros(1), one, **kw) == want


@pytest.mark.parametrize("beta", [-1.0, float("nan"), float("inf"), True])
def test_beta_rule_is_shared_with_the_reward_kl(beta):
    """rpg_ref.core.advantages.reinforce_pp (the KL in the reward) refuses beta with the same
    rule."""
    want = _refused(".", L.check_beta, beta)
    got = _refused(
        ".", reinforce_pp, torch.ones(2), torch.ones(2, 3), torch.zeros(2, 3), None, beta
    )
    assert got == want


def test_every_loss_accepts_a_runs_beta():
    """A run's beta (the paper's 1e-3, or 0 for dapo, which has no KL) is accepted by every loss
    with its default options; as the loss's own beta (run=False) reinforce++ refuses it."""
    for name in L.LOSSES:
        beta = 1e-3 if L.SPECS[name].has_kl else 0.0
        L.resolve_options(name, beta=beta, run=True)
        if L.SPECS[name].kl_in_reward:
            _refused("puts its k1 KL penalty into the reward", L.resolve_options, name, beta=beta)


def test_a_runs_beta_goes_to_the_reward_or_to_the_loss():
    """A run's beta goes to the reward where the loss puts its KL there (reinforce++:
    reward_beta), else to the loss; the clip resolves to bounds, the loss's default without one.
    A bad run beta is refused here too: for reinforce++ it would otherwise reach the advantages
    unchecked."""
    o = L.resolve_options("reinforce++", beta=0.3, run=True)
    assert (o.beta, o.reward_beta, o.bounds) == (0.0, 0.3, (0.8, 1.2, None))
    o = L.resolve_options("rpg-reinforce-urkl", beta=0.3, clip=["0.2", "0.28", "3"],
                          agg="seq-mean-token-sum", run=True)
    assert (o.loss, o.beta, o.reward_beta) == ("rpg-reinforce-urkl", 0.3, 0.0)
    assert o.bounds == (1 - 0.2, 1 + 0.28, 3.0) and o.agg == "seq-mean-token-sum"
    assert L.resolve_options("rpg-urkl", beta=0.3, no_clip=True, run=True).bounds is None
    assert L.resolve_options("rpg-urkl", beta=0.3) == L.resolve_options("rpg-urkl", beta=0.3,
                                                                        run=True)
    _refused("beta must be a finite number >= 0, got -1.0", L.resolve_options, "reinforce++",
             beta=-1.0, run=True)
    _refused("beta must be a finite number >= 0, got nan", L.resolve_options, "reinforce++",
             beta=float("nan"), run=True)


def test_options_are_resolved_once_per_run_and_per_call_otherwise(monkeypatch):
    """Given a LossOptions (the trainer's path), a call resolves nothing; given loose keywords
    (a library call), every call resolves them. The result is the same either way, bit for
    bit."""
    calls = []
    real = L.resolve_options
    monkeypatch.setattr(L, "resolve_options", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(3, 4, generator=g), -torch.rand(3, 4, generator=g)
    adv, mask = torch.randn(3, generator=g), torch.ones(3, 4)
    kw = dict(beta=0.1, clip=[0.2, 0.28, 3.0], agg="seq-mean-token-mean")
    opts = L.resolve_options("rpg-reinforce-ufkl", **kw)
    assert len(calls) == 1
    fn = L.get_loss("rpg-reinforce-ufkl")
    with_opts = [fn(logp, old, adv, mask, options=opts)[0] for _ in range(3)]
    assert len(calls) == 1
    loose = [fn(logp, old, adv, mask, **kw)[0] for _ in range(3)]
    assert len(calls) == 4
    assert all(torch.equal(a, with_opts[0]) for a in with_opts + loose)


def test_options_of_another_loss_or_with_keywords_refused():
    """options= is a LossOptions resolved for this very loss, and comes alone."""
    z, one = torch.zeros(1, 1), torch.ones(1, 1)
    opts = L.resolve_options("rpg-urkl", beta=0.1)
    _refused("rpg-fkl: options must be a LossOptions resolved for rpg-fkl .*loss='rpg-urkl'",
             L.get_loss("rpg-fkl"), z, z, torch.zeros(1), one, options=opts)
    _refused("rpg-fkl: options must be a LossOptions", L.get_loss("rpg-fkl"), z, z, torch.zeros(1),
             one, options={"beta": 0.1})
    _refused("rpg-urkl: give options", L.get_loss("rpg-urkl"), z, z, torch.zeros(1), one,
             options=opts, beta=0.2)


def test_loss_options_are_frozen():
    """A LossOptions cannot change after it was checked."""
    opts = L.resolve_options("rpg-urkl", beta=0.1)
    with pytest.raises(AttributeError):
        opts.beta = 1.0
