"""The fast path of rpg_ref.core.losses: every loss in one pure function, gradients in closed form.

rpg_ref/core/losses.py is the specification: each loss written as the paper writes it and
differentiated by autograd (``impl="reference"``). ``LOSSES[name](...)`` runs this module instead
(the default, ``impl="fused"``): one function, ``loss_kernel``, computes the loss value, its
derivative with respect to log pi_theta from the hand-derived formulas below, every statistic and
the data checks, with no autograd graph. It answers to the reference: tests/test_losses_reference.py
compares values, gradients and statistics to 1e-12 (float64) for every loss, clip setting,
reference setting, level and aggregation. Only first derivatives exist (a double backward raises).
Both paths share the KL terms (rpg_ref/core/divergences.py: each estimate d with its closed-form
derivatives) and the input checks (rpg_ref/core/loss_checks.py).

Inputs with at least FUSE_MIN_NUMEL entries run the kernel fused by torch.compile (the same Python
function traced, not a second implementation; sizes dynamic, a few seconds to compile each setting
on first use). ``RPG_REF_COMPILE=0`` always runs it op by op, ``=1`` insists on fusing; the default
``auto`` warns once and runs it op by op where torch.compile cannot (no C++ compiler on CPU, no
triton on CUDA). Fused and op by op agree to float rounding (tests/test_losses_fused.py).

The kernel takes the loss's LossSpec vocabulary: its family ("rpg", "rpg-reinforce",
"baseline") and its KL term (a row of rpg_ref.core.divergences.DIVERGENCES), whose columns ``score``
(h = (dd / d log pi_theta) / w) and ``per_ratio`` (g = d / w, g' = dg / d log rho) replace autograd;
the PPO-clip baselines add GRPO's k3 term, which has no importance weight, from its ``unweighted``
column (d and dd / d log pi_theta from 1/rho).
"""

from __future__ import annotations

import os
import shutil
import warnings

import torch

from rpg_ref.core.divergences import DIVERGENCES
from rpg_ref.core.loss_checks import data_checks, refuse_bad_data, row_sum

FUSE_MIN_NUMEL = 1 << 16   # below this, compiling (seconds per setting) costs more than it saves

# The losses of rpg_ref.core.losses that the kernel computes from their LossSpec (family, kl), each
# held against its own formula by tests/test_losses_reference.py. Any other registered loss (a new
# formula in an existing family, say) runs its formula through autograd.
FUSED_LOSSES = frozenset({
    "rpg-fkl", "rpg-rkl", "rpg-ufkl", "rpg-urkl",
    "rpg-reinforce-fkl", "rpg-reinforce-rkl", "rpg-reinforce-ufkl", "rpg-reinforce-urkl",
    "grpo", "grpo-corrected", "dapo", "reinforce++", "reinforce++-baseline"})


def loss_kernel(family: str, kl: str, logp, old_logp, advantages, mask, ref_logp,
                beta: float, bounds: tuple | None, level: str, agg: str, clamp: float,
                sample_weight=None):
    """Pure tensor math shared by every loss (run op by op, or fused by torch.compile).

    Inputs are detached; bounds is (1 - eps_low, 1 + eps_high, c or None); clamp bounds every
    log-ratio; sample_weight (None, [B] or [B, T]) multiplies each unit's term. Returns (loss
    value, d loss / d logp [B, T] in logp's dtype, stats, data checks). A unit is a token
    ([B, T]) or a whole sequence ([B, 1]). family and kl: the loss's LossSpec.
    """
    D = DIVERGENCES[kl]
    dt = torch.promote_types(logp.dtype, torch.float32)
    lp, old, adv = logp.to(dt), old_logp.to(dt), advantages.to(dt)
    ref = None if ref_logp is None else ref_logp.to(dt)
    B = lp.shape[0]
    m = mask.to(dt)                                                         # [B, T]
    n_tok = m.sum(1)                                                        # [B]
    n_all = n_tok.sum()
    tok_lw_raw = lp - old                                                   # [B, T] log w per token
    # [B, T] log rho per token
    lr_raw = None if ref is None else lp - ref
    checks = data_checks(mask, n_tok, tok_lw_raw, lr_raw, adv)

    # --- units: log w, log rho, log u, ell = -log pi, advantages, weights ---
    tok_lw = tok_lw_raw.clamp(-clamp, clamp)
    # [B, T] token-mean weights
    tok_w = m / n_all
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
        # [B, 1] whole-response log w
        lw = (tok_lw_raw * m).sum(1, keepdim=True).clamp(-clamp, clamp)
        lr = lw if ref is None else (lr_raw * m).sum(1, keepdim=True).clamp(-clamp, clamp)
        lu = None if ref is None else ((ref - old) * m).sum(1, keepdim=True).clamp(-clamp, clamp)
        ell = -(lp * m).sum(1, keepdim=True)                                # [B, 1]
        adv = adv[:, None]                                                  # [B, 1]
        unit_w = torch.full((B, 1), 1.0 / B, dtype=dt, device=lp.device)
        agg_w = (
            torch.full((B, 1), 1.0, dtype=dt, device=lp.device) / n_all
            if agg == "token-mean"
            else (1.0 / (n_tok * B))[:, None]
            if agg == "seq-mean-token-mean"
            else unit_w
        )
    if sample_weight is not None:                   # each unit's term times its constant weight
        sw = sample_weight.to(dt)
        agg_w = agg_w * (sw[:, None] if sw.dim() == 1 else sw)

    w = torch.exp(lw)                                                       # [B, T|1]
    u = 1.0 if lu is None else torch.exp(lu)                                # u = w / rho
    if family != "baseline":
        u_w = torch.reciprocal(w) if lu is None else u / w                  # u / w = 1/rho
    low = high = dual = None

    if family == "rpg":                                                     # fully differentiable
        kl_u = D.estimate(w, lr, u)
        grad = -w * (adv - beta * D.score(w, lr, u_w))                   # d(-w A + beta d)/d log pi
        if bounds is None:
            value = -w * adv + beta * kl_u
        else:  # Algorithm 1 (alg:offpolicy_rpg_ppo_dualclip)
            lo, hi, c = bounds
            g, g_prime = D.per_ratio(lr, u_w)
            # -w a_hat = -w A + beta d
            a_hat = adv - beta * g
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
        c_kl = -beta * w * D.score(w, lr, u_w)                              # KL part of the weight
        weight = w * adv + c_kl                                             # w A'
        kl_u = D.estimate(w, lr, u)
        if bounds is None:
            value, grad = weight * ell, -weight                             # L = -SG(w A') log pi
        else:                                   # Algorithm 2 (alg:offpolicy_rpg_rf_ppo_dualclip_v1)
            lo, hi, c = bounds
            pos = weight * ell >= 0                                         # psi = A' ell >= 0
            high = pos & (w >= hi)
            low = ~pos & (w <= lo)
            flat = high | low
            # hi on `high`, lo on `low`
            clip_w = w.clamp(lo, hi)
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
        if D.unweighted is not None:                                        # grpo: k3, no weight
            inv_rho = torch.reciprocal(w) if lu is None else torch.exp(-lr)     # 1/rho
            kl_u, d_kl = D.unweighted(lr, inv_rho)
        else:                               # grpo-corrected (reported only: dapo, reinforce++)
            kl_u, d_kl = D.estimate(w, lr, u), None
        if beta != 0:                                                       # grpo, grpo-corrected
            value = value + beta * kl_u
            grad = grad + (beta * d_kl if d_kl is not None else beta * w * D.score(w, lr, None))

    # --- statistics (means over valid units; kl_old per token) ---
    tw, tlw = (w, lw) if level == "token" else (torch.exp(tok_lw), tok_lw)
    zero = torch.zeros((), dtype=dt, device=lp.device)
    stats = {
        "ratio_mean": row_sum(w * unit_w),
        "kl": row_sum(kl_u * unit_w),
        # E_old[w log w - w + 1]
        "kl_old": row_sum((tw * tlw - tw + 1.0) * tok_w),
    }
    for key, flag in (("clip_frac_low", low), ("clip_frac_high", high), ("clip_frac_dual", dual)):
        stats[key] = row_sum(flag * unit_w) if flag is not None else zero
    grad_logp = grad * agg_w if level == "token" else grad * agg_w * m      # [B, T]: d/d logp_t
    return row_sum(value * agg_w), grad_logp.to(logp.dtype), stats, checks


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
            warnings.warn(
                f"rpg_ref.core.losses: cannot fuse the loss kernel on {device_type} "
                f"({_NO_FUSION[device_type]}); running it op by op: same numbers, slower. "
                f"RPG_REF_COMPILE=0 silences this.",
                stacklevel=6,
            )
    if _NO_FUSION[device_type] and mode == "1":
        raise RuntimeError(
            f"RPG_REF_COMPILE=1 but the loss kernel cannot be fused on {device_type}: "
            f"{_NO_FUSION[device_type]}"
        )
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


def fused_loss(spec, opts, logp, old_logp, advantages, mask, ref_logp, *, clamp: float,
               sample_weight=None):
    """(loss differentiable in logp, detached stats) of the loss of rpg_ref.core.losses that
    ``spec`` (its LossSpec) describes, with ``opts`` (its LossOptions, resolved); the caller has
    checked the shapes (check_tensors); bad data raises here."""
    with torch.no_grad():
        value, grad, stats, checks = run_kernel(
            spec.family, spec.kl, logp.detach(), old_logp.detach(), advantages.detach(), mask,
            None if ref_logp is None else ref_logp.detach(), opts.beta, opts.bounds, opts.level,
            opts.agg, clamp, None if sample_weight is None else sample_weight.detach(),
            numel=logp.numel(), device_type=logp.device.type)
    refuse_bad_data(checks, logp, old_logp, advantages, mask, ref_logp)
    loss = PrecomputedGradient.apply(logp, value.to(logp.dtype), grad)
    return loss, {k: v.detach() for k, v in stats.items()}
