"""Item 8: clipping (Algorithm 1 (alg:offpolicy_rpg_ppo_dualclip), Algorithm 2
(alg:offpolicy_rpg_rf_ppo_dualclip_v1), Section 3.3 (subsec:rpg_style_clip), Section 4.1
(subsec:rpg_style_clip_reinforce), Appendix G.2 (subsec:offpolicy_reinforce_stabilization)).

Every per-sample loss here depends on theta only through log pi_theta(x), so its gradient is
coef * grad log pi_theta(x) with coef = d loss / d log pi_theta(x): comparing descriptions means
comparing coef as a function of w on each segment. The descriptions of RPG-Style Clip:

  A  Section 3.3 (subsec:rpg_style_clip) (l.433-447): the dual-clip max/min form with the
     *differentiable* A_hat(x; theta) (A_hat_URKL = (R-b) - beta log w,
     A_hat_RKL = (R-b) - beta (log w + 1));
  B  Section 4.1 (subsec:rpg_style_clip_reinforce) (l.600-604): -C(w, SG(A_hat)) log pi_theta,
     C = the dual-clip objective; as written w is not under SG.  B': the same with
     SG(C(w, SG(A_hat))) (the remark of l.1319: "replacing w with w-bar ... inside SG");
  C  Algorithm 2 (alg:offpolicy_rpg_rf_ppo_dualclip_v1) (l.1501-1556), line by line;
  D  Appendix G.2 (subsec:offpolicy_reinforce_stabilization) (l.1471-1489): PPO dual clip with
     SG(A_hat), gradient through w, which the text says Algorithm C "details".
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from rpg_ref.core.losses import get_loss

from . import paper
from ._core import (
    DTYPE,
    Checker,
    SymSoftmax,
    claim,
    expected_loss_grad,
    make_problem,
    mc_n,
    mc_through_loss,
)

# the paper's (eps1, eps2); c = 3 (verl's default clip_ratio_c)
EPS1, EPS2, C = 0.2, 0.28, 3.0
CLIP = (EPS1, EPS2, C)
LOGPI = math.log(0.4)                   # log pi_theta(x) of the single sample on the grid
W_GRID = (0.5, 0.7, 1.0, 1.1, 1.5, 2.9, 3.1, 4.0)   # boundaries excluded (ties are measure-zero)


def _lib(name):
    fn = get_loss(name)

    def loss(logpi, old_logp, A_R, div, beta):
        out, _ = fn(
            logpi.view(1, 1),
            old_logp.view(1, 1),
            A_R.view(1),
            torch.ones(1, 1, dtype=DTYPE),
            beta=beta,
            clip=CLIP,
        )
        return out
    return loss


def _desc_A(logpi, old_logp, A_R, div, beta):
    w = torch.exp(logpi - old_logp)
    return paper.dualclip_loss(w, paper.ahat_paper(div, A_R, logpi - old_logp, beta), EPS1, EPS2, C)


def _desc_B(logpi, old_logp, A_R, div, beta, sg_w=False):
    w = torch.exp(logpi - old_logp)
    a = paper.ahat_paper(div, A_R, (logpi - old_logp).detach(), beta)       # SG(A_hat)
    Cw = paper.dualclip_objective(w.detach() if sg_w else w, a, EPS1, EPS2, C)
    return -Cw * logpi


def _desc_C(logpi, old_logp, A_R, div, beta):
    return paper.alg2_loss(logpi, old_logp, A_R, div, beta, EPS1, EPS2, C)


def _desc_D(logpi, old_logp, A_R, div, beta):
    w = torch.exp(logpi - old_logp)
    a = paper.ahat_paper(div, A_R, (logpi - old_logp).detach(), beta)       # SG(A_hat), A_hat = A'
    return paper.dualclip_loss(w, a, EPS1, EPS2, C)


DESCRIPTIONS = {
    "A max/min, differentiable A_hat": _desc_A,
    "B -C(w,SG(A_hat)) log pi (as written)": _desc_B,
    "B' -SG(C(w,SG(A_hat))) log pi": lambda *a: _desc_B(*a, sg_w=True),
    "C Algorithm 2": _desc_C,
    "D PPO dual clip, SG(A_hat)": _desc_D,
}


def coefficient(
    loss_fn, w: float, A_R: float, div: str, beta: float, logpi: float = LOGPI
) -> tuple[float, float]:
    """(loss value, d loss / d log pi_theta(x)) for one sample with ratio w."""
    lp = torch.tensor(logpi, dtype=DTYPE, requires_grad=True)
    old = torch.tensor(logpi - math.log(w), dtype=DTYPE)
    val = loss_fn(lp, old, torch.tensor(A_R, dtype=DTYPE), div, beta)
    if not val.requires_grad:          # every input detached (a flat branch): autodiff gives 0
        return float(val), 0.0
    (g,) = torch.autograd.grad(val, lp)
    return float(val.detach()), float(g)


def segment(w: float, a_sign: int) -> str:
    if a_sign >= 0:
        return "clipped (w >= 1+eps2)" if w >= 1 + EPS2 else "unclipped"
    if w <= 1 - EPS1:
        return "clipped (w <= 1-eps1)"
    return "dual-clipped (w >= c)" if w >= C else "unclipped"


def clip_descriptions_table(
    div: str = "urkl", beta: float = 0.1, A_values=(1.0, -1.0), w_grid=W_GRID
) -> list[dict]:
    """Per-sample gradient coefficient (grad = coef * grad log pi_theta(x)) of each description of
    RPG-Style Clip and of rpg_ref's clipped losses, on a grid of w and both advantage signs.
    'target' is the unclipped REINFORCE weight: coef = -w A_hat."""
    rows = []
    for A_R in A_values:
        for w in w_grid:
            lw = math.log(w)
            ahat = float(
                paper.ahat_paper(
                    div, torch.tensor(A_R, dtype=DTYPE), torch.tensor(lw, dtype=DTYPE), beta
                )
            )
            row = {"A_R": A_R, "w": w, "A_hat": ahat, "segment": segment(w, 1 if ahat >= 0 else -1),
                   "target (unclipped)": -w * ahat}
            for name, fn in DESCRIPTIONS.items():
                row[name] = coefficient(fn, w, A_R, div, beta)[1]
            for lib in (f"rpg-{div}", f"rpg-reinforce-{div}"):
                row[f"rpg_ref {lib}"] = coefficient(_lib(lib), w, A_R, div, beta)[1]
            rows.append(row)
    return rows


def _expected_grad(loss_fn, logits, old_logp, A_R, div, beta):
    """sum_x pi_old(x) grad loss(x) for a per-sample description (one call per outcome)."""
    th = logits.detach().clone().requires_grad_(True)
    lp = torch.log_softmax(th, -1)
    total = sum(
        old_logp[k].exp() * loss_fn(lp[k], old_logp[k], A_R[k], div, beta) for k in range(len(lp))
    )
    (g,) = torch.autograd.grad(total, th)
    return g


def _grad_J(div, logits, old_logp, R, beta):
    th = logits.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(paper.objective_torch(div, th, old_logp, R, beta), th)
    return g


# ---------------------------------------------------------------------------
# Algorithm 1: fully differentiable dual clip
# ---------------------------------------------------------------------------

@claim(
    "dualclip-fd",
    "alg:offpolicy_rpg_ppo_dualclip",
    "Dual-clip RPG (fully differentiable): at theta = theta_old the clipped loss has the "
    "unclipped expected "
    "gradient -grad J; on clipped segments no gradient flows through w (only through A_hat when "
    "beta > 0).",
)
def check_alg_offpolicy_rpg_ppo_dualclip(ck: Checker, fast: bool) -> None:
    for div in ("fkl", "rkl", "ufkl", "urkl"):
        # theta = theta_old: w = 1 everywhere
        P = make_problem(K=6, seed=3, z_old=1.0, dist=0.0)
        gJ = _grad_J(div, P.logits, P.old_logp, P.R, P.beta)
        g, G = expected_loss_grad(
            get_loss(f"rpg-{div}"), P.logits, P.old_logp, P.R, beta=P.beta, clip=CLIP
        )
        ck.exact(f"rpg-{div} clip={CLIP}, theta=theta_old: E_old[grad] == -grad J", g, -gJ)
        if div == "urkl":
            mc_through_loss(
                ck,
                f"rpg-{div} clipped at theta_old",
                get_loss(f"rpg-{div}"),
                P.logits,
                P.old_logp,
                P.R,
                -gJ,
                G,
                beta=P.beta,
                clip=CLIP,
                n=mc_n(fast),
                seed=51,
            )
    # per sample, on the grid: unclipped == the table loss's gradient; clipped: zero via w, so
    # zero altogether at beta = 0, and only the A_hat path (-clip(w) * dA_hat/dlog pi) at beta > 0
    for div in ("fkl", "rkl", "ufkl", "urkl"):
        lib, form = _lib(f"rpg-{div}"), paper.PAPER[div]
        for A_R in (1.0, -1.0):
            for w in W_GRID:
                _, c0 = coefficient(lib, w, A_R, div, 0.0)
                seg = segment(w, 1 if A_R >= 0 else -1)
                lw = math.log(w)
                if seg == "unclipped":
                    ck.exact(f"{div} A={A_R} w={w} beta=0: coef == -w A", c0, -w * A_R)
                else:
                    ck.fact(
                        f"{div} A={A_R} w={w} beta=0 ({seg}): coef exactly 0",
                        c0 == 0.0,
                        f"coef {c0}",
                        quiet=True,
                    )
                _, c1 = coefficient(lib, w, A_R, div, 0.1)
                if seg == "unclipped":
                    ck.exact(f"{div} A={A_R} w={w} beta=0.1: coef == -(paper weight)",
                             c1, -float(form.rf_weight(w, lw, LOGPI, A_R, 0.1, 1.0)))
    ck.note(
        "clipped segments carry gradient only through A_hat when beta > 0 "
        "(fig:ppo_dualclip_loss_vis "
        "caption allows it); at beta = 0 they carry exactly none"
    )
    ck.note("symbolic: n/a (piecewise in w; checked exactly on a grid of w covering every segment)")


@claim(
    "alg1-ahat-rkl",
    "alg:offpolicy_rpg_ppo_dualclip",
    "Algorithm 1's example A_hat_RKL = (R-b) - beta(log w + 1) is consistent with its own "
    "unclipped "
    "line L = w(-(R-b) + beta log w), i.e. -w A_hat_RKL = L.",
)
def check_alg1_ahat_rkl(ck: Checker, fast: bool) -> None:
    S = SymSoftmax(3)
    Rb = sp.symbols("A1:4", real=True)  # R - b
    diffs = [
        -S.w[k] * (Rb[k] - S.beta * (S.logw[k] + 1)) - S.w[k] * (-Rb[k] + S.beta * S.logw[k])
        for k in range(3)
    ]
    nonzero = not ck.symbolic("-w A_hat_RKL - L_unclipped", diffs[0], expect_zero=False)
    ck.symbolic("-w A_hat_RKL - L_unclipped - beta w == 0", diffs[0] - S.beta * S.w[0])
    # E_old[beta w] = beta sum pi_theta
    mean_diff = sum(S.o[k] * diffs[k] for k in range(3))
    for j in range(3):
        ck.symbolic(
            f"E_old[grad(beta w)] == 0 (d/dtheta_{j + 1}, pi_theta normalized)", S.d(mean_diff, j)
        )
    # the two readings differ per sample, and under clipping also in expectation
    P = make_problem(K=6, seed=8, z_old=1.0, dist=0.9)
    th = P.logits.detach().clone().requires_grad_(True)
    lp = torch.log_softmax(th, -1)
    lw = lp - P.old_logp
    w = lw.exp()
    # differentiable, as in Alg. 1
    ahat_paper = paper.ahat_paper("rkl", P.R, lw, P.beta)
    e = P.old_logp.exp()
    # l.1438: w(-(R-b) + beta log w)
    line = w * (-P.R + P.beta * lw)
    ck.exact(
        "float64, K=6: -w A_hat_RKL - L_line == beta w",
        (-w * ahat_paper - line).detach(),
        (P.beta * w).detach(),
    )
    (g_paper,) = torch.autograd.grad((e * paper.dualclip_loss(w, ahat_paper, *CLIP)).sum(), th)
    g_lib, _ = expected_loss_grad(
        get_loss("rpg-rkl"), P.logits, P.old_logp, P.R, beta=P.beta, clip=CLIP
    )
    gap = float((g_paper - g_lib).abs().max())
    ck.erratum(
        "alg:offpolicy_rpg_ppo_dualclip l.1423 vs l.1438-1439",
        nonzero and gap > 1e-6,
        "-w*A_hat_RKL = L_unclipped + beta*w: the per-sample gradients differ by beta*w*grad log "
        "pi "
        "(mean zero for normalized pi_theta, so unclipped expected gradients agree), but once "
        "clipping is "
        f"active the expected gradients differ (here max |diff| {gap:.3g} off-policy with "
        f"clip={CLIP})",
    )
    ck.note("rpg_ref uses A_hat = -L_unclipped/w, the reading consistent with the unclipped line")
    ck.note(
        "MC: n/a (a statement about formulas; the exact gradient gap is computed by enumeration)"
    )


# ---------------------------------------------------------------------------
# Algorithm 2: REINFORCE-style RPG-Style Clip
# ---------------------------------------------------------------------------

@claim(
    "rpg-style-clip-alg2",
    "alg:offpolicy_rpg_rf_ppo_dualclip_v1",
    "RPG-Style Clip (Algorithm 2): at theta = theta_old the expected gradient is -grad J; the "
    "flat segments "
    "(psi>=0, w>=1+eps2; psi<0, w<=1-eps1 or w>=c) carry exactly zero gradient; elsewhere -w A' "
    "grad log pi.",
)
def check_alg_offpolicy_rpg_rf_ppo_dualclip_v1(ck: Checker, fast: bool) -> None:
    w, R, b = sp.Symbol("w", positive=True), sp.Symbol("R", real=True), sp.Symbol("beta", real=True)
    # w A' = w A_R + C_KL is the REINFORCE weight (Z_old = 1)
    for div, form in paper.PAPER.items():
        ck.symbolic(f"{div}: w A' == Weight", w * (R + paper.kl_component(div, w, sp.log(w), b) / w)
                    - form.rf_weight(w, sp.log(w), None, R, b, 1))
    for div in ("fkl", "rkl", "ufkl", "urkl"):
        P = make_problem(K=6, seed=3, z_old=1.0, dist=0.0)
        gJ = _grad_J(div, P.logits, P.old_logp, P.R, P.beta)
        ck.exact(f"Algorithm 2 ({div}), theta=theta_old: E_old[grad] == -grad J",
                 _expected_grad(_desc_C, P.logits, P.old_logp, P.R, div, P.beta), -gJ)
        g, G = expected_loss_grad(
            get_loss(f"rpg-reinforce-{div}"), P.logits, P.old_logp, P.R, beta=P.beta, clip=CLIP
        )
        ck.exact(f"rpg-reinforce-{div} clipped, theta=theta_old: E_old[grad] == -grad J", g, -gJ)
        if div == "rkl":
            mc_through_loss(
                ck,
                f"rpg-reinforce-{div} clipped at theta_old",
                get_loss(f"rpg-reinforce-{div}"),
                P.logits,
                P.old_logp,
                P.R,
                -gJ,
                G,
                beta=P.beta,
                clip=CLIP,
                n=mc_n(fast),
                seed=52,
            )
        # small |A_R|: the KL part can flip the sign of A'
        for A_R in (1.0, -1.0, 0.05, -0.05):
            for w in W_GRID:
                lw = math.log(w)
                weight = float(paper.PAPER[div].rf_weight(w, lw, LOGPI, A_R, 0.1, 1.0))   # w A'
                seg = segment(w, 1 if weight >= 0 else -1)
                v2, c2 = coefficient(_desc_C, w, A_R, div, 0.1)
                vl, cl = coefficient(_lib(f"rpg-reinforce-{div}"), w, A_R, div, 0.1)
                if seg == "unclipped":
                    ck.exact(f"Alg.2 {div} A={A_R} w={w}: coef == -w A'", c2, -weight)
                else:
                    ck.fact(
                        f"Alg.2 {div} A={A_R} w={w} ({seg}): coef exactly 0",
                        c2 == 0.0,
                        f"coef {c2}",
                        quiet=True,
                    )
                ck.exact(f"rpg_ref rpg-reinforce-{div} == Alg.2 (coef) A={A_R} w={w}", cl, c2)
                ck.exact(f"rpg_ref rpg-reinforce-{div} == Alg.2 (value) A={A_R} w={w}", vl, v2)
    ck.note(
        "Algorithm 2 transcribed line by line (derivations/paper.py alg2_loss); C_KL = KL part of "
        "the "
        "REINFORCE weight (Compute_KL_Component is not defined in the paper); eps=(0.2, 0.28), c=3"
    )


@claim(
    "rpg-style-clip-descriptions",
    "subsec:rpg_style_clip",
    "The three descriptions of RPG-Style Clip (max/min form with A_hat in subsec:rpg_style_clip; "
    "C(w, SG(A_hat)) log pi in subsec:rpg_style_clip_reinforce; Algorithm 2) define the same "
    "update.",
)
def check_subsec_rpg_style_clip(ck: Checker, fast: bool) -> None:
    w, R, b = sp.Symbol("w", positive=True), sp.Symbol("R", real=True), sp.Symbol("beta", real=True)
    for div in ("urkl", "rkl"):
        form, ahat = paper.PAPER[div], paper.ahat_paper(div, R, sp.log(w), b)
        ck.symbolic(
            f"{div}: w A_hat == REINFORCE weight (SG forms B', C, D)",
            w * ahat - form.rf_weight(w, sp.log(w), None, R, b, 1),
        )
        ck.symbolic(f"{div}: -w A_hat - table loss == beta w (form A differentiates this)",
                    -w * ahat - form.loss(w, sp.log(w), None, R, b, 1) - b * w)
    beta = 0.1
    # (div, A_R, w) where A or B' != C
    disagree = []
    for div in ("urkl", "rkl"):
        rows = clip_descriptions_table(div, beta)
        for r in rows:
            tag = f"{div} A_R={r['A_R']} w={r['w']} ({r['segment']})"
            ck.exact(f"{tag}: D == C", r["D PPO dual clip, SG(A_hat)"], r["C Algorithm 2"])
            if r["segment"] == "unclipped":
                ck.exact(
                    f"{tag}: C == target -w A_hat", r["C Algorithm 2"], r["target (unclipped)"]
                )
                ck.exact(
                    f"{tag}: B' == target",
                    r["B' -SG(C(w,SG(A_hat))) log pi"],
                    r["target (unclipped)"],
                )
                ck.exact(f"{tag}: A == target + beta w", r["A max/min, differentiable A_hat"],
                         r["target (unclipped)"] + beta * r["w"])
            else:
                if (
                    r["A max/min, differentiable A_hat"] != 0.0
                    and abs(r["B' -SG(C(w,SG(A_hat))) log pi"]) > 1e-3
                ):
                    disagree.append((div, r["A_R"], r["w"]))
                ck.fact(f"{tag}: C exactly 0", r["C Algorithm 2"] == 0.0, quiet=True)
                ck.fact(
                    f"{tag}: A != 0 (gradient through A_hat)",
                    r["A max/min, differentiable A_hat"] != 0.0,
                    quiet=True,
                )
                ck.fact(
                    f"{tag}: B' == -C(w, A_hat) != 0",
                    abs(r["B' -SG(C(w,SG(A_hat))) log pi"]) > 1e-3,
                    quiet=True,
                )
    # expectation at theta = theta_old: A, B', C, D all give -grad J; B as written does not
    P = make_problem(K=6, seed=3, z_old=1.0, dist=0.0)
    errs = {}
    for div in ("urkl", "rkl"):
        gJ = _grad_J(div, P.logits, P.old_logp, P.R, beta)
        for name, fn in DESCRIPTIONS.items():
            g = _expected_grad(fn, P.logits, P.old_logp, P.R, div, beta)
            errs[(div, name)] = float((g + gJ).abs().max())
            if not name.startswith("B "):
                ck.exact(f"{div} {name}: E_old[grad] at theta_old == -grad J", g, -gJ)
    b_err = max(v for (d, n), v in errs.items() if n.startswith("B "))
    ck.erratum(
        "subsec:rpg_style_clip_reinforce l.602 (C(w, SG(A_hat)) log pi, w not under SG)",
        b_err > 1e-3,
        f"as written, grad = -C grad log pi - w dC/dw log pi grad log pi; at theta_old this is "
        f"-A (1 + log pi) grad log pi, max |E grad + grad J| = {b_err:.3g}; only SG(C(...)) gives "
        "-grad J",
    )
    ck.erratum(
        "the three descriptions disagree on clipped segments",
        len(disagree) > 0,
        "Algorithm 2 (= the appendix PPO form D): exactly zero gradient on clipped segments; "
        "max/min form A: "
        "gradient through the differentiable A_hat there (coef +beta*clip(w)), and -w(A_hat - "
        "beta) instead of "
        "-w A_hat on unclipped ones (mean-zero difference); B' (SG(C)): clipped weight, coef "
        "-C(w, A_hat) != 0; "
        f"seen at {len(disagree)} grid points",
    )
    ck.note(
        "MC: n/a (deterministic per-sample comparison on a grid, and exact expectations at "
        "theta_old)"
    )
