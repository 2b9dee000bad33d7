"""verl plugin: every RPG loss in verl's policy-loss registry (verl >= 0.5; checked with verl
0.9.1).

Use it by listing this module in VERL_USE_EXTERNAL_MODULES (verl imports it in every worker) and
choosing a loss by name:

    VERL_USE_EXTERNAL_MODULES=rpg_ref.integrations.verl python -m verl.trainer.main_ppo \\
        actor_rollout_ref.actor.policy_loss.loss_mode=rpg-reinforce-urkl \\
        actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.kl_loss_coef=1e-4 ...

Registered names (REGISTERED): the eight rpg losses of rpg_ref.core.losses and grpo-corrected, and
each loss that may run unclipped (the rpg losses; grpo-corrected always clips) also with a "-noclip"
suffix. Each is a thin adapter: it calls the rpg_ref.core.losses function itself
(never a copy) at level="token" with pi_ref = pi_old (verl's policy-loss signature carries no
reference log-probs, which is exactly the paper's iterative reference: use_kl_loss=False, no ref
model) and rescales the result to verl's global aggregation.

Actor-config keys read (actor_rollout_ref.actor.*):
    kl_loss_coef               beta, the loss's own KL coefficient (use_kl_loss must be False,
                               else verl would add its own, unweighted KL on top: ValueError)
    clip_ratio_low / clip_ratio_high (fall back to clip_ratio)   eps_low, eps_high
    clip_ratio_c               dual-clip bound c (> 1, inf: none); the "-noclip" names ignore all
                               three (checked on each call by
                               rpg_ref.core.losses.resolve_options, the loss options' one rule book)
    loss_agg_mode              token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean,
                               seq-mean-token-sum-norm
    global_batch_info          dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
                               (filled by verl's workers; defaults: the local batch)

Aggregation. rpg_ref returns L_rpg aggregated over the local micro-batch (token-mean:
sum_b S_b / N_local; seq modes: mean over the B_local rows, with S_b the masked token sum of
row b and N_local the token count). verl wants, per verl.trainer.ppo.core_algos.agg_loss,
    token-mean               sum_b S_b / batch_num_tokens * dp_size
                             = L_rpg(token-mean) * N_local * dp / bnt
    token-sum                sum_b S_b * dp_size
                             = L_rpg(token-mean) * N_local * dp
    seq-mean-token-mean      sum_b S_b/n_b / global_batch_size * dp
                             = L_rpg(seq-mean-token-mean) * B_local * dp / gbs
    seq-mean-token-sum       sum_b S_b / global_batch_size * dp
                             = L_rpg(seq-mean-token-sum) * B_local * dp / gbs
    seq-mean-token-sum-norm  the previous / loss_scale_factor (default: the padded length T)
The factors are constants, so values and gradients are rpg_ref's times the factor. (verl's own
seq-mean-token-mean divides by n_b + 1e-8; rpg_ref divides by n_b.) Rows with no response token
contribute nothing in verl and are dropped before the call (rpg_ref rejects empty rows).

Not supported (ValueError): rollout_is_weights (verl's rollout-correction IS weights): the rpg
losses have no per-token weight input; turn algorithm.rollout_correction off for these losses.
"""
from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import register_policy_loss

from rpg_ref.core.losses import LOSSES, SPECS, parse_clip, resolve_options

BASE_NAMES = [n for n in LOSSES if SPECS[n].family in ("rpg", "rpg-reinforce")] + ["grpo-corrected"]
REGISTERED = BASE_NAMES + [f"{n}-noclip" for n in BASE_NAMES if not SPECS[n].always_clips]
VERL_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                  "seq-mean-token-sum-norm")


def _get(config, key: str, default=None):
    if config is None:
        return default
    v = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if v is None else v


def read_config(config, clipped: bool) -> tuple[float, tuple | None]:
    """(beta, clip) from verl's actor config (module docstring); clip = (eps_low, eps_high, c or
    None)."""
    beta, clip = _config_values(config, clipped)
    return beta, parse_clip(clip)


def _config_values(config, clipped: bool) -> tuple[float, tuple | None]:
    """(beta, clip as verl's config gives it), checked by resolve_options on each call."""
    if config is None:
        raise ValueError("rpg losses need verl's actor config (beta = kl_loss_coef, clip ratios)")
    if _get(config, "use_kl_loss", False):
        raise ValueError(
            "actor.use_kl_loss=True would add verl's own KL loss on top of the rpg loss's "
            "KL term: set actor_rollout_ref.actor.use_kl_loss=False (beta is read from "
            "actor.kl_loss_coef)"
        )
    beta = float(_get(config, "kl_loss_coef", 0.0))
    if not clipped:
        return beta, None
    eps = _get(config, "clip_ratio", 0.2)
    low, high = _get(config, "clip_ratio_low", eps), _get(config, "clip_ratio_high", eps)
    return beta, (low, high, _get(config, "clip_ratio_c", 3.0))


def _agg_plan(mode: str) -> str:
    if mode not in VERL_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {VERL_AGG_MODES}, got {mode!r}")
    return "token-mean" if mode in ("token-mean", "token-sum") else \
        "seq-mean-token-mean" if mode == "seq-mean-token-mean" else "seq-mean-token-sum"


def verl_scale(mode: str, mask: torch.Tensor, info: dict) -> float:
    """The constant turning rpg_ref's local aggregation into verl's global one (module
    docstring)."""
    dp = int(info.get("dp_size") or 1)
    n_local, b_local = float(mask.sum()), int((mask.sum(-1) > 0).sum())
    if mode in ("token-mean", "token-sum"):
        bnt = info.get("batch_num_tokens")
        if bnt is None and dp > 1:
            raise ValueError("global_batch_info.batch_num_tokens is required when dp_size > 1")
        return (
            n_local * dp
            if mode == "token-sum"
            else n_local * dp / float(bnt if bnt is not None else n_local)
        )
    gbs = info.get("global_batch_size")
    if gbs is None and dp > 1:
        raise ValueError("global_batch_info.global_batch_size is required when dp_size > 1")
    scale = b_local * dp / float(gbs if gbs is not None else b_local)
    if mode == "seq-mean-token-sum-norm":
        lsf = info.get("loss_scale_factor")
        scale /= float(lsf if lsf is not None else mask.shape[-1])
    return scale


def _make(name: str):
    base = name.removesuffix("-noclip")
    fn, clipped = LOSSES[base], not name.endswith("-noclip")

    def policy_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict]:
        if rollout_is_weights is not None:
            raise ValueError(
                f"{name}: rollout_is_weights are not supported by the rpg losses; disable "
                f"algorithm.rollout_correction for this loss"
            )
        beta, clip = _config_values(config, clipped)
        options = resolve_options(base, beta=beta, clip=clip, level="token",
                                  agg=_agg_plan(loss_agg_mode))
        info = dict(_get(config, "global_batch_info", {}) or {})
        # [B, T]
        mask = response_mask.to(log_prob.dtype if log_prob.is_floating_point() else torch.float32)
        # [B]
        keep = mask.sum(-1) > 0
        if not bool(keep.any()):  # nothing to learn from: a zero that still depends on log_prob
            return (log_prob * 0.0).sum(), {}
        loss, stats = fn(log_prob[keep], old_log_prob[keep], advantages[keep], mask[keep],
                         options=options)
        loss = loss * verl_scale(loss_agg_mode, mask, info)
        with torch.no_grad():
            m = mask[keep]
            ppo_kl = float(((old_log_prob[keep] - log_prob[keep]) * m).sum() / m.sum())
        metrics = {"actor/pg_clipfrac": float(stats["clip_frac_low"] + stats["clip_frac_high"]),
                   "actor/pg_clipfrac_lower": float(stats["clip_frac_dual"]),
                   "actor/ppo_kl": ppo_kl}
        metrics.update({f"actor/rpg_{k}": float(v) for k, v in stats.items()})
        return loss, metrics

    policy_loss.__name__ = "rpg_" + name.replace("-", "_")
    policy_loss.__doc__ = (
        f"verl adapter for rpg_ref.core.losses '{base}' "
        f"({'clipped' if clipped else 'no clip'}).\n\n"
        + (fn.formula.__doc__ or "")
    )
    return policy_loss


for _name in REGISTERED:
    register_policy_loss(_name)(_make(_name))
