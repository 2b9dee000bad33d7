"""Combination verdicts: is a loss's KL part one fixed linear combination of the candidates?

At one draw of the policies the KL gradient lives in a space of n_prefix (V - 1) dimensions (2 at
V = 3, H = 1), so with a few candidates *any* vector is a combination of them. A combination is a
verdict only when the SAME coefficients fit the loss's KL part on K independent draws of the
policies (same setting and horizon), with K (n_prefix (V - 1)) equations at least EQ_PER_UNKNOWN
times the number of candidates that could be used, and on every draw separately to the tolerance.
The smallest subset of candidates that fits is reported (first in BASIS order among equals).
"""

from __future__ import annotations

import itertools
import math

import torch

from rpg_ref.audit.adapter import Adapter
from rpg_ref.audit.core import (
    BASIS,
    MATCH_TOL,
    Case,
    Objective,
    Policies,
    candidate_grads,
    expected_grad,
    make_problem,
    rel_err,
)

EQ_PER_UNKNOWN = 10
MIN_DRAWS = 4


def n_draws(case: Case, n_unknowns: int) -> int:
    # softmax: V - 1 per prefix
    per_draw = case.prob.ar.n_prefix * (case.prob.ar.V - 1)
    return max(MIN_DRAWS, math.ceil(EQ_PER_UNKNOWN * n_unknowns / per_draw))


def fit_case(adapter: Adapter, case: Case, seed: int, policies: Policies,
             objectives: dict[str, Objective], tol: float) -> dict | None:
    """The smallest combination sum_k c_k beta grad D_k equal to the KL part on every draw, or
    None."""
    basis = list(BASIS) + [f"user:{n}" for n in objectives]
    K = n_draws(case, len(basis))
    # shared by every adapter
    while len(case.draws) < K - 1:
        p = make_problem(case.setting, case.horizon, seed, policies, draw=len(case.draws) + 1)
        case.draws.append((p, candidate_grads(p, objectives)))
    problems = [(case.prob, case.cands)] + case.draws[:K - 1]
    g_kl = [expected_grad(adapter, p, torch.zeros_like(p.R)) for p, _ in problems]
    b = torch.cat(g_kl)
    # float64 first, as single verdicts
    for t in sorted({MATCH_TOL, tol}):
        for size in range(1, len(basis) + 1):
            for subset in itertools.combinations(basis, size):
                cols = [torch.stack([adapter.beta * c[k] for k in subset], 1) for _, c in problems]
                A = torch.cat(cols)                                          # [K * dim, size]
                coef = torch.linalg.lstsq(A, b[:, None]).solution[:, 0]
                per_draw = [rel_err(a @ coef, g) for a, g in zip(cols, g_kl)]
                err = max(rel_err(A @ coef, b), *per_draw)
                if err <= t:
                    return {"terms": {k: float(c) for k, c in zip(subset, coef)}, "rel_err": err,
                            "tolerance": t, "draws": K, "unknowns": len(basis),
                            "equations": int(K * case.prob.ar.n_prefix * (case.prob.ar.V - 1))}
    return None
