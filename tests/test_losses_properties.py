"""Property-based tests (hypothesis): finiteness under extreme inputs and input validation."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rpg_ref.core.losses as L

ALL = sorted(L.LOSSES)


def _beta_for(name, beta):
    """beta for a loss with a KL term of its own, else 0 (dapo, and reinforce++'s KL in the
    reward)."""
    return beta if L.SPECS[name].has_kl and not L.SPECS[name].kl_in_reward else 0.0


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(ALL),
    log_ratio=st.floats(-50, 50),
    ref_ratio=st.floats(-50, 50),
    adv=st.floats(-10, 10),
    beta=st.floats(0, 1),
    clip=st.sampled_from([None, (0.2, 0.28, 3.0), (0.1, 0.1, None)]),
    level=st.sampled_from(["token", "sequence"]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_finite_under_extreme_log_ratios(name, log_ratio, ref_ratio, adv, beta, clip, level, dtype):
    """Log-ratios up to +-50 (to pi_old and to pi_ref) give finite losses, gradients and stats."""
    if level == "sequence" and L.SPECS[name].kl_in_reward:
        level = "token"                                   # refused (test_losses_options.py)
    logp = torch.full((2, 3), -2.0, dtype=dtype, requires_grad=True)
    old = (logp.detach() - log_ratio).clone()
    ref = (logp.detach() - ref_ratio).clone()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    loss, stats = L.get_loss(name)(logp, old, torch.tensor([adv, -adv], dtype=dtype), mask,
                                   beta=_beta_for(name, beta), ref_logp=ref, clip=clip, level=level)
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss), (name, float(loss))
    assert torch.isfinite(g).all(), (name, g)
    for k, v in stats.items():
        assert torch.isfinite(v), (name, k, float(v))


def _args():
    lp = torch.zeros(2, 3, requires_grad=True)
    return dict(
        logp=lp, old_logp=torch.zeros(2, 3), advantages=torch.ones(2), mask=torch.ones(2, 3)
    )


def _call(name="rpg-urkl", **over):
    a = _args()
    kw = {
        k: over.pop(k)
        for k in list(over)
        if k in ("beta", "ref_logp", "clip", "level", "agg")
    }
    a.update(over)
    return L.get_loss(name)(a["logp"], a["old_logp"], a["advantages"], a["mask"], **kw)


BAD = [
    (dict(old_logp=torch.zeros(2, 4)), "old_logp shape"),
    (dict(mask=torch.ones(3, 3)), "mask shape"),
    (dict(advantages=torch.ones(3)), "advantages shape"),
    (dict(advantages=torch.ones(2, 2)), "advantages shape"),
    (dict(ref_logp=torch.zeros(2, 2)), "ref_logp shape"),
    (dict(logp=torch.zeros(2, 3, 1)), "logp must have"),
    (dict(mask=torch.full((2, 3), 0.5)), "mask must contain only 0 and 1"),
    (dict(mask=torch.tensor([[1.0, 1, 1], [0, 0, 0]])), "mask row 1 has no tokens"),
    (dict(beta=-0.1), "beta"),
    (dict(beta=float("nan")), "beta"),
    (dict(clip=(0.0, 0.2, 3.0)), "eps_low"),
    (dict(clip=(0.2, -0.1, 3.0)), "eps_high"),
    (dict(clip=(0.2, 0.2, 1.0)), "c must be > 1"),
    (dict(clip=(0.2,)), "clip must be"),
    (dict(level="word"), "level"),
    (dict(agg="mean"), "agg"),
    (dict(level="sequence", advantages=torch.ones(2, 3)), "level='sequence'"),
    (
        dict(logp=torch.tensor([[0.0, float("nan"), 0], [0, 0, 0]])),
        "logp has non-finite values at index \\(0, 1\\)",
    ),
    (dict(old_logp=torch.tensor([[0.0, 0, 0], [0, float("inf"), 0]])), "old_logp has non-finite"),
    (dict(advantages=torch.tensor([1.0, float("-inf")])), "advantages has non-finite"),
    (dict(ref_logp=torch.tensor([[0.0, 0, 0], [0, 0, float("nan")]])), "ref_logp has non-finite"),
    (dict(logp=[[0.0]]), "logp must be a torch.Tensor"),
    (
        dict(logp=torch.full((2, 3), 3e38), old_logp=torch.full((2, 3), -3e38)),
        r"logp has non-finite values \(entries too large to sum in torch.float32",
    ),
]


@pytest.mark.parametrize("bad,match", BAD, ids=[m for _, m in BAD])
@pytest.mark.parametrize("name", ["rpg-urkl", "rpg-reinforce-fkl", "grpo"])
def test_bad_input_raises_value_error(name, bad, match):
    """Every bad input gets a ValueError naming what is wrong."""
    with pytest.raises(ValueError, match=match):
        _call(name, **bad)


def test_non_finite_at_masked_position_still_raises():
    """Non-finite values are refused even where mask = 0 (they are never silently dropped)."""
    with pytest.raises(ValueError, match="logp has non-finite"):
        _call(logp=torch.tensor([[0.0, 0, -float("inf")], [0, 0, 0]]),
              mask=torch.tensor([[1.0, 1, 0], [1, 1, 1]]))


@pytest.mark.parametrize("name", ["dapo", "reinforce++", "reinforce++-baseline"])
def test_kl_free_losses_refuse_beta(name):
    """Losses without a KL term (or with the KL in the reward) refuse beta > 0 instead of ignoring
    it."""
    with pytest.raises(ValueError, match="beta"):
        _call(name, beta=0.1)


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 4), T=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_aggregations_match_manual_formula(B, T, seed):
    """agg weights: token-mean = sum/N_tok, seq-mean-token-mean = mean_i(sum_t/n_i),
    seq-mean-token-sum = mean_i sum_t; checked on the PPO term at w = 1 (= -A per token)."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = (torch.rand(B, T, generator=g) > 0.4).double()
    m[:, 0] = 1.0
    lp = torch.zeros(B, T, dtype=torch.float64)
    rows = [(-A[i] * m[i]).sum().item() for i in range(B)]
    n = [m[i].sum().item() for i in range(B)]
    want = {"token-mean": sum(rows) / sum(n),
            "seq-mean-token-mean": sum(r / k for r, k in zip(rows, n)) / B,
            "seq-mean-token-sum": sum(rows) / B}
    for agg, w in want.items():
        loss, _ = L.get_loss("dapo")(lp, lp, A, m, agg=agg)
        assert math.isclose(loss.item(), w, rel_tol=1e-12, abs_tol=1e-12), (agg, loss.item(), w)
