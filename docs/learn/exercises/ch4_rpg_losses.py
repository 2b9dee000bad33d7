"""Chapter 4 solutions: the two families give one gradient; pi_ref != pi_old on the bandit."""

import torch

from rpg_ref.core.exact import expected_loss_grad, objective_grad
from rpg_ref.core.losses import LOSSES


def per_sample_gradients(logp, old_logp, advantages, beta, kl="urkl"):
    """Exercise 4.1: d loss / d logp of the fully differentiable rpg-<kl> and the REINFORCE-style
    rpg-reinforce-<kl> on the same batch, no clip (Proposition 4.1)."""
    mask = torch.ones_like(logp)
    grads = []
    for name in (f"rpg-{kl}", f"rpg-reinforce-{kl}"):
        leaf = logp.detach().clone().requires_grad_(True)
        loss, _ = LOSSES[name](leaf, old_logp, advantages, mask, beta=beta)
        (g,) = torch.autograd.grad(loss, leaf)
        grads.append(g)
    return grads


def ref_is_not_old(theta, theta_old, theta_ref, R, beta):
    """Exercise 4.2: samples from pi_old, reference pi_ref != pi_old, theta != theta_old. Returns
    (expected gradient of rpg-reinforce-urkl given ref_logp, the same without ref_logp (the paper's
    pi_ref = pi_old), -grad J for D = UKL(pi_theta || pi_ref), -grad J for D = UKL(pi_theta ||
    pi_old))."""
    logp_old = torch.log_softmax(theta_old, 0)
    logp_ref = torch.log_softmax(theta_ref, 0)
    with_ref = expected_loss_grad("rpg-reinforce-urkl", theta, logp_old, R, beta,
                                  ref_logp=logp_ref)
    without = expected_loss_grad("rpg-reinforce-urkl", theta, logp_old, R, beta)
    return (with_ref, without, -objective_grad("urkl", theta, R, beta, logp_ref),
            -objective_grad("urkl", theta, R, beta, logp_old))
