"""TRL integration: every RPG loss inside TRL's GRPOTrainer (written against TRL 1.16.0).

    from rpg_ref.integrations.trl import RPGConfig, RPGTrainer
    args = RPGConfig(output_dir="out", rpg_loss="rpg-reinforce-urkl",  # the paper's beta, c
                     epsilon_high=0.28)                                 # and its clip
    RPGTrainer(model="Qwen/Qwen3-4B", reward_funcs=reward, args=args, train_dataset=ds).train()

RPGTrainer is GRPOTrainer with one method replaced, ``_compute_loss`` (the hook TRL's own
``compute_loss`` calls): TRL still generates, scores, computes advantages and old log-probs, and
its ``_get_per_token_logps_and_entropies`` gives log pi_theta; the loss is then
``rpg_ref.core.losses.LOSSES[rpg_loss]``, called (never copied), and rescaled by a constant to TRL's
normalization. RPGConfig is GRPOConfig plus the ``rpg_*`` fields; it refuses, when it is built,
every TRL setting that contradicts the loss. Option mapping:

    rpg_loss                     the loss (the eight rpg-* losses, grpo, grpo-corrected, dapo)
    rpg_beta                     beta of the loss (None: 1e-4, the paper's; 0 for dapo)
    epsilon / epsilon_high       eps_low / eps_high; epsilon_high None means epsilon, as in TRL
                                 (the paper's clip: epsilon_high=0.28)
    rpg_dual_clip_c              dual-clip c > 1, inf: no dual bound (None: 10, the paper's released
                                 scripts, for the rpg losses; none for grpo/dapo); rpg_clip=False:
                                 no clipping (rpg losses)
    rpg_level                    the loss's level: "token", or "sequence" = the whole response,
                                 ratio pi_theta(y)/pi_old(y), the product of its token ratios.
                                 TRL's importance_sampling_level must stay "token": its "sequence"
                                 is GSPO's geometric mean of the token ratios, which no rpg loss
                                 computes, so it is refused.
    loss_type                    aggregation, TRL's normalizer (LOSS_TYPE_AGG below)
    scale_rewards                the advantage (None: the loss's own estimator: R - group mean,
                                 "none", for the rpg losses; "group" for grpo/dapo)
    rpg_reference                "old" (default): pi_ref = pi_old, the paper's iterative reference.
                                 TRL's beta must be 0, so TRL loads no reference model. pi_old is
                                 the policy that generated the batch: TRL's old_per_token_logps
                                 when it keeps them (num_iterations > 1, or steps_per_generation >
                                 gradient_accumulation_steps), else the current log-probs detached
                                 (one update per batch: pi_theta = pi_old there, w = 1).
                                 "model": pi_ref = TRL's reference model (the initial policy, or
                                 refreshed every ref_model_sync_steps with sync_ref_model); TRL
                                 loads and scores it only when its beta > 0: set beta = rpg_beta.
                                 TRL's own k3 KL term is never added, so use_bias_correction_kl
                                 (which weights that term) must agree with the loss: False for
                                 grpo (k3 as TRL adds it), True for grpo-corrected (k3 times
                                 pi_theta/pi_old), False for the others (their KL is their own).
                                 With beta = 0 TRL adds no KL term and the flag acts nowhere.
    use_vllm (TRL's vLLM)        TRL's vllm_importance_sampling_correction (default True) becomes
                                 rpg_ref's rollout correction (rpg_ref.trainer.rollout_correction)
                                 with the same weights: mode token_/sequence_ + truncate/mask
                                 -> level token/sequence, tis/mis; the cap is
                                 vllm_importance_sampling_clip_max (None: no cap; a clip_min is
                                 refused). The weight multiplies each response's (or token's)
                                 whole rpg loss term, KL included (E_mu[r L] = E_old[L]); TRL puts
                                 it on its policy term only. A token vLLM gave no log-prob for
                                 gets weight 1, as in TRL.

With pi_ref = pi_old every divergence and its gradient vanish at the first update of a batch, so
beta acts only across several updates of one batch (steps_per_generation > gradient accumulation
steps, or num_iterations > 1), as in the paper's scheme.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig, GRPOTrainer

from rpg_ref.core.losses import LOSSES, SPECS, parse_clip, resolve_options
from rpg_ref.trainer import rollout_correction
from rpg_ref.trainer.presets import PAPER_HPARAMS

SUPPORTED = [
    n for n in LOSSES if not SPECS[n].kl_in_reward and SPECS[n].advantage.startswith("group")
]
# TRL loss_type -> rpg aggregation; TRL's normalizer is applied on top (trl_scale)
LOSS_TYPE_AGG = {"dapo": "token-mean", "bnpo": "token-mean", "grpo": "seq-mean-token-mean",
                 "luspo": "seq-mean-token-sum", "dr_grpo": "seq-mean-token-sum"}
# the advantage TRL must compute for a loss's default estimator (rpg_ref.core.advantages names)
SCALE_REWARDS = {"group-mean": "none", "group-mean-std": "group"}
REFERENCES = ("old", "model")
# TRL's vllm_importance_sampling_mode -> rpg_ref's rollout correction (mode, level)
VLLM_IS_MODES = {"token_truncate": ("tis", "token"), "token_mask": ("mis", "token"),
                 "sequence_truncate": ("tis", "sequence"), "sequence_mask": ("mis", "sequence")}
# use_bias_correction_kl a loss's KL agrees with when TRL's beta > 0 (TRL's k3 term is replaced)
BIAS_CORRECTED_KL = {"grpo": False, "grpo-corrected": True}


@dataclass
class RPGConfig(GRPOConfig):
    """GRPOConfig plus the rpg loss and its options (module docstring); checked when built."""
    rpg_loss: str = field(default="rpg-reinforce-urkl", metadata={"help": f"one of {SUPPORTED}"})
    rpg_beta: float | None = field(default=None, metadata={
        "help": "KL coefficient of the rpg loss (None: 1e-4, the paper's; 0 for dapo)"})
    rpg_dual_clip_c: float | None = field(default=None, metadata={
        "help": "dual-clip bound c > 1, inf: none (None: 10, the paper's released scripts, for the "
                "rpg losses; none for grpo/dapo); eps_low/eps_high are epsilon/epsilon_high"})
    rpg_clip: bool = field(default=True, metadata={"help": "False: no clipping (rpg losses only)"})
    rpg_level: str = field(default="token", metadata={
        "help": "'token', or 'sequence': one ratio pi_theta(y)/pi_old(y) per response, the product "
                "of its token ratios (TRL's importance_sampling_level='sequence' is GSPO's "
                "geometric mean, refused)"})
    rpg_reference: str = field(
        default="old",
        metadata={
            "help": ("'old': pi_ref = pi_old (the paper); 'model': TRL's reference model (beta = "
                     "rpg_beta)")
        },
    )
    scale_rewards: str | None = field(default=None, metadata={
        "help": "TRL's reward scaling; None: the loss's own advantage ('none' = R - group mean for "
                "the rpg losses, 'group' for grpo/dapo)"})

    def __post_init__(self):
        if self.rpg_loss not in SUPPORTED:
            why = (
                " (its KL is in a token-level reward TRL does not compute)"
                if self.rpg_loss in LOSSES
                else ""
            )
            raise ValueError(f"rpg_loss {self.rpg_loss!r} cannot run in TRL{why}; choose one of "
                             f"{', '.join(SUPPORTED)}")
        if self.rpg_beta is None:
            self.rpg_beta = SPECS[self.rpg_loss].default_beta(PAPER_HPARAMS["beta"])
        # a PPO-type loss's own; else the paper's RPG clip
        own = SPECS[self.rpg_loss].default_clip
        if self.rpg_dual_clip_c is None:
            self.rpg_dual_clip_c = own[2] if own else PAPER_HPARAMS["dual_clip_c_released_code"]
        if self.scale_rewards is None:
            self.scale_rewards = SCALE_REWARDS[SPECS[self.rpg_loss].advantage]
        super().__post_init__()
        check_trl_settings(self)


def rpg_clip(args: RPGConfig) -> tuple | None:
    """(eps_low, eps_high, c or None) from TRL's epsilon / epsilon_high and rpg_dual_clip_c."""
    if not args.rpg_clip:
        return None
    high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    return parse_clip((args.epsilon, high, args.rpg_dual_clip_c))


def check_trl_settings(args: RPGConfig) -> None:
    """One ValueError for the first TRL setting that contradicts the rpg loss (module docstring)."""
    name = args.rpg_loss
    if args.rpg_reference not in REFERENCES:
        raise ValueError(f"rpg_reference must be one of {REFERENCES}, got {args.rpg_reference!r}")
    if args.rpg_reference == "old" and args.beta != 0:
        raise ValueError(f"beta={args.beta} makes TRL load a frozen reference model for its own KL "
                         f"term; with rpg_reference='old' (pi_ref = pi_old, the paper) set beta=0 "
                         f"and give the loss's KL coefficient as rpg_beta")
    if args.rpg_reference == "model" and args.beta != args.rpg_beta:
        raise ValueError(f"rpg_reference='model' uses TRL's reference model, which TRL loads only "
                         f"when beta > 0: set beta = rpg_beta (got beta={args.beta}, rpg_beta="
                         f"{args.rpg_beta}); TRL's own KL term is not added")
    if args.loss_type not in LOSS_TYPE_AGG:
        raise ValueError(f"loss_type {args.loss_type!r} is a loss of its own, not an aggregation; "
                         f"with an rpg loss use one of {', '.join(LOSS_TYPE_AGG)}")
    if args.importance_sampling_level != "token":
        raise ValueError(f"importance_sampling_level={args.importance_sampling_level!r} is TRL's "
                         f"geometric mean of token ratios (GSPO), which no rpg loss computes: keep "
                         f"it 'token'; rpg_level='sequence' gives the response's ratio "
                         f"pi_theta(y)/pi_old(y), the product of its token ratios")
    want = BIAS_CORRECTED_KL.get(name, False)
    if args.beta != 0 and args.use_bias_correction_kl != want:
        fix = {"grpo": "rpg_loss='grpo-corrected' (k3 times pi_theta/pi_old)",
               "grpo-corrected": "rpg_loss='grpo' (k3 as TRL adds it)"}.get(
            name, f"use_bias_correction_kl=False ({name}'s KL term is its own)")
        raise ValueError(f"use_bias_correction_kl={args.use_bias_correction_kl} weights TRL's k3 "
                         f"term, which RPGTrainer replaces by {name}'s KL: set {fix}")
    resolve_options(
        name,
        beta=args.rpg_beta,
        clip=rpg_clip(args),
        level=args.rpg_level,
        agg=LOSS_TYPE_AGG[args.loss_type],
        no_clip=not args.rpg_clip,
    )
    if args.use_vllm and args.vllm_importance_sampling_correction:
        vllm_correction(args)  # refuses what rpg_ref's rollout correction cannot do
    # TRL options that reweight or add to the per-token loss, which the rpg loss replaces
    refused = {
        "delta": (args.delta is not None, "None (the rpg dual clip is rpg_dual_clip_c)"),
        "off_policy_mask_threshold": (args.off_policy_mask_threshold is not None, "None"),
        "top_entropy_quantile": (args.top_entropy_quantile != 1.0, "1.0"),
        "entropy_coef": (args.entropy_coef != 0.0, "0.0"),
        "use_adaptive_entropy": (args.use_adaptive_entropy, "False"),
    }
    for key, (bad, fix) in refused.items():
        if bad:
            raise ValueError(
                f"{key}={getattr(args, key)!r} is not supported with rpg_loss={name!r}: "
                f"set {key}={fix}"
            )


def vllm_correction(args: RPGConfig) -> tuple[str, str, float] | None:
    """TRL's vLLM importance-sampling correction as rpg_ref's rollout correction (mode, level,
    cap), or None when off; a ValueError (one line) for what it cannot express."""
    if not (args.use_vllm and args.vllm_importance_sampling_correction):
        return None
    mode = args.vllm_importance_sampling_mode
    if mode not in VLLM_IS_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {', '.join(VLLM_IS_MODES)}"
                         f", got {mode!r}")
    if args.vllm_importance_sampling_clip_min is not None:
        raise ValueError(f"vllm_importance_sampling_clip_min="
                         f"{args.vllm_importance_sampling_clip_min} has no counterpart in "
                         f"rpg_ref's rollout correction (an upper cap only): set it to None")
    cap = args.vllm_importance_sampling_clip_max
    cap = float("inf") if cap is None else cap
    rc_mode, level = VLLM_IS_MODES[mode]
    try:
        rollout_correction.check_options(rc_mode, level, cap)
    except ValueError as e:
        raise ValueError(f"vllm_importance_sampling_clip_max={cap}: {e}") from None
    if level == "token" and args.rpg_level == "sequence":
        raise ValueError(f"vllm_importance_sampling_mode={mode!r} weights tokens, but "
                         f"rpg_level='sequence' has one term per response: use a sequence_* mode")
    return rc_mode, level, cap


def trl_scale(loss_type: str, *, n_tokens: float, rows_kept: int, rows: int, num_items_in_batch,
              num_processes: int, accumulation: float, steps_per_generation: int,
              max_completion_length: int) -> float:
    """The constant that turns the rpg loss over the kept (non-empty) rows, aggregated by
    LOSS_TYPE_AGG[loss_type], into TRL's normalization of that loss_type:
        dapo     sum / (tokens of the generation batch / processes * accumulation / steps_per_gen.)
        bnpo     sum / local tokens / accumulation
        grpo     mean over all B rows of the row's token-mean / accumulation
        luspo    mean over all B rows of the row's token-sum / accumulation
        dr_grpo  sum / (B * max_completion_length) / accumulation
    (``accumulation`` = TRL's current gradient-accumulation steps in training, 1 in evaluation.)"""
    if loss_type == "dapo":
        normalizer = max(float(num_items_in_batch), 1.0) / num_processes
        return n_tokens / (normalizer * accumulation / steps_per_generation)
    if loss_type == "bnpo":
        return 1.0 / accumulation
    scale = rows_kept / rows / accumulation                     # rpg's seq means are over kept rows
    return scale / max_completion_length if loss_type == "dr_grpo" else scale


class RPGTrainer(GRPOTrainer):
    """GRPOTrainer whose loss is rpg_ref.core.losses.LOSSES[args.rpg_loss] (module docstring)."""

    def __init__(self, model, reward_funcs=None, args: RPGConfig | None = None, **kwargs):
        if not isinstance(args, RPGConfig):
            raise ValueError(
                "RPGTrainer needs args=RPGConfig(...) (a GRPOConfig plus the rpg_* fields)"
            )
        super().__init__(model, reward_funcs, args, **kwargs)
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != self.accelerator.num_processes:  # e.g. torchrun on CPU without use_cpu=True
            raise ValueError(
                f"{launched} processes were launched but accelerate sees "
                f"{self.accelerator.num_processes}: on CPU set use_cpu=True (--use_cpu)"
            )
        self.rpg_loss_fn = LOSSES[args.rpg_loss]
        self.rpg_options = resolve_options(  # resolved once; every loss call gets these
            args.rpg_loss, beta=args.rpg_beta, clip=rpg_clip(args),
            level=args.rpg_level, agg=LOSS_TYPE_AGG[args.loss_type])
        self.rpg_correction = vllm_correction(args)  # (mode, level, cap) or None

    def rollout_weights(self, inputs, mask):
        """rpg_ref's rollout correction of TRL's vLLM samples: weights [B, T] (token level) or [B]
        (sequence level) and their statistics; (None, {}) without the correction. A token vLLM
        gave no log-prob for (NaN) has ratio 1, as in TRL."""
        if self.rpg_correction is None:
            return None, {}
        mode, level, cap = self.rpg_correction
        old, sampler = inputs["old_per_token_logps"], inputs["sampling_per_token_logps"]
        sampler = torch.where(torch.isnan(sampler), old, sampler)     # [B, T]
        return rollout_correction.importance_weights(old, sampler, mask, mode=mode, level=level,
                                                     cap=cap)

    def _compute_loss(self, model, inputs):
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = (
            completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        )
        logp, entropy, aux_loss = self._get_per_token_logps_and_entropies(  # [B, T] each
            model, input_ids, attention_mask, completion_ids.size(1),
            compute_entropy=True, compute_aux_loss=self.aux_loss_enabled,
            **{k: inputs[k] for k in _FORWARD_KEYS if k in inputs})
        old = inputs.get("old_per_token_logps")
        # TRL skips it when pi_theta = pi_old exactly
        old = logp.detach() if old is None else old
        ref = inputs["ref_per_token_logps"] if self.args.rpg_reference == "model" and \
            self.beta != 0 else None                    # None: pi_ref = pi_old
        adv = inputs["advantages"]                      # [B] (or [B, T] from a subclass)

        weight, rc_stats = self.rollout_weights(inputs, mask)  # [B, T], [B] or None

        keep = mask.sum(-1) > 0                         # [B]: rpg losses refuse empty rows
        mode = "train" if self.model.training else "eval"
        if bool(keep.any()):
            loss, stats = self.rpg_loss_fn(
                logp[keep], old[keep], adv[keep], mask[keep],
                ref_logp=None if ref is None else ref[keep],
                sample_weight=None if weight is None else weight[keep], options=self.rpg_options)
        else:                                           # nothing to learn; still a graph for DDP
            loss, stats = (logp * 0.0).sum(), {}
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = loss * trl_scale(
            self.loss_type, n_tokens=float(mask.sum()), rows_kept=int(keep.sum()), rows=len(keep),
            num_items_in_batch=inputs.get("num_items_in_batch", mask.sum()),
            num_processes=self.accelerator.num_processes, accumulation=accumulation,
            steps_per_generation=self.args.steps_per_generation if mode == "train" else 1,
            max_completion_length=self.max_completion_length)
        if self.aux_loss_enabled:                       # MoE load balancing, as TRL adds it
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
        # token-mean over all processes, as TRL logs it
        if entropy is not None:
            totals = self.accelerator.reduce(
                torch.stack([(entropy.detach() * mask).sum(), mask.sum().to(entropy.dtype)]),
                reduction="sum",
            )
            self._metrics[mode]["entropy"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        for key in (
            "kl",
            "kl_old",
            "ratio_mean",
            "clip_frac_low",
            "clip_frac_high",
            "clip_frac_dual",
        ):
            value = stats.get(key, torch.zeros((), dtype=torch.float32)).to(
                logp.device, torch.float32
            )
            self._metrics[mode][f"rpg/{key}"].append(self.accelerator.gather(value).mean().item())
        for key, value in rc_stats.items():  # over processes: the largest |log r|, else the mean
            v = self.accelerator.gather(torch.tensor(value, device=logp.device))
            self._metrics[mode][f"rpg/{key}"].append(
                (v.max() if key == "rc_log_ratio_max" else v.mean()).item())
        return loss


# inputs that TRL's _get_per_token_logps_and_entropies takes besides the ids (multimodal models)
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
