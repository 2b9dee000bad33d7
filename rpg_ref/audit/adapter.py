"""The contract a loss meets to be audited (imported by every adapter and by users' code)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

BETA = 0.5  # the KL coefficient every built-in adapter uses


@dataclass(frozen=True)
class Adapter:
    """A loss as the audit calls it: ``loss(logp, old_logp, ref_logp, advantages, mask) -> scalar``
    on a batch of B responses of length H (log-probs and mask [B, H], advantages [B], one reward per
    response). Token-level advantages (KL in the reward, GAE, return-to-go) are built inside
    ``loss`` from what it is handed. The loss must be a mean over its batch's responses (the audit
    checks
    it).

    ``beta``: its KL coefficient (its KL part is compared with beta * grad D). ``own_code``: the
    library's own function runs; else the loss was written from the library's documentation or
    source (a twin). ``library`` names the version it was run on (e.g. "OpenRLHF 0.11.2")."""
    name: str
    loss: Callable[..., Tensor]
    beta: float
    library: str
    own_code: bool
    level: str = "token"
    note: str = ""

    @property
    def code(self) -> str:
        return f"{self.library}: {'own code' if self.own_code else 'from docs'}"
