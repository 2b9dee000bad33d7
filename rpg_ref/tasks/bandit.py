"""The ``bandit`` task: a K-armed softmax bandit whose KL-regularized optimum is known.

A sample x is one arm (one token, so the losses run at level="token" with T = 1) and R(x) is that
arm's reward. With ``--ref init`` the optimum of J = E_p[R] - beta D(p, pi_ref) is computed in
float64 (``kl_regularized_optimum``) and summary.json reports its total-variation distance to the
policy. With the iterative reference the regularizer only bounds each step: the policy tends to the
best arm (the reported optimum is then that one-hot vector).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from torch import Tensor, nn

from rpg_ref.core.losses import SPECS
from rpg_ref.interfaces import Prompt


class TabularPolicy(nn.Module):
    """A softmax over K arms that ignores its input: logits [K], same distribution at every
    position."""

    def __init__(self, logits: Tensor):
        super().__init__()
        self.logits = nn.Parameter(logits.clone())  # [K]

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, **_):
        B, L = input_ids.shape
        keep = logits_to_keep or L
        return SimpleNamespace(logits=self.logits.expand(B, keep, -1))  # [B, keep, K]


def kl_regularized_optimum(ref: np.ndarray, rewards: np.ndarray, beta: float,
                           divergence: str) -> np.ndarray:
    """argmax_p  sum_i p_i R_i - beta D(p, ref) over the simplex, in float64.

    rkl / urkl (D = KL(p||ref); UKL = KL for normalized p): p* ∝ ref exp(R / beta).
    fkl / ufkl (D = KL(ref||p)):  stationarity R_i + beta ref_i / p_i = lam gives
        p_i = beta ref_i / (lam - R_i),  lam > max R,  with lam the root of sum_i p_i = 1
    (sum is decreasing in lam: bisection, then Newton polish). beta = 0: the best arm(s).
    """
    ref, R = np.asarray(ref, np.float64), np.asarray(rewards, np.float64)
    if beta == 0:
        p = (R == R.max()).astype(np.float64)
        return p / p.sum()
    if divergence in ("rkl", "urkl"):
        z = np.log(ref) + R / beta
        p = np.exp(z - z.max())
        return p / p.sum()
    if divergence in ("fkl", "ufkl"):
        g = lambda lam: float(np.sum(beta * ref / (lam - R)) - 1.0)
        # p_best <= 1 gives lam >= max R + beta ref_best (there g >= 0); at lam = max R + beta
        # every p_i <= ref_i, so g <= 0: the root is bracketed.
        lo, hi = R.max() + beta * ref[R == R.max()].sum(), R.max() + beta
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if g(mid) > 0 else (lo, mid)
        lam = 0.5 * (lo + hi)
        for _ in range(5):  # Newton polish
            lam -= g(lam) / float(-np.sum(beta * ref / (lam - R) ** 2))
        p = beta * ref / (lam - R)
        return p / p.sum()
    raise ValueError(f"no optimum for divergence {divergence!r}")


# The divergence whose optimum GRPO's KL term leads to at one token: beta * grad k3(ref / p) is
# beta * grad KL(ref || p) without the importance weight and beta * grad KL(p || ref) with it (the
# paper's correction). With group-mean advantages the reward part is -grad E[R] unscaled, so the
# fixed point is that optimum; a std-normalized advantage rescales the reward part by 1/std, which
# changes as the policy sharpens, and moves it (tests/test_bandit_kl_direction.py).
GRPO_KL = {"grpo": "fkl", "grpo-corrected": "rkl"}


class BanditTask:
    """The Task protocol for a K-armed bandit (module docstring)."""

    name = "bandit"
    default_engine = "sample"
    evaluation = "exact"
    eos_id = None
    pad_id = 0

    @dataclass
    class Options:
        rewards: list[float] = field(default_factory=lambda: [1.0, 0.8, 0.5, 0.2, 0.0],
                                     metadata={"help": "reward of each arm (K = number of values)"})
        init_scale: float = field(default=1.0, metadata={
            "help": "initial logits ~ N(0, init_scale^2) (0 = uniform policy)"})

        def __post_init__(self):
            if len(self.rewards) < 2 or not all(math.isfinite(r) for r in self.rewards):
                raise ValueError(f"bad configuration: --bandit-rewards must be finite numbers, "
                                 f"one per arm, at least 2 arms; got {self.rewards}")
            if not 0 <= self.init_scale < math.inf:
                raise ValueError(f"bad configuration: --bandit-init-scale must be finite and >= 0, "
                                 f"got {self.init_scale}")

    def __init__(self, cfg, device: torch.device):
        self.opt = self.Options(**cfg.task_options)
        if cfg.max_new_tokens != 1:
            raise ValueError(f"bandit responses are one arm: --max-new-tokens must be 1, got "
                             f"{cfg.max_new_tokens}")
        self.R = torch.tensor(self.opt.rewards, dtype=torch.float32, device=device)  # [K]

    def build_policy(self) -> nn.Module:
        # [K] = pi_ref's; the global generator, which the trainer seeds with --init-seed
        self.init_logits = torch.randn(len(self.opt.rewards)) * self.opt.init_scale
        return TabularPolicy(self.init_logits)

    def sample_prompts(self, n, gen):
        return [Prompt(ids=[0], answer=None) for _ in range(n)]

    def reward(self, prompts, responses):
        arms = torch.tensor([r[0] for r in responses], device=self.R.device)  # [N]
        r = self.R[arms]
        return r, r == self.R.max()

    def evaluate(self, policy, engine):
        p = torch.softmax(policy.logits.detach().double(), -1)
        return {"expected_reward": float(p @ self.R.double()), "p_best": float(p[self.R.argmax()])}

    def summary(self, policy, cfg):
        p = torch.softmax(policy.logits.detach().double(), -1).cpu().numpy()
        ref = torch.softmax(self.init_logits.double(), -1).numpy()
        R = np.asarray(self.opt.rewards, np.float64)
        spec = SPECS[cfg.algo]
        if cfg.ref == "iterative":
            optimum = kl_regularized_optimum(ref, R, 0.0, "rkl")
            note = "iterative reference: best arm"
        elif spec.family in ("rpg", "rpg-reinforce"):
            optimum = kl_regularized_optimum(ref, R, cfg.beta, spec.divergence)
            note = f"argmax E[R] - beta {spec.divergence}(p, ref)"
        elif cfg.algo in GRPO_KL and (SPECS[cfg.algo].advantage if cfg.adv == "auto"
                                      else cfg.adv) == "group-mean":
            optimum = kl_regularized_optimum(ref, R, cfg.beta, GRPO_KL[cfg.algo])
            note = (f"{cfg.algo} with group-mean advantages: argmax E[R] - beta "
                    f"{GRPO_KL[cfg.algo]}(p, ref)")
        else:
            optimum = None
            note = f"{cfg.algo}: no closed-form fixed point (advantage scaling / estimator bias)"
        tv = None if optimum is None else float(0.5 * np.abs(p - optimum).sum())
        return {"policy": p.tolist(), "ref_policy": ref.tolist(), "rewards": R.tolist(),
                "beta": cfg.beta, "algo": cfg.algo,
                "optimum": None if optimum is None else optimum.tolist(),
                "optimum_note": note, "tv_distance": tv}
