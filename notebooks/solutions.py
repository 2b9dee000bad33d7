"""Solutions to the notebooks' exercises: one function per exercise, named as the notebook names it
(``exNN_K_what``), returning the numbers that answer it. tests/test_notebook_solutions.py runs
every one and checks the answer, so an exercise whose solution stops working fails the suite.

Run one from the repository root: ``python -c "from notebooks import solutions as s;
print(s.ex05_1_larger_beta_stays_closer_to_ref())"``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
F64 = torch.float64


# ---------------------------------------------------------------------------------------------
# 01: k3 is the unnormalized KL
# ---------------------------------------------------------------------------------------------

def ex01_1_k3_mean_is_ukl_for_any_mass() -> dict:
    """E_{x~q}[k3(p/q)] for measures q, p of masses 0.7 and 1.9, against UKL(q||p) and KL(q||p)."""
    from rpg_ref.core import kl

    g = torch.Generator().manual_seed(0)
    logq = torch.log_softmax(torch.randn(6, generator=g, dtype=F64), 0) + np.log(0.7)
    logp = torch.log_softmax(torch.randn(6, generator=g, dtype=F64), 0) + np.log(1.9)
    mean_k3 = float((logq.exp() * kl.k3(logp - logq)).sum())
    return {"mean_k3": mean_k3, "ukl": float(kl.ukl(logq, logp)), "kl": float(kl.kl(logq, logp)),
            "mass_term": float(logp.exp().sum() - logq.exp().sum())}


def ex01_2_k1_is_noisier_near_ref() -> dict:
    """Mean and variance under q of k1 and k3 for p close to q (both normalized)."""
    from rpg_ref.core import kl

    g = torch.Generator().manual_seed(1)
    q_logits = torch.randn(6, generator=g, dtype=F64)
    logq = torch.log_softmax(q_logits, 0)
    logp = torch.log_softmax(q_logits + 0.1 * torch.randn(6, generator=g, dtype=F64), 0)
    q = logq.exp()
    out = {"kl": float(kl.kl(logq, logp))}
    for name, f in (("k1", kl.k1), ("k3", kl.k3)):
        v = f(logp - logq)
        mean = (q * v).sum()
        out[f"mean_{name}"], out[f"var_{name}"] = float(mean), float((q * (v - mean) ** 2).sum())
    return out


# ---------------------------------------------------------------------------------------------
# 02: GRPO's KL term and its correction
# ---------------------------------------------------------------------------------------------

def ex02_1_both_gradients_vanish_on_policy_iterative() -> dict:
    """|E grad| of GRPO's KL term and of the corrected one at theta = theta_old, pi_ref = pi_old."""
    from derivations.grpo_kl import kl_term_grad

    theta = torch.randn(6, generator=torch.Generator().manual_seed(1), dtype=F64)
    old = torch.log_softmax(theta, 0)
    return {name: float(kl_term_grad(name, theta, old, old)[0].norm())
            for name in ("grpo", "grpo-corrected")}


def _bandit(flags: list[str]) -> dict:
    from rpg_ref.cli import parse_config
    from rpg_ref.trainer.train import train

    with tempfile.TemporaryDirectory() as tmp:
        return train(parse_config(["--preset", "bandit", *flags, "--out", str(Path(tmp) / "run"),
                                   "--no-progress"]))


def _tv(a, b) -> float:
    return float(0.5 * np.abs(np.asarray(a) - np.asarray(b)).sum())


def ex02_2_grpo_corrected_reaches_the_reverse_kl_optimum() -> dict:
    """GRPO with the importance-weighted k3 (grpo-corrected), group-mean advantages and a frozen
    reference on the bandit: TV of the final policy to the reverse- and forward-KL optima."""
    from rpg_ref.tasks.bandit import kl_regularized_optimum

    s = _bandit(["--algo", "grpo-corrected", "--adv", "group-mean", "--ref", "init"])
    ref, R = np.asarray(s["ref_policy"]), np.asarray(s["rewards"])
    return {d: _tv(s["policy"], kl_regularized_optimum(ref, R, s["beta"], d))
            for d in ("rkl", "fkl")}


# ---------------------------------------------------------------------------------------------
# 03: the eight surrogates
# ---------------------------------------------------------------------------------------------

def _off_policy_problem():
    g = torch.Generator().manual_seed(0)
    th_old = torch.randn(6, generator=g, dtype=F64)
    theta = th_old + 0.7 * torch.randn(6, generator=g, dtype=F64)
    return theta, torch.log_softmax(th_old, 0), torch.rand(6, generator=g, dtype=F64)


def ex03_1_reinforce_and_fd_have_one_expected_gradient() -> dict:
    """max |E grad rpg-D - E grad rpg-reinforce-D| off-policy, for each divergence D."""
    from rpg_ref.core import exact

    theta, old, R = _off_policy_problem()
    return {d: float((exact.expected_loss_grad(f"rpg-{d}", theta, old, R, 0.3)
                      - exact.expected_loss_grad(f"rpg-reinforce-{d}", theta, old, R, 0.3))
                     .abs().max()) for d in ("fkl", "rkl", "ufkl", "urkl")}


def ex03_2_rkl_and_urkl_share_a_gradient() -> dict:
    """max |E grad rpg-rkl - E grad rpg-urkl| off-policy, and the same for fkl / ufkl: for a
    normalized policy the UKL's extra mass term sum(pi) = 1 has no gradient."""
    from rpg_ref.core import exact

    theta, old, R = _off_policy_problem()
    grad = lambda name: exact.expected_loss_grad(name, theta, old, R, 0.3)
    return {"rkl-urkl": float((grad("rpg-rkl") - grad("rpg-urkl")).abs().max()),
            "fkl-ufkl": float((grad("rpg-fkl") - grad("rpg-ufkl")).abs().max())}


# ---------------------------------------------------------------------------------------------
# 04: RPG-Style Clip
# ---------------------------------------------------------------------------------------------

def _clip_grad(log_w: float, advantage: float) -> tuple[float, dict]:
    """d loss / d log pi_theta for one token of rpg-reinforce-urkl at ratio exp(log_w), beta 0,
    the presets' clip (0.2, 0.28, 3)."""
    from rpg_ref.core.losses import get_loss

    logp = torch.tensor([[-1.0]], dtype=F64, requires_grad=True)
    old = logp.detach() - log_w
    loss, stats = get_loss("rpg-reinforce-urkl")(logp, old, torch.tensor([advantage], dtype=F64),
                                                 torch.ones(1, 1, dtype=F64), beta=0.0,
                                                 clip=(0.2, 0.28, 3.0))
    (g,) = torch.autograd.grad(loss, logp)
    return float(g), {k: float(v) for k, v in stats.items()}


def ex04_1_no_gradient_beyond_the_clip() -> dict:
    """A > 0: the gradient inside the clip range (w = 1.1) and beyond 1 + eps_high (w = 1.5)."""
    return {"inside": _clip_grad(np.log(1.1), 1.0)[0], "beyond": _clip_grad(np.log(1.5), 1.0)[0]}


def ex04_2_dual_clip_caps_a_negative_advantage() -> dict:
    """A < 0: the gradient at w = 2 (inside the dual clip's bound c = 3) and at w = 5 (beyond),
    and the loss's dual-clip statistic there."""
    inside, _ = _clip_grad(np.log(2.0), -1.0)
    beyond, stats = _clip_grad(np.log(5.0), -1.0)
    return {"inside": inside, "beyond": beyond, "clip_frac_dual": stats["clip_frac_dual"]}


# ---------------------------------------------------------------------------------------------
# 05: bandit to transformer
# ---------------------------------------------------------------------------------------------

def ex05_1_larger_beta_stays_closer_to_ref() -> dict:
    """TV(optimum of E[R] - beta KL(p||ref), ref) for growing beta."""
    from rpg_ref.tasks.bandit import kl_regularized_optimum

    R = np.array([1.0, 0.8, 0.5, 0.2, 0.0])
    ref = np.full(5, 0.2)
    return {beta: _tv(kl_regularized_optimum(ref, R, beta, "rkl"), ref)
            for beta in (0.1, 0.5, 2.0, 10.0)}


def ex05_2_iterative_reference_ends_at_the_best_arm() -> dict:
    """The bandit preset with the iterative reference (pi_ref = pi_old each step): the final
    probability of the best arm."""
    s = _bandit(["--ref", "iterative"])
    return {"p_best": float(np.asarray(s["policy"])[int(np.argmax(s["rewards"]))])}


# ---------------------------------------------------------------------------------------------
# 06: audit your library's KL term
# ---------------------------------------------------------------------------------------------

BETA_06 = 0.1


def _k2(ref_logp, logp):
    return 0.5 * (logp - ref_logp) ** 2


def _k2_without_w(logp, old_logp, ref_logp, advantages, mask):
    w = torch.exp(logp - old_logp)
    return ((-w * advantages[:, None] + BETA_06 * _k2(ref_logp, logp)) * mask).sum(1).mean()


def _k2_with_w(logp, old_logp, ref_logp, advantages, mask):
    w = torch.exp(logp - old_logp)
    return ((-w * advantages[:, None] + BETA_06 * w * _k2(ref_logp, logp)) * mask).sum(1).mean()


def _k3_without_w(logp, old_logp, ref_logp, advantages, mask):
    w = torch.exp(logp - old_logp)
    k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    return ((-w * advantages[:, None] + BETA_06 * k3) * mask).sum(1).mean()


def _audit_matches(losses: dict, on_policy: bool, ref_is_old: bool, horizon: int = 3) -> dict:
    from rpg_ref.audit import Adapter, audit

    rows = audit([Adapter(n, f, beta=BETA_06, library="exercise", own_code=True)
                  for n, f in losses.items()], horizons=(horizon,))
    return {r["loss"]: {"matches": r["kl_matches"], "all_zero": r["kl_all_zero"]} for r in rows
            if (r["on_policy"], r["ref_is_old"]) == (on_policy, ref_is_old)}


def ex06_1_k2_with_and_without_w() -> dict:
    """The candidates each k2 loss's KL part matches, on-policy with a fixed reference (H = 3)."""
    found = _audit_matches({"k2 without w": _k2_without_w, "k2 with w": _k2_with_w},
                           on_policy=True, ref_is_old=False)
    return {name: v["matches"] for name, v in found.items()}


def ex06_2_on_policy_iterative_is_zero() -> dict:
    """On-policy with pi_ref = pi_old: is every candidate's gradient 0 (the audit's
    `0 (every D: 0)`) for k3 and k2 losses?"""
    found = _audit_matches({"k3 without w": _k3_without_w, "k2 with w": _k2_with_w},
                           on_policy=True, ref_is_old=True)
    return {name: v["all_zero"] for name, v in found.items()}


# ---------------------------------------------------------------------------------------------
# 07: off-policy on the bandit (the setting of notebook 7, rebuilt from its seeds)
# ---------------------------------------------------------------------------------------------

def _nb07(stale: float = 0.6):
    """(R, beta, ref, theta_old, old_logp, mu_logp) as notebook 7 draws them; ``stale`` scales
    the sampler's distance from theta_old."""
    R, beta = torch.tensor([1.0, 0.8, 0.5, 0.2, 0.0], dtype=F64), 0.5
    g = torch.Generator().manual_seed(0)
    ref_logits = torch.randn(5, generator=g, dtype=F64)
    theta_old = ref_logits + 0.8 * torch.randn(5, generator=g, dtype=F64)
    theta_mu = theta_old - stale * torch.randn(5, generator=g, dtype=F64)
    return (R, beta, torch.softmax(ref_logits, 0), theta_old, torch.log_softmax(theta_old, 0),
            torch.log_softmax(theta_mu, 0))


def _nb07_grads(stale: float, weight_cap: float | None, coupled: bool, clip=None):
    """(the loss's exact expected gradient at theta_old, -grad J there)."""
    from rpg_ref.core.losses import get_loss

    R, beta, ref, theta_old, old_logp, mu_logp = _nb07(stale)
    theta = theta_old.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, 0)
    pi_old = mu_logp if coupled else old_logp
    ratio = (old_logp - mu_logp).exp()
    total = 0.0
    for x in range(5):
        sw = None if coupled else ratio[x].clamp(max=weight_cap).view(1)
        loss, _ = get_loss("rpg-reinforce-urkl")(
            logp[x].view(1, 1), pi_old[x].view(1, 1), R[x].view(1), torch.ones(1, 1, dtype=F64),
            beta=beta, ref_logp=torch.log(ref)[x].view(1, 1), clip=clip, sample_weight=sw)
        total = total + mu_logp[x].exp() * loss
    (grad,) = torch.autograd.grad(total, theta)
    th = theta_old.clone().requires_grad_(True)
    p = torch.softmax(th, 0)
    (grad_J,) = torch.autograd.grad(p @ R - beta * (p * (torch.log(p) - torch.log(ref))).sum(), th)
    return grad, -grad_J


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def ex07_1_smallest_exact_cap() -> dict:
    """The smallest TIS cap at which the decoupled gradient is exact: the largest pi_old / mu."""
    _, _, _, _, old_logp, mu_logp = _nb07()
    cap = float((old_logp - mu_logp).exp().max())
    err = lambda c: _rel(*_nb07_grads(0.6, c, coupled=False))
    return {"cap": cap, "error_at_cap": err(cap), "error_just_below": err(cap * 0.99)}


def ex07_2_slightly_stale_coupled_is_exact() -> dict:
    """A sampler 0.05 (not 0.6) of the way: the ratios pi_old / mu, and the coupled clipped
    gradient's error at theta_old."""
    _, _, _, _, old_logp, mu_logp = _nb07(0.05)
    ratio = (old_logp - mu_logp).exp()
    grad, exact = _nb07_grads(0.05, None, coupled=True, clip=(0.2, 0.28, 3.0))
    return {"ratio_min": float(ratio.min()), "ratio_max": float(ratio.max()),
            "error": _rel(grad, exact)}


def ex07_3_lag_8_with_tis_reaches_the_optimum() -> dict:
    """--sampler-lag 8 with TIS (sequence level) on the bandit preset, frozen reference."""
    s = _bandit(["--ref", "init", "--sampler-lag", "8", "--rollout-correction", "tis",
                 "--rollout-correction-level", "sequence"])
    return {"tv": s["tv_distance"]}


# ---------------------------------------------------------------------------------------------
# 08: reading a study
# ---------------------------------------------------------------------------------------------

def _study_c_pairs(a: str, b: str, outcome: str = "heldout") -> np.ndarray:
    rows = [json.loads(x) for x in (ROOT / "small_scale/results/C.jsonl").open()]
    rule = json.loads((ROOT / "small_scale/studies/C.json").read_text())["analysis"]["exclude"]
    out = {r["seed"] for r in rows if r["cell"] == rule["reference_cell"]
           and r["outcomes"][rule["outcome"]] < rule["below"]}
    val = lambda c: {r["seed"]: r["outcomes"][outcome] for r in rows
                     if r["cell"] == c and r["seed"] not in out}
    va, vb = val(a), val(b)
    return np.array([va[s] - vb[s] for s in sorted(set(va) & set(vb))])


def ex08_1_urkl_vs_dapo_at_16_updates() -> dict:
    """Mean paired difference urkl-u16 - dapo-u16 and its 95 % t interval."""
    from scipy import stats

    d = _study_c_pairs("urkl-u16", "dapo-u16")
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return {"n": len(d), "mean": float(d.mean()), "lo": float(d.mean() - half),
            "hi": float(d.mean() + half)}


def _power(delta: float, sd: float, n: int, alpha: float = 0.05) -> float:
    from scipy import stats

    tc, nc = stats.t.ppf(1 - alpha / 2, n - 1), delta * np.sqrt(n) / sd
    return float(stats.nct.sf(tc, n - 1, nc) + stats.nct.sf(tc, n - 1, -nc))


def ex08_2_seeds_for_an_mde_of_0_02() -> dict:
    """The fewest paired seeds whose power to find a difference of 0.02 (two-sided t at 0.05) is
    at least 0.8, with the spread of urkl-u4 - grpo-u4's differences."""
    sd = float(_study_c_pairs("urkl-u4", "grpo-u4").std(ddof=1))
    n = 2
    while _power(0.02, sd, n) < 0.8:
        n += 1
    return {"sd": sd, "n": n, "power_at_n": _power(0.02, sd, n),
            "power_at_n_minus_1": _power(0.02, sd, n - 1)}


def ex08_3_holm_family_error_rate(families: int = 20_000, m: int = 21,
                                  alpha: float = 0.05) -> dict:
    """Share of families of m independent null p-values with any rejection, with Holm and
    without a correction (fixed seed)."""
    p = np.random.default_rng(0).random((families, m))
    sorted_p = np.sort(p, axis=1)
    # Holm rejects something iff its first step does: the smallest p <= alpha / m
    holm_any = sorted_p[:, 0] <= alpha / m
    return {"holm": float(holm_any.mean()), "uncorrected": float((p <= alpha).any(1).mean())}
