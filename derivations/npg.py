"""Item 7: RPG and natural policy gradient (Appendix B (app:rpg_npg_connection)).

Claims: KL(pi_k || pi_theta) = 1/2 dtheta^T F dtheta + O(|dtheta|^3) with F the Fisher matrix
(Eq. (B.4) (eq:gu0003)); the maximizer of the quadratic surrogate Eq. (B.5) (eq:gu0004) is (1/beta)
F^{-1} grad J.

For a softmax, F = diag(p) - p p^T is singular (F 1 = 0: shifting all logits changes nothing),
so F^{-1} does not exist; we use the pseudo-inverse F^+, which gives the minimum-norm maximizer
(every maximizer differs from it by a multiple of 1). Numerically: the exact maximizer of
J(theta) - beta KL(pi_k || pi_theta) (Newton's method on the closed form; that the expected
rpg-fkl loss of rpg_ref.core.losses is stationary there is checked), satisfies beta * dtheta* -> F^+
grad J as beta grows, with error O(1/beta).
"""

from __future__ import annotations

import itertools

import sympy as sp
import torch

from rpg_ref.core.losses import get_loss

from ._core import DTYPE, Checker, SymSoftmax, claim, cosine, expected_loss_grad, mc_n, rel_err


def regularized_objective(theta, theta_k, R, beta):
    """J(theta) - beta KL(pi_k || pi_theta), J = sum_x pi_theta(x) R(x) (Eq. (B.1) (eq:gu0001)),
    closed form."""
    lp, lk = torch.log_softmax(theta, -1), torch.log_softmax(theta_k, -1)
    return (lp.exp() * R).sum() - beta * (lk.exp() * (lk - lp)).sum()


def regularized_step(theta_k, R, beta, iters: int = 60) -> torch.Tensor:
    """dtheta* = argmax_theta J(theta) - beta KL(pi_k||pi_theta) - theta_k, gauge-fixed to sum 0
    (Newton with pseudo-inverse Hessian -- the objective is flat along 1 -- and backtracking)."""
    th = theta_k.clone()
    f = lambda t: -regularized_objective(t, theta_k, R, beta)
    for _ in range(iters):
        t = th.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(f(t), t)
        if float(g.norm()) < 1e-15:
            break
        step = -torch.linalg.pinv(torch.autograd.functional.hessian(f, th), hermitian=True) @ g
        lr, f0 = 1.0, float(f(th))
        while float(f(th + lr * step)) > f0 + 1e-15 and lr > 1e-8:
            lr /= 2
        th = th + lr * step
    d = th - theta_k
    return d - d.mean()


@claim(
    "npg",
    "app:rpg_npg_connection",
    "The Hessian of KL(pi_theta_k||pi_theta) at theta_k is the Fisher matrix F; the maximizer of "
    "J + grad J^T dtheta - beta/2 dtheta^T F dtheta is (1/beta) F^{-1} grad J (F singular for "
    "softmax: "
    "pseudo-inverse), and the exact regularized step approaches it as beta grows.",
)
def check_app_rpg_npg_connection(ck: Checker, fast: bool) -> None:
    S = SymSoftmax(3)
    b = sp.symbols("b1:4", positive=True)                             # a at theta_k
    at_k = dict(zip(S.a, b))
    pk = [bi / sum(b) for bi in b]                                    # pi_k, normalized
    kl = sum(pk[i] * (sp.log(pk[i]) - S.logp[i]) for i in range(3))   # KL(pi_k || pi_theta)
    for i in range(3):
        ck.symbolic(f"grad KL at theta_k, coord {i + 1}", S.d(kl, i).subs(at_k))
        for j in range(i, 3):
            fisher = sum(S.p[x] * S.dlogp(x, i) * S.dlogp(x, j) for x in range(3))
            ck.symbolic(
                f"Hessian[{i + 1},{j + 1}] == F[{i + 1},{j + 1}]",
                (S.d(S.d(kl, i), j) - fisher).subs(at_k),
            )
    F_sym = sp.Matrix(
        3, 3, lambda i, j: sum(S.p[x] * S.dlogp(x, i) * S.dlogp(x, j) for x in range(3))
    )
    for i in range(3):
        ck.symbolic(f"F 1 == 0 (row {i + 1}): F is singular", sum(F_sym[i, j] for j in range(3)))
    ck.note("symbolic: K=3 softmax, theta and theta_k real; F = diag(p) - p p^T has null vector 1, "
            "so F^{-1} is read as the pseudo-inverse F^+")

    # exact (K=5, float64)
    K = 5
    g = torch.Generator().manual_seed(4)
    theta_k = torch.randn(K, generator=g, dtype=DTYPE)
    R = torch.randn(K, generator=g, dtype=DTYPE)
    old_logp = torch.log_softmax(theta_k, -1)
    p = old_logp.exp()
    F = torch.diag(p) - torch.outer(p, p)
    # (rpg_ref's losses return analytic first derivatives, so second derivatives are taken of the
    # closed-form KL; the loss enters through its first-order stationarity below)
    H = torch.autograd.functional.hessian(
        lambda t: -regularized_objective(t, theta_k, torch.zeros_like(R), 1.0), theta_k
    )
    ck.exact("Hessian of KL(pi_k||pi_theta) at theta_k == F", H, F)
    # grad_theta sum pi R at theta_k
    gJ = p * (R - (p * R).sum())
    npg = torch.linalg.pinv(F, hermitian=True) @ gJ
    # the quadratic surrogate eq:gu0004 is stationary at dtheta = F^+ grad J / beta: grad J lies in
    # the range of F (it is orthogonal to 1), so F F^+ grad J = grad J
    ck.exact("F (F^+ grad J) == grad J (F^+ grad J / beta maximizes the surrogate)", F @ npg, gJ)
    errs = []
    for beta in ((1.0, 10.0, 100.0) if fast else (1.0, 10.0, 100.0, 1000.0)):
        d = regularized_step(theta_k, R, beta)
        g_loss, _ = expected_loss_grad(get_loss("rpg-fkl"), theta_k + d, old_logp, R, beta=beta)
        ck.exact(
            f"beta={beta:g}: E_k[grad rpg-fkl loss] == 0 at the exact regularized step",
            g_loss / beta,
            torch.zeros_like(g_loss),
        )
        errs.append((beta, rel_err(beta * d, npg), cosine(d, npg)))
    ck.note(
        "beta * dtheta* vs F^+ grad J: "
        + "; ".join(f"beta={b_:g}: rel err {e:.3g}, cos {c:.6f}" for b_, e, c in errs)
    )
    ck.fact("error decreases as beta grows, like 1/beta",
            all(e2 < e1 for (_, e1, _), (_, e2, _) in itertools.pairwise(errs))
            and 5 < errs[-2][1] / errs[-1][1] < 20 and errs[-1][1] < 2e-2,
            f"errors {[f'{e:.3g}' for _, e, _ in errs]}")

    # Monte Carlo: F = E_{pi_k}[grad log pi grad log pi^T]
    n = mc_n(fast)
    idx = torch.multinomial(p, n, replacement=True, generator=torch.Generator().manual_seed(41))
    score = torch.eye(K, dtype=DTYPE)[idx] - p  # [N, K] grad log pi(x)
    ck.mc(
        "Fisher from samples", (score[:, :, None] * score[:, None, :]).reshape(n, -1), F.reshape(-1)
    )
