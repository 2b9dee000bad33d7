"""TRL 1.16's own GRPO loss: GRPOTrainer._compute_loss, called on a stand-in for the trainer.

_compute_loss is a method of a trainer that needs a model, data and an accelerator; the stand-in
holds only the attributes the method reads (its config values, a no-op metrics sink) and returns the
audit's log-probs from _get_per_token_logps_and_entropies. loss_type="grpo" (per-response token
mean, mean over responses; x H gives the audit's seq-mean-token-sum), epsilon 0.2, beta = BETA,
importance_sampling_level token | sequence, use_bias_correction_kl off | on.
"""

from __future__ import annotations

import types
from collections import defaultdict

import torch

from rpg_ref.audit.adapter import BETA, Adapter

TRL_VERSION = "1.16.0"


class _Accelerator:
    sync_gradients = True
    num_processes = 1

    @staticmethod
    def gather(x):
        return x

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


def _stand_in(level: str, bias_correction: bool):
    return types.SimpleNamespace(
        beta=BETA,
        loss_type="grpo",
        importance_sampling_level=level,
        epsilon_low=0.2,
        epsilon_high=0.2,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        model=types.SimpleNamespace(training=True),
        accelerator=_Accelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=types.SimpleNamespace(use_bias_correction_kl=bias_correction, delta=None),
    )


def trl_adapters() -> tuple[list[Adapter], list[str]]:
    try:
        import trl
        from trl.trainer.grpo_trainer import GRPOTrainer
    except ImportError as e:
        return [], [f"TRL is not importable here ({e}): its own-code rows are left out"]
    if trl.__version__ != TRL_VERSION:
        return [], [
            (f"TRL {trl.__version__} is installed; the adapters are pinned to {TRL_VERSION}: left "
             "out")
        ]

    def make(level: str, bias_correction: bool) -> Adapter:
        def loss(logp, old, ref, adv, mask):
            B, H = logp.shape
            me = _stand_in(level, bias_correction)
            me._get_per_token_logps_and_entropies = lambda *a, **k: (
                logp,
                torch.zeros_like(logp),
                None,
            )
            inputs = {
                "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
                "prompt_mask": torch.ones(B, 1),
                "completion_ids": torch.zeros(B, H, dtype=torch.long),
                "completion_mask": mask,
                "advantages": adv,
                "old_per_token_logps": old,
                "ref_per_token_logps": ref,
            }
            return H * GRPOTrainer._compute_loss(me, None, inputs)

        return Adapter(
            f"TRL GRPO importance_sampling_level={level} use_bias_correction_kl={bias_correction}",
            loss,
            BETA,
            f"TRL {TRL_VERSION}",
            True,
            level,
            "GRPOTrainer._compute_loss, loss_type=grpo, k3 per token",
        )
    return [make(lv, bc) for lv in ("token", "sequence") for bc in (False, True)], []
