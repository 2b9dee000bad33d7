"""Per-sample oracle: rpg_ref.losses computes gradients in closed form; here every loss is
re-derived by autograd through its literal formula (written independently below, from the
paper's tables and algorithms) and compared value-by-value and gradient-by-gradient."""

import itertools
import math

import pytest
import torch

import rpg_ref.losses as L

pytestmark = pytest.mark.usefixtures("float64_default")
SG = torch.Tensor.detach


def oracle_unit_loss(name, logp, old, ref, A, clip, beta):
    """Per-unit loss by the literal formulas, differentiable through logp only."""
    lw, lr, lu = logp - old, logp - ref, ref - old
    w, rho, u = lw.exp(), lr.exp(), lu.exp()
    fam, div = (name.rsplit("-", 1) if name.startswith("rpg") else (name, None))
    d = {"fkl": -u * lr, "rkl": w * lr, "ufkl": u * (rho - 1 - lr), "urkl": w * (1 / rho - 1 + lr)}.get(div)

    def dual_clip(w, a):
        lo, hi, c = 1 - clip[0], 1 + clip[1], clip[2]
        lc = torch.maximum(-w * a, -w.clamp(lo, hi) * a)
        return torch.where(a < 0, torch.minimum(lc, -c * a), lc) if c is not None else lc

    if fam == "rpg":
        if clip is None:
            return -w * A + beta * d
        return dual_clip(w, A - beta * d / w)                       # A_hat = -L / w, differentiable
    if fam == "rpg-reinforce":
        h = {"fkl": -1 / rho, "ufkl": 1 - 1 / rho, "rkl": lr + 1, "urkl": lr}[div]
        c_kl = SG(-beta * w * h)
        weight = SG(w) * A + c_kl
        ell = -logp
        if clip is None:
            return weight * ell
        lo, hi, c = 1 - clip[0], 1 + clip[1], clip[2] if clip[2] is not None else math.inf
        wv = SG(w)
        psi = weight * SG(ell)
        if psi >= 0:
            return weight * ell if wv < hi else (A * hi + c_kl) * SG(ell)
        if wv <= lo:
            return (A * lo + c_kl) * SG(ell)
        return weight * ell if wv < c else (A * c + c_kl) * SG(ell)
    clip = clip or L.SPECS[name].default_clip
    base = dual_clip(w, A)
    k3_ref = 1 / rho - 1 + lr
    if name == "grpo":
        return base + beta * k3_ref
    if name == "grpo-corrected":
        return base + beta * w * k3_ref
    return base


CASES = list(itertools.product(sorted(L.LOSSES), [None, (0.2, 0.28, 3.0), (0.1, 0.1, None)],
                               [False, True]))


@pytest.mark.parametrize("name,clip,with_ref", CASES)
def test_closed_form_matches_autograd_of_literal_formula(name, clip, with_ref):
    """Token level: loss value and d loss/d logp equal the oracle's for spread-out ratios."""
    g = torch.Generator().manual_seed(hash((name, str(clip), with_ref)) % 2**31)
    B, T = 3, 40
    logp = -torch.rand(B, T, generator=g) * 2 - 0.05
    old = logp + 0.6 * torch.randn(B, T, generator=g)             # ratios in ~[0.2, 5]
    ref = logp + 0.4 * torch.randn(B, T, generator=g) if with_ref else old.clone()
    A = torch.randn(B, generator=g)
    mask = torch.ones(B, T)
    mask[0, 30:] = 0
    beta = 0.0 if L.SPECS[name].kl_in_reward or name == "dapo" else 0.3
    lp = logp.clone().requires_grad_(True)
    loss, _ = L.get_loss(name)(lp, old, A, mask, beta=beta, ref_logp=ref if with_ref else None, clip=clip)
    (grad,) = torch.autograd.grad(loss, lp)

    lp2 = logp.clone().requires_grad_(True)
    total = 0.0
    n = mask.sum()
    for i in range(B):
        for t in range(T):
            if mask[i, t]:
                total = total + oracle_unit_loss(name, lp2[i, t], old[i, t], ref[i, t], A[i], clip, beta) / n
    (want_grad,) = torch.autograd.grad(total, lp2)
    assert abs(loss.item() - total.item()) < 1e-10, (loss.item(), total.item())
    err = (grad - want_grad).abs().max().item()
    assert err < 1e-10, f"{name} clip={clip} ref={with_ref}: max grad error {err:.3e}"


@pytest.mark.parametrize("name", [n for n in sorted(L.LOSSES) if n.startswith("rpg")])
@pytest.mark.parametrize("clip", [None, (0.2, 0.28, 3.0)])
def test_sequence_level_matches_oracle(name, clip):
    """Sequence level: the unit is the response, log w = sum_t log w_t, log pi = sum_t log pi_t."""
    g = torch.Generator().manual_seed(7)
    B, T = 6, 4
    logp = -torch.rand(B, T, generator=g) - 0.05
    old = logp + 0.2 * torch.randn(B, T, generator=g)
    ref = logp + 0.2 * torch.randn(B, T, generator=g)
    A = torch.randn(B, generator=g)
    mask = torch.ones(B, T)
    mask[1, 2:] = 0
    lp = logp.clone().requires_grad_(True)
    loss, _ = L.get_loss(name)(lp, old, A, mask, beta=0.2, ref_logp=ref, clip=clip, level="sequence",
                               agg="seq-mean-token-sum")
    (grad,) = torch.autograd.grad(loss, lp)
    lp2 = logp.clone().requires_grad_(True)
    total = sum(oracle_unit_loss(name, (lp2[i] * mask[i]).sum(), (old[i] * mask[i]).sum(),
                                 (ref[i] * mask[i]).sum(), A[i], clip, 0.2) for i in range(B)) / B
    (want,) = torch.autograd.grad(total, lp2)
    assert abs(loss.item() - total.item()) < 1e-10
    assert (grad - want).abs().max().item() < 1e-10
