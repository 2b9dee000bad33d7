"""Items 2 and 3: the off-policy gradients and surrogate losses of the four KL forms
(Table 1 (tab:off-policy-loss), Table 4 (tab:off-policy-loss-normalized), Table 2
(tab:off-policy-loss-reinforce) and their propositions), as printed, with a general unnormalized
pi_old of mass Z_old.

For each form (paper.PAPER) three statements are checked:
  (G) grad J = E[W(x) grad log pi_theta(x)]           the proposition's gradient
  (L) grad L = -grad J,  L = E[l(x)]                   the fully differentiable loss
  (RF) -E[V(x) grad log pi_theta(x)] = -grad J         the REINFORCE-style loss (SG(V) log pi)
where E is over x ~ pi_old/Z_old ("tilde", unnormalized tables) or, for the normalized tables,
x ~ pi_old read as sum_x pi_old(x)(.) -- the expectation when Z_old = 1, which is the stated
setting; the checks run that reading for general Z_old too and state so.
"""

from __future__ import annotations

import torch

from rpg_ref.core import exact as rexact
from rpg_ref.core.losses import get_loss

from . import paper
from ._core import (
    ASSUMPTIONS,
    Checker,
    SymSoftmax,
    check_row_separability,
    claim,
    expected_loss_grad,
    jac,
    make_problem,
    mc_n,
    mc_through_loss,
)
from .paper import PAPER

# ---------------------------------------------------------------------------
# the paper's expressions evaluated symbolically and in float64
# ---------------------------------------------------------------------------

def _sym_residuals(form, S: SymSoftmax, which: str):
    """Residual expressions (one per theta_j) that are 0 iff the printed statement holds."""
    e = [S.o[k] / S.Z if form.sampling == "tilde" else S.o[k] for k in range(S.K)]
    args = lambda k: (S.w[k], S.logw[k], S.logp[k], S.R[k], S.beta, S.Z)
    J = paper.objective_sym(form.div, S)
    if which == "L":
        L = sum(e[k] * form.loss(*args(k)) for k in range(S.K))
        return [S.d(L, j) + S.d(J, j) for j in range(S.K)]
    # G:  E[W grad log pi] = grad J
    # RF: grad L_RF = -E[V grad log pi] = -grad J, the same equation in V
    weight = form.grad_weight if which == "G" else form.rf_weight
    return [
        sum(e[k] * weight(*args(k)) * S.dlogp(k, j) for k in range(S.K)) - S.d(J, j)
        for j in range(S.K)
    ]


def paper_grads(form, logits, old_logp, R, beta):
    """float64 (grad J, paper's G formula, grad of paper's L, REINFORCE-style gradient)."""
    th = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(th, -1)                                    # [K]
    mass = old_logp.exp()
    Z = mass.sum()
    e = mass / Z if form.sampling == "tilde" else mass                  # expectation weights [K]
    lw = logp - old_logp
    w = lw.exp()
    (gJ,) = torch.autograd.grad(
        paper.objective_torch(form.div, th, old_logp, R, beta), th, retain_graph=True
    )
    dlogp = jac(logp, th)                                               # [K, K] rows grad log pi_k
    Wg = form.grad_weight(w, lw, logp, R, beta, Z).detach()
    g_formula = (e * Wg) @ dlogp
    (gL,) = torch.autograd.grad(
        (e * form.loss(w, lw, logp, R, beta, Z)).sum(), th, retain_graph=True
    )
    V = form.rf_weight(w, lw, logp, R, beta, Z).detach()                # SG(V)
    (gRF,) = torch.autograd.grad(-(e * V * logp).sum(), th)
    return gJ, g_formula, gL, gRF


def _check_form(ck: Checker, div: str, fast: bool, reinforce: bool) -> None:
    form = PAPER[div]
    S = SymSoftmax(3)
    parts = ("RF",) if reinforce else ("G", "L")
    for which in parts:
        for j, r in enumerate(_sym_residuals(form, S, which)):
            ck.symbolic(f"{div} {which} d/dtheta_{j + 1}", r)
    ck.note(
        f"symbolic assumptions: {ASSUMPTIONS}; expectation "
        + (
            "over pi_old/Z_old"
            if form.sampling == "tilde"
            else "sum_x pi_old(x)(.) (= E_{pi_old} at Z_old=1)"
        )
    )
    ck.note(f"transcribed from {form.where}")

    # exact: K=6; unnormalized pi_old (and Z_old=1 for the normalized tables' literal setting)
    z_list = (1.7,) if form.sampling == "tilde" else (1.0, 1.7)
    name = f"rpg-reinforce-{div}" if reinforce else f"rpg-{div}"
    fn = get_loss(name)
    for z in z_list:
        for seed, dist in ((1, 0.0), (2, 0.7), (3, 1.5)):
            P = make_problem(K=6, seed=seed, z_old=z, dist=dist)
            gJ, g_formula, gL, gRF = paper_grads(form, P.logits, P.old_logp, P.R, P.beta)
            tag = f"{div} Z_old={z} |theta-theta_old|~{dist}"
            if reinforce:
                ck.exact(f"{tag}: paper REINFORCE-style loss grad == -grad J", gRF, -gJ)
            else:
                ck.exact(f"{tag}: paper gradient formula == grad J", g_formula, gJ)
                ck.exact(f"{tag}: grad paper loss == -grad J", gL, -gJ)
            g_lib, _ = expected_loss_grad(fn, P.logits, P.old_logp, P.R, beta=P.beta)
            ck.exact(f"{tag}: rpg_ref {name} E_old[grad loss] == -grad J", g_lib, -gJ)
            if seed == 2:
                check_row_separability(ck, fn, P.logits, P.old_logp, P.R, beta=P.beta)
                # rpg_ref.core.exact (used by the library's own tests) agrees with these oracles
                ck.exact(f"{tag}: rpg_ref.core.exact.objective_grad == grad J (definitions)",
                         rexact.objective_grad(div, P.logits, P.R, P.beta, P.old_logp), gJ)
                ck.exact(f"{tag}: rpg_ref.core.exact.expected_loss_grad == batched enumeration",
                         rexact.expected_loss_grad(name, P.logits, P.old_logp, P.R, P.beta), g_lib)

    # Monte Carlo through the library loss, off-policy, unnormalized pi_old
    P = make_problem(K=6, seed=7, z_old=z_list[0] if form.sampling == "old" else 1.7, dist=0.7)
    gJ = paper_grads(form, P.logits, P.old_logp, P.R, P.beta)[0]
    _, G = expected_loss_grad(fn, P.logits, P.old_logp, P.R, beta=P.beta)
    mc_through_loss(ck, f"{name} Z_old={P.z_old:.2f}", fn, P.logits, P.old_logp, P.R, -gJ, G,
                    beta=P.beta, n=mc_n(fast), seed=11)


def _register_prop(div: str, text: str):
    @claim(f"prop-{div}", PAPER[div].label, text)
    def check(ck: Checker, fast: bool) -> None:
        _check_form(ck, div, fast, reinforce=False)
    return check


def _register_reinforce(div: str, text: str):
    @claim(f"reinforce-{div}", PAPER[div].rf_label, text)
    def check(ck: Checker, fast: bool) -> None:
        _check_form(ck, div, fast, reinforce=True)
    return check


check_prop_policy_gradient_forward_kl = _register_prop(
    "fkl",
    "FKL: grad J = E_old[(w R + beta) grad log pi]; L = E_old[-w R - beta log pi] has grad L = "
    "-grad J.",
)
check_prop_policy_gradient_reverse_kl = _register_prop(
    "rkl",
    "RKL: grad J = E_old[w (R - beta (log w + 1)) grad log pi]; L = E_old[w (-R + beta log w)] has "
    "grad L = -grad J.",
)
check_prop_policy_gradient_unormalized_forward_kl = _register_prop(
    "ufkl",
    "UFKL: grad J = Z_old E_~old[(w R - beta (w - 1)) grad log pi]; L = Z_old E_~old[-w R + "
    "beta (w - log w - 1)] has grad L = -grad J, for unnormalized pi_old of mass Z_old.",
)
check_prop_policy_gradient_unormalized_reverse_kl = _register_prop(
    "urkl", "URKL: grad J = Z_old E_~old[w (R - beta log w) grad log pi]; L = Z_old E_~old[-w R + "
            "beta (w log w - w)] has grad L = -grad J, for unnormalized pi_old of mass Z_old.")


@claim("equiv-rf-fd", "prop:equiv_rf_fd",
       "The REINFORCE-style losses -E[SG(Weight) log pi_theta] have the same gradient as the fully "
       "differentiable losses, -grad J (here: per sample, not only in expectation).")
def check_prop_equiv_rf_fd(ck: Checker, fast: bool) -> None:
    S = SymSoftmax(3)
    for div, form in PAPER.items():
        for k in range(S.K):
            args = (S.w[k], S.logw[k], S.logp[k], S.R[k], S.beta, S.Z)
            for j in range(S.K):   # per sample: grad l(x) == -V(x) grad log pi(x)
                ck.symbolic(f"{div} x={k + 1} d/dtheta_{j + 1}",
                            S.d(form.loss(*args), j) + form.rf_weight(*args) * S.dlogp(k, j))
    ck.note(
        "symbolic: per-sample identity grad l(x) = -V(x) grad log pi(x) for all 4 forms; "
        f"{ASSUMPTIONS}"
    )
    # exact, through rpg_ref: per-outcome gradients of the two families coincide (pi_ref = pi_old
    # and pi_ref != pi_old), and their expectation is -grad J
    for div in PAPER:
        fd, rf = get_loss(f"rpg-{div}"), get_loss(f"rpg-reinforce-{div}")
        for ref_dist in (None, 0.8):
            P = make_problem(K=6, seed=5, z_old=1.3, dist=0.9, ref_dist=ref_dist)
            _, G_fd = expected_loss_grad(
                fd, P.logits, P.old_logp, P.R, beta=P.beta, ref_logp=P.ref_logp
            )
            g_rf, G_rf = expected_loss_grad(
                rf, P.logits, P.old_logp, P.R, beta=P.beta, ref_logp=P.ref_logp
            )
            th = P.logits.clone().requires_grad_(True)
            (gJ,) = torch.autograd.grad(
                paper.objective_torch(div, th, P.old_logp, P.R, P.beta, P.ref_logp), th
            )
            tag = f"{div} pi_ref {'= pi_old' if ref_dist is None else '!= pi_old'}"
            ck.exact(
                f"{tag}: per-outcome grads rpg-reinforce == rpg (fully differentiable)", G_rf, G_fd
            )
            ck.exact(f"{tag}: rpg-reinforce E_old[grad] == -grad J", g_rf, -gJ)
            if ref_dist is not None:
                mc_through_loss(
                    ck,
                    f"rpg-reinforce-{div} pi_ref != pi_old",
                    rf,
                    P.logits,
                    P.old_logp,
                    P.R,
                    -gJ,
                    G_rf,
                    beta=P.beta,
                    ref_logp=P.ref_logp,
                    n=mc_n(fast),
                    seed=13,
                )


check_prop_offpolicy_reinforce_loss_fkl = _register_reinforce(
    "fkl", "REINFORCE-style FKL: -E_old[SG(w R + beta) log pi_theta] has gradient -grad J_FKL.")
check_prop_offpolicy_reinforce_loss_ufkl = _register_reinforce(
    "ufkl",
    "REINFORCE-style UFKL: -E_~old[SG(Z_old (w R - beta (w - 1))) log pi_theta] has gradient "
    "-grad J_UFKL.",
)
check_prop_offpolicy_reinforce_loss_rkl = _register_reinforce(
    "rkl",
    "REINFORCE-style RKL: -E_old[SG(w (R - beta log w - beta)) log pi_theta] has gradient -grad "
    "J_RKL.",
)
check_prop_offpolicy_reinforce_loss_urkl = _register_reinforce(
    "urkl",
    "REINFORCE-style URKL: -E_~old[SG(Z_old w (R - beta log w)) log pi_theta] has gradient -grad "
    "J_URKL.",
)
