"""The fast path of rpg_ref.losses: every loss in one pure function, gradients in closed form.

rpg_ref/losses.py is the specification: each loss written as the paper writes it and
differentiated by autograd (``impl="reference"``). ``LOSSES[name](...)`` runs this module instead
(the default, ``impl="fused"``): one function, ``loss_kernel``, computes the loss value, its
derivative with respect to log pi_theta from the hand-derived formulas below, every statistic and
the data checks, with no autograd graph. It answers to the reference: tests/test_losses_reference.py
compares values, gradients and statistics to 1e-12 (float64) for every loss, clip setting,
reference setting, level and aggregation. Only first derivatives exist (a double backward raises).
The input checks both paths share (check_tensors, data_checks, refuse_bad_data) live here too.

Inputs with at least FUSE_MIN_NUMEL entries run the kernel fused by torch.compile (the same Python
function traced, not a second implementation; sizes dynamic, a few seconds to compile each setting
on first use). ``RPG_REF_COMPILE=0`` always runs it op by op, ``=1`` insists on fusing; the default
``auto`` warns once and runs it op by op where torch.compile cannot (no C++ compiler on CPU, no
triton on CUDA). Fused and op by op agree to float rounding (tests/test_losses_fused.py).

Per divergence D, with rho = e^{lr} = pi_theta / pi_ref and u = pi_ref / pi_old (the notation of
rpg_ref.losses), the kernel needs three pieces of the KL estimate d(x) of the loss:
    kl_estimate        d                    the KL part of the loss (E_old[d] = D for every theta)
    kl_score           h = (d d / d log pi_theta) / w   (gradient weight w (A - beta h))
    kl_per_ratio       g = d / w and g' = dg / d lr      (A_hat = A - beta g, clipped gradients)
They take u_w = u / w, which is 1/rho, but stays the exact derivative of the reference's d when
the log-ratios are clamped (then u / w and 1/rho differ).
"""

from __future__ import annotations

import math
import os
import shutil
import warnings

import torch
from torch import Tensor

FUSE_MIN_NUMEL = 1 << 16   # below this, compiling (seconds per setting) costs more than it saves

# The kernel branch that computes each loss of rpg_ref.losses: (family, divergence). For the PPO
# baselines the "divergence" is the penalized KL term: "k3" = k3(pi_ref/pi_theta) unweighted (grpo),
# "urkl" = w k3(pi_ref/pi_theta) (grpo-corrected), None = the urkl estimate reported, not penalized.
KERNELS = {
    "rpg-fkl": ("rpg", "fkl"), "rpg-rkl": ("rpg", "rkl"),
    "rpg-ufkl": ("rpg", "ufkl"), "rpg-urkl": ("rpg", "urkl"),
    "rpg-reinforce-fkl": ("rpg-reinforce", "fkl"), "rpg-reinforce-rkl": ("rpg-reinforce", "rkl"),
    "rpg-reinforce-ufkl": ("rpg-reinforce", "ufkl"), "rpg-reinforce-urkl": ("rpg-reinforce", "urkl"),
    "grpo": ("ppo", "k3"), "grpo-corrected": ("ppo", "urkl"), "dapo": ("ppo", None),
    "reinforce++": ("ppo", None), "reinforce++-baseline": ("ppo", None),
}


def kl_estimate(div: str, w: Tensor, lr: Tensor, u) -> Tensor:
    if div == "fkl":
        return -u * lr                                  # -u log rho
    if div == "rkl":
        return w * lr                                   # w log rho
    if div == "ufkl":
        return w - u - u * lr                           # u k3(rho)      (u rho = w)
    return u - w + w * lr                               # w k3(1/rho)    (urkl)


def kl_score(div: str, lr: Tensor, u_w: Tensor) -> Tensor:
    if div == "fkl":
        return -u_w                                     # -1/rho
    if div == "rkl":
        return lr + 1.0                                 # log rho + 1
    if div == "ufkl":
        return 1.0 - u_w                                # 1 - 1/rho
    return lr                                           # log rho        (urkl)


def kl_per_ratio(div: str, lr: Tensor, u_w: Tensor) -> tuple[Tensor, Tensor]:
    """(g, g') with g = d / w, a function of rho alone."""
    if div == "fkl":
        return -lr * u_w, (lr - 1.0) * u_w              # -log rho / rho
    if div == "rkl":
        return lr, 1.0                                  # log rho
    if div == "ufkl":
        return 1.0 - (1.0 + lr) * u_w, lr * u_w          # 1 - (1 + log rho) / rho
    return u_w - 1.0 + lr, 1.0 - u_w                    # k3(1/rho)      (urkl)


def _sum(x: Tensor) -> Tensor:
    """Sum of a [B, T] or [B, 1] tensor, by rows first: the fused kernel then computes every
    reduction inside its one row-wise pass instead of materializing [B, T] intermediates."""
    return x.sum(1).sum()


def check_tensors(logp, old_logp, advantages, mask, ref_logp, level: str) -> None:
    """Shapes and dtypes: everything that can be checked without reading the data."""
    named = {"logp": (logp, (2,)), "old_logp": (old_logp, (2,)), "advantages": (advantages, (1, 2)),
             "mask": (mask, (2,)), "ref_logp": (ref_logp, (2,))}
    for key, (x, ndims) in named.items():
        if x is None and key == "ref_logp":
            continue
        if not isinstance(x, Tensor):
            raise ValueError(f"{key} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() not in ndims:
            raise ValueError(f"{key} must have {' or '.join(map(str, ndims))} dimensions, "
                             f"got shape {tuple(x.shape)}")
        if key in ("old_logp", "mask", "ref_logp") and x.shape != logp.shape:
            raise ValueError(f"{key} shape {tuple(x.shape)} != logp shape {tuple(logp.shape)}")
    B = logp.shape[0]
    if advantages.shape not in ((B,), logp.shape):
        raise ValueError(f"advantages shape {tuple(advantages.shape)} must be [B]={B} or "
                         f"[B, T]={tuple(logp.shape)}")
    if level == "sequence" and advantages.dim() != 1:
        raise ValueError("level='sequence' needs one advantage per sequence: advantages of shape [B]")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be floating point, got {logp.dtype}")
    if mask.dtype != torch.bool and not mask.is_floating_point() and \
            mask.dtype not in (torch.int64, torch.int32, torch.uint8, torch.int8):
        raise ValueError(f"mask must be bool, integer or float, got {mask.dtype}")


def check_sample_weight(sample_weight, logp, level: str) -> None:
    """A sample weight is None or a finite tensor >= 0 of shape [B, T] (token level) or [B]."""
    if sample_weight is None:
        return
    if not isinstance(sample_weight, Tensor) or not sample_weight.is_floating_point():
        raise ValueError(f"sample_weight must be a floating-point torch.Tensor, got "
                         f"{getattr(sample_weight, 'dtype', type(sample_weight).__name__)}")
    shapes = (logp.shape[:1],) if level == "sequence" else (logp.shape[:1], logp.shape)
    if sample_weight.shape not in shapes:
        raise ValueError(f"sample_weight shape {tuple(sample_weight.shape)} must be "
                         + " or ".join(str(list(s)) for s in shapes) + f" at level={level!r}")
    w = sample_weight.detach()
    if not bool((torch.isfinite(w) & (w >= 0)).all()):
        bad = (~(torch.isfinite(w) & (w >= 0))).nonzero()[0]
        raise ValueError(f"sample_weight must be finite and >= 0, got {float(w[tuple(bad)])} at "
                         f"index {tuple(bad.tolist())}")


def refuse_bad_data(checks: Tensor, logp, old_logp, advantages, mask, ref_logp) -> None:
    """Raise the ValueError that ``data_checks`` flagged, naming the argument (one host sync)."""
    mask_bad, total, n_empty = checks.tolist()
    if mask_bad:
        raise ValueError("mask must contain only 0 and 1")
    if not math.isfinite(total):
        named = [(n, x.detach()) for n, x in (("logp", logp), ("old_logp", old_logp),
                 ("advantages", advantages), ("ref_logp", ref_logp)) if x is not None]
        for name, x in named:
            bad = (~torch.isfinite(x)).nonzero()
            if len(bad):
                raise ValueError(f"{name} has non-finite values at index {tuple(bad[0].tolist())}")
        name, x = max(named, key=lambda nx: float(nx[1].abs().max()))    # finite, but the sum overflows
        raise ValueError(f"{name} has non-finite values (entries too large to sum in {x.dtype}: "
                         f"max |{name}| = {float(x.abs().max()):.3g})")
    if n_empty:
        raise ValueError(f"mask row {int((mask.sum(1) == 0).nonzero()[0])} has no tokens; "
                         f"drop empty responses")


def data_checks(mask: Tensor, n_tok: Tensor, log_w: Tensor, log_rho: Tensor | None,
                advantages: Tensor) -> Tensor:
    """[entries of mask not 0/1, sum of all log-ratios and advantages, empty rows], reduced in the
    kernel's pass. log p - log q is finite iff both are, so the sum is finite iff every input is
    (or the entries are so large that the sum overflows: refuse_bad_data names that too)."""
    dt = log_w.dtype
    total = _sum(log_w) + advantages.sum() + (0.0 if log_rho is None else _sum(log_rho))
    mask_bad = (_sum(((mask != 0) & (mask != 1)).to(dt)) if mask.dtype != torch.bool
                else torch.zeros((), dtype=dt, device=log_w.device))
    return torch.stack([mask_bad, total, (n_tok == 0).sum().to(dt)])


def loss_kernel(family: str, div: str | None, logp, old_logp, advantages, mask, ref_logp,
                beta: float, bounds: tuple | None, level: str, agg: str, clamp: float,
                sample_weight=None):
    """Pure tensor math shared by every loss (run op by op, or fused by torch.compile).

    Inputs are detached; bounds is (1 - eps_low, 1 + eps_high, c or None); clamp bounds every
    log-ratio; sample_weight (None, [B] or [B, T]) multiplies each unit's term. Returns (loss
    value, d loss / d logp [B, T] in logp's dtype, stats, data checks).
    A unit is a token ([B, T]) or a whole sequence ([B, 1]).
    """
    dt = torch.promote_types(logp.dtype, torch.float32)
    lp, old, adv = logp.to(dt), old_logp.to(dt), advantages.to(dt)
    ref = None if ref_logp is None else ref_logp.to(dt)
    B = lp.shape[0]
    m = mask.to(dt)                                                         # [B, T]
    n_tok = m.sum(1)                                                        # [B]
    n_all = n_tok.sum()
    tok_lw_raw = lp - old                                                   # [B, T] log w per token
    lr_raw = None if ref is None else lp - ref                              # [B, T] log rho per token
    checks = data_checks(mask, n_tok, tok_lw_raw, lr_raw, adv)

    # --- units: log w, log rho, log u, ell = -log pi, advantages, weights ---
    tok_lw = tok_lw_raw.clamp(-clamp, clamp)
    tok_w = m / n_all                                                       # [B, T] token-mean weights
    if level == "token":
        lw = tok_lw
        lr = lw if ref is None else lr_raw.clamp(-clamp, clamp)
        lu = None if ref is None else (ref - old).clamp(-clamp, clamp)
        ell = -lp
        adv = adv[:, None] if adv.dim() == 1 else adv                       # [B, 1] or [B, T]
        unit_w = tok_w
        agg_w = (tok_w if agg == "token-mean" else
                 m / (n_tok[:, None] * B) if agg == "seq-mean-token-mean" else m / B)
    else:
        lw = (tok_lw_raw * m).sum(1, keepdim=True).clamp(-clamp, clamp)     # [B, 1] whole-response log w
        lr = lw if ref is None else (lr_raw * m).sum(1, keepdim=True).clamp(-clamp, clamp)
        lu = None if ref is None else ((ref - old) * m).sum(1, keepdim=True).clamp(-clamp, clamp)
        ell = -(lp * m).sum(1, keepdim=True)                                # [B, 1]
        adv = adv[:, None]                                                  # [B, 1]
        unit_w = torch.full((B, 1), 1.0 / B, dtype=dt, device=lp.device)
        agg_w = (torch.full((B, 1), 1.0, dtype=dt, device=lp.device) / n_all if agg == "token-mean" else
                 (1.0 / (n_tok * B))[:, None] if agg == "seq-mean-token-mean" else unit_w)
    if sample_weight is not None:                   # each unit's term times its constant weight
        sw = sample_weight.to(dt)
        agg_w = agg_w * (sw[:, None] if sw.dim() == 1 else sw)

    w = torch.exp(lw)                                                       # [B, T|1]
    u = 1.0 if lu is None else torch.exp(lu)                                # u = w / rho
    if family != "ppo":
        u_w = torch.reciprocal(w) if lu is None else u / w                  # u / w = 1/rho
    low = high = dual = None

    if family == "rpg":                                                     # fully differentiable
        kl_u = kl_estimate(div, w, lr, u)
        grad = -w * (adv - beta * kl_score(div, lr, u_w))                   # d(-w A + beta d)/d log pi
        if bounds is None:
            value = -w * adv + beta * kl_u
        else:                                                               # alg:offpolicy_rpg_ppo_dualclip
            lo, hi, c = bounds
            g, g_prime = kl_per_ratio(div, lr, u_w)
            a_hat = adv - beta * g                                          # -w a_hat = -w A + beta d
            cw = w.clamp(lo, hi)
            t1, t2 = -w * a_hat, -cw * a_hat
            clipped = t2 > t1                                               # max(t1, t2) picks t2
            value = torch.where(clipped, t2, t1)
            grad = torch.where(clipped, beta * cw * g_prime, grad)          # only through A_hat
            neg = a_hat < 0
            low, high = neg & clipped, ~neg & clipped
            if c is not None:
                dual = neg & (-c * a_hat < value)                           # min(., -c A_hat)
                value = torch.where(dual, -c * a_hat, value)
                grad = torch.where(dual, beta * c * g_prime, grad)

    elif family == "rpg-reinforce":                                         # stop-gradient weights
        c_kl = -beta * w * kl_score(div, lr, u_w)                           # KL part of the weight
        weight = w * adv + c_kl                                             # w A'
        kl_u = kl_estimate(div, w, lr, u)
        if bounds is None:
            value, grad = weight * ell, -weight                             # L = -SG(w A') log pi
        else:                                                               # alg:offpolicy_rpg_rf_ppo_dualclip_v1
            lo, hi, c = bounds
            pos = weight * ell >= 0                                         # psi = A' ell >= 0
            high = pos & (w >= hi)
            low = ~pos & (w <= lo)
            flat = high | low
            clip_w = w.clamp(lo, hi)                                        # hi on `high`, lo on `low`
            if c is not None:
                dual = ~pos & (w >= c)
                flat = flat | dual
                clip_w = torch.where(dual, c, clip_w)                       # c on `dual`
            value = torch.where(flat, adv * clip_w + c_kl, weight) * ell
            grad = torch.where(flat, 0.0, -weight)

    else:                                                                   # PPO-clip baselines
        lo, hi, c = bounds
        t1, t2 = -w * adv, -w.clamp(lo, hi) * adv
        clipped = t2 > t1
        value = torch.where(clipped, t2, t1)
        grad = torch.where(clipped, 0.0, t1)                                # t1 = -w A
        neg = adv < 0
        low, high = neg & clipped, ~neg & clipped
        if c is not None:
            dual = neg & (-c * adv < value)
            value = torch.where(dual, -c * adv, value)
            grad = torch.where(dual, 0.0, grad)
        if div == "k3":                                                     # grpo as published
            inv_rho = torch.reciprocal(w) if ref is None else torch.exp(-lr)   # 1/rho
            kl_u = inv_rho - 1.0 + lr                                       # k3(pi_ref/pi_theta), no weight
            value = value + beta * kl_u
            grad = grad + beta * (1.0 - inv_rho)
        else:
            kl_u = u - w + w * lr                                           # w k3(1/rho): UKL(pi_theta||pi_ref)
            if div == "urkl":                                               # grpo-corrected: penalized
                value = value + beta * kl_u
                grad = grad + beta * w * lr
            # dapo, reinforce++: reported, not penalized

    # --- statistics (means over valid units; kl_old per token) ---
    tw, tlw = (w, lw) if level == "token" else (torch.exp(tok_lw), tok_lw)
    zero = torch.zeros((), dtype=dt, device=lp.device)
    stats = {
        "ratio_mean": _sum(w * unit_w),
        "kl": _sum(kl_u * unit_w),
        "kl_old": _sum((tw * tlw - tw + 1.0) * tok_w),                    # E_old[w log w - w + 1]
    }
    for key, flag in (("clip_frac_low", low), ("clip_frac_high", high), ("clip_frac_dual", dual)):
        stats[key] = _sum(flag * unit_w) if flag is not None else zero
    grad_logp = grad * agg_w if level == "token" else grad * agg_w * m      # [B, T]: d/d logp_t
    return _sum(value * agg_w), grad_logp.to(logp.dtype), stats, checks


_COMPILED: dict = {}
_NO_FUSION: dict = {}      # device type -> why torch.compile cannot fuse there (warned once)


def _fusion_unavailable(device_type: str) -> str | None:
    """Why torch.compile cannot fuse the kernel on this device type, or None if it can."""
    if device_type == "cuda":
        from torch.utils._triton import has_triton
        return None if has_triton() else "triton is not installed"
    if device_type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler
        cxx = get_cpp_compiler()
        return None if shutil.which(cxx) else f"C++ compiler {cxx!r} not found (set CXX)"
    return f"no fused kernel for device type {device_type!r}"


def _use_fused(numel: int, device_type: str) -> bool:
    mode = os.environ.get("RPG_REF_COMPILE", "auto")
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"RPG_REF_COMPILE must be auto, 0 or 1, got {mode!r}")
    if mode == "0" or numel < FUSE_MIN_NUMEL:
        return False
    if device_type not in _NO_FUSION:
        _NO_FUSION[device_type] = _fusion_unavailable(device_type)
        if _NO_FUSION[device_type] and mode == "auto":
            warnings.warn(f"rpg_ref.losses: cannot fuse the loss kernel on {device_type} "
                          f"({_NO_FUSION[device_type]}); running it op by op: same numbers, slower. "
                          f"RPG_REF_COMPILE=0 silences this.", stacklevel=6)
    if _NO_FUSION[device_type] and mode == "1":
        raise RuntimeError(f"RPG_REF_COMPILE=1 but the loss kernel cannot be fused on {device_type}: "
                           f"{_NO_FUSION[device_type]}")
    return _NO_FUSION[device_type] is None


def run_kernel(*args, numel: int, device_type: str):
    """loss_kernel(*args), fused by torch.compile for large inputs (RPG_REF_COMPILE=auto, the
    default), else op by op. Each (loss, clip, level, agg, ref) setting is one specialization
    (sizes are dynamic, the first call of each compiles for a few seconds); the first fused call
    raises dynamo's recompile limit so that 13 losses x settings don't fall back to eager.
    """
    if not _use_fused(numel, device_type):
        return loss_kernel(*args)
    if not _COMPILED:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        _COMPILED["kernel"] = torch.compile(loss_kernel, dynamic=True)
    return _COMPILED["kernel"](*args)


class PrecomputedGradient(torch.autograd.Function):
    """Returns a precomputed loss value; backward returns the precomputed d loss / d logp.

    First derivatives only: asking for a second derivative raises instead of returning 0.
    """

    @staticmethod
    def forward(ctx, logp, value, grad):
        ctx.save_for_backward(grad)
        return value.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        (grad,) = ctx.saved_tensors
        return grad_out * grad, None, None


def fused_loss(name: str, logp, old_logp, advantages, mask, ref_logp, *, beta: float,
               bounds: tuple | None, level: str, agg: str, clamp: float, sample_weight=None):
    """(loss differentiable in logp, detached stats) of the loss ``name`` of rpg_ref.losses, whose
    caller has checked the options and the shapes (check_tensors); bad data raises here."""
    family, div = KERNELS[name]
    with torch.no_grad():
        value, grad, stats, checks = run_kernel(
            family, div, logp.detach(), old_logp.detach(), advantages.detach(), mask,
            None if ref_logp is None else ref_logp.detach(), float(beta), bounds, level, agg, clamp,
            None if sample_weight is None else sample_weight.detach(),
            numel=logp.numel(), device_type=logp.device.type)
    refuse_bad_data(checks, logp, old_logp, advantages, mask, ref_logp)
    loss = PrecomputedGradient.apply(logp, value.to(logp.dtype), grad)
    return loss, {k: v.detach() for k, v in stats.items()}
