"""The fast path answers to the specification.

rpg_ref/core/losses.py writes every loss as the paper writes it and differentiates it by autograd
(impl="reference"); rpg_ref/core/losses_fused.py computes the same loss, its gradient in closed form
and its statistics in one kernel (impl="fused", the default). Here the two are compared value by
value, gradient by gradient and statistic by statistic (float64, 1e-12) for every loss x clip
setting x reference setting x level x aggregation, on inputs where every clip branch is taken
(asserted).
"""

import inspect
import itertools
import math
import zlib

import pytest
import torch

import rpg_ref.core.losses as L
import rpg_ref.core.losses_fused as F

pytestmark = pytest.mark.usefixtures("float64_default")

CLIPS = {"no-clip": None, "ppo-clip": (0.2, 0.28), "dual-clip": (0.2, 0.28, 3.0)}
CASES = list(itertools.product(L.LOSSES, CLIPS, ["ref=old", "ref!=old"], L.LEVELS, L.AGGREGATIONS))
TOL = 1e-12


def _inputs(level, seed, log_ratio_scale=1.0):
    """Unit ratios w from ~0.17 to ~6 (either side of 1 -/+ eps and beyond c = 3) with advantages
    of both signs at every ratio, ragged rows. At sequence level a unit's log-ratio is the sum
    over its tokens: the per-response log-ratios run over a grid, spread evenly over the tokens."""
    g = torch.Generator().manual_seed(seed)
    B, T = 48, 6
    logp = -torch.rand(B, T, generator=g) * 2 - 0.05
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    ref = logp - 0.8 * (2 * torch.rand(B, T, generator=g) - 1)
    if level == "token":
        log_w = 1.8 * (2 * torch.rand(B, T, generator=g) - 1)
        adv = torch.randn(B, T, generator=g)
    else:
        log_w = torch.linspace(-1.8, 1.8, B)[:, None] / lengths[:, None] * torch.ones(B, T)
        adv = (-1.0) ** torch.arange(B) * (0.5 + torch.randn(B, generator=g).abs())
    return logp, logp - log_ratio_scale * log_w, ref, adv, mask
def _run(name, impl, logp, old, ref, adv, mask, **kw):
    x = logp.clone().requires_grad_(True)
    loss, stats = L.get_loss(name)(x, old, adv, mask, ref_logp=ref, impl=impl, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad, stats


def _assert_same(name, got, want):
    for what, a, b in (("loss", got[0], want[0]), ("grad", got[1], want[1])):
        err = (a - b).abs().max().item()
        assert err <= TOL * (1 + b.abs().max().item()), (
            f"{name} {what}: fused vs reference {err:.3e}"
        )
    assert got[2].keys() == want[2].keys()
    for k, v in want[2].items():
        assert abs(got[2][k].item() - v.item()) <= TOL * (1 + abs(v.item())), (
            name,
            k,
            got[2][k],
            v,
        )


@pytest.mark.parametrize("name,clip,ref,level,agg", CASES, ids=["-".join(c) for c in CASES])
def test_fused_kernel_equals_reference(name, clip, ref, level, agg):
    """Loss, d loss / d logp and every statistic of impl="fused" equal impl="reference" to 1e-12,
    and each clip branch the setting has (low, high, dual) is taken by some unit."""
    logp, old, ref_logp, adv, mask = _inputs(
        level, seed=zlib.crc32(f"{name}{clip}{ref}{level}{agg}".encode())
    )
    data = dict(old=old, ref=None if ref == "ref=old" else ref_logp, adv=adv, mask=mask)
    kw = dict(
        beta=L.loss_beta(name, L.default_beta(name, 0.3)), clip=CLIPS[clip], level=level, agg=agg
    )
    if level == "sequence" and L.SPECS[name].kl_in_reward:
        with pytest.raises(ValueError, match="token-level advantages"):
            _run(name, "reference", logp, **data, **kw)
        return
    want = _run(name, "reference", logp, **data, **kw)
    _assert_same(name, _run(name, "fused", logp, **data, **kw), want)
    eps = L.parse_clip(CLIPS[clip] or L.SPECS[name].default_clip)
    fracs = [want[2][f"clip_frac_{k}"].item() for k in ("low", "high", "dual")]
    expect = [eps is not None, eps is not None, eps is not None and eps[2] is not None]
    assert [f > 0 for f in fracs] == expect, (name, clip, fracs)


CLAMP_CASES = [(name, level, ref) for name in L.LOSSES for level in L.LEVELS
               for ref in ("ref=old", "ref!=old")
               # refused (tested above)
               if not (level == "sequence" and L.SPECS[name].kl_in_reward)]


@pytest.mark.parametrize("name,level,ref", CLAMP_CASES)
def test_fused_kernel_equals_reference_at_the_clamp(name, level, ref):
    """Log-ratios beyond +-LOG_RATIO_CLAMP, clamped for log w but not for log rho (pi_ref !=
    pi_old, so u != w / rho there): both implementations saturate the same way (value and
    gradient at the clamp), with the dual clip on."""
    logp, old, ref_logp, adv, mask = _inputs(level, seed=3, log_ratio_scale=30.0)
    unit_log_w = (logp - old) if level == "token" else ((logp - old) * mask).sum(1)
    assert unit_log_w.max() > L.LOG_RATIO_CLAMP and unit_log_w.min() < -L.LOG_RATIO_CLAMP
    kw = dict(beta=L.loss_beta(name, L.default_beta(name, 0.3)), clip=(0.2, 0.28, 3.0), level=level)
    data = dict(old=old, ref=None if ref == "ref=old" else ref_logp, adv=adv, mask=mask)
    _assert_same(
        name, _run(name, "fused", logp, **data, **kw), _run(name, "reference", logp, **data, **kw)
    )


def test_every_loss_is_registered_under_its_literal_name_with_a_kernel():
    """grep '"<name>"' rpg_ref/core/losses.py finds the decorator of each loss's definition, the
    name is a LossSpec built by keyword, and the fast path has a kernel for every registered
    loss."""
    source = inspect.getsource(L)
    for name in L.LOSSES:
        assert f'@register_loss("{name}",' in source, name
    assert F.FUSED_LOSSES == set(L.LOSSES)
    with pytest.raises(TypeError):
        L.LossSpec("x", "rpg", "group-mean", "")                    # keywords only


def test_a_loss_without_a_kernel_runs_the_reference(monkeypatch):
    """impl="fused" falls back to the reference for a registered loss with no kernel: the
    result then has the reference's exact second derivative (the kernel's raises)."""
    monkeypatch.setattr(L, "FUSED_LOSSES", F.FUSED_LOSSES - {"rpg-rkl"})
    logp = torch.tensor([[-1.0]], requires_grad=True)
    loss, _ = L.get_loss("rpg-rkl")(
        logp, torch.tensor([[-1.3]]), torch.tensor([0.7]), torch.ones(1, 1), beta=0.5
    )
    (g,) = torch.autograd.grad(loss, logp, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), logp)
    assert abs(h.item() - math.exp(0.3) * (0.5 * 2.3 - 0.7)) < 1e-12
