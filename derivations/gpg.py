"""Item 1: the generalized policy gradient theorem, Proposition 2.1
(thm:generalized_policy_gradient_theorem),

    grad E_{x~pi_theta}[f(x, theta)]
        = E_{x~pi_theta}[f(x, theta) grad log pi_theta(x) + grad f(x, theta)],

for a K-outcome softmax. Symbolically f_k(theta) are arbitrary (undefined) differentiable
functions; numerically f(x, theta) = R_x tanh(v_x . theta) + theta_x^2 / 2.
"""

from __future__ import annotations

import sympy as sp
import torch

from ._core import DTYPE, Checker, claim, jac, mc_n


def f_torch(theta: torch.Tensor, R: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """[K] values f(x, theta) = R_x tanh(V_x . theta) + theta_x^2 / 2."""
    return R * torch.tanh(V @ theta) + 0.5 * theta ** 2


@claim(
    "gpg",
    "thm:generalized_policy_gradient_theorem",
    "grad E_{pi_theta}[f(x,theta)] = E_{pi_theta}[f(x,theta) grad log pi_theta(x) + grad "
    "f(x,theta)] "
    "for f depending on theta.",
)
def check_thm_generalized_policy_gradient_theorem(ck: Checker, fast: bool) -> None:
    K = 3
    th = sp.symbols(f"theta1:{K + 1}", real=True)
    f = [sp.Function(f"f{k + 1}")(*th) for k in range(K)]           # arbitrary f(x_k, theta)
    S = sum(sp.exp(t) for t in th)
    p = [sp.exp(t) / S for t in th]
    logp = [t - sp.log(S) for t in th]
    lhs_obj = sum(p[k] * f[k] for k in range(K))
    for j in range(K):
        rhs = sum(p[k] * (f[k] * sp.diff(logp[k], th[j]) + sp.diff(f[k], th[j])) for k in range(K))
        ck.symbolic(f"d/dtheta_{j + 1}", sp.diff(lhs_obj, th[j]) - rhs)
    ck.note("symbolic: K=3 softmax, theta real, f_k(theta) arbitrary differentiable functions")

    # exact: K=6, autograd of sum pi f vs the theorem's right-hand side
    K = 6
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(K, generator=g, dtype=DTYPE).requires_grad_(True)
    R = torch.randn(K, generator=g, dtype=DTYPE)
    V = torch.randn(K, K, generator=g, dtype=DTYPE)
    logp_t = torch.log_softmax(theta, -1)
    fv = f_torch(theta, R, V)                                         # [K]
    (lhs,) = torch.autograd.grad((logp_t.exp() * fv).sum(), theta, retain_graph=True)
    # [K, K] f grad log pi + grad f
    per_x = fv.detach()[:, None] * jac(logp_t, theta) + jac(fv, theta)
    p_t = logp_t.exp().detach()
    ck.exact("sum_x pi f grad log pi + grad f == grad sum_x pi f", p_t @ per_x, lhs)

    # Monte Carlo: x ~ pi_theta
    n = mc_n(fast)
    idx = torch.multinomial(p_t, n, replacement=True, generator=torch.Generator().manual_seed(1))
    ck.mc("E_theta[f grad log pi + grad f]", per_x[idx], lhs)
