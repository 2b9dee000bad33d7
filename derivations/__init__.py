"""derivations: every claim of the RPG paper checked symbolically (sympy), exactly (float64
enumeration through rpg_ref.core.losses) and statistically (Monte Carlo); its results tables checked
for consistency with themselves and with the text (tables.py, on the transcription in
paper_tables.py).

    python -m derivations [--fast] [--json FILE]     (also: rpg-verify)

Each module registers its checks (``derivations._core.claim``) on import; ``CHECKS`` lists
them in report order. A check returns one row {id, label, claim, symbolic, exact_max_err,
mc_max_z, passed, seconds, status, detail}; tests/test_derivations.py calls the same functions.
"""

from . import (  # noqa: F401
    clipping,
    gpg,
    grpo_kl,
    k3,
    npg,
    offpolicy,
    rollout_correction,
    tables,
    token_sequence,
    variance,
)
from ._core import CHECKS

# report order: items 1-9 and 11 (the math), then 10 (the results tables); registration order within
# a module
_ORDER = ("gpg", "offpolicy", "k3", "grpo_kl", "variance", "npg", "clipping", "token_sequence",
          "rollout_correction", "tables")
CHECKS.sort(key=lambda c: _ORDER.index(c.__module__.rsplit(".", 1)[1]))

__all__ = ["CHECKS", "run_all"]


def run_all(fast: bool = False, only=None, on_check=None) -> list[dict]:
    """Run every registered check (or those whose id/label contains one of ``only``);
    ``on_check(i, n, check)`` is called before each (progress)."""
    chosen = [c for c in CHECKS if not only or any(s in c.id or s in c.label for s in only)]
    rows = []
    for i, check in enumerate(chosen):
        if on_check is not None:
            on_check(i, len(chosen), check)
        rows.append(check(fast=fast))
    return rows
