"""verl 0.9.1's own actor loss (verl.workers.utils.losses.ppo_loss), where verl is installed."""

from __future__ import annotations

import torch

from rpg_ref.audit.adapter import BETA, Adapter
from rpg_ref.audit.adapters.common import AGG, VERL_KL_TYPES, VERL_NOTE


def _verl_own(kind: str) -> Adapter:
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        use_kl_loss=True,
        kl_loss_type=kind,
        kl_loss_coef=BETA,
        loss_agg_mode=AGG,
        policy_loss=PolicyLossConfig(loss_mode="vanilla"),
    )

    def loss(logp, old, ref, adv, mask):
        B, H = logp.shape
        # verl's packed model output: per response 1 prompt token + H response tokens, log-probs
        # shifted left by one (the prompt position predicts y_1), so the last slot is unused
        packed = torch.cat([logp, logp.new_zeros(B, 1)], 1).reshape(-1)
        data = TensorDict({"prompts": torch.zeros(B, 1, dtype=torch.long),
                           "responses": torch.zeros(B, H, dtype=torch.long),
                           "attention_mask": torch.ones(B, 1 + H, dtype=torch.long),
                           "response_mask": mask.bool(), "old_log_probs": old, "ref_log_prob": ref,
                           "advantages": adv[:, None].expand(B, H).contiguous()}, batch_size=[B])
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=B)
        return ppo_loss(cfg, {"log_probs": packed}, data)[0]

    return Adapter(
        f"verl kl_loss_type={kind}", loss, BETA, "verl 0.9.1", True, "token", VERL_NOTE[kind]
    )


def verl_adapters() -> tuple[list[Adapter], list[str]]:
    """verl's own loss for every kl_loss_type, or ([], [why not]) without verl 0.9.x."""
    try:
        import verl
    except ImportError:
        return [], [
            (
                "verl is not installed: its own-code rows are left out (the 'from docs' rows stand "
                "for them; CI checks they agree in .venv-verl)"
            )
        ]
    if not verl.__version__.startswith("0.9."):
        return [], [
            f"verl {verl.__version__} is installed; the adapters are written for 0.9.x: left out"
        ]
    return [_verl_own(k) for k in VERL_KL_TYPES], []
