"""What a loss is besides its formula, and the checks of a clip and of a KL coefficient.

``LossSpec`` describes a loss of rpg_ref.core.losses (its family, its KL term, its defaults).
``LossOptions`` is a loss's options resolved and validated, by
rpg_ref.core.losses.resolve_options: the trainer resolves them once per run
(rpg_ref.trainer.config.loss_options) and passes them to every call.
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
    """What a trainer needs to know about a loss besides calling it."""
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

    def default_beta(self, kl_default: float) -> float:
        """The KL coefficient when none is given: ``kl_default`` (a trainer's own default) for a
        loss with a KL term, 0 for one without (dapo), which refuses any other value."""
        return kl_default if self.has_kl else 0.0

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
    """A loss's options, validated (rpg_ref.core.losses.resolve_options)."""
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
