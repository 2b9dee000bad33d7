"""Exact expectations over a K-outcome softmax policy, by enumeration (no sampling).

The tool behind the library's exactness claims: for a categorical pi_theta = softmax(theta)
the expectation of a loss under pi_old is a finite sum, so its autograd gradient can be
compared with -grad J(theta) computed from J's definition. Used by tests, derivations/,
the demo and the notebooks.

``Autoregressive`` does the same for a small autoregressive policy: every response of a fixed
length, with tabular logits for every prefix (derivations/token_sequence.py, rpg_ref/audit/).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from rpg_ref.core import kl, losses

__all__ = ["Autoregressive", "divergence", "expected_loss", "expected_loss_grad", "objective",
           "objective_grad"]


_DIVERGENCES = {
    "fkl": kl.forward_kl,
    "rkl": kl.reverse_kl,
    "ufkl": kl.forward_ukl,
    "urkl": kl.reverse_ukl,
}


def divergence(div: str, logp_theta: Tensor, logp_ref: Tensor) -> Tensor:
    """D(pi_theta, pi_ref) from rpg_ref.core.kl; pi_ref may be an unnormalized measure.

    fkl: KL(ref||theta)   rkl: KL(theta||ref)   ufkl: UKL(ref||theta)   urkl: UKL(theta||ref)
    """
    if div not in _DIVERGENCES:
        raise ValueError(f"unknown divergence {div!r}; valid: {', '.join(_DIVERGENCES)}")
    return _DIVERGENCES[div](logp_theta, logp_ref)


def objective(div: str, theta: Tensor, R: Tensor, beta: float, logp_ref: Tensor) -> Tensor:
    """J(theta) = sum_x pi_theta(x) R(x) - beta D(pi_theta, pi_ref), pi_theta = softmax(theta)."""
    logp = torch.log_softmax(theta, 0)
    return (logp.exp() * R).sum() - beta * divergence(div, logp, logp_ref)


def objective_grad(div: str, theta: Tensor, R: Tensor, beta: float, logp_ref: Tensor) -> Tensor:
    th = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(objective(div, th, R, beta, logp_ref), th)
    return g


def expected_loss(name: str, theta: Tensor, logp_old: Tensor, A: Tensor, beta: float,
                  ref_logp: Tensor | None = None, clip=None) -> Tensor:
    """sum_x pi_old(x) L(x) with each outcome x one sample (B=1, T=1); differentiable in theta.

    ``logp_old`` may be the log of an unnormalized measure of mass Z_old: the sum is then
    Z_old * E_{x ~ pi_old / Z_old}[L(x)], the paper's unnormalized expectations.
    """
    logp = torch.log_softmax(theta, 0)
    fn = losses.get_loss(name)
    one = torch.ones(1, 1, dtype=theta.dtype)
    total = theta.new_zeros(())
    for x in range(theta.shape[0]):
        loss, _ = fn(logp[x].view(1, 1), logp_old[x].view(1, 1), A[x].view(1), one, beta=beta,
                     ref_logp=None if ref_logp is None else ref_logp[x].view(1, 1), clip=clip)
        total = total + logp_old[x].exp() * loss
    return total


def expected_loss_grad(name: str, theta: Tensor, logp_old: Tensor, A: Tensor, beta: float,
                       ref_logp: Tensor | None = None, clip=None) -> Tensor:
    th = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(expected_loss(name, th, logp_old, A, beta, ref_logp, clip), th)
    return g


class Autoregressive:
    """Every response y = (y_1..y_L) over a vocabulary of V tokens, for a tabular policy.

    A policy is a logits table [n_prefix, V]: row p holds the logits of the next token after
    prefix p. Prefixes are numbered by length, then lexicographically: the prefix (a_1..a_t) is
    (V^t - 1) / (V - 1) + sum_i a_i V^(t-i), so () -> 0 and, for V = 3, (a) -> 1 + a,
    (a, b) -> 4 + 3a + b. Responses all have length L (no end token): sums over the V^L rows
    are exact expectations.
    """

    def __init__(self, V: int, L: int):
        if V < 2 or L < 1:
            raise ValueError(f"need a vocabulary V >= 2 and a length L >= 1, got V={V}, L={L}")
        self.V, self.L = V, L
        self.seqs = torch.tensor(list(itertools.product(range(V), repeat=L)))       # [V^L, L]
        # first id of length t
        offset = [(V ** t - 1) // (V - 1) for t in range(L)]
        cols = [torch.full((len(self.seqs),), offset[0], dtype=torch.long)]
        for t in range(1, L):
            # base-V value of y_<t
            code = (self.seqs[:, :t] * V ** torch.arange(t - 1, -1, -1)).sum(1)
            cols.append(offset[t] + code)
        # [V^L, L] prefix of y_t
        self.prefix = torch.stack(cols, 1)
        self.n_prefix = (V ** L - 1) // (V - 1)
        flat = self.prefix.reshape(-1)
        order = torch.argsort(flat, stable=True)
        # one (y, t) per prefix
        self._first = order[torch.searchsorted(flat[order], torch.arange(self.n_prefix))]

    def token_logp(self, logits: Tensor) -> Tensor:
        """[V^L, L] log pi(y_t | y_<t) of every response, from a logits table [n_prefix, V]."""
        return torch.log_softmax(logits, -1)[self.prefix, self.seqs]

    def prefix_logp(self, logits: Tensor) -> Tensor:
        """[n_prefix] log-probability that a response starts with each prefix."""
        tok = self.token_logp(logits)
        # sum_{s<t} log pi(y_s|y_<s)
        before = tok.cumsum(1) - tok
        return before.reshape(-1)[self._first]
