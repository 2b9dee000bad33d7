"""Rollout correction: importance weights for a sampler whose distribution mu is not pi_old.

Every loss of rpg_ref.core.losses is built so that E_{x ~ pi_old}[grad L(x)] = -grad J. The trainer
recomputes log pi_old(x) itself, but x was drawn by the engine, whose distribution mu can differ
from pi_old (a bf16 vLLM sampling for an fp32 trainer). Then E_{x ~ mu}[grad L] is not -grad J;
weighting each sample's loss by r = pi_old(x) / mu(x) restores it, since E_mu[r f] = E_old[f]:

    level "sequence": r(y) = prod_t pi_old(y_t | y_<t) / mu(y_t | y_<t), one weight per response
                      (exact for any loss: E_mu[r L] = E_old[L]);
    level "token":    r_t = pi_old(y_t | y_<t) / mu(y_t | y_<t), one weight per token (lower
                      variance, biased: it corrects token t's draw, not its prefix's or suffix's).

Modes, with cap C (inf: no cap):
    tis  truncated importance sampling   weight = min(r, C)        bias -E_mu[(r - C)_+ grad L]
    mis  masked importance sampling      weight = r 1{r <= C}      bias -E_mu[r 1{r > C} grad L]

The weights are constants (no gradient) handed to the loss as ``sample_weight``; log r is clamped
to +-LOG_RATIO_CLAMP before exp(), as the losses clamp theirs. docs/rollout_correction.md has the
derivation and derivations/rollout_correction.py its exact checks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpg_ref.core.losses import LOG_RATIO_CLAMP

MODES = ("none", "tis", "mis")
LEVELS = ("token", "sequence")


def check_options(mode: str, level: str, cap: float) -> None:
    """Refuse a bad mode, level or cap with a one-line ValueError."""
    if mode not in MODES:
        raise ValueError(f"rollout correction must be one of {MODES}, got {mode!r}")
    if level not in LEVELS:
        raise ValueError(f"rollout correction level must be one of {LEVELS}, got {level!r}")
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap >= 1:
        raise ValueError(
            f"rollout correction cap must be a number >= 1 (inf: no cap), got {cap!r}; "
            f"a cap below 1 would shrink samples the sampler drew exactly as pi_old"
        )


def importance_weights(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, mode: str,
                       level: str, cap: float) -> tuple[Tensor | None, dict]:
    """(weights, stats) for samples drawn by the sampler mu and scored by pi_old.

    old_logp, sampler_logp, mask: [B, T] (log pi_old and log mu of each response token; mask 0/1).
    weights: [B, T] at level "token" (0 at padding), [B] at level "sequence"; None for mode "none".
    stats (floats, over units: tokens or responses): rc_weight_mean, rc_capped_frac (fraction with
    r > C: truncated by tis, zeroed by mis), rc_log_ratio_max (max |log r|), rc_ess (effective
    sample size fraction (sum w)^2 / (n sum w^2), 1 when all weights are equal).
    """
    check_options(mode, level, cap)
    if mode == "none":
        return None, {}
    with torch.no_grad():
        dt = torch.promote_types(old_logp.dtype, torch.float32)
        m = mask.to(dt)
        log_r = torch.where(m > 0, old_logp.to(dt) - sampler_logp.to(dt), 0.0)  # [B, T] per token
        if not bool(torch.isfinite(log_r).all()):
            bad = tuple((~torch.isfinite(log_r)).nonzero()[0].tolist())
            raise ValueError(f"log pi_old - log pi_sampler is not finite at {bad}: old_logp "
                             f"{float(old_logp[bad])}, sampler_logp {float(sampler_logp[bad])}")
        if level == "sequence":
            log_r, m = log_r.sum(1), torch.ones(m.shape[0], dtype=dt, device=m.device)  # [B]
        r = log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
        over = (r > cap) & (m > 0)
        # tis: min(r, C); mis: r 1{r <= C}
        w = r.clamp(max=cap) if mode == "tis" else torch.where(over, 0.0, r)
        w = w * m                                                           # 0 at padding
        w64 = w.double()                                                    # sums in float64
        n, sw, sw2 = float(m.sum()), float(w64.sum()), float((w64 * w64).sum())
    return w, {"rc_weight_mean": sw / n, "rc_capped_frac": float(over.sum()) / n,
               "rc_log_ratio_max": float(log_r.abs().max()),
               "rc_ess": sw * sw / (n * sw2) if sw2 > 0 else 0.0}


def weights_for_batch(batch, cfg) -> dict:
    """Set ``batch.rollout_weight`` from cfg.rollout_correction* (None for "none"); return the
    statistics to log. The engine must have reported its log-probs (checked at configuration)."""
    if cfg.rollout_correction == "none":
        return {}
    if batch.sampler_logp is None:
        raise RuntimeError(f"--rollout-correction {cfg.rollout_correction}: engine {cfg.engine!r} "
                           f"returned no sampler log-probs for this batch")
    batch.rollout_weight, stats = importance_weights(
        batch.old_logp, batch.sampler_logp, batch.mask, mode=cfg.rollout_correction,
        level=cfg.rollout_correction_level, cap=cfg.rollout_correction_cap)
    return stats
