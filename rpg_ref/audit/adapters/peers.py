"""The peers' own loss code, pinned to the versions it was run on (installed with --no-deps; CI's
.venv-audit). Each adapter calls the library's functions from its installed files
(source.load_defs); what is written here is only the glue: tensors in the library's layout, and the
conversion of its per-token mean to the audit's seq-mean-token-sum (x H: responses have
fixed length H).

    OpenRLHF 0.11.2   models/loss.py PolicyLoss + models/utils.py compute_approx_kl (k1, k2, k3,
                      unbiased_gradient off/on) + aggregate_loss: the actor loss with the KL loss
    SkyRL 0.3.1       skyrl_train/utils/ppo_utils.py compute_approx_kl (under @torch.no_grad)
    SkyRL 0.4.0       skyrl/backends/skyrl_train/utils/ppo_utils.py compute_approx_kl (fixed)
                      (policy term for both: PPO clip written here; the KL term is theirs)
    AReaL 1.0.4       KLEstimator (k1, k2, k3) in the reward, PPOActor._compute_advantages (GAE,
                      discount 1, lambda 1, no critic) and ppo_actor_loss_fn
    Oat 0.2.4         PPOLearner.compute_ppo_advantages (GAE with a zero critic, gamma = lambda = 1)
                      on k1 in the reward (kl_penalty_coef); the PPO loss and the k3 loss (beta) are
                      inline in learning_step: written from that source
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from rpg_ref.audit.adapter import BETA, Adapter
from rpg_ref.audit.adapters.common import ppo_clip, token_sum_mean
from rpg_ref.audit.adapters.source import PeerMissing, load_defs

# what the picked definitions use (annotations unevaluated)
TORCH_ENV = {"torch": torch, "nn": nn, "F": F}
PINS = {
    "openrlhf": "0.11.2",
    "skyrl-train": "0.3.1",
    "skyrl": "0.4.0",
    "areal": "1.0.4",
    "oat-llm": "0.2.4",
}


# ---------------------------------------------------------------------------
# OpenRLHF
# ---------------------------------------------------------------------------

def openrlhf_adapters() -> list[Adapter]:
    v = PINS["openrlhf"]
    utils = load_defs("openrlhf", v, "openrlhf/models/utils.py",
                      ["KL_IS_WEIGHT_CLIP", "compute_approx_kl", "masked_mean"], TORCH_ENV)
    loss_mod = load_defs("openrlhf", v, "openrlhf/models/loss.py", ["aggregate_loss", "PolicyLoss"],
                         TORCH_ENV | {"masked_mean": utils["masked_mean"]})
    policy = loss_mod["PolicyLoss"](clip_eps_low=0.2, clip_eps_high=0.2)        # its defaults

    def make(est: str, unbiased: bool) -> Adapter:
        def loss(logp, old, ref, adv, mask):
            H = logp.shape[1]
            actor = policy(logp, old, adv[:, None].expand_as(logp), action_mask=mask)[0]
            kl = utils["compute_approx_kl"](logp, ref, log_probs_old=old, kl_estimator=est,
                                            unbiased_gradient=unbiased)
            return H * (actor + BETA * loss_mod["aggregate_loss"](kl, mask))   # token-mean x H
        return Adapter(
            f"OpenRLHF kl_estimator={est} unbiased_gradient={unbiased}",
            loss,
            BETA,
            f"OpenRLHF {v}",
            True,
            "token",
            f"use_kl_loss; {'KL gradient w·k1, w = π/π_old clamped at 10' if unbiased else est}",
        )

    return [make(e, u) for u in (False, True) for e in ("k1", "k2", "k3")]


# ---------------------------------------------------------------------------
# SkyRL
# ---------------------------------------------------------------------------

def _skyrl(dist: str, relpath: str, label: str) -> list[Adapter]:
    v = PINS[dist]
    ns = load_defs(dist, v, relpath, ["compute_approx_kl"], TORCH_ENV)

    def make(est: str) -> Adapter:
        def loss(logp, old, ref, adv, mask):
            kl = ns["compute_approx_kl"](logp, ref, loss_mask=mask, kl_estimator_type=est)
            # masked_mean(dim=-1).mean()
            kl_loss = ((kl * mask).sum(1) / mask.sum(1)).mean()
            return token_sum_mean(ppo_clip(logp, old, adv), mask) + BETA * logp.shape[1] * kl_loss

        return Adapter(
            f"SkyRL {label} kl_estimator_type={est}",
            loss,
            BETA,
            f"SkyRL {v}",
            True,
            "token",
            f"use_kl_loss, {est}; policy term: PPO clip written here",
        )
    return [make(e) for e in ("k1", "k2", "k3")]


def skyrl_adapters() -> list[Adapter]:
    return (_skyrl("skyrl-train", "skyrl_train/utils/ppo_utils.py", "(skyrl-train)")
            + _skyrl("skyrl", "skyrl/backends/skyrl_train/utils/ppo_utils.py", "(skyrl)"))


# ---------------------------------------------------------------------------
# AReaL
# ---------------------------------------------------------------------------

def areal_adapters() -> list[Adapter]:
    v = PINS["areal"]
    est_ns = load_defs("areal", v, "areal/utils/data.py", ["KLEstimator"], TORCH_ENV)
    actor_ns = load_defs(
        "areal", v, "areal/trainer/ppo/actor.py", ["PPOActor._compute_advantages"], TORCH_ENV
    )
    fn_ns = load_defs(
        "areal", v, "areal/utils/functional/functional.py", ["ppo_actor_loss_fn"], TORCH_ENV
    )
    config = types.SimpleNamespace(overlong_reward_penalty=False, use_decoupled_loss=False,
                                   recompute_logprob=False)

    def make(est: str) -> Adapter:
        actor = types.SimpleNamespace(
            config=config,
            reward_bias=0.0,
            reward_scaling=1.0,
            reward_clip=1e30,
            reward_norm=None,
            kl_ctl=BETA,
            kl_estimator=est_ns["KLEstimator"](est),
            mask_no_eos_with_zero=False,
            discount=1.0,
            gae_lambda=1.0,
            adv_norm=None,
        )

        def loss(logp, old, ref, adv, mask):
            B, H = logp.shape
            z = logp.new_zeros(B, 1)
            # AReaL's layout: one prompt token + H response tokens; logprobs at the token's own slot
            # (rolled left inside), ref_logp and loss_mask as computed by its actor (already rolled)
            data = {
                "input_ids": torch.zeros(B, 1 + H, dtype=torch.long),
                "rewards": adv.clone(),
                "loss_mask": torch.cat([z, mask], 1),
                "logprobs": torch.cat([z, old], 1),
                "ref_logp": torch.cat([ref, z], 1),
                "attention_mask": torch.ones(B, 1 + H, dtype=torch.long),
            }
            a_tok = actor_ns["_compute_advantages"](actor, data)["advantages"][:, :H]   # [B, H]
            pg, _ = fn_ns["ppo_actor_loss_fn"](logp, old, old, a_tok.detach(), 0.2, mask.bool())
            # token-mean x H
            return H * pg

        return Adapter(
            f"AReaL kl_estimator={est} (KL in reward)",
            loss,
            BETA,
            f"AReaL {v}",
            True,
            "token",
            f"{est} of π_old vs π_ref in the reward, GAE γ = λ = 1 without critic, PPO clip 0.2",
        )

    return [make(e) for e in ("k1", "k2", "k3")]


# ---------------------------------------------------------------------------
# Oat
# ---------------------------------------------------------------------------

def _oat_pg(logp, old, a_tok, mask, cliprange=0.2):
    """Oat's inline PPO term (learning_step): max(-A w, -A clip(w)), masked_mean over tokens,
    mean."""
    ratio = torch.exp(logp - old)
    pg = torch.max(-a_tok * ratio, -a_tok * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange))
    return ((pg * mask).sum(1) / mask.sum(1)).mean()


def oat_adapters() -> list[Adapter]:
    v = PINS["oat-llm"]
    ns = load_defs(
        "oat-llm", v, "oat/algorithms/ppo.py", ["PPOLearner.compute_ppo_advantages"], TORCH_ENV
    )

    def k1_in_reward(logp, old, ref, adv, mask):
        B, H = logp.shape
        learner = types.SimpleNamespace(
            args=types.SimpleNamespace(
                train_batch_size_per_device=B, gamma=1.0, lam=1.0, whiten_adv=False
            ),
            critic=lambda input_ids, attention_mask: torch.zeros(input_ids.shape, dtype=logp.dtype),
        )
        rewards = -BETA * (old - ref) * mask                                  # kl_penalty_coef * k1
        # final reward at the eos
        rewards[torch.arange(B), H - 1] += adv
        a_tok, _, _ = ns["compute_ppo_advantages"](
            learner, rewards, torch.zeros(B, H + 1, dtype=torch.long), torch.ones(B, H + 1), mask
        )
        return H * _oat_pg(logp, old, a_tok.detach(), mask)

    def k3_loss(logp, old, ref, adv, mask):
        H = logp.shape[1]
        log_ratio = (ref - logp).clamp(-40.0, 40.0)
        kl3 = torch.expm1(log_ratio) - log_ratio
        reg = ((kl3 * mask).sum(1) / mask.sum(1)).mean()
        return H * (_oat_pg(logp, old, adv[:, None], mask) + BETA * reg)

    return [
        Adapter(
            "Oat kl_penalty_coef (k1 in reward, critic_type=ppo)",
            k1_in_reward,
            BETA,
            f"Oat {v}",
            True,
            "token",
            "advantages: Oat's compute_ppo_advantages, zero critic; PPO term as in its source",
        ),
        Adapter(
            "Oat beta (k3 loss)",
            k3_loss,
            BETA,
            f"Oat {v}",
            False,
            "token",
            "k3(π_ref/π) per token, inline in PPOLearner.learning_step: written from that source",
        ),
    ]


def peer_adapters() -> tuple[list[Adapter], list[str]]:
    """Every peer whose pinned version is installed here; a note for each that is not."""
    out, notes = [], []
    for make in (openrlhf_adapters, skyrl_adapters, areal_adapters, oat_adapters):
        try:
            out += make()
        except PeerMissing as e:
            notes.append(f"{e}: its rows are left out (CI's .venv-audit has it)")
    return out, notes

