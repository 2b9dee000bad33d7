"""Chapter 3 solutions: which optimum GRPO's k3 reaches, and what k1 as a loss does."""

import numpy as np
import torch

from rpg_ref.audit.adapters import docs_adapters
from rpg_ref.audit.core import SETTINGS, expected_grad, make_problem
from rpg_ref.audit.design_space import Cell
from rpg_ref.core.exact import expected_loss_grad


def train_on_bandit(loss, ref_probs, R, beta, steps=300, lr=4.0):
    """Exercise 3.1: on-policy exact training (theta_old = theta every step, the expected gradient
    of the loss under pi_theta, advantages = the rewards) from the reference; returns pi at the
    end. Passing ref_logp makes pi_ref a fixed reference, not pi_old."""
    ref_logp = torch.log(torch.as_tensor(ref_probs, dtype=torch.float64))
    R = torch.as_tensor(R, dtype=torch.float64)
    theta = ref_logp.clone()
    for _ in range(steps):
        logp_old = torch.log_softmax(theta, 0)
        theta = theta - lr * expected_loss_grad(loss, theta, logp_old, R, beta, ref_logp=ref_logp)
    return np.asarray(torch.softmax(theta, 0))


def k1_loss_gradient_on_policy(horizon=2, seed=0):
    """Exercise 3.2: the exact expected gradient of beta k1 as a loss (no w, token level) on an
    autoregressive policy at theta = theta_old with a fixed reference: its norm."""
    on_policy_fixed_ref = next(s for s in SETTINGS if s.on_policy and not s.ref_is_old)
    prob = make_problem(on_policy_fixed_ref, horizon, seed)
    adapter = Cell("k1", "loss", False, "token").adapter()
    g = expected_grad(adapter, prob, torch.zeros_like(prob.R))    # A = 0: the KL part alone
    return float(g.norm())


def k2_loss_vs_k1_reward(horizon=2, seed=0):
    """Exercise 3.3: on-policy with a fixed reference, the exact KL parts (A = 0) of k2 as a loss,
    of k1 in the reward with A_t = R - beta k1_t (no return to go), and of k1 in the reward with
    return to go. Returns the three gradients."""
    on_policy_fixed_ref = next(s for s in SETTINGS if s.on_policy and not s.ref_is_old)
    prob = make_problem(on_policy_fixed_ref, horizon, seed)
    zero = torch.zeros_like(prob.R)
    k2_loss = Cell("k2", "loss", False, "token").adapter()
    rtg = Cell("k1", "reward", True, "token").adapter()
    per_token = next(a for a in docs_adapters() if a.name.startswith("k1 in reward, A_t"))
    return [expected_grad(a, prob, zero) for a in (k2_loss, per_token, rtg)]
