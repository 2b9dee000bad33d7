"""The KL terms of the losses, one row each: the per-unit estimate d and its closed-form pieces.

Both implementations of rpg_ref.core.losses read this table: the reference losses
(rpg_ref/core/losses.py) put ``estimate`` into their formulas and let autograd differentiate it; the
fast kernel (rpg_ref/core/losses_fused.py) uses ``score`` and ``per_ratio``, the hand-derived
derivatives, instead of autograd. tests/test_divergences.py holds each derivative against autograd
of ``estimate``.

Notation of rpg_ref.core.losses, per unit x ~ pi_old (a token or a whole response):
    w  = pi_theta / pi_old,  lr = log rho = log(pi_theta / pi_ref),  u = pi_ref / pi_old = w / rho
    u_w = u / w = 1 / rho    (the kernel takes u / w, which is 1/rho and stays the exact derivative
                              of d when the log-ratios are clamped, where u / w and 1/rho differ)
Columns, per row:
    estimate(w, lr, u)      d, with E_old[d] = D(pi_theta, pi_ref) for every theta (``unbiased``)
    score(w, lr, u_w)       h = (d d / d log pi_theta) / w: the gradient of E_old[d] is
                            E_old[w h grad log pi_theta] (the REINFORCE weight's C_KL = -beta w h)
    per_ratio(lr, u_w)      (g, g') with g = d / w, a function of rho alone, and g' = dg / d lr
                            (Algorithm 1's clipped surrogate: A_hat = A - beta g)
    unweighted(lr, 1/rho)   (d, dd / d log pi_theta), for the k3 row only: the PPO-clip kernel adds
                            GRPO's penalty with no importance weight, computed from 1/rho
Each of the four rows is the paper's term for its divergence up to a theta-independent constant
(the same gradient), chosen so that the estimate is D itself. The fifth, "k3", is GRPO's published
per-token penalty k3(pi_ref / pi_theta), with no importance weight: off-policy it estimates no
divergence (Section 2.2 (subsec:grpo_main)), so it has no per_ratio and ``unbiased`` is False.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


class Divergence(NamedTuple):
    what: str                       # the divergence D that E_old[d] equals
    paper: str                      # the paper's label of the loss that penalizes it
    estimate: Callable              # d(w, lr, u)
    score: Callable                 # h(w, lr, u_w) = (d d / d log pi_theta) / w
    per_ratio: Callable | None      # (lr, u_w) -> (g, g'), g = d / w
    unbiased: bool = True           # E_old[d] = D for every theta
    # (lr, 1/rho) -> (d, dd / d log pi_theta) for a term added with no importance weight
    # (GRPO's k3): the kernel's form, from 1/rho as it has it (1/w when pi_ref = pi_old)
    unweighted: Callable | None = None


DIVERGENCES: dict[str, Divergence] = {
    "fkl": Divergence(
        "KL(pi_ref || pi_theta)", "prop:policy_gradient_forward_kl",
        estimate=lambda w, lr, u: -u * lr,                              # d = -u log rho
        score=lambda w, lr, u_w: -u_w,                                  # h = -1/rho
        per_ratio=lambda lr, u_w: (-lr * u_w, (lr - 1.0) * u_w)),       # g = -log rho / rho
    "rkl": Divergence(
        "KL(pi_theta || pi_ref)", "prop:policy_gradient_reverse_kl",
        estimate=lambda w, lr, u: w * lr,                               # d = w log rho
        score=lambda w, lr, u_w: lr + 1.0,                              # h = log rho + 1
        per_ratio=lambda lr, u_w: (lr, 1.0)),                           # g = log rho
    "ufkl": Divergence(
        "UKL(pi_ref || pi_theta)", "prop:policy_gradient_unormalized_forward_kl",
        estimate=lambda w, lr, u: w - u - u * lr,                       # d = u k3(rho)
        score=lambda w, lr, u_w: 1.0 - u_w,                             # h = 1 - 1/rho
        per_ratio=lambda lr, u_w: (1.0 - (1.0 + lr) * u_w, lr * u_w)),  # g = 1 - (1 + log rho)/rho
    "urkl": Divergence(
        "UKL(pi_theta || pi_ref)", "prop:policy_gradient_unormalized_reverse_kl",
        estimate=lambda w, lr, u: u - w + w * lr,                       # d = w k3(1/rho)
        score=lambda w, lr, u_w: lr,                                    # h = log rho
        per_ratio=lambda lr, u_w: (u_w - 1.0 + lr, 1.0 - u_w)),         # g = k3(1/rho)
    "k3": Divergence(
        "none off-policy (GRPO's per-token k3)", "subsec:grpo_main",
        estimate=lambda w, lr, u: torch.exp(-lr) - 1.0 + lr,            # d = k3(pi_ref/pi_theta)
        score=lambda w, lr, u_w: (1.0 - torch.exp(-lr)) / w,            # h = (1 - 1/rho) / w
        per_ratio=None, unbiased=False,
        unweighted=lambda lr, inv_rho: (inv_rho - 1.0 + lr, 1.0 - inv_rho)),
}
