"""The fused (torch.compile) loss kernel against the eager one, and the switch between them.

Large inputs run rpg_ref.core.losses_fused.loss_kernel traced by torch.compile; small ones and
RPG_REF_COMPILE=0 run the same function op by op (tests/test_losses_reference.py compares that
with the reference). The two must agree to float rounding on
values, gradients and statistics, and bad data must be refused the same way. Each case
compiles one specialization (a few seconds on CPU), so the cases are few and chosen to cover
every branch of the kernel: each family, clipping with and without dual clip, pi_ref != pi_old,
the sequence level and every aggregation.
"""

import pytest
import torch

import rpg_ref.core.losses as L
import rpg_ref.core.losses_fused as F

B, T = 8, 48

CASES = [  # (loss, kwargs)
    ("rpg-urkl", dict(beta=0.3, clip=(0.2, 0.28, 3.0), use_ref=True, agg="token-mean")),
    ("rpg-fkl", dict(beta=0.3, clip=(0.2, 0.28, 3.0), use_ref=False, agg="seq-mean-token-mean")),
    (
        "rpg-reinforce-ufkl",
        dict(beta=0.3, clip=(0.2, 0.28, 3.0), use_ref=True, agg="seq-mean-token-sum"),
    ),
    (
        "rpg-reinforce-rkl",
        dict(beta=0.3, clip=None, use_ref=True, agg="token-mean", level="sequence"),
    ),
    ("grpo", dict(beta=0.1, clip=None, use_ref=True, agg="token-mean")),
]


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    # ratios well inside and outside the clip range
    old = logp + 0.5 * torch.randn(B, T, generator=g, dtype=dtype)
    ref = logp + 0.5 * torch.randn(B, T, generator=g, dtype=dtype)
    adv = torch.randn(B, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return logp, old, ref, adv, mask


def _run(name, kw, logp, old, ref, adv, mask):
    kw = dict(kw)
    use_ref = kw.pop("use_ref")
    x = logp.clone().requires_grad_(True)
    loss, stats = L.get_loss(name)(x, old, adv, mask, ref_logp=ref if use_ref else None, **kw)
    loss.backward()
    return loss.detach(), x.grad, stats


@pytest.fixture
def fuse_everything(monkeypatch):
    """Fuse every input size (the tests' tensors are below FUSE_MIN_NUMEL); start with no
    compiled wrapper so a test can see whether the fused path was taken."""
    monkeypatch.setattr(F, "FUSE_MIN_NUMEL", 0)
    monkeypatch.setattr(F, "_COMPILED", {})


@pytest.mark.parametrize(
    "name,kw", CASES, ids=[c[0] + "-" + c[1].get("level", "token") for c in CASES]
)
def test_fused_kernel_matches_eager(name, kw, monkeypatch, fuse_everything):
    """Value, gradient and every statistic of the fused kernel equal the eager kernel's (float64,
    1e-12)."""
    data = _inputs(torch.float64)
    monkeypatch.setenv("RPG_REF_COMPILE", "0")
    want = _run(name, kw, *data)
    assert F._COMPILED == {}, "RPG_REF_COMPILE=0 must not compile"
    monkeypatch.setenv("RPG_REF_COMPILE", "1")
    got = _run(name, kw, *data)
    assert "kernel" in F._COMPILED, "RPG_REF_COMPILE=1 did not take the fused path"
    for what, a, b in (("loss", got[0], want[0]), ("grad", got[1], want[1])):
        err = (a - b).abs().max().item()
        assert err <= 1e-12 * (1 + b.abs().max().item()), (
            f"{name} {what}: fused vs eager max diff {err:.3e}"
        )
    assert got[2].keys() == want[2].keys()
    for k in want[2]:
        assert abs(got[2][k].item() - want[2][k].item()) <= 1e-12, (
            name,
            k,
            got[2][k].item(),
            want[2][k].item(),
        )
    # the case must exercise clipping where it is on, or the comparison proves little
    if kw["clip"] is not None:
        assert want[2]["clip_frac_low"] > 0 and want[2]["clip_frac_high"] > 0, want[2]


def test_fused_kernel_refuses_bad_data_by_name(monkeypatch, fuse_everything):
    """Non-finite values, a non-0/1 mask and empty rows raise the same ValueErrors when fused."""
    monkeypatch.setenv("RPG_REF_COMPILE", "1")
    name, kw = CASES[0]
    logp, old, ref, adv, mask = _inputs(torch.float64)
    _run(name, kw, logp, old, ref, adv, mask)                 # compiles once
    bad_old = old.clone()
    bad_old[2, 5] = float("nan")
    with pytest.raises(ValueError, match=r"old_logp has non-finite values at index \(2, 5\)"):
        _run(name, kw, logp, bad_old, ref, adv, mask)
    bad_ref = ref.clone()
    bad_ref[1, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"ref_logp has non-finite values at index \(1, 0\)"):
        _run(name, kw, logp, old, bad_ref, adv, mask)
    bad_mask = mask.double()
    bad_mask[0, 0] = 0.5
    with pytest.raises(ValueError, match="mask must contain only 0 and 1"):
        _run(name, kw, logp, old, ref, adv, bad_mask)
    empty = mask.clone()
    empty[3] = False
    with pytest.raises(ValueError, match="mask row 3 has no tokens"):
        _run(name, kw, logp, old, ref, adv, empty)


def test_fusion_switch(monkeypatch, fuse_everything):
    """RPG_REF_COMPILE: an unknown value is refused; =1 refuses a device it cannot fuse on;
    auto warns once and runs eagerly (same numbers)."""
    data = _inputs(torch.float32)
    name, kw = CASES[4]
    monkeypatch.setenv("RPG_REF_COMPILE", "yes")
    with pytest.raises(ValueError, match="RPG_REF_COMPILE must be auto, 0 or 1, got 'yes'"):
        _run(name, kw, *data)

    monkeypatch.setattr(F, "_fusion_unavailable", lambda device_type: "no compiler in this test")
    monkeypatch.setattr(F, "_NO_FUSION", {})
    monkeypatch.setenv("RPG_REF_COMPILE", "1")
    with pytest.raises(RuntimeError, match="cannot be fused on cpu: no compiler in this test"):
        _run(name, kw, *data)

    monkeypatch.setattr(F, "_NO_FUSION", {})
    monkeypatch.setenv("RPG_REF_COMPILE", "auto")
    with pytest.warns(UserWarning, match="cannot fuse the loss kernel on cpu"):
        got = _run(name, kw, *data)
    monkeypatch.setenv("RPG_REF_COMPILE", "0")
    want = _run(name, kw, *data)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_small_inputs_run_eagerly(monkeypatch):
    """Below FUSE_MIN_NUMEL nothing is compiled, whatever RPG_REF_COMPILE says."""
    calls = []
    monkeypatch.setattr(F, "_COMPILED", {"kernel": lambda *a: calls.append(1)})
    monkeypatch.setenv("RPG_REF_COMPILE", "1")
    logp, old, ref, adv, mask = _inputs(torch.float32)
    assert logp.numel() < F.FUSE_MIN_NUMEL
    _run("rpg-urkl", dict(beta=0.1, clip=None, use_ref=False), logp, old, ref, adv, mask)
    assert calls == []
