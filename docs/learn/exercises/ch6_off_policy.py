"""Chapter 6 solutions: a stale sampler, TIS and its cap, coupled vs decoupled, on a bandit."""

import torch

from rpg_ref.core.exact import expected_loss_grad, objective_grad
from rpg_ref.core.losses import LOSSES


def sampler_expectation(name, theta, logp_old, logp_sampler, R, beta, weights=None, clip=None):
    """sum_x mu(x) weight(x) grad L(x): the expected gradient of a loss whose samples come from the
    sampler mu, each weighted by the constant ``weights[x]`` (None: 1)."""
    th = theta.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(th, 0)
    one, total = torch.ones(1, 1, dtype=theta.dtype), th.new_zeros(())
    for x in range(len(theta)):
        loss, _ = LOSSES[name](logp[x].view(1, 1), logp_old[x].view(1, 1), R[x].view(1), one,
                               beta=beta, clip=clip)
        wx = 1.0 if weights is None else float(weights[x])
        total = total + logp_sampler[x].exp() * wx * loss
    (g,) = torch.autograd.grad(total, th)
    return g


def tis_and_its_cap(theta, theta_old, theta_sampler, R, beta, cap):
    """Exercise 6.1: (uncorrected, TIS without a cap, TIS capped at ``cap``, the exact -grad J for
    D = UKL(pi_theta || pi_old)), the loss rpg-reinforce-urkl without clip."""
    lo, ls = torch.log_softmax(theta_old, 0), torch.log_softmax(theta_sampler, 0)
    r = (lo - ls).exp()
    target = -objective_grad("urkl", theta, R, beta, lo)
    name = "rpg-reinforce-urkl"
    return (sampler_expectation(name, theta, lo, ls, R, beta),
            sampler_expectation(name, theta, lo, ls, R, beta, weights=r),
            sampler_expectation(name, theta, lo, ls, R, beta, weights=r.clamp(max=cap)), target)


def coupled_vs_decoupled(theta, theta_sampler, R, beta, clip=None):
    """Exercise 6.2: the update at theta = the current policy, samples from a stale sampler.
    Coupled: pi_old = the sampler (the ratio and the KL to pi_old taken against it). Decoupled:
    pi_old = the current policy, recomputed, each sample weighted by pi_old / sampler (TIS, no cap).
    Returns both expected gradients."""
    ls, lc = torch.log_softmax(theta_sampler, 0), torch.log_softmax(theta, 0).detach()
    coupled = expected_loss_grad("rpg-reinforce-urkl", theta, ls, R, beta, clip=clip)
    decoupled = sampler_expectation("rpg-reinforce-urkl", theta, lc, ls, R, beta,
                                    weights=(lc - ls).exp(), clip=clip)
    return coupled, decoupled
