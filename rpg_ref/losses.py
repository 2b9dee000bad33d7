"""Every surrogate loss of the RPG paper and its baselines, in one place.

Notation (the paper's, sec:offpolicy_policy_gradients). A sample x is drawn from the
behaviour policy pi_old; at ``level="token"`` x is one token (ratios per token, as verl and
the paper's code apply the losses), at ``level="sequence"`` x is a whole response.

    w   = pi_theta(x) / pi_old(x)      importance ratio          (differentiable)
    rho = pi_theta(x) / pi_ref(x)      ratio to the reference    (differentiable)
    u   = pi_ref(x)  / pi_old(x)       = w / rho                 (constant)
    A   = advantages (R - b; pass R itself for the paper's literal formulas)

The paper assumes pi_ref = pi_old (then u = 1 and rho = w). We allow pi_ref != pi_old
(``ref_logp``) and keep the defining property: for every rpg loss, in expectation over
x ~ pi_old,

    grad L(theta) = -grad J(theta),   J(theta) = E_{pi_theta}[A] - beta * D(pi_theta, pi_ref)

with D the loss's divergence. The derivation is one line: if E_old[d(x; theta)] = D(theta)
for every theta, then E_old[grad d] = grad D, because pi_old does not depend on theta.

Fully differentiable family (tab:off-policy-loss, tab:off-policy-loss-normalized):
    L(x) = -w A + beta * d(x)
    name        D(pi_theta, pi_ref)        d(x), an unbiased estimate of D     paper (pi_ref = pi_old)
    rpg-fkl     KL(pi_ref || pi_theta)     -u log rho                          -beta log pi_theta  (+const)
    rpg-rkl     KL(pi_theta || pi_ref)      w log rho                           beta w log w
    rpg-ufkl    UKL(pi_ref || pi_theta)     u k3(rho) = u (rho - 1 - log rho)   beta (w - log w - 1)
    rpg-urkl    UKL(pi_theta || pi_ref)     w k3(1/rho) = u - w + w log rho      beta (w log w - w) (+const)
  Each d is the paper's term up to a theta-independent constant (same gradient); ours is the
  one whose mean is the divergence itself, so ``stats["kl"]`` is an honest KL estimate.

REINFORCE-style family (tab:off-policy-loss-reinforce, prop:offpolicy_reinforce_loss_*):
    L(x) = -SG(w * A') * log pi_theta(x),   A' = A - beta * h(rho)
    rpg-reinforce-fkl   h = -1/rho        (paper: SG(w R + beta))
    rpg-reinforce-ufkl  h = 1 - 1/rho     (paper: SG(w R - beta (w - 1)))
    rpg-reinforce-rkl   h = log rho + 1   (paper: SG(w (R - beta log w - beta)))
    rpg-reinforce-urkl  h = log rho       (paper: SG(w (R - beta log w)))
  grad d = w h grad log pi_theta, so the unclipped per-sample gradients of the two families are
  *identical* (not only equal in expectation) -- prop:equiv_rf_fd.

Clipping (``clip=(eps_low, eps_high, c)``; c None or inf disables the dual clip):
  * fully differentiable family: Algorithm alg:offpolicy_rpg_ppo_dualclip with the
    differentiable regularized advantage  A_hat = -L_unclipped / w = A - beta * d / w,
        A_hat >= 0:  max(-w A_hat, -clip(w, 1-eps_low, 1+eps_high) A_hat)
        A_hat <  0:  min(max(...same...), -c A_hat)
    so that with nothing clipped the loss equals the unclipped table loss exactly. (The
    algorithm's own example A_hat_RKL = A - beta(log w + 1) contradicts its unclipped line by
    beta*w; see derivations/ERRATA.md.) On a clipped segment no gradient flows through w,
    but gradient still flows through A_hat when beta > 0 (fig:ppo_dualclip_loss_vis caption).
  * REINFORCE family: Algorithm alg:offpolicy_rpg_rf_ppo_dualclip_v1 (RPG-Style Clip),
    branching on psi = A' * ell with ell = -log pi_theta; gradient-free (flat) segments exactly
    as in fig:offpolicy_rpg_rf_ppo_dualclip_v1:
        psi >= 0:  w <  1+eps_high -> ell * SG(w A')                (gradient)
                   w >= 1+eps_high -> SG(ell) * (A w_high + C_KL)     (flat)
        psi <  0:  w <= 1-eps_low  -> SG(ell) * (A w_low + C_KL)      (flat)
                   1-eps_low < w < c -> ell * SG(w A')               (gradient)
                   w >= c          -> SG(ell) * (A c + C_KL)          (flat)
    with C_KL = -beta w h(rho) the KL part of the weight (w A' = w A + C_KL).

Baselines:
  grpo            PPO clip on A + beta * k3(pi_ref/pi_theta) per token, no importance weight
                  (DeepSeekMath; subsec:grpo_main). Its gradient is not grad UKL off-policy.
  grpo-corrected  PPO clip on A + beta * w * k3(pi_ref/pi_theta), w differentiable (the paper's
                  correction; the same KL term as rpg-urkl).
  dapo            clip-higher PPO (default eps (0.2, 0.28)), no KL (DAPO, Yu et al. 2025).
  reinforce++ / reinforce++-baseline
                  PPO clip on token advantages from ``rpg_ref.advantages.reinforce_pp`` (Hu et al.
                  2025, arXiv:2501.03262): the k1 KL to pi_ref is folded into the reward, the return
                  to go is whitened over the whole batch (the -baseline variant first subtracts the
                  group mean reward). The KL lives in the advantage, so these losses take beta=0.

Numerics and implementation:
  * Log-ratios (log w, log rho, log u) are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] = [-40, 40]
    before exp(). Inside that range nothing changes. Outside it the loss value and its gradient are
    those at the clamp (e^{+-40}): finite, and the sample's weight saturates instead of overflowing.
  * Gradients with respect to ``logp`` are computed in closed form inside one pure kernel (the
    derivatives of the per-unit losses above; tests/test_losses_autograd_oracle.py checks them
    against autograd through the literal formulas). This saves autograd's per-op memory passes.
    Only first derivatives are available; a double backward raises.
  * Losses are computed in at least float32 (bf16/fp16 inputs are upcast).
  * Input checks that need the data (non-finite values, a mask that is not 0/1, empty rows) are
    reduced inside the kernel and raised before anything is returned.
  * Inputs with at least FUSE_MIN_NUMEL entries run the kernel fused by torch.compile (the same
    Python function traced, not a second implementation; sizes dynamic, a few seconds to compile
    each setting on first use). ``RPG_REF_COMPILE=0`` always runs it eagerly, ``=1`` insists on
    fusing; the default ``auto`` warns once and runs eagerly where torch.compile cannot (no C++
    compiler on CPU, no triton on CUDA). Fused and eager agree to float rounding (tested).
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "AGGREGATIONS",
    "LEVELS",
    "LOG_RATIO_CLAMP",
    "LOSSES",
    "SPECS",
    "LossSpec",
    "get_loss",
    "ppo_clip_floor",
]

LOG_RATIO_CLAMP = 40.0  # e^40 ~ 2.4e17; products of two such ratios stay finite in float32
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class LossSpec:
    """What a trainer needs to know about a loss besides calling it."""
    name: str
    family: str                 # "rpg" (fully differentiable), "rpg-reinforce", or "baseline"
    divergence: str | None   # D whose gradient the KL part has in expectation, for every theta;
                                # None for published grpo (its term matches no fixed D off-policy)
    advantage: str              # default estimator in rpg_ref.advantages.ADVANTAGES
    kl_in_reward: bool          # True: the KL goes into the advantage; call the loss with beta=0
    default_clip: tuple | None  # used when clip=None (baselines only; rpg losses: no clip)
    paper_label: str
    has_kl: bool = True         # False only for dapo (no KL anywhere)


LOSSES: dict[str, Callable] = {}
SPECS: dict[str, LossSpec] = {}


def get_loss(name: str) -> Callable:
    """Return the loss function registered under ``name``; ValueError lists valid names."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


# ---------------------------------------------------------------------------
# input checking and the per-unit view
# ---------------------------------------------------------------------------

def _check_tensor(name: str, x, ndim_ok: tuple) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() not in ndim_ok:
        raise ValueError(f"{name} must have {' or '.join(f'{d}' for d in ndim_ok)} dimensions, "
                         f"got shape {tuple(x.shape)}")


def _parse_clip(clip) -> tuple | None:
    """(eps_low, eps_high[, c]) -> (1 - eps_low, 1 + eps_high, c or None), checked."""
    if clip is None:
        return None
    if not isinstance(clip, (tuple, list)) or len(clip) not in (2, 3):
        raise ValueError(f"clip must be (eps_low, eps_high, c) or None, got {clip!r}")
    eps_low, eps_high = float(clip[0]), float(clip[1])
    c = None if len(clip) == 2 or clip[2] is None else float(clip[2])
    if not (0.0 < eps_low < 1.0):
        raise ValueError(f"clip eps_low must be in (0, 1), got {eps_low}")
    if not (eps_high > 0.0 and math.isfinite(eps_high)):
        raise ValueError(f"clip eps_high must be > 0 and finite, got {eps_high}")
    if c is not None and not (c > 1.0):
        raise ValueError(f"clip c (dual-clip bound) must be > 1 (or None to disable), got {c}")
    return (1.0 - eps_low, 1.0 + eps_high, c if c is not None and math.isfinite(c) else None)


def _validate(logp, old_logp, advantages, mask, beta, ref_logp, clip, level, agg) -> tuple | None:
    """Everything that can be checked without reading the data: shapes, dtypes, options."""
    _check_tensor("logp", logp, (2,))
    _check_tensor("old_logp", old_logp, (2,))
    _check_tensor("advantages", advantages, (1, 2))
    _check_tensor("mask", mask, (2,))
    B, T = logp.shape
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp shape {tuple(old_logp.shape)} != logp shape {(B, T)}")
    if mask.shape != logp.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logp shape {(B, T)}")
    if ref_logp is not None:
        _check_tensor("ref_logp", ref_logp, (2,))
        if ref_logp.shape != logp.shape:
            raise ValueError(f"ref_logp shape {tuple(ref_logp.shape)} != logp shape {(B, T)}")
    if advantages.dim() == 1 and advantages.shape[0] != B:
        raise ValueError(f"advantages shape {tuple(advantages.shape)} must be [B]={B} or [B, T]={(B, T)}")
    if advantages.dim() == 2 and advantages.shape != logp.shape:
        raise ValueError(f"advantages shape {tuple(advantages.shape)} must be [B]={B} or [B, T]={(B, T)}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    if level == "sequence" and advantages.dim() != 1:
        raise ValueError("level='sequence' needs one advantage per sequence: advantages of shape [B]")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be floating point, got {logp.dtype}")
    if not isinstance(beta, (int, float)) or isinstance(beta, bool) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    if mask.dtype != torch.bool and not mask.is_floating_point() and \
            mask.dtype not in (torch.int64, torch.int32, torch.uint8, torch.int8):
        raise ValueError(f"mask must be bool, integer or float, got {mask.dtype}")
    return _parse_clip(clip)


def _raise_on_bad_data(checks: Tensor, logp, old_logp, advantages, mask, ref_logp) -> None:
    """Raise the ValueError that the kernel's data checks flagged, naming the argument.

    ``checks`` = [entries of mask not 0/1, sum of all log-ratios and advantages, empty rows],
    reduced by the kernel in the same pass as the loss: one host sync instead of one pass and
    one sync per input. Nothing computed from bad data is returned.
    """
    mask_bad, total, n_empty = checks.tolist()
    if mask_bad:
        raise ValueError("mask must contain only 0 and 1")
    if not math.isfinite(total):
        # log p - log q is finite iff both are, so a non-finite total means a non-finite input
        # (or finite entries so large that their sum overflows): find and name it.
        named = (("logp", logp), ("old_logp", old_logp), ("advantages", advantages), ("ref_logp", ref_logp))
        for name, x in named:
            if x is not None:
                bad = (~torch.isfinite(x.detach())).nonzero()
                if len(bad):
                    raise ValueError(f"{name} has non-finite values at index {tuple(bad[0].tolist())}")
        name, x = max(((n, x) for n, x in named if x is not None), key=lambda nx: float(nx[1].detach().abs().max()))
        raise ValueError(f"{name} has non-finite values (entries too large to sum in {x.dtype}: "
                         f"max |{name}| = {float(x.detach().abs().max()):.3g})")
    if n_empty:
        row = int((mask.sum(1) == 0).nonzero()[0])
        raise ValueError(f"mask row {row} has no tokens; drop empty responses")


# ---------------------------------------------------------------------------
# per-divergence pieces. With rho = e^{lr}:
#   d(x)   unbiased estimate of D under pi_old            (value of the KL part of the loss)
#   h(lr)  d d / d log pi_theta = w * h                    (so the gradient weight is w (A - beta h))
#   g(lr)  d / w, a function of rho alone                  (A_hat = A - beta g for clipping)
#   g'(lr) d g / d lr                                      (gradient through A_hat on clipped segments)
# ---------------------------------------------------------------------------

def _d(div: str, w: Tensor, lr: Tensor, u) -> Tensor:
    if div == "fkl":
        return -u * lr                                  # -u log rho
    if div == "rkl":
        return w * lr                                   # w log rho
    if div == "ufkl":
        return w - u - u * lr                           # u k3(rho)      (u rho = w)
    return u - w + w * lr                               # w k3(1/rho)    (urkl)


def _h(div: str, lr: Tensor, inv_rho: Tensor) -> Tensor:
    if div == "fkl":
        return -inv_rho                                 # -1/rho
    if div == "rkl":
        return lr + 1.0                                 # log rho + 1
    if div == "ufkl":
        return 1.0 - inv_rho                            # 1 - 1/rho
    return lr                                           # log rho        (urkl)


def _g(div: str, lr: Tensor, inv_rho: Tensor) -> tuple[Tensor, Tensor]:
    """(g, g') with g = d / w."""
    if div == "fkl":
        return -lr * inv_rho, (lr - 1.0) * inv_rho      # -log rho / rho
    if div == "rkl":
        return lr, 1.0                                  # log rho
    if div == "ufkl":
        return 1.0 - (1.0 + lr) * inv_rho, lr * inv_rho  # 1 - (1 + log rho) / rho
    return inv_rho - 1.0 + lr, 1.0 - inv_rho            # k3(1/rho)      (urkl)


# ---------------------------------------------------------------------------
# the kernel: per-unit loss values and d loss / d log pi_theta in closed form
# ---------------------------------------------------------------------------

def _sum(x: Tensor) -> Tensor:
    """Sum of a [B, T] or [B, 1] tensor, by rows first: the fused kernel then computes every
    reduction inside its one row-wise pass instead of materializing [B, T] intermediates."""
    return x.sum(1).sum()


def _kernel(kind: str, logp, old_logp, advantages, mask, ref_logp,
            beta: float, clip: tuple | None, level: str, agg: str):
    """Pure tensor math shared by every loss (run eagerly, or fused by torch.compile).

    Inputs are detached; clip is (1 - eps_low, 1 + eps_high, c or None). Returns
    (loss value, d loss / d logp [B, T] in logp's dtype, stats, data checks). The gradients
    are the exact derivatives of the documented per-unit losses (tests compare them with
    autograd through the literal formulas); computing them here avoids autograd's per-op
    passes and memory. A unit is a token ([B, T]) or a whole sequence ([B, 1]).
    """
    C = LOG_RATIO_CLAMP
    dt = torch.promote_types(logp.dtype, torch.float32)
    lp, old, adv = logp.to(dt), old_logp.to(dt), advantages.to(dt)
    ref = None if ref_logp is None else ref_logp.to(dt)
    B = lp.shape[0]
    m = mask.to(dt)                                                         # [B, T]
    n_tok = m.sum(1)                                                        # [B]
    n_all = n_tok.sum()

    # --- data checks, reduced here and raised by the caller (_raise_on_bad_data) ---
    tok_lw_raw = lp - old                                                   # [B, T] log w per token
    lr_raw = None if ref is None else lp - ref                              # [B, T] log rho per token
    total = _sum(tok_lw_raw) + adv.sum() + (0.0 if ref is None else _sum(lr_raw))
    mask_bad = (_sum(((mask != 0) & (mask != 1)).to(dt)) if mask.dtype != torch.bool
                else torch.zeros((), dtype=dt, device=lp.device))
    checks = torch.stack([mask_bad, total, (n_tok == 0).sum().to(dt)])

    # --- units: log w, log rho, log u, ell = -log pi, advantages, weights ---
    tok_lw = tok_lw_raw.clamp(-C, C)
    tok_w = m / n_all                                                       # [B, T] token-mean weights
    if level == "token":
        lw = tok_lw
        lr = lw if ref is None else lr_raw.clamp(-C, C)
        lu = None if ref is None else (ref - old).clamp(-C, C)
        ell = -lp
        adv = adv[:, None] if adv.dim() == 1 else adv                       # [B, 1] or [B, T]
        unit_w = tok_w
        agg_w = (tok_w if agg == "token-mean" else
                 m / (n_tok[:, None] * B) if agg == "seq-mean-token-mean" else m / B)
    else:
        lw = (tok_lw_raw * m).sum(1, keepdim=True).clamp(-C, C)             # [B, 1] log of the whole-response ratio
        lr = lw if ref is None else (lr_raw * m).sum(1, keepdim=True).clamp(-C, C)
        lu = None if ref is None else ((ref - old) * m).sum(1, keepdim=True).clamp(-C, C)
        ell = -(lp * m).sum(1, keepdim=True)                                # [B, 1]
        adv = adv[:, None]                                                  # [B, 1]
        unit_w = torch.full((B, 1), 1.0 / B, dtype=dt, device=lp.device)
        agg_w = (torch.full((B, 1), 1.0, dtype=dt, device=lp.device) / n_all if agg == "token-mean" else
                 (1.0 / (n_tok * B))[:, None] if agg == "seq-mean-token-mean" else unit_w)

    w = torch.exp(lw)                                                       # [B, T|1]
    inv_rho = torch.reciprocal(w) if ref is None else torch.exp(-lr)        # 1/rho
    u = 1.0 if lu is None else torch.exp(lu)                                # u = w / rho
    family, _, div = kind.partition(":")
    low = high = dual = None

    if family == "rpg":                                                     # fully differentiable
        kl_u = _d(div, w, lr, u)
        grad = -w * (adv - beta * _h(div, lr, inv_rho))                     # d(-w A + beta d)/d log pi
        if clip is None:
            value = -w * adv + beta * kl_u
        else:                                                               # alg:offpolicy_rpg_ppo_dualclip
            lo, hi, c = clip
            g, g_prime = _g(div, lr, inv_rho)
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
        c_kl = -beta * w * _h(div, lr, inv_rho)                             # KL part of the weight
        weight = w * adv + c_kl                                             # w A'
        kl_u = _d(div, w, lr, u)
        if clip is None:
            value, grad = weight * ell, -weight                             # L = -SG(w A') log pi
        else:                                                               # alg:offpolicy_rpg_rf_ppo_dualclip_v1
            lo, hi, c = clip
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
        lo, hi, c = clip
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
        if family == "grpo":
            kl_u = inv_rho - 1.0 + lr                                       # k3(pi_ref/pi_theta), no weight
            value = value + beta * kl_u
            grad = grad + beta * (1.0 - inv_rho)
        else:
            kl_u = u - w + w * lr                                           # w k3(1/rho) = UKL(pi_theta||pi_ref) estimate
            if family == "grpo-corrected":                                  # the paper's correction: penalized
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
FUSE_MIN_NUMEL = 1 << 16   # below this the eager kernel is as fast as a compiled one


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
                          f"({_NO_FUSION[device_type]}); running it eagerly: same numbers, slower. "
                          f"RPG_REF_COMPILE=0 silences this.", stacklevel=4)
    if _NO_FUSION[device_type] and mode == "1":
        raise RuntimeError(f"RPG_REF_COMPILE=1 but the loss kernel cannot be fused on {device_type}: "
                           f"{_NO_FUSION[device_type]}")
    return _NO_FUSION[device_type] is None


def _run_kernel(*args, numel: int, device_type: str):
    """Fused by torch.compile for large inputs (RPG_REF_COMPILE=auto, the default), else eager.

    The fused kernel is this same Python function traced by torch.compile (no second
    implementation); RPG_REF_COMPILE=0 always runs it eagerly, =1 insists on fusing. Each
    (loss, clip, level, agg, ref) setting is one specialization (sizes are dynamic, the first
    call of each compiles for a few seconds); the first fused call raises dynamo's recompile
    limit so that 13 losses x settings don't fall back to eager.
    """
    if not _use_fused(numel, device_type):
        return _kernel(*args)
    if not _COMPILED:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        _COMPILED["kernel"] = torch.compile(_kernel, dynamic=True)
    return _COMPILED["kernel"](*args)


class _Surrogate(torch.autograd.Function):
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


def _loss(kind, logp, old_logp, advantages, mask, *, beta, ref_logp, clip, level, agg, default_clip=None):
    clip = _validate(logp, old_logp, advantages, mask, beta, ref_logp, clip, level, agg)
    family = kind.partition(":")[0]
    if family in ("dapo", "reinforce++", "reinforce++-baseline") and beta != 0:
        where = ("puts its k1 KL penalty into the reward: pass beta to rpg_ref.advantages.reinforce_pp "
                 "and call the loss with beta=0") if family.startswith("reinforce++") else "has no KL term"
        raise ValueError(f"{family} {where}; got beta={beta}")
    if clip is None and default_clip is not None:
        clip = _parse_clip(default_clip)
    with torch.no_grad():
        value, grad, stats, checks = _run_kernel(
            kind, logp.detach(), old_logp.detach(), advantages.detach(), mask,
            None if ref_logp is None else ref_logp.detach(), float(beta), clip, level, agg,
            numel=logp.numel(), device_type=logp.device.type)
    _raise_on_bad_data(checks, logp, old_logp, advantages, mask, ref_logp)
    loss = _Surrogate.apply(logp, value.to(logp.dtype), grad)
    return loss, {k: v.detach() for k, v in stats.items()}


def ppo_clip_floor(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                   eps_low: float = 0.2, eps_high: float = 0.2) -> Tensor:
    """Minimal token-mean PPO-clip loss with no checks and no statistics.

    Not an algorithm of the library: it is the speed floor that small_scale/bench_losses.py
    measures every loss against (any clipped loss pays at least this much).
    """
    ratio = torch.exp(logp - old_logp)
    a = advantages[:, None] if advantages.dim() == 1 else advantages
    per_tok = -torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)
    return (per_tok * mask).sum() / mask.sum()


# ---------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------

_SIGNATURE_DOC = """

    Args:
        logp: [B, T] log pi_theta of the sampled tokens (differentiable).
        old_logp: [B, T] log-probs of the behaviour policy that sampled them.
        advantages: [B] or [B, T] (R - b; R itself for the paper's literal formulas).
        mask: [B, T] 0/1 (bool, int or float); every row needs at least one token.
        beta: KL coefficient >= 0.
        ref_logp: [B, T] log pi_ref; None means pi_ref = pi_old (the paper's setting).
        clip: (eps_low, eps_high, c) or None; c None/inf disables the dual clip.
        level: "token" (per-token ratios) or "sequence" (whole-response ratio, advantages [B]).
        agg: "token-mean", "seq-mean-token-mean" or "seq-mean-token-sum".

    Returns:
        (loss, stats): scalar loss; stats holds detached 0-dim tensors clip_frac_low,
        clip_frac_high, clip_frac_dual, ratio_mean, kl (this loss's divergence estimate,
        mean over units) and kl_old (token-mean estimate of KL(pi_theta || pi_old)).
    """


def _register(name: str, impl: Callable, doc: str, spec: LossSpec) -> None:
    def loss_fn(logp, old_logp, advantages, mask, *, beta=0.0, ref_logp=None, clip=None,
                level="token", agg="token-mean"):
        return impl(logp, old_logp, advantages, mask, beta=beta, ref_logp=ref_logp, clip=clip,
                    level=level, agg=agg)
    loss_fn.__name__ = name.replace("-", "_").replace("+", "p")
    loss_fn.__qualname__ = loss_fn.__name__
    loss_fn.__doc__ = doc.strip() + _SIGNATURE_DOC
    loss_fn.spec = spec
    LOSSES[name] = loss_fn
    SPECS[name] = spec


_FD_DOCS = {
    "fkl": ("Fully differentiable RPG loss, forward KL (prop:policy_gradient_forward_kl, "
            "tab:off-policy-loss-normalized).\n\n    Paper: L = E_old[-w R - beta log pi_theta].  "
            "Here: L = -w A - beta u log rho, D = KL(pi_ref || pi_theta)."),
    "rkl": ("Fully differentiable RPG loss, reverse KL (prop:policy_gradient_reverse_kl, "
            "tab:off-policy-loss-normalized).\n\n    Paper: L = E_old[w (-R + beta log w)].  "
            "Here: L = -w A + beta w log rho, D = KL(pi_theta || pi_ref)."),
    "ufkl": ("Fully differentiable RPG loss, unnormalized forward KL "
             "(prop:policy_gradient_unormalized_forward_kl, tab:off-policy-loss).\n\n    Paper: "
             "L = Z_old E[-w R + beta (w - log w - 1)].  Here: L = -w A + beta u k3(rho), "
             "D = UKL(pi_ref || pi_theta)."),
    "urkl": ("Fully differentiable RPG loss, unnormalized reverse KL "
             "(prop:policy_gradient_unormalized_reverse_kl, tab:off-policy-loss).\n\n    Paper: "
             "L = Z_old E[-w R + beta (w log w - w)].  Here: L = -w A + beta w k3(1/rho) "
             "(= paper + beta u, a constant), D = UKL(pi_theta || pi_ref)."),
}
_RF_DOCS = {
    "fkl": ("REINFORCE-style RPG loss, forward KL (prop:offpolicy_reinforce_loss_fkl).\n\n    "
            "Paper: L = -E_old[SG(w R + beta) log pi_theta].  Here: SG(w A + beta u)."),
    "ufkl": ("REINFORCE-style RPG loss, unnormalized forward KL (prop:offpolicy_reinforce_loss_ufkl, "
             "tab:off-policy-loss-reinforce).\n\n    Paper: L = -E[SG(Z_old (w R - beta (w - 1))) log pi_theta]."
             "  Here: SG(w A - beta (w - u))."),
    "rkl": ("REINFORCE-style RPG loss, reverse KL (prop:offpolicy_reinforce_loss_rkl, "
            "eq:loss_rkl_offpolicy_reinforce).\n\n    Paper: L = -E_old[SG(w (R - beta log w - beta)) "
            "log pi_theta].  Here: SG(w (A - beta (log rho + 1)))."),
    "urkl": ("REINFORCE-style RPG loss, unnormalized reverse KL (prop:offpolicy_reinforce_loss_urkl, "
             "tab:off-policy-loss-reinforce).\n\n    Paper: L = -E[SG(Z_old w (R - beta log w)) log pi_theta]."
             "  Here: SG(w (A - beta log rho))."),
}
_DIV_LABEL = {"fkl": "prop:policy_gradient_forward_kl", "rkl": "prop:policy_gradient_reverse_kl",
              "ufkl": "prop:policy_gradient_unormalized_forward_kl",
              "urkl": "prop:policy_gradient_unormalized_reverse_kl"}

for _div in ("fkl", "rkl", "ufkl", "urkl"):
    _register(f"rpg-{_div}",
              lambda *a, _d=_div, **k: _loss(f"rpg:{_d}", *a, **k), _FD_DOCS[_div],
              LossSpec(f"rpg-{_div}", "rpg", _div, "group-mean", False, None, _DIV_LABEL[_div]))
for _div in ("fkl", "rkl", "ufkl", "urkl"):
    _register(f"rpg-reinforce-{_div}",
              lambda *a, _d=_div, **k: _loss(f"rpg-reinforce:{_d}", *a, **k), _RF_DOCS[_div],
              LossSpec(f"rpg-reinforce-{_div}", "rpg-reinforce", _div, "group-mean", False, None,
                       f"prop:offpolicy_reinforce_loss_{_div}"))

_BASELINES = {
    "grpo": (("GRPO as published (subsec:grpo_main): PPO clip on A plus beta * k3(pi_ref/pi_theta) per "
             "token with no importance weight."), "group-mean-std", False, (0.2, 0.2, None)),
    "grpo-corrected": (("GRPO with the paper's corrected KL term (subsec:grpo_main): PPO clip on A plus "
                       "beta * w * k3(pi_ref/pi_theta), an unbiased estimate of UKL(pi_theta || pi_ref) "
                       "whose expected gradient is grad UKL for every theta."),
                       "group-mean-std", False, (0.2, 0.2, None)),
    "dapo": (("DAPO (Yu et al. 2025): clip-higher PPO (default eps_low 0.2, eps_high 0.28), token-level "
             "aggregation, no KL term (beta must be 0)."), "group-mean-std", False, (0.2, 0.28, None)),
    "reinforce++": (("REINFORCE++ (Hu et al. 2025): PPO clip on token advantages from "
                    "rpg_ref.advantages.reinforce_pp (k1 KL in the reward, return-to-go, global "
                    "whitening). beta must be 0 here: the KL is in the advantage."),
                    "reinforce++", True, (0.2, 0.2, None)),
    "reinforce++-baseline": (("REINFORCE++-baseline (Hu et al. 2025): as reinforce++, with the group-mean "
                             "reward subtracted before global whitening."),
                             "reinforce++-baseline", True, (0.2, 0.2, None)),
}
for _name, (_doc, _adv, _kir, _clip) in _BASELINES.items():
    _register(_name,
              lambda *a, _n=_name, _c=_clip, **k: _loss(_n, *a, default_clip=_c, **k), _doc,
              LossSpec(_name, "baseline", "urkl" if _name == "grpo-corrected" else None, _adv, _kir,
                       _clip, "subsec:grpo_main" if _name.startswith("grpo") else "",
                       has_kl=_name != "dapo"))


# --- TEMPORARY (replaced by the losses rewrite): option rules as functions ---
def parse_clip(values):
    if values is None:
        return None
    if not isinstance(values, (list, tuple)) or len(values) not in (2, 3):
        raise ValueError(f"clip takes eps_low eps_high [c], got {values}")
    try:
        v = [float(x) for x in values]
    except (TypeError, ValueError) as e:
        raise ValueError(f"clip values must be numbers ('inf' allowed for c), got {values}") from e
    lo, hi, c = _parse_clip(v)
    return (1.0 - lo, hi - 1.0, c)


def loss_beta(name, beta):
    if not isinstance(beta, (int, float)) or isinstance(beta, bool) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    return 0.0 if SPECS[name].kl_in_reward else beta


def default_beta(name, beta):
    return beta if SPECS[name].has_kl else 0.0


def check_options(name, *, beta, clip=None, level="token", agg="token-mean", no_clip=False):
    get_loss(name)
    spec = SPECS[name]
    if no_clip and clip is not None:
        raise ValueError("--clip and --no-clip together")
    if no_clip and spec.default_clip is not None:
        raise ValueError(f"--no-clip: {name} is a PPO-type loss that always clips; pass a wide --clip instead")
    parse_clip(clip)
    if level not in LEVELS or agg not in AGGREGATIONS:
        raise ValueError(f"level must be in {LEVELS} and agg in {AGGREGATIONS}; got {level!r}, {agg!r}")
    if level == "sequence" and spec.kl_in_reward:
        raise ValueError(f"{name} has token-level advantages and cannot run at --level sequence")
    z = torch.zeros(1, 1)
    LOSSES[name](z, z, torch.zeros(1), torch.ones(1, 1), beta=beta, clip=parse_clip(clip), level=level, agg=agg)
