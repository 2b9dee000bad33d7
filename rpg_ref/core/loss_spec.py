"""What a loss is besides its formula, and the rules of its options, stated once.

``LossSpec`` describes a loss of rpg_ref.core.losses (its family, its KL term, its defaults); both
the reference formulas and the fast kernel read it. ``LossOptions`` is a loss's options resolved and
validated once (``resolve``): the trainer builds one per run (rpg_ref.trainer.config.loss_options)
and passes it to every call; a library call with loose keywords resolves them on its first call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rpg_ref.core.divergences import DIVERGENCES

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LEVELS = ("token", "sequence")
FAMILIES = ("rpg", "rpg-reinforce", "baseline")


@dataclass(frozen=True, kw_only=True)
class LossSpec:
    """What a trainer (and the fast kernel) needs to know about a loss besides calling it."""
    name: str
    family: str                 # FAMILIES: "rpg" (fully differentiable), "rpg-reinforce" (stop-
                                # gradient weight) or "baseline" (PPO clip on A)
    kl: str                     # its KL term, a row of rpg_ref.core.divergences.DIVERGENCES: beta
                                # times it is in the loss, stats["kl"] reports it (beta = 0: only
                                # reported)
    advantage: str              # default estimator in rpg_ref.core.advantages.ADVANTAGES
    paper_label: str
    kl_in_reward: bool = False  # the KL goes into the advantage: the loss takes beta = 0
    has_kl: bool = True         # False only for dapo (no KL anywhere)
    default_clip: tuple | None = None   # used when clip=None; such (PPO-type) losses always clip

    def __post_init__(self):
        if self.family not in FAMILIES or self.kl not in DIVERGENCES:
            raise ValueError(f"loss {self.name}: family must be one of {FAMILIES} and kl one of "
                             f"{tuple(DIVERGENCES)}, got {self.family!r}, {self.kl!r}")

    @property
    def always_clips(self) -> bool:
        return self.default_clip is not None

    @property
    def divergence(self) -> str | None:
        """D whose gradient the loss's KL term has in expectation for every theta; None: none
        (grpo's unweighted k3; no KL term in the loss: dapo, reinforce++)."""
        penalized = self.has_kl and not self.kl_in_reward
        return self.kl if penalized and DIVERGENCES[self.kl].unbiased else None


@dataclass(frozen=True)
class LossOptions:
    """A loss's options, validated: the loop resolves them once and passes this to every call."""
    loss: str                   # the loss they were resolved for
    beta: float                 # the loss's KL coefficient (0 where the KL is in the reward)
    reward_beta: float          # the KL coefficient of the reward (reinforce++ advantages), else 0
    bounds: tuple | None        # (1 - eps_low, 1 + eps_high, c or None); None: no clipping
    level: str = "token"
    agg: str = "token-mean"


def parse_clip(values) -> tuple[float, float, float | None] | None:
    """(eps_low, eps_high[, c]) as numbers or strings -> (eps_low, eps_high, c or None), checked:
    0 < eps_low < 1, 0 < eps_high finite, c > 1 (None or 'inf': no dual bound). None -> None."""
    if values is None:
        return None
    if not isinstance(values, (tuple, list)) or len(values) not in (2, 3):
        raise ValueError(f"clip must be (eps_low, eps_high) or (eps_low, eps_high, c), "
                         f"got {values!r}")

    def number(what, v):
        try:
            return math.inf if what == "c" and v is None else float(v)
        except (TypeError, ValueError):
            raise ValueError(f"clip {what} must be a number ('inf' allowed for c), "
                             f"got {v!r}") from None

    eps_low, eps_high = number("eps_low", values[0]), number("eps_high", values[1])
    c = number("c", values[2]) if len(values) == 3 else math.inf
    if not 0.0 < eps_low < 1.0:
        raise ValueError(f"clip eps_low must be in (0, 1) (the lower ratio bound 1 - eps_low must "
                         f"be positive), got {eps_low}")
    if not 0.0 < eps_high < math.inf:
        raise ValueError(f"clip eps_high must be > 0 and finite, got {eps_high}")
    if not c > 1.0:
        raise ValueError(f"dual-clip c must be > 1 (None or inf: no dual bound), got {c}")
    return eps_low, eps_high, None if c == math.inf else c


def check_beta(beta) -> None:
    """A KL coefficient is a finite number >= 0 (for the losses and for the KL in the reward)."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (
            math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")


def resolve(spec: LossSpec, *, beta, clip=None, level: str = "token", agg: str = "token-mean",
            no_clip: bool = False, reward_beta=0.0, run: bool = False) -> LossOptions:
    """The options of the loss ``spec`` checked (a one-line ValueError for the first violation)
    and resolved: clip=None means the loss's default_clip. ``beta`` is the loss's own, or with
    run=True a training run's: it then goes to the reward where the loss puts its KL there
    (reinforce++: reward_beta), else to the loss."""
    name = spec.name
    check_beta(beta)
    if run:
        beta, reward_beta = (0.0, beta) if spec.kl_in_reward else (beta, 0.0)
    check_beta(reward_beta)
    if beta != 0 and not spec.has_kl:
        raise ValueError(f"{name} has no KL term; got beta={beta}: use beta=0")
    if reward_beta != 0 and not spec.kl_in_reward:
        raise ValueError(f"{name} has no KL in the reward; got reward_beta={reward_beta}: use 0")
    if beta != 0 and spec.kl_in_reward:
        raise ValueError(f"{name} puts its k1 KL penalty into the reward: pass beta to "
                         f"rpg_ref.core.advantages.reinforce_pp and call the loss with beta=0; "
                         f"got beta={beta}")
    eps = parse_clip(clip)
    if no_clip and clip is not None:
        raise ValueError(f"clip {clip} and no_clip together: give one of them")
    if no_clip and spec.always_clips:
        raise ValueError(f"no_clip: {name} is a PPO-type loss that always clips; pass a wide clip "
                         f"instead, e.g. (0.99, 100)")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    if level == "sequence" and spec.kl_in_reward:
        raise ValueError(f"{name} has token-level advantages and cannot run at level='sequence'")
    eps = eps if eps is not None else parse_clip(spec.default_clip)
    bounds = None if eps is None else (1.0 - eps[0], 1.0 + eps[1], eps[2])
    return LossOptions(name, float(beta), float(reward_beta), bounds, level, agg)
