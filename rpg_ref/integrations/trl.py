"""TRL integration: every RPG loss inside TRL's GRPOTrainer (written against TRL 1.16.0).

    from rpg_ref.integrations.trl import RPGConfig, RPGTrainer
    args = RPGConfig(output_dir="out", rpg_loss="rpg-reinforce-urkl")  # the paper's beta, clip
    RPGTrainer(model="Qwen/Qwen3-4B", reward_funcs=reward, args=args, train_dataset=ds).train()

RPGTrainer is GRPOTrainer with one method replaced, ``_compute_loss`` (the hook TRL's own
``compute_loss`` calls): TRL still generates, scores, computes advantages and old log-probs, and
its ``_get_per_token_logps_and_entropies`` gives log pi_theta; the loss is then
``rpg_ref.core.losses.LOSSES[rpg_loss]``, called (never copied), and rescaled by a constant to TRL's
normalization. RPGConfig is GRPOConfig plus the ``rpg_*`` fields; it refuses, when it is built,
every TRL setting that contradicts the loss. Option mapping:

    rpg_loss                     the loss (the eight rpg-* losses, grpo, grpo-corrected, dapo)
    rpg_beta                     beta of the loss (None: 1e-4, the paper's; 0 for dapo)
    epsilon / epsilon_high       eps_low / eps_high (epsilon_high None: the paper's 0.28 for the
                                 rpg losses and dapo, 0.2 for grpo)
    rpg_dual_clip_c              dual-clip c > 1, inf: no dual bound (None: 10, the paper's released
                                 scripts, for the rpg losses; none for grpo/dapo); rpg_clip=False:
                                 no clipping (rpg losses)
    importance_sampling_level    level: "token", or "sequence" = the whole response, ratio
                                 pi_theta(y)/pi_old(y) (the product, not GSPO's geometric mean)
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
                                 TRL's own k3 KL term is never added.

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
from rpg_ref.trainer.config import PAPER_HPARAMS

SUPPORTED = [
    n for n in LOSSES if not SPECS[n].kl_in_reward and SPECS[n].advantage.startswith("group")
]
# TRL loss_type -> rpg aggregation; TRL's normalizer is applied on top (trl_scale)
LOSS_TYPE_AGG = {"dapo": "token-mean", "bnpo": "token-mean", "grpo": "seq-mean-token-mean",
                 "luspo": "seq-mean-token-sum", "dr_grpo": "seq-mean-token-sum"}
# the advantage TRL must compute for a loss's default estimator (rpg_ref.core.advantages names)
SCALE_REWARDS = {"group-mean": "none", "group-mean-std": "group"}
REFERENCES = ("old", "model")


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
            self.rpg_beta = PAPER_HPARAMS["beta"] if SPECS[self.rpg_loss].has_kl else 0.0
        # a PPO-type loss's own; else the paper's RPG clip
        own = SPECS[self.rpg_loss].default_clip
        if self.epsilon_high is None:
            self.epsilon_high = own[1] if own else PAPER_HPARAMS["clip_rpg"][1]
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
    if args.importance_sampling_level not in ("token", "sequence"):
        raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got "
                         f"{args.importance_sampling_level!r}")
    resolve_options(
        name,
        beta=args.rpg_beta,
        clip=rpg_clip(args),
        level=args.importance_sampling_level,
        agg=LOSS_TYPE_AGG[args.loss_type],
        no_clip=not args.rpg_clip,
    )
    # TRL options that reweight or add to the per-token loss, which the rpg loss replaces
    refused = {
        "delta": (args.delta is not None, "None (the rpg dual clip is rpg_dual_clip_c)"),
        "off_policy_mask_threshold": (args.off_policy_mask_threshold is not None, "None"),
        "top_entropy_quantile": (args.top_entropy_quantile != 1.0, "1.0"),
        "entropy_coef": (args.entropy_coef != 0.0, "0.0"),
        "use_adaptive_entropy": (args.use_adaptive_entropy, "False"),
        "vllm_importance_sampling_correction": (
            args.use_vllm and args.vllm_importance_sampling_correction,
            "False with use_vllm (the rpg losses take no per-token weight)"),
    }
    for key, (bad, fix) in refused.items():
        if bad:
            raise ValueError(
                f"{key}={getattr(args, key)!r} is not supported with rpg_loss={name!r}: "
                f"set {key}={fix}"
            )


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
            level=args.importance_sampling_level, agg=LOSS_TYPE_AGG[args.loss_type])

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

        keep = mask.sum(-1) > 0                         # [B]: rpg losses refuse empty rows
        mode = "train" if self.model.training else "eval"
        if bool(keep.any()):
            loss, stats = self.rpg_loss_fn(
                logp[keep], old[keep], adv[keep], mask[keep],
                ref_logp=None if ref is None else ref[keep], options=self.rpg_options)
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
