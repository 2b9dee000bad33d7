"""The losses rpg-audit audits, each wrapped as ``Adapter(loss(logp, old_logp, ref_logp, A, mask))``.

Own code (the library's function runs):
    rpg-ref     its 13 losses (rpg_ref.losses), the 8 rpg losses at level token and sequence
    verl 0.9.1  verl.workers.utils.losses.ppo_loss -- the loss verl's actor workers call -- with the
                vanilla (PPO dual-clip) policy loss and use_kl_loss=True for each kl_loss_type;
                only where verl is installed (CI: .venv-verl)
Written here from documentation (marked "from docs" in the table):
    verl 0.9.1  the same kl_loss_types, from verl's documented estimators (twins of the rows above,
                so that the table exists without verl; tests/test_audit_verl.py checks they agree)
    TRL         GRPOTrainer's per-token k3 term, with and without use_bias_correction_kl
    DeepSeekMath  GRPO as published (Shao et al. 2024, eq. of the GRPO objective)

Every adapter aggregates seq-mean-token-sum (rpg_ref.audit's convention) and uses beta = BETA.
Advantages arrive as one reward per response [B]; token-level code gets them broadcast to [B, H].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rpg_ref.advantages import kl_return_to_go
from rpg_ref.losses import LOSSES, SPECS

BETA = 0.5  # the KL coefficient every built-in adapter uses


@dataclass(frozen=True)
class Adapter:
    """A loss as the audit calls it. ``own_code``: the library's own function runs (else the loss
    was written here from the library's documentation)."""
    name: str
    loss: Callable[..., Tensor]     # loss(logp, old_logp, ref_logp, advantages, mask) -> scalar
    beta: float                     # its KL coefficient: its KL part is compared with beta * grad D
    library: str
    own_code: bool
    level: str = "token"
    note: str = ""

    @property
    def code(self) -> str:
        return f"{self.library}: {'own code' if self.own_code else 'from docs'}"

RPG = [n for n in LOSSES if SPECS[n].family in ("rpg", "rpg-reinforce")]
VERL_KL_TYPES = ("kl", "abs", "mse", "low_var_kl", "k1+", "k3+")
VERL_NOTE = {"kl": "k1", "abs": "|log r|", "mse": "k2", "low_var_kl": "k3, clamped to [-10, 10]",
             "k1+": "k1 value, k2 gradient", "k3+": "k3 value, k2 gradient"}
AGG = "seq-mean-token-sum"


# ---------------------------------------------------------------------------
# rpg-ref: its own losses
# ---------------------------------------------------------------------------

def _rpg_ref(name: str, level: str = "token", beta: float = BETA, note: str = "") -> Adapter:
    fn = LOSSES[name]

    def loss(logp, old, ref, adv, mask):
        return fn(logp, old, adv, mask, beta=beta, ref_logp=ref, level=level, agg=AGG)[0]
    return Adapter(name, loss, BETA, "rpg-ref", True, level, note)


def _reinforce_pp() -> Adapter:
    fn = LOSSES["reinforce++"]

    def loss(logp, old, ref, adv, mask):
        a_tok = kl_return_to_go(adv, mask, old, ref, BETA)                    # R - beta k1, return to go
        return fn(logp, old, a_tok, mask, beta=0.0, agg=AGG)[0]
    return Adapter("reinforce++", loss, BETA, "rpg-ref", True, "token",
                   "KL in the reward; also stands for reinforce++-baseline (the group baseline and the "
                   "batch whitening couple responses: left out)")


def rpg_ref_adapters() -> list[Adapter]:
    out = [_rpg_ref(n, level) for level in ("token", "sequence") for n in RPG]
    out += [_rpg_ref("grpo"), _rpg_ref("grpo-corrected"),
            _rpg_ref("dapo", beta=0.0, note="no KL term (beta must be 0)"), _reinforce_pp()]
    return out


# ---------------------------------------------------------------------------
# written from documentation
# ---------------------------------------------------------------------------

def ppo_clip(logp: Tensor, old: Tensor, adv: Tensor, eps_low=0.2, eps_high=0.2, dual_c=None) -> Tensor:
    """[B, H] PPO clip per token (Schulman et al. 2017), dual clip for A < 0 (Ye et al. 2020)."""
    w = torch.exp(logp - old)                                                 # per-token ratio
    a = adv[:, None]
    loss = torch.maximum(-w * a, -w.clamp(1 - eps_low, 1 + eps_high) * a)     # -min(w A, clip(w) A)
    if dual_c is not None:
        loss = torch.where(a < 0, torch.minimum(loss, -dual_c * a), loss)     # at most -c A when A < 0
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
        return k2 + (verl_kl_estimate(logp, ref, kind[:-1]) - k2).detach()  # value of kind, gradient of k2
    lr = logp - ref                                                           # log pi_theta / pi_ref
    return {"kl": lambda: lr, "k1": lambda: lr, "abs": lambda: lr.abs(),
            "mse": lambda: 0.5 * lr * lr, "k2": lambda: 0.5 * lr * lr,
            "low_var_kl": lambda: k3(logp, ref).clamp(-10, 10), "k3": lambda: k3(logp, ref).clamp(-10, 10),
            }[kind]()


def _token_sum_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """seq-mean-token-sum: sum of each response's token losses, mean over responses."""
    return (per_token * mask).sum(1).mean()


def _verl_docs(kind: str) -> Adapter:
    def loss(logp, old, ref, adv, mask):
        pg = ppo_clip(logp, old, adv, 0.2, 0.2, dual_c=3.0)                  # actor defaults: 0.2, c = 3
        return _token_sum_mean(pg + BETA * verl_kl_estimate(logp, ref, kind), mask)
    return Adapter(f"verl kl_loss_type={kind}", loss, BETA, "verl 0.9.1", False, "token", VERL_NOTE[kind])


def _trl_docs(bias_correction: bool) -> Adapter:
    def loss(logp, old, ref, adv, mask):
        kl_tok = k3(logp, ref)                                                # TRL: k3(pi_ref / pi_theta)
        if bias_correction:
            kl_tok = torch.exp(logp - old) * kl_tok                           # times the ratio, differentiable
        return _token_sum_mean(ppo_clip(logp, old, adv, 0.2, 0.2) + BETA * kl_tok, mask)
    name = f"TRL GRPO use_bias_correction_kl={bias_correction}"
    return Adapter(name, loss, BETA, "TRL", False, "token", "k3 per token, PPO clip eps 0.2")


def _grpo_published() -> Adapter:
    def loss(logp, old, ref, adv, mask):
        return _token_sum_mean(ppo_clip(logp, old, adv, 0.2, 0.2) + BETA * k3(logp, ref), mask)
    return Adapter("GRPO (published)", loss, BETA, "DeepSeekMath", False, "token",
                   "-min(wA, clip(w)A) + beta k3(pi_ref/pi_theta) per token")


def docs_adapters() -> list[Adapter]:
    return ([_grpo_published(), _trl_docs(False), _trl_docs(True)]
            + [_verl_docs(k) for k in VERL_KL_TYPES])


# ---------------------------------------------------------------------------
# verl's own code (needs verl, e.g. CI's .venv-verl)
# ---------------------------------------------------------------------------

def _verl_own(kind: str) -> Adapter:
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, use_kl_loss=True,
                      kl_loss_type=kind, kl_loss_coef=BETA, loss_agg_mode=AGG,
                      policy_loss=PolicyLossConfig(loss_mode="vanilla"))

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
    return Adapter(f"verl kl_loss_type={kind}", loss, BETA, "verl 0.9.1", True, "token", VERL_NOTE[kind])


def verl_adapters() -> tuple[list[Adapter], list[str]]:
    """verl's own loss for every kl_loss_type, or ([], [why not]) without verl 0.9.x."""
    try:
        import verl
    except ImportError:
        return [], [("verl is not installed: its own-code rows are left out (the 'from docs' rows stand "
                     "for them; CI checks they agree in .venv-verl)")]
    if not verl.__version__.startswith("0.9."):
        return [], [f"verl {verl.__version__} is installed; the adapters are written for 0.9.x: left out"]
    return [_verl_own(k) for k in VERL_KL_TYPES], []


def all_adapters() -> tuple[list[Adapter], list[str]]:
    verl_own, notes = verl_adapters()
    return rpg_ref_adapters() + docs_adapters() + verl_own, notes
