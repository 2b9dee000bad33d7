"""Chapter 5 solutions: where each clip has no gradient, and through what the gradient flows."""

import math

import torch

from rpg_ref.core.losses import LOSSES


def unit_gradient(loss, w, A, clip, beta=0.0):
    """d loss / d log pi_theta for one token with ratio w = pi_theta / pi_old and advantage A."""
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[math.log(0.5) - math.log(w)]], dtype=torch.float64)
    value, _ = LOSSES[loss](logp, old, torch.tensor([A], dtype=torch.float64),
                            torch.ones(1, 1, dtype=torch.float64), beta=beta, clip=clip)
    (g,) = torch.autograd.grad(value, logp)
    return float(g)


def six_cases(eps=0.2):
    """Exercise 5.1: PPO clip (no dual clip) at w below, inside and above [1 - eps, 1 + eps], for
    A = +1 and -1: {(w, A): d loss / d log pi}."""
    return {(w, A): unit_gradient("dapo", w, A, (eps, eps, None))
            for w in (0.5, 1.0, 1.5) for A in (1.0, -1.0)}


def rpg_clip_gradient(w, A, clip=(0.2, 0.2, 3.0)):
    """Exercise 5.2: RPG-Style Clip (rpg-reinforce-urkl, beta 0): d loss / d log pi at ratio w."""
    return unit_gradient("rpg-reinforce-urkl", w, A, clip)
