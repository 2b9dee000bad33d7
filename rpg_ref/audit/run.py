"""The audit of a list of adapters: every setting and horizon through core's verdicts, and
through fit's combinations where no single candidate matches."""

from __future__ import annotations

import torch

from rpg_ref.audit.adapter import Adapter
from rpg_ref.audit.core import (
    DEFAULT_POLICIES,
    HORIZONS,
    SETTINGS,
    Case,
    Objective,
    Policies,
    audit_case,
    candidate_grads,
    check_mean_over_responses,
    has_gradient,
    loss_precision,
    make_problem,
    precision_name,
    reward_grad,
    tolerance,
)
from rpg_ref.audit.fit import fit_case


def audit(adapters: list[Adapter], horizons=HORIZONS, seed: int = 0,
          policies: Policies = DEFAULT_POLICIES, objectives: dict[str, Objective] | None = None,
          fit: bool = True, progress=None) -> list[dict]:
    """One row per adapter x setting x horizon (dicts, JSON-ready). ``progress(text)`` is told
    each stage before it starts (the command line prints it when a loss is slow)."""
    objectives = objectives or {}
    progress = progress or (lambda text: None)
    cases = []
    for s in SETTINGS:
        for h in horizons:
            p = make_problem(s, h, seed, policies)
            cases.append(Case(s, h, p, candidate_grads(p, objectives), reward_grad(p)))
    rows = []
    for ad in adapters:
        probe = next(
            c.prob for c in cases if c.setting == SETTINGS[-1] and c.horizon == max(horizons)
        )
        precision = loss_precision(ad, probe)
        if torch.finfo(precision).eps > torch.finfo(torch.float32).eps:
            raise ValueError(
                f"{ad.name}: computes in {precision_name(precision)} (eps "
                f"{torch.finfo(precision).eps:.2g}): too coarse to tell objectives apart; "
                "audit it in float32 or float64"
            )
        tol = tolerance(precision)
        if not has_gradient(ad, probe):
            raise ValueError(
                f"{ad.name}: the loss has no gradient with respect to logp (computed under "
                "no_grad, detached, or not using logp): there is no objective to audit"
            )
        progress(f"{ad.name}: checking that the loss is a mean over its responses")
        check_mean_over_responses(ad, probe, tol)
        for i, c in enumerate(cases, 1):
            progress(f"{ad.name}: case {i} of {len(cases)} (θ {c.setting.theta}, π_ref "
                     f"{c.setting.ref}, H={c.horizon})")
            row = {"loss": ad.name, "level": ad.level, "code": ad.code, "own_code": ad.own_code,
                   "library": ad.library, "on_policy": c.setting.on_policy,
                   "ref_is_old": c.setting.ref_is_old, "horizon": c.horizon, "beta": ad.beta,
                   "note": ad.note, "precision": precision_name(precision), "tolerance": tol,
                   "vocab": policies.vocab, "seed": seed}
            row |= audit_case(ad, c.prob, c.cands, c.g_reward, tol)
            row["kl_match_err"] = max((row["kl_errs"][k] for k in row["kl_matches"]), default=None)
            row["kl_combination"] = None
            if fit and not row["kl_matches"] and not row["kl_all_zero"]:
                row["kl_combination"] = fit_case(ad, c, seed, policies, objectives, tol)
                if row["kl_combination"]:
                    row["kl_judged_at"] = row["kl_combination"]["tolerance"]
            rows.append(row)
    return rows
