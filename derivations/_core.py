"""Shared machinery of the derivation checks.

* the claim registry and the result row {id, label, claim, symbolic, exact_max_err, mc_max_z,
  passed, seconds} (plus ``status`` and ``detail``);
* ``Checker``: collects the three kinds of evidence for one claim;
* exact enumeration *through rpg_ref.core.losses*: every outcome x of a K-outcome softmax is one
  token; the loss is called once on a [K, 1] batch holding every outcome, the per-outcome
  gradients are read off that call, and an expectation over the (possibly unnormalized)
  measure pi_old is the sum  sum_x pi_old(x) * grad loss(x);
* Monte Carlo: one loss call on a [N, 1] batch of x ~ pi_old / Z_old (token-mean = sample
  mean), z-scores per coordinate against the exact value;
* a sympy zero test with an exact-rational fallback.

Monte-Carlo threshold. One comparison of a d-vector fails when some |z_j| exceeds
z* = Phi^{-1}(1 - ALPHA / (2 d)) (Bonferroni), so each comparison falsely fails with
probability <= ALPHA = 1e-6 under the CLT; the ~40 comparisons of a full run give a combined
false-failure rate below 1e-4. Seeds are fixed, so a run is reproducible anyway.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist

import sympy as sp
import torch
from torch import Tensor

DTYPE = torch.float64
ALPHA = 1e-6          # false-failure probability of one Monte-Carlo comparison
EXACT_TOL = 1e-10     # float64 enumeration: max abs error allowed (relative to scale max(1, |ref|))
MC_N = {False: 100_000, True: 4_000}       # Monte-Carlo samples per comparison: full run / --fast


def mc_n(fast: bool, scalar: bool = False) -> int:
    """Samples per Monte-Carlo comparison (x5 for scalar statistics, which are cheap)."""
    return MC_N[fast] * (5 if scalar else 1)


CHECKS: list[Callable] = []


# ---------------------------------------------------------------------------
# registry and the result row
# ---------------------------------------------------------------------------

def claim(id: str, label: str, text: str):
    """Register ``fn(ck: Checker, fast: bool)`` as the check of one claim of the paper."""
    def deco(fn):
        def run(fast: bool = False) -> dict:
            ck = Checker()
            t0 = time.perf_counter()
            fn(ck, fast)
            return ck.row(id, label, text, time.perf_counter() - t0)
        run.__name__ = fn.__name__
        run.__module__ = fn.__module__
        run.__doc__ = text
        run.id, run.label, run.claim = id, label, text
        CHECKS.append(run)
        return run
    return deco


@dataclass
class Checker:
    """Evidence for one claim. A check FAILS when any exact error exceeds its tolerance, a
    Monte-Carlo |z| exceeds its threshold, a symbolic residual is not 0, a stated fact does
    not hold, or a documented erratum does not reproduce. ERRATUM means the paper's
    statement is wrong and the check shows exactly the documented discrepancy (not a failure)."""
    sym: list = field(default_factory=list)          # (what, ok, method, is_zero)
    exact_err: float | None = None
    mc_z: float | None = None
    failures: list = field(default_factory=list)
    errata: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def symbolic(self, what: str, expr, expect_zero: bool = True) -> bool:
        is_zero, method = sym_is_zero(expr)
        self.sym.append((what, is_zero == expect_zero, method, is_zero))
        if is_zero != expect_zero:
            self.failures.append(f"symbolic {what}: residual {'is' if is_zero else 'is not'} 0 "
                                 f"({method}); expected {'0' if expect_zero else 'nonzero'}")
        return is_zero

    def exact(self, what: str, got, ref, tol: float = EXACT_TOL) -> float:
        got, ref = torch.as_tensor(got, dtype=DTYPE), torch.as_tensor(ref, dtype=DTYPE)
        err = float((got - ref).abs().max())
        scale = max(1.0, float(ref.abs().max()))
        self.exact_err = max(self.exact_err or 0.0, err / scale)
        if not err <= tol * scale:
            self.failures.append(f"exact {what}: max abs err {err:.3e} > {tol:.0e} x {scale:.3g}\n"
                                 f"  got   {fmt(got)}\n  exact {fmt(ref)}")
        return err

    def mc(self, what: str, per_sample: Tensor, exact: Tensor, scale: float = 1.0) -> float:
        """per_sample: [N, d] i.i.d. unbiased samples of ``exact`` (after multiplying by scale)."""
        per_sample = per_sample.detach().to(DTYPE).reshape(per_sample.shape[0], -1) * scale
        exact = torch.as_tensor(exact, dtype=DTYPE).detach().reshape(-1)
        n, d = per_sample.shape
        est = per_sample.mean(0)
        se = per_sample.std(0, unbiased=True) / math.sqrt(n)
        diff = est - exact
        degenerate = se <= 1e-14 * (1.0 + exact.abs())  # zero-variance coordinate: must be exact
        z = torch.where(
            degenerate,
            torch.where(diff.abs() <= 1e-10 * (1 + exact.abs()), 0.0, math.inf),
            diff / torch.where(degenerate, torch.ones_like(se), se),
        )
        zmax = float(z.abs().max())
        crit = z_crit(d)
        self.mc_z = max(self.mc_z or 0.0, zmax)
        if not zmax <= crit:
            j = int(z.abs().argmax())
            self.failures.append(
                f"MC {what}: max |z| = {zmax:.2f} > {crit:.2f} (alpha={ALPHA:g}, d={d}, "
                f"N={n}) at coord {j}: estimate {float(est[j]):.6g} +- {float(se[j]):.2g}, "
                f"exact {float(exact[j]):.6g}\n  estimate {fmt(est)}\n  exact    {fmt(exact)}"
            )
        return zmax

    def fact(self, what: str, ok: bool, detail: str = "", quiet: bool = False) -> bool:
        """A stated finding of the check (e.g. 'differs by 12% off-policy') that must hold;
        recorded in the row's detail unless quiet."""
        if not ok:
            self.failures.append(f"{what} does not hold: {detail}")
        elif not quiet:
            self.notes.append(f"{what}" + (f": {detail}" if detail else ""))
        return ok

    def erratum(self, what: str, reproduced: bool, detail: str) -> None:
        """A documented error of the paper; the check must reproduce the discrepancy."""
        if reproduced:
            self.errata.append(f"{what}: {detail}")
        else:
            self.failures.append(f"documented erratum not reproduced: {what}: {detail}")

    def note(self, text: str) -> None:
        self.notes.append(text)

    def row(self, id: str, label: str, text: str, seconds: float) -> dict:
        status = "FAIL" if self.failures else ("ERRATUM" if self.errata else "pass")
        if not self.sym:
            symbolic = "n/a"
        else:
            methods = sorted({m for _, _, m, _ in self.sym})
            bad = [w for w, ok, _, _ in self.sym if not ok]
            nonzero_expected = [w for w, ok, _, z in self.sym if ok and not z]
            symbolic = ("FAIL" if bad else "0") + f" [{'+'.join(methods)}]"
            if nonzero_expected:
                symbolic += f" ({len(nonzero_expected)} !=0 as documented)"
        return {
            "id": id, "label": label, "claim": text, "symbolic": symbolic,
            "exact_max_err": self.exact_err, "mc_max_z": self.mc_z,
            "passed": not self.failures, "seconds": round(seconds, 3), "status": status,
            "detail": self.failures + [f"ERRATUM {e}" for e in self.errata] + self.notes,
        }


def z_crit(d: int, alpha: float = ALPHA) -> float:
    """Two-sided Bonferroni threshold for d coordinates at family-wise rate alpha."""
    return NormalDist().inv_cdf(1.0 - alpha / (2 * d))


def fmt(t) -> str:
    t = torch.as_tensor(t).detach().reshape(-1)
    return "[" + ", ".join(f"{float(v):+.6g}" for v in t[:8]) + (" ...]" if t.numel() > 8 else "]")


def rel_err(a: Tensor, b: Tensor) -> float:
    """||a - b|| / ||b||."""
    return float((a - b).norm() / b.norm())


def cosine(a: Tensor, b: Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


# ---------------------------------------------------------------------------
# sympy
# ---------------------------------------------------------------------------

def sym_is_zero(expr) -> tuple[bool, str]:
    """Decide expr == 0. First sympy (expand_log under the positivity assumptions of the
    symbols, then cancel as a rational function in the remaining logs); if that does not give
    0, evaluate at 3 random positive-rational points and decide exactly there: the value is a
    rational combination of 1 and logs of primes, which are linearly independent over Q (unique
    factorization; Lindemann for the constant), so it is 0 iff every coefficient is 0 (any other
    transcendental atom is kept as its own term). A nonzero value proves expr != 0; zero at 3
    points is evidence, labelled "exact-rational". Returns (is_zero, method)."""
    e = sp.expand_log(sp.expand(expr), force=True)
    # remaining logs as generators
    e = e.xreplace({lg: sp.Dummy() for lg in e.atoms(sp.log)})
    if sp.expand(sp.fraction(sp.together(e))[0]) == 0:
        return True, "sympy"
    e = sp.cancel(sp.together(sp.expand_log(sp.expand(expr), force=True)))
    rng = random.Random(0)
    for _ in range(3):
        point = {s: sp.Rational(rng.randint(1, 19), rng.randint(1, 19)) for s in e.free_symbols}
        if not _rational_log_combination_is_zero(e.subs(point)):
            return False, "exact-rational"
    return True, "exact-rational"


def _rational_log_combination_is_zero(v) -> bool:
    def split(arg):
        num, den = sp.fraction(sp.Rational(arg))
        terms = [k * sp.Symbol(f"log{p}") for p, k in sp.factorint(num).items()]
        terms += [-k * sp.Symbol(f"log{p}") for p, k in sp.factorint(den).items()]
        return sp.Add(*terms)
    v = sp.expand(v.replace(lambda x: isinstance(x, sp.log) and x.args[0].is_Rational,
                            lambda x: split(x.args[0])))
    return all(c == 0 for c in v.as_coefficients_dict().values())


@dataclass
class SymSoftmax:
    """A K-outcome softmax pi_k = a_k / sum(a), a_k = exp(theta_k) > 0, and a positive
    unnormalized measure o (pi_old) of mass Z; d(f, j) = df/dtheta_j = a_j df/da_j."""
    K: int = 3

    def __post_init__(self):
        K = self.K
        self.a = sp.symbols(f"a1:{K + 1}", positive=True)
        self.o = sp.symbols(f"o1:{K + 1}", positive=True)
        self.R = sp.symbols(f"R1:{K + 1}", real=True)
        self.beta = sp.Symbol("beta", real=True)
        S = sum(self.a)
        self.Z = sum(self.o)
        self.p = [ai / S for ai in self.a]
        self.logp = [sp.log(ai) - sp.log(S) for ai in self.a]
        self.w = [self.p[k] / self.o[k] for k in range(K)]
        self.logw = [self.logp[k] - sp.log(self.o[k]) for k in range(K)]

    def d(self, f, j: int):
        return self.a[j] * sp.diff(f, self.a[j])

    def dlogp(self, k: int, j: int):
        """d log pi_k / d theta_j = [k == j] - pi_j."""
        return (1 if k == j else 0) - self.p[j]


ASSUMPTIONS = ("K=3 softmax, theta real (a=exp(theta)>0), pi_old an arbitrary positive measure "
               "of mass Z_old (unnormalized), R and beta real")


# ---------------------------------------------------------------------------
# exact enumeration and Monte Carlo through rpg_ref.core.losses
# ---------------------------------------------------------------------------

def unit_losses(fn, logp_all: Tensor, old_logp_all: Tensor, adv_all: Tensor, *, beta: float,
                ref_logp_all: Tensor | None = None, clip=None) -> Tensor:
    """[K] losses, outcome k fed to ``fn`` alone as a [1, 1] batch (one token = one sample)."""
    one = torch.ones(1, 1, dtype=DTYPE)
    out = []
    for k in range(logp_all.shape[0]):
        ref = None if ref_logp_all is None else ref_logp_all[k].view(1, 1)
        loss, _ = fn(logp_all[k].view(1, 1), old_logp_all[k].view(1, 1), adv_all[k].view(1), one,
                     beta=beta, ref_logp=ref, clip=clip)
        out.append(loss)
    return torch.stack(out)                                           # [K]


def jac(values: Tensor, params: Tensor) -> Tensor:
    """[K, d] Jacobian of the vector ``values`` w.r.t. ``params`` (one backward per entry)."""
    rows = [torch.autograd.grad(v, params, retain_graph=True, allow_unused=True)[0] for v in values]
    return torch.stack([torch.zeros_like(params) if r is None else r for r in rows]).reshape(
        len(rows), -1
    )


def row_grads(fn, logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, **kw) -> Tensor:
    """d loss_b / d logp[b, t] for every row b of ONE batched call (same shape as logp).

    With agg="token-mean" or "seq-mean-token-sum" a row's loss enters the batch loss with a known
    weight and depends only on that row's inputs, so the per-row gradients are the batch
    gradient rescaled; ``check_row_separability`` verifies this against single-row calls."""
    leaf = logp.detach().clone().requires_grad_(True)
    loss, _ = fn(leaf, old_logp, adv, mask, **kw)
    (g,) = torch.autograd.grad(loss, leaf)
    B = logp.shape[0]
    if kw.get("agg", "token-mean") == "token-mean":
        return g * mask.sum()                                         # loss = sum_units / n_units
    # seq-mean-token-sum: sum_rows / B
    return g * B


def expected_loss_grad(fn, logits: Tensor, old_logp: Tensor, adv: Tensor, *, beta: float,
                       ref_logp: Tensor | None = None, clip=None) -> tuple[Tensor, Tensor]:
    """Exact E_{pi_old}[grad loss] = sum_x pi_old(x) grad loss(x) for a softmax over ``logits``
    (pi_old may be unnormalized: old_logp = log of its measure), from ONE loss call on a [K, 1]
    batch holding every outcome once. Returns (grad [K], G [K, K]), G[x] the gradient of the
    loss of outcome x: G[x] = d loss_x / d log pi(x) * grad log pi(x)."""
    K = logits.shape[0]
    th = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(th, -1)                                  # [K]
    ref = None if ref_logp is None else ref_logp.view(K, 1)
    dl = row_grads(fn, logp.view(K, 1), old_logp.view(K, 1), adv, torch.ones(K, 1, dtype=DTYPE),
                   beta=beta, ref_logp=ref, clip=clip)                # [K, 1]
    G = dl * jac(logp, th)                                            # [K, K]
    return old_logp.exp() @ G, G


def check_row_separability(
    ck: Checker, fn, logits, old_logp, adv, *, beta, ref_logp=None, clip=None
) -> None:
    """The batched per-row gradients equal K separate single-row calls (exact)."""
    th = logits.detach().clone().requires_grad_(True)
    ell = unit_losses(
        fn, torch.log_softmax(th, -1), old_logp, adv, beta=beta, ref_logp_all=ref_logp, clip=clip
    )
    _, G = expected_loss_grad(fn, logits, old_logp, adv, beta=beta, ref_logp=ref_logp, clip=clip)
    ck.exact("batched per-outcome gradients == single-outcome calls", G, jac(ell, th))


def mc_loss_grad(
    fn,
    logits: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    *,
    beta: float,
    n: int,
    seed: int,
    ref_logp: Tensor | None = None,
    clip=None,
) -> tuple[Tensor, Tensor]:
    """One loss call on N outcomes x_i ~ pi_old / Z_old (a [N, 1] batch, token-mean). Returns
    (Z_old * grad, idx). Z_old * grad is the Monte-Carlo estimate of E_{pi_old}[grad loss]."""
    gen = torch.Generator().manual_seed(seed)
    mass = old_logp.exp()
    z_old = float(mass.sum())
    idx = torch.multinomial(mass / z_old, n, replacement=True, generator=gen)   # [N]
    logits = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)[idx].view(n, 1)                     # [N, 1]
    ref = None if ref_logp is None else ref_logp[idx].view(n, 1)
    loss, _ = fn(logp, old_logp[idx].view(n, 1), adv[idx], torch.ones(n, 1, dtype=DTYPE),
                 beta=beta, ref_logp=ref, clip=clip)
    (g,) = torch.autograd.grad(loss, logits)
    return z_old * g, idx


def mc_through_loss(ck: Checker, what: str, fn, logits, old_logp, adv, exact: Tensor, G: Tensor, *,
                    beta: float, n: int, seed: int, ref_logp=None, clip=None) -> None:
    """Monte-Carlo check of a loss's expected gradient. The estimate is the gradient of ONE
    batched loss call; its per-sample spread comes from the per-outcome gradients G (the loss
    is a token-mean, so batch gradient == mean of G[x_i]; asserted to 1e-12)."""
    g_batch, idx = mc_loss_grad(fn, logits, old_logp, adv, beta=beta, n=n, seed=seed,
                                ref_logp=ref_logp, clip=clip)
    z_old = float(old_logp.exp().sum())
    per_sample = G[idx]                                                      # [N, K]
    mean = z_old * per_sample.mean(0)
    err = float((g_batch - mean).abs().max())
    ck.fact(
        f"{what}: batched loss gradient == mean of per-outcome gradients",
        err <= 1e-12 * max(1.0, float(mean.abs().max())),
        f"max abs diff {err:.2e}",
        quiet=True,
    )
    ck.mc(what, per_sample, exact, scale=z_old)


# ---------------------------------------------------------------------------
# random test problems (float64)
# ---------------------------------------------------------------------------

@dataclass
class Problem:
    """A K-outcome softmax problem: current logits, a behaviour measure pi_old of mass z_old
    (old_logp = its log), a reference pi_ref (ref_logp, None = pi_old), rewards R, beta."""
    logits: Tensor
    old_logp: Tensor
    R: Tensor
    beta: float
    ref_logp: Tensor | None = None

    @property
    def z_old(self) -> float:
        return float(self.old_logp.exp().sum())


def make_problem(
    K: int = 6,
    seed: int = 0,
    z_old: float = 1.7,
    dist: float = 0.6,
    beta: float = 0.3,
    ref_dist: float | None = None,
) -> Problem:
    """theta_old ~ N(0, 1); theta = theta_old + dist * N(0, 1); pi_old = z_old * softmax(theta_old);
    pi_ref = softmax(theta_old + ref_dist * N(0,1)) when ref_dist is given (else pi_ref =
    pi_old)."""
    g = torch.Generator().manual_seed(seed)
    th_old = torch.randn(K, generator=g, dtype=DTYPE)
    logits = th_old + dist * torch.randn(K, generator=g, dtype=DTYPE)
    old_logp = torch.log_softmax(th_old, -1) + math.log(z_old)
    R = torch.randn(K, generator=g, dtype=DTYPE)
    ref = None
    if ref_dist is not None:
        ref = torch.log_softmax(th_old + ref_dist * torch.randn(K, generator=g, dtype=DTYPE), -1)
    return Problem(logits, old_logp, R, beta, ref)
