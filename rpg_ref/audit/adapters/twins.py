"""Losses written here from a library's or paper's documented formula ("from docs" in the table).

    verl 0.9.1    the kl_loss_types (twins of verl's own code, tests/test_audit_verl.py checks
                  they agree)
    TRL           GRPOTrainer's k3 term, with and without use_bias_correction_kl (TRL's own code:
                  trl.py)
    DeepSeekMath  GRPO as published (Shao et al. 2024)
    DeepSeek-V3.2 the KL term k3 times the ratio pi_theta/pi_old, differentiable
    NeMo-RL       the KL estimate times exp(log pi - sg(log pi)) (value unchanged,
                  NVIDIA-NeMo/RL#2506); not installable from the package registry
    slime         --use-kl-loss --use-unbiased-kl: the estimate times exp(log pi - log pi_old),
                  differentiable; not installable from the package registry
    Liu et al.    k1 in the reward with per-token advantage A_t = R - beta k1_t (no return-to-go),
    2025          the setting in which it equals k2 as a loss (compare reinforce++: return-to-go)
"""

from __future__ import annotations

import torch

from rpg_ref.audit.adapter import BETA, Adapter
from rpg_ref.audit.adapters.common import (
    VERL_KL_TYPES,
    VERL_NOTE,
    k3,
    ppo_clip,
    token_sum_mean,
    verl_kl_estimate,
)

ESTIMATOR = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}   # Schulman's names -> verl's


def _verl_docs(kind: str) -> Adapter:
    def loss(logp, old, ref, adv, mask):
        # actor defaults: 0.2, c = 3
        pg = ppo_clip(logp, old, adv, 0.2, 0.2, dual_c=3.0)
        return token_sum_mean(pg + BETA * verl_kl_estimate(logp, ref, kind), mask)

    return Adapter(
        f"verl kl_loss_type={kind}", loss, BETA, "verl 0.9.1", False, "token", VERL_NOTE[kind]
    )


def _trl_docs(bias_correction: bool) -> Adapter:
    def loss(logp, old, ref, adv, mask):
        # TRL: k3(pi_ref / pi_theta)
        kl_tok = k3(logp, ref)
        if bias_correction:
            # times the ratio, differentiable
            kl_tok = torch.exp(logp - old) * kl_tok
        return token_sum_mean(ppo_clip(logp, old, adv, 0.2, 0.2) + BETA * kl_tok, mask)
    name = f"TRL GRPO use_bias_correction_kl={bias_correction}"
    return Adapter(name, loss, BETA, "TRL", False, "token", "k3 per token, PPO clip eps 0.2")


def _grpo_published() -> Adapter:
    def loss(logp, old, ref, adv, mask):
        return token_sum_mean(ppo_clip(logp, old, adv, 0.2, 0.2) + BETA * k3(logp, ref), mask)
    return Adapter("GRPO (published)", loss, BETA, "DeepSeekMath", False, "token",
                   "-min(wA, clip(w)A) + beta k3(pi_ref/pi_theta) per token")


def _deepseek_v32() -> Adapter:
    def loss(logp, old, ref, adv, mask):
        w = torch.exp(logp - old)                                             # differentiable ratio
        return token_sum_mean(ppo_clip(logp, old, adv, 0.2, 0.2) + BETA * w * k3(logp, ref), mask)
    return Adapter("DeepSeek-V3.2 KL term", loss, BETA, "DeepSeek-V3.2", False, "token",
                   "k3(π_ref/π) times π_θ/π_old per token")


def _nemo_rl(est: str) -> Adapter:
    def loss(logp, old, ref, adv, mask):
        kl_tok = verl_kl_estimate(logp, ref, ESTIMATOR[est]) * torch.exp(logp - logp.detach())
        return token_sum_mean(ppo_clip(logp, old, adv, 0.2, 0.2) + BETA * kl_tok, mask)
    return Adapter(f"NeMo-RL {est} (twin)", loss, BETA, "NeMo-RL", False, "token",
                   f"{est} times exp(log π - sg(log π)); written from the documented formula")


def _slime(est: str) -> Adapter:
    def loss(logp, old, ref, adv, mask):
        kl_tok = verl_kl_estimate(logp, ref, ESTIMATOR[est]) * torch.exp(logp - old)
        return token_sum_mean(ppo_clip(logp, old, adv, 0.2, 0.2) + BETA * kl_tok, mask)
    return Adapter(f"slime {est} --use-unbiased-kl (twin)", loss, BETA, "slime", False, "token",
                   f"{est} times π_θ/π_old (differentiable); written from the documented formula")


def _k1_reward_per_token() -> Adapter:
    def loss(logp, old, ref, adv, mask):
        # R - beta k1_t, no future terms
        a_tok = adv[:, None] - BETA * (old - ref)
        return token_sum_mean(-torch.exp(logp - old) * a_tok, mask)
    return Adapter(
        "k1 in reward, A_t = R - β k1_t",
        loss,
        BETA,
        "Liu et al. 2025",
        False,
        "token",
        "per-token importance weight, no clip; the KL reward is not summed over the future",
    )


def docs_adapters() -> list[Adapter]:
    return ([_grpo_published(), _trl_docs(False), _trl_docs(True)]
            + [_verl_docs(k) for k in VERL_KL_TYPES]
            + [_deepseek_v32(), _k1_reward_per_token()]
            + [_nemo_rl(e) for e in ESTIMATOR] + [_slime(e) for e in ESTIMATOR])
