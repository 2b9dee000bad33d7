"""Input checks of the losses (rpg_ref/core/losses.py): shapes and dtypes before any work
(``check_tensors``, ``check_sample_weight``), then the data (``data_checks``: three numbers reduced
on the device; ``refuse_bad_data``: one host sync, then a ValueError naming the argument)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


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
        raise ValueError("level='sequence' needs one advantage per sequence: advantages of "
                         "shape [B]")
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
        # finite entries, but their sum overflows
        name, x = max(named, key=lambda nx: float(nx[1].abs().max()))
        raise ValueError(f"{name} has non-finite values (entries too large to sum in {x.dtype}: "
                         f"max |{name}| = {float(x.abs().max()):.3g})")
    if n_empty:
        raise ValueError(f"mask row {int((mask.sum(1) == 0).nonzero()[0])} has no tokens; "
                         f"drop empty responses")


def data_checks(mask: Tensor, n_tok: Tensor, log_w: Tensor, log_rho: Tensor | None,
                advantages: Tensor) -> Tensor:
    """[entries of mask not 0/1, sum of all log-ratios and advantages, empty rows]. log p - log q
    is finite iff both are, so the sum is finite iff every input is (or the entries are so large
    that the sum overflows: refuse_bad_data names that too)."""
    dt = log_w.dtype
    total = log_w.sum() + advantages.sum() + (0.0 if log_rho is None else log_rho.sum())
    mask_bad = (((mask != 0) & (mask != 1)).sum().to(dt) if mask.dtype != torch.bool
                else torch.zeros((), dtype=dt, device=log_w.device))
    return torch.stack([mask_bad, total, (n_tok == 0).sum().to(dt)])
