"""derivations: every claim of the RPG paper checked symbolically (sympy), exactly (float64
enumeration through rpg_ref.losses) and statistically (Monte Carlo); its results tables checked for
consistency with themselves and with the text (tables.py, on the transcription in paper_tables.py).

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

# report order: items 1-9 and 11 (the math), then 10 (the results tables); registration order within a module
_ORDER = ("gpg", "offpolicy", "k3", "grpo_kl", "variance", "npg", "clipping", "token_sequence",
          "rollout_correction", "tables")
CHECKS.sort(key=lambda c: _ORDER.index(c.__module__.rsplit(".", 1)[1]))

__all__ = ["CHECKS", "run_all"]


def run_all(fast: bool = False, only=None) -> list[dict]:
    """Run every registered check (or those whose id/label contains one of ``only``)."""
    rows = []
    for check in CHECKS:
        if only and not any(s in check.id or s in check.label for s in only):
            continue
        rows.append(check(fast=fast))
    return rows
