"""KL divergences and their sample estimators.

Two kinds of objects live here:

1. Per-sample estimators k1, k2, k3 (Schulman, "Approximating KL divergence", 2020).
   Convention: x ~ q and ``log_ratio = log p(x) - log q(x)``. The *mean* of each over
   samples from q estimates KL(q || p):

       k1 = -log_ratio                        unbiased, high variance, can be negative
       k2 = log_ratio**2 / 2                  biased, low variance
       k3 = exp(log_ratio) - 1 - log_ratio    unbiased for normalized p, q; always >= 0

   For unnormalized measures E_q[k3] equals the *unnormalized* KL,
   UKL(q || p) = sum q log(q/p) + sum (p - q)  (Remark 3.5 (remark:k3_connection_main),
   Appendix D (app:k3_ukl_connection)). Note these are estimators of KL *values*; differentiating
   them as losses does not in general give the gradient of the KL (see derivations/).

2. Exact divergences between categorical distributions given as log-probabilities
   (or logits with ``logits=True``), reduced over ``dim``.

Paper naming (Section 3 (sec:offpolicy_policy_gradients)): with pi_theta the policy being trained
and pi_old the reference, *forward* KL is KL(pi_old || pi_theta) and *reverse* KL is
KL(pi_theta || pi_old).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "forward_kl",
    "forward_ukl",
    "k1",
    "k2",
    "k3",
    "kl",
    "reverse_kl",
    "reverse_ukl",
    "ukl",
]


# ---------------------------------------------------------------------------
# per-sample estimators: x ~ q, log_ratio = log p(x) - log q(x), mean -> KL(q || p)
# ---------------------------------------------------------------------------

def k1(log_ratio: Tensor) -> Tensor:
    """k1 = -log r, r = p(x)/q(x), x ~ q. Unbiased for KL(q||p); can be negative."""
    return -log_ratio


def k2(log_ratio: Tensor) -> Tensor:
    """k2 = (log r)^2 / 2, r = p(x)/q(x), x ~ q. Biased for KL(q||p), low variance, >= 0."""
    return 0.5 * log_ratio * log_ratio


def k3(log_ratio: Tensor) -> Tensor:
    """k3 = r - 1 - log r, r = p(x)/q(x), x ~ q.

    Unbiased for KL(q||p) when p and q are normalized, and for UKL(q||p) when they are not
    (E_q[r - 1 - log r] = sum p - sum q + sum q log(q/p)). Always >= 0.
    ``expm1`` keeps it accurate for small |log r|.
    """
    return torch.expm1(log_ratio) - log_ratio


# ---------------------------------------------------------------------------
# exact divergences between categoricals
# ---------------------------------------------------------------------------

def _as_logprobs(x: Tensor, logits: bool, dim: int) -> Tensor:
    return torch.log_softmax(x, dim=dim) if logits else x


def kl(logp: Tensor, logq: Tensor, dim: int = -1, logits: bool = False) -> Tensor:
    """KL(p || q) = sum_x p(x) (log p(x) - log q(x)) for categoricals given as log-probs.

    Outcomes with p(x) = 0 contribute 0 (the 0 log 0 = 0 convention), also where q(x) = 0.
    With ``logits=True`` both inputs are normalized with log_softmax first.
    """
    logp, logq = _as_logprobs(logp, logits, dim), _as_logprobs(logq, logits, dim)
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return terms.sum(dim)


def ukl(logp: Tensor, logq: Tensor, dim: int = -1, logits: bool = False) -> Tensor:
    """Unnormalized KL between measures: UKL(p || q) = sum p log(p/q) + sum (q - p).

    No normalization is applied (unless ``logits=True``, which normalizes both and makes
    this equal to ``kl``). The mass-correction term sum(q - p) makes UKL >= 0 with equality
    iff p = q, for measures of any total mass (definitions in Section 3.1
    (subsec:offpolicy_ufkl)/urkl).
    """
    logp, logq = _as_logprobs(logp, logits, dim), _as_logprobs(logq, logits, dim)
    p, q = logp.exp(), logq.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return terms.sum(dim) + (q - p).sum(dim)


def forward_kl(logp_theta: Tensor, logp_old: Tensor, dim: int = -1, logits: bool = False) -> Tensor:
    """Forward KL of the paper: KL(pi_old || pi_theta) (Eq. (E.1) (eq:FKL))."""
    return kl(logp_old, logp_theta, dim, logits)


def reverse_kl(logp_theta: Tensor, logp_old: Tensor, dim: int = -1, logits: bool = False) -> Tensor:
    """Reverse KL of the paper: KL(pi_theta || pi_old) (Eq. (E.2) (eq:rkl))."""
    return kl(logp_theta, logp_old, dim, logits)


def forward_ukl(
    logp_theta: Tensor, logp_old: Tensor, dim: int = -1, logits: bool = False
) -> Tensor:
    """Unnormalized forward KL: UKL(pi_old || pi_theta) (Eq. (3.1) (eq:UFKL))."""
    return ukl(logp_old, logp_theta, dim, logits)


def reverse_ukl(
    logp_theta: Tensor, logp_old: Tensor, dim: int = -1, logits: bool = False
) -> Tensor:
    """Unnormalized reverse KL: UKL(pi_theta || pi_old) (Eq. (3.3) (eq:urkl))."""
    return ukl(logp_theta, logp_old, dim, logits)
