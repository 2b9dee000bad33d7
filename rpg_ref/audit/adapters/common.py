"""Pieces the adapters share: the audit's aggregation, PPO clipping, k3, and the verl estimators."""

from __future__ import annotations

import torch
from torch import Tensor

AGG = "seq-mean-token-sum"
VERL_KL_TYPES = ("kl", "abs", "mse", "low_var_kl", "k1+", "k3+")
VERL_NOTE = {"kl": "k1", "abs": "|log r|", "mse": "k2", "low_var_kl": "k3, clamped to [-10, 10]",
             "k1+": "k1 value, k2 gradient", "k3+": "k3 value, k2 gradient"}


def ppo_clip(
    logp: Tensor, old: Tensor, adv: Tensor, eps_low=0.2, eps_high=0.2, dual_c=None
) -> Tensor:
    """[B, H] PPO clip per token (Schulman et al. 2017), dual clip for A < 0 (Ye et al. 2020)."""
    w = torch.exp(logp - old)                                                 # per-token ratio
    a = adv[:, None]
    loss = torch.maximum(-w * a, -w.clamp(1 - eps_low, 1 + eps_high) * a)     # -min(w A, clip(w) A)
    if dual_c is not None:
        # at most -c A when A < 0
        loss = torch.where(a < 0, torch.minimum(loss, -dual_c * a), loss)
    return loss


def k3(logp: Tensor, ref: Tensor) -> Tensor:
    """k3(pi_ref / pi_theta) = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1, per token."""
    lr = ref - logp
    return torch.expm1(lr) - lr


def verl_kl_estimate(logp: Tensor, ref: Tensor, kind: str) -> Tensor:
    """verl's documented kl_loss_type estimators of KL(pi_theta || pi_ref) per token; a '+' suffix
    keeps the estimator's value and takes the gradient of k2 (straight-through)."""
    if kind.endswith("+"):
        k2 = verl_kl_estimate(logp, ref, "mse")
        # value of kind, gradient of k2
        return k2 + (verl_kl_estimate(logp, ref, kind[:-1]) - k2).detach()
    # log pi_theta / pi_ref
    lr = logp - ref
    return {
        "kl": lambda: lr,
        "k1": lambda: lr,
        "abs": lambda: lr.abs(),
        "mse": lambda: 0.5 * lr * lr,
        "k2": lambda: 0.5 * lr * lr,
        "low_var_kl": lambda: k3(logp, ref).clamp(-10, 10),
        "k3": lambda: k3(logp, ref).clamp(-10, 10),
    }[kind]()


def token_sum_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """seq-mean-token-sum: sum of each response's token losses, mean over responses."""
    return (per_token * mask).sum(1).mean()
