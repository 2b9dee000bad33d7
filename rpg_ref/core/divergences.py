"""The KL terms of the losses, one row each: the per-unit estimate d a loss puts in its formula.

Notation of rpg_ref.core.losses, per unit x ~ pi_old (a token or a whole response):
    w = pi_theta / pi_old,   log_rho = log(pi_theta / pi_ref),   u = pi_ref / pi_old
Every row is ``estimate(w, log_rho, u)`` and differentiates through w and log_rho (u is constant).
Each of the four divergence rows is the paper's term up to a theta-independent constant (the same
gradient), chosen so that E_old[d] = D(pi_theta, pi_ref) for every theta (``unbiased``); a k3 is
rpg_ref.core.kl.k3. They are written with w = u rho, which holds inside the losses' log-ratio clamp
(rpg_ref.core.losses.LOG_RATIO_CLAMP); beyond it the three ratios saturate separately and d is the
formula at the clamped ratios. The fifth row, "k3", is GRPO's published per-token penalty
k3(pi_ref / pi_theta) with no importance weight: off-policy it estimates no divergence
(Section 2.2 (subsec:grpo_main)), so ``unbiased`` is False.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from rpg_ref.core.kl import k3


class Divergence(NamedTuple):
    what: str                       # the divergence D that E_old[d] equals
    paper: str                      # the paper's label of the loss that penalizes it
    estimate: Callable              # d(w, log_rho, u)
    unbiased: bool = True           # E_old[d] = D for every theta


DIVERGENCES: dict[str, Divergence] = {
    "fkl": Divergence(
        "KL(pi_ref || pi_theta)", "prop:policy_gradient_forward_kl",
        estimate=lambda w, log_rho, u: -u * log_rho),                   # d = -u log rho
    "rkl": Divergence(
        "KL(pi_theta || pi_ref)", "prop:policy_gradient_reverse_kl",
        estimate=lambda w, log_rho, u: w * log_rho),                    # d = w log rho
    "ufkl": Divergence(
        "UKL(pi_ref || pi_theta)", "prop:policy_gradient_unormalized_forward_kl",
        estimate=lambda w, log_rho, u: u * k3(log_rho)),                # d = w - u - u log rho
    "urkl": Divergence(
        "UKL(pi_theta || pi_ref)", "prop:policy_gradient_unormalized_reverse_kl",
        estimate=lambda w, log_rho, u: w * k3(-log_rho)),               # d = u - w + w log rho
    "k3": Divergence(
        "none off-policy (GRPO's per-token k3)", "subsec:grpo_main",
        estimate=lambda w, log_rho, u: k3(-log_rho), unbiased=False),   # d = k3(pi_ref / pi_theta)
}
