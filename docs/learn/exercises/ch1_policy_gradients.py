"""Chapter 1 solutions: the score-function gradient and importance sampling, exact on a bandit."""

import torch

from rpg_ref.core.exact import expected_loss_grad


def reinforce_estimator_is_the_gradient(theta, R):
    """Exercise 1.1: sum_x pi(x) R(x) grad log pi(x) against autograd of E_pi[R] = sum_x pi(x) R(x).
    Returns (score-function expectation, autograd gradient)."""
    th = theta.detach().clone().requires_grad_(True)
    (g_true,) = torch.autograd.grad((torch.softmax(th, 0) * R).sum(), th)
    pi = torch.softmax(theta, 0)
    score = torch.eye(len(theta), dtype=theta.dtype) - pi       # row x: grad log pi(x) = e_x - pi
    g_score = (pi[:, None] * R[:, None] * score).sum(0)
    return g_score, g_true


def importance_weight_needed(theta, theta_old, R):
    """Exercise 1.2: samples from pi_old, policy pi_theta. Returns (-E_old[grad of the weighted loss
    -w R], the same without the weight, -R log pi, and the true grad E_theta[R])."""
    logp_old = torch.log_softmax(theta_old, 0)
    weighted = -expected_loss_grad("rpg-rkl", theta, logp_old, R, beta=0.0)   # L = -w A at beta 0
    th = theta.detach().clone().requires_grad_(True)
    unweighted_loss = (logp_old.exp() * -R * torch.log_softmax(th, 0)).sum()   # -E_old[R log pi]
    (g_unw,) = torch.autograd.grad(unweighted_loss, th)
    th = theta.detach().clone().requires_grad_(True)
    (g_true,) = torch.autograd.grad((torch.softmax(th, 0) * R).sum(), th)
    return weighted, -g_unw, g_true
