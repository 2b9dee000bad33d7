"""rpg-audit: which objective does a policy-gradient loss really optimize?

    rpg-audit [--only NAME ...] | --loss PATH.py:NAME [options]     (python -m rpg_ref.audit)

adapter.py  the contract: Adapter(name, loss(logp, old_logp, ref_logp, advantages, mask), beta, ...)
core.py     exact expected gradients, candidate objectives, the precision of a loss, verdicts
fit.py      combination verdicts (same coefficients on many draws)
run.py      audit(): every adapter x setting x horizon, through core and fit
report.py   the table (console and markdown)
cli.py      the command line (a user's own loss and objectives)
adapters/   the built-in adapters: rpg-ref, twins written from docs, and the peers' own code
"""

from rpg_ref.audit.adapter import BETA, Adapter
from rpg_ref.audit.cli import main
from rpg_ref.audit.core import (
    BASIS,
    HORIZONS,
    MATCH_TOL,
    SETTINGS,
    ZERO_NORM,
    LossFailed,
    Policies,
    Problem,
    Setting,
    audit_case,
    candidate_grads,
    check_mean_over_responses,
    closest_class,
    expected_grad,
    loss_precision,
    make_problem,
    max_token_ratio,
    rel_err,
    reward_grad,
)
from rpg_ref.audit.report import describe, describe_combination, format_table, kl_cell, to_markdown
from rpg_ref.audit.run import audit

__all__ = [
    "BASIS",
    "BETA",
    "HORIZONS",
    "MATCH_TOL",
    "SETTINGS",
    "ZERO_NORM",
    "Adapter",
    "LossFailed",
    "Policies",
    "Problem",
    "Setting",
    "audit",
    "audit_case",
    "candidate_grads",
    "check_mean_over_responses",
    "closest_class",
    "default_adapters",
    "describe",
    "describe_combination",
    "expected_grad",
    "format_table",
    "kl_cell",
    "loss_precision",
    "main",
    "make_problem",
    "max_token_ratio",
    "rel_err",
    "reward_grad",
    "to_markdown",
]


def default_adapters():
    """Every built-in adapter that can run here, and notes on those that cannot."""
    from rpg_ref.audit.adapters import all_adapters
    return all_adapters()
