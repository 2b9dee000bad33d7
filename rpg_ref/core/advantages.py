"""Advantage estimators (baselines) for outcome rewards.

Rewards are a flat tensor [N] holding groups of ``group_size`` consecutive responses to
the same prompt (N = num_prompts * group_size), the layout every trainer here uses.

    name                  formula                                   used by
    group-mean            A_i = R_i - mean_{j in g(i)} R_j          RPG (docs/paper_code.md)
    group-mean-std        A_i = (R_i - mean_g R) / (std_g R + eps)  GRPO, DAPO
    batch-mean            A_i = R_i - mean_batch R                  Algorithm 1's example
    leave-one-out         A_i = R_i - mean_{j in g(i), j != i} R_j  RLOO
    reinforce++           per token: k1 KL in the reward, whitened  REINFORCE++
    reinforce++-baseline  as above, with R minus its group mean     REINFORCE++-baseline

Algorithm 1 is alg:offpolicy_rpg_ppo_dualclip.

The std is the population std (divide by G), as in DeepSeekMath's GRPO description.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpg_ref.core.loss_spec import check_beta

__all__ = [
    "ADVANTAGES",
    "GROUP_ESTIMATORS",
    "TOKEN_LEVEL",
    "batch_mean",
    "compute_advantages",
    "group_mean",
    "group_mean_std",
    "kl_return_to_go",
    "leave_one_out",
    "reinforce_pp",
]


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    if not isinstance(rewards, Tensor) or rewards.dim() != 1:
        raise ValueError(
            f"rewards must be a 1-D tensor [N], got {getattr(rewards, 'shape', type(rewards))}"
        )
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.numel() % group_size:
        raise ValueError(
            f"number of rewards {rewards.numel()} is not a multiple of group_size {group_size}"
        )
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards contain non-finite values")
    return rewards.reshape(-1, group_size)                      # [P, G]


def group_mean(rewards: Tensor, group_size: int) -> Tensor:
    """A_i = R_i - mean of its group (the paper's RPG advantage, no std division)."""
    if group_size < 2:
        raise ValueError("group-mean baseline needs group_size >= 2 (with 1 every advantage is 0)")
    g = _groups(rewards, group_size)
    return (g - g.mean(1, keepdim=True)).reshape(-1)


def group_mean_std(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """A_i = (R_i - mean_g) / (std_g + eps), population std (GRPO)."""
    if group_size < 2:
        raise ValueError("group-mean-std baseline needs group_size >= 2")
    g = _groups(rewards, group_size)
    centred = g - g.mean(1, keepdim=True)
    std = centred.pow(2).mean(1, keepdim=True).sqrt()
    return (centred / (std + eps)).reshape(-1)


def batch_mean(rewards: Tensor, group_size: int = 1) -> Tensor:
    """A_i = R_i - mean over the whole batch."""
    _groups(rewards, 1)
    return rewards - rewards.mean()


def leave_one_out(rewards: Tensor, group_size: int) -> Tensor:
    """A_i = R_i - mean of the other G-1 rewards of its group (RLOO)."""
    if group_size < 2:
        raise ValueError("leave-one-out baseline needs group_size >= 2")
    g = _groups(rewards, group_size)
    others = (g.sum(1, keepdim=True) - g) / (group_size - 1)
    return (g - others).reshape(-1)


def kl_return_to_go(rewards: Tensor, mask: Tensor, old_logp: Tensor, ref_logp: Tensor | None,
                    beta: float) -> Tensor:
    """REINFORCE++'s token returns before whitening: the k1 KL to pi_ref folded into the reward.

    Per token t of response i (gamma = 1):
        r_t  = R_i [t is the last valid token] - beta * k1_t
        k1_t = log pi_old(y_t) - log pi_ref(y_t)
        A_t  = sum_{s >= t} r_s                                 (return to go)
    ``ref_logp`` None means pi_ref = pi_old (then the KL term is 0).
    """
    if mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"mask must be [N, T] with N = len(rewards) = {rewards.shape[0]}, got "
            f"{tuple(mask.shape)}"
        )
    if old_logp.shape != mask.shape or (ref_logp is not None and ref_logp.shape != mask.shape):
        raise ValueError("old_logp and ref_logp must have the mask's shape [N, T]")
    check_beta(beta)
    r = _groups(rewards, 1).reshape(-1)
    m = mask.to(old_logp.dtype)                                  # [N, T]
    if bool((m.sum(1) == 0).any()):
        raise ValueError("a mask row has no tokens")
    last = (torch.arange(m.shape[1], device=m.device)[None, :] == (m.cumsum(1).argmax(1))[:, None])
    # [N, T] reward on the last valid token
    per_tok = r[:, None].to(m.dtype) * last.to(m.dtype)
    if ref_logp is not None and beta > 0:
        per_tok = per_tok - beta * (old_logp - ref_logp).detach() * m
    return per_tok.flip(1).cumsum(1).flip(1) * m                 # [N, T] return to go


def reinforce_pp(rewards: Tensor, mask: Tensor, old_logp: Tensor, ref_logp: Tensor | None,
                 beta: float, group_size: int | None = None, eps: float = 1e-8) -> Tensor:
    """REINFORCE++ token advantages (Hu et al. 2025, arXiv:2501.03262).

    ``kl_return_to_go`` (k1 KL in the reward, return to go), then whitened over all valid tokens
    of the batch: (A - mean) / (std + eps). With ``group_size`` (REINFORCE++-baseline) R_i is
    first replaced by R_i - mean_group(R).
    """
    r = group_mean(rewards, group_size) if group_size is not None else rewards
    ret = kl_return_to_go(r, mask, old_logp, ref_logp, beta)      # [N, T]
    m = mask.to(old_logp.dtype)
    mean = ret.sum() / m.sum()
    var = ((ret - mean) ** 2 * m).sum() / m.sum()
    return ((ret - mean) / (var.sqrt() + eps)) * m


ADVANTAGES = {
    "group-mean": group_mean,
    "group-mean-std": group_mean_std,
    "batch-mean": batch_mean,
    "leave-one-out": leave_one_out,
    "reinforce++": None,            # token-level: see reinforce_pp
    "reinforce++-baseline": None,
}
GROUP_ESTIMATORS = ("group-mean", "group-mean-std", "leave-one-out", "reinforce++-baseline")
# [N, T] advantages from per-token rewards: the losses whose KL is in the reward
# (rpg_ref.core.loss_spec.LossSpec.kl_in_reward) take these, and only these
TOKEN_LEVEL = ("reinforce++", "reinforce++-baseline")


def compute_advantages(name: str, rewards: Tensor, group_size: int, mask: Tensor | None = None,
                       old_logp: Tensor | None = None, ref_logp: Tensor | None = None,
                       beta: float = 0.0) -> Tensor:
    """Dispatch by estimator name; returns [N] (outcome estimators) or [N, T] (reinforce++)."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {', '.join(ADVANTAGES)}")
    if name in TOKEN_LEVEL:
        if mask is None or old_logp is None:
            raise ValueError(f"{name} needs mask and old_logp (token-level advantages)")
        return reinforce_pp(rewards, mask, old_logp, ref_logp, beta,
                            group_size if name == "reinforce++-baseline" else None)
    return ADVANTAGES[name](rewards, group_size)
