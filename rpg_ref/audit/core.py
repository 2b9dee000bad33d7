"""The audit's computation: exact expected gradients of a loss and the objective they follow.

On a small autoregressive softmax policy (vocabulary V, responses of length H, tabular logits for
every prefix: rpg_ref.core.exact.Autoregressive) every response is enumerated, so a loss's expected
gradient under pi_old is a finite sum (float64):

    g = sum_y pi_old(y) grad_theta loss({y})

and it is split into

    reward part   g(A = R) - g(A = 0)   vs  -grad E_{pi_theta}[R]                (sequence level)
    KL part       g(A = 0)              vs  +beta grad D, i.e. the loss follows E[R] - beta D, for
        D = KL(pi||ref), UKL(pi||ref), KL(ref||pi), UKL(ref||pi)   over whole responses, and
            sum_t KL(pi||ref), sum_t KL(ref||pi)                   per position t, prefixes ~ pi_old
            (the token-level sums people optimize; their prefix weights are not differentiated),
            0 (no KL), the user's objectives, and each D with the opposite sign ("-D": the loss
            *raises* D).

A candidate matches when ||g - t|| <= tol * max(||g||, ||t||, ZERO_NORM); tol is 1e-10 for a loss
computed in float64 and 100 eps of its precision otherwise (see ``loss_precision``). When no single
candidate matches, ``rpg_ref.audit.fit`` looks for one linear combination of them that holds with
the same coefficients on many independent draws of the policies.

Conventions (docs/audit.md says why each is harmless):
* A loss must be a mean over the responses of its batch: then its expected gradient does not
  depend on the batch size. ``audit`` checks it (one batched call vs separate calls) per adapter.
* Aggregation seq-mean-token-sum: a response's loss is the sum of its token losses, the scale of
  the sequence-level objectives. token-mean and seq-mean-token-mean divide a fixed-length loss by H.
* The advantages passed are the rewards R(y) (no baseline; a baseline changes no expected gradient
  of a normalized policy).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from rpg_ref.audit.adapter import Adapter
from rpg_ref.core import kl
from rpg_ref.core.exact import Autoregressive, divergence

DTYPE = torch.float64
HORIZONS = (1, 2, 3)
MATCH_TOL = 1e-10          # float64 losses
EPS_FACTOR = 100           # lower precisions: tolerance = 100 eps of the precision
ZERO_NORM = 1e-4           # shorter gradients count as 0 (the settings' others are > 1e-2: tested)

LABELS = {"seq-rkl": "KL(π‖ref)", "seq-urkl": "UKL(π‖ref)", "seq-fkl": "KL(ref‖π)",
          "seq-ufkl": "UKL(ref‖π)", "tok-rkl": "Σt KL(π‖ref)", "tok-fkl": "Σt KL(ref‖π)",
          "no-kl": "0 (no KL)"}
BASIS = ("seq-rkl", "seq-fkl", "tok-rkl", "tok-fkl")   # distinct gradients (UKL = KL here)


@dataclass(frozen=True)
class Setting:
    on_policy: bool
    ref_is_old: bool

    @property
    def theta(self) -> str:
        return "= θ_old" if self.on_policy else "≠ θ_old"

    @property
    def ref(self) -> str:
        return "= π_old" if self.ref_is_old else "≠ π_old"


SETTINGS = (Setting(True, True), Setting(True, False), Setting(False, True), Setting(False, False))


@dataclass(frozen=True)
class Policies:
    """How the random policies are drawn. Logits of pi_old ~ logit_scale N(0, 1); off-policy
    theta = theta_old + off_step N(0, 1); theta_ref = theta_old + ref_step N(0, 1) where
    pi_ref != pi_old. ``max_ratio``: rescale theta - theta_old so that the largest per-token ratio
    pi_theta / pi_old (over every prefix and token) is exactly this (clamps on the ratio bind)."""
    vocab: int = 3
    off_step: float = 0.5
    ref_step: float = 0.8
    logit_scale: float = 1.0
    max_ratio: float | None = None

    def check(self) -> str | None:
        """One line saying what is wrong, or None."""
        if self.vocab < 2 or self.vocab > 8:
            return f"--vocab must be in 2..8 (V^H responses are enumerated), got {self.vocab}"
        for name, v in (("--off-step", self.off_step), ("--ref-step", self.ref_step),
                        ("--logit-scale", self.logit_scale)):
            if not (math.isfinite(v) and v > 0):
                return f"{name} must be a finite number > 0, got {v}"
        if self.max_ratio is not None and not (
            math.isfinite(self.max_ratio) and self.max_ratio > 1
        ):
            return f"--max-ratio must be a finite number > 1, got {self.max_ratio}"
        return None


DEFAULT_POLICIES = Policies()


@dataclass
class Problem:
    """Logits tables [n_prefix, V] of pi_theta, pi_old and pi_ref, and a reward per response."""
    ar: Autoregressive
    theta: Tensor
    old: Tensor
    ref: Tensor
    R: Tensor                       # [V^H]

    def __post_init__(self):
        # [V^H, H] constants
        self.old_tok, self.ref_tok = self.tokens(self.old), self.tokens(self.ref)

    def tokens(self, logits: Tensor) -> Tensor:
        return self.ar.token_logp(logits)                                    # [V^H, H]


def max_token_ratio(theta: Tensor, old: Tensor) -> float:
    """Largest pi_theta(x|p) / pi_old(x|p) over every prefix p and token x."""
    return float((torch.log_softmax(theta, -1) - torch.log_softmax(old, -1)).max().exp())


def scale_to_ratio(old: Tensor, delta: Tensor, target: float) -> Tensor:
    """theta = old + c d with the largest per-token ratio equal to target (bisection on c); d is
    delta plus a push towards each prefix's least likely token, so that ratios up to 1 / min pi_old
    are reached."""
    # sup over directions: 1 / min pi_old
    reach = float(torch.log_softmax(old, -1).min().neg().exp())
    push = torch.zeros_like(old).scatter_(-1, old.argmin(-1, keepdim=True), 1.0)
    delta = delta + 10 * delta.abs().max() * push
    lo, hi = 0.0, 1.0
    while max_token_ratio(old + hi * delta, old) < target:
        hi *= 2
        if hi > 2 ** 20:
            raise ValueError(
                f"--max-ratio {target:g} is not reached by these policies (at most "
                f"{reach:.3g} = 1 / the smallest token probability of π_old); choose a "
                "smaller ratio, a larger --logit-scale or a larger --vocab"
            )
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if max_token_ratio(old + mid * delta, old) < target else (lo, mid)
    return old + hi * delta


def make_problem(setting: Setting, horizon: int, seed: int = 0,
                 policies: Policies = DEFAULT_POLICIES, draw: int = 0) -> Problem:
    """Random float64 policies; the four settings of one (horizon, seed, draw) share theta_old
    and R. draw > 0: further independent draws (the combination fit)."""
    g = torch.Generator().manual_seed(1000 * seed + horizon + 1_000_003 * draw)
    V = policies.vocab
    ar = Autoregressive(V, horizon)
    shape = (ar.n_prefix, V)
    old = policies.logit_scale * torch.randn(shape, generator=g, dtype=DTYPE)
    delta = policies.off_step * torch.randn(shape, generator=g, dtype=DTYPE)
    ref = old + policies.ref_step * torch.randn(shape, generator=g, dtype=DTYPE)
    R = torch.randn(len(ar.seqs), generator=g, dtype=DTYPE)
    theta = (
        old + delta
        if policies.max_ratio is None
        else scale_to_ratio(old, delta, policies.max_ratio)
    )
    return Problem(
        ar, old if setting.on_policy else theta, old, old if setting.ref_is_old else ref, R
    )


# ---------------------------------------------------------------------------
# exact expected gradient of a loss
# ---------------------------------------------------------------------------

class LossFailed(ValueError):
    """The audited loss raised, or returned or differentiated to something that is not a finite
    scalar, on one batch: ``str`` is one line naming the loss, the batch's shape and what came
    back (a NaN fed on would end in a linear solver's error far from its cause)."""

    def __init__(self, adapter: Adapter, logp: Tensor, what: str, why: str = ""):
        self.adapter = adapter
        self.detail = (f"{what} on a {list(logp.shape)} batch (log-probs and mask "
                       f"{list(logp.shape)}, advantages [{len(logp)}])"
                       + (f": {why}" if why else
                          "; the audit needs a finite loss and gradient on every batch"))
        super().__init__(f"{adapter.name}: {self.detail}")


INPUT_NAMES = ("logp", "old_logp", "ref_logp", "advantages", "mask")  # the loss's arguments


def changed_in_place(before: tuple, after: tuple) -> list[str]:
    """The names (INPUT_NAMES) of the loss's inputs whose values differ after the call from the
    copies taken before it."""
    return [name for name, b, a in zip(INPUT_NAMES, before, after)
            if not torch.equal(b, a.detach())]


def mutation_advice(names: list[str]) -> str:
    """Why a loss must leave its inputs as they were, and the fix, for inputs ``names``."""
    x = names[0]
    return (f"a loss must not change its inputs (a trainer hands the same tensors to several "
            f"calls); compute on a copy: `{x} = {x} + 1`, not `{x} += 1`")


def _call(adapter: Adapter, prob: Problem, logp: Tensor, adv: Tensor, rows=slice(None)) -> Tensor:
    """The loss on one batch, checked: a finite scalar tensor that left its inputs as they were,
    else LossFailed. The inputs are copies: a loss that changes them cannot change the problem."""
    inputs = (logp, prob.old_tok[rows].clone(), prob.ref_tok[rows].clone(), adv[rows].clone(),
              torch.ones_like(logp))
    before = tuple(t.detach().clone() for t in inputs)
    try:
        out = adapter.loss(*inputs)
    except Exception as e:  # noqa: BLE001 -- the audited loss is another author's code
        first = (str(e).strip().splitlines() or [""])[0]
        raise LossFailed(adapter, logp, f"raised {type(e).__name__}", first or "(no message)"
                         ) from None
    if changed := changed_in_place(before, inputs):
        raise LossFailed(adapter, logp, f"changed {' and '.join(changed)} in place",
                         mutation_advice(changed))
    if not (isinstance(out, Tensor) and out.numel() == 1 and out.is_floating_point()):
        got = (f"a {out.dtype} tensor of shape {list(out.shape)}" if isinstance(out, Tensor)
               else type(out).__name__)
        raise LossFailed(adapter, logp, f"returned {got}, not a floating scalar tensor,")
    value = float(out.detach())
    if not math.isfinite(value):
        raise LossFailed(adapter, logp, f"returned {value}")
    return out


def _finite_grad(adapter: Adapter, out: Tensor, leaf: Tensor) -> Tensor | None:
    """d out / d leaf (None where the loss does not use it); LossFailed where it is not finite."""
    (g,) = torch.autograd.grad(out, leaf, allow_unused=True)
    if g is not None and not bool(torch.isfinite(g).all()):
        bad = float(g[~torch.isfinite(g)][0])
        raise LossFailed(adapter, leaf,
                         f"returned {float(out.detach()):.6g} but its gradient holds {bad}")
    return g


def response_grads(adapter: Adapter, prob: Problem, logp: Tensor, adv: Tensor) -> Tensor:
    """[N, H] d loss({y}) / d log pi(y_t | y_<t) for every response y, from ONE call on the batch
    of all N responses: a mean over responses has batch gradient = response gradient / N.
    A loss without a gradient (computed under no_grad) has gradient 0."""
    leaf = logp.detach().clone().requires_grad_(True)
    out = _call(adapter, prob, leaf, adv)
    if not out.requires_grad:
        return torch.zeros_like(leaf)
    g = _finite_grad(adapter, out, leaf)
    return torch.zeros_like(leaf) if g is None else g.to(DTYPE) * len(leaf)


def has_gradient(adapter: Adapter, prob: Problem) -> bool:
    """Whether the loss's gradient with respect to logp is non-zero for some response, with the
    rewards as advantages or with none (a loss that ignores logp, or is computed under no_grad or
    detached, has none at all)."""
    tok = prob.tokens(prob.theta)
    return any(bool(response_grads(adapter, prob, tok, adv).ne(0).any())
               for adv in (prob.R, torch.zeros_like(prob.R)))


def expected_grad(adapter: Adapter, prob: Problem, adv: Tensor) -> Tensor:
    """sum_y pi_old(y) grad_theta loss({y}), flattened over the logits table."""
    th = prob.theta.detach().clone().requires_grad_(True)
    tok = prob.tokens(th)                                                    # [N, H]
    p_old = prob.old_tok.sum(1).exp()                                        # [N] pi_old(y)
    d_tok = response_grads(adapter, prob, tok, adv)                          # [N, H]
    (g,) = torch.autograd.grad((p_old[:, None] * d_tok * tok).sum(), th)     # chain rule to theta
    return g.reshape(-1)


# ---------------------------------------------------------------------------
# the precision a loss computes at
# ---------------------------------------------------------------------------

class _LowestFloat(TorchFunctionMode):
    """Records the lowest floating dtype among the tensors a call creates, ignoring tensors whose
    values are all integers (masks and counts cast to float32 are exact)."""

    def __init__(self):
        super().__init__()
        self.lowest: torch.dtype = DTYPE

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, Tensor) and t.is_floating_point() and t.dtype != DTYPE and t.numel()
                    and torch.finfo(t.dtype).eps > torch.finfo(self.lowest).eps):
                with torch.no_grad():
                    if not bool((t == t.round()).all()):
                        self.lowest = t.dtype
        return out


def loss_precision(adapter: Adapter, prob: Problem) -> torch.dtype:
    """The lowest floating precision the loss computes at on float64 inputs (float64 unless its code
    casts, e.g. ``.float()``), from one batched call with and one without rewards."""
    mode = _LowestFloat()
    tok = prob.tokens(prob.theta).detach().requires_grad_(True)
    with mode:
        for adv in (prob.R, torch.zeros_like(prob.R)):
            out = _call(adapter, prob, tok, adv)
            if out.requires_grad:
                _finite_grad(adapter, out, tok)
    return mode.lowest


def tolerance(precision: torch.dtype) -> float:
    return MATCH_TOL if precision == DTYPE else EPS_FACTOR * torch.finfo(precision).eps


def precision_name(precision: torch.dtype) -> str:
    return str(precision).removeprefix("torch.")


def check_mean_over_responses(adapter: Adapter, prob: Problem, tol: float = MATCH_TOL) -> None:
    """The per-response gradients read off one batched call equal separate one-response calls
    (to ``tol``: the loss's own precision)."""
    tok = prob.tokens(prob.theta)
    batched = response_grads(adapter, prob, tok, prob.R)
    for y in range(len(tok)):
        leaf = tok[y:y + 1].detach().clone().requires_grad_(True)
        out = _call(adapter, prob, leaf, prob.R, slice(y, y + 1))
        g = _finite_grad(adapter, out, leaf) if out.requires_grad else None
        single = torch.zeros_like(leaf[0]) if g is None else g[0].to(DTYPE)
        diff = float((single - batched[y]).abs().max())
        if diff > tol * max(1.0, float(single.abs().max())):
            raise ValueError(
                f"{adapter.name}: the loss of a batch is not the mean of its responses' losses "
                f"(response {y}: its gradient alone and in the batch differ by {diff:.3g}); "
                f"aggregate with seq-mean-token-sum or token-mean"
            )


# ---------------------------------------------------------------------------
# candidate objectives
# ---------------------------------------------------------------------------

Objective = Callable[[Tensor, Tensor, Tensor], Tensor]   # D(logp, old_logp, ref_logp) -> scalar


def _grad(f: Callable[[Tensor], Tensor], theta: Tensor) -> Tensor:
    th = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(th), th)
    return g.reshape(-1)


def candidate_grads(
    prob: Problem, objectives: dict[str, Objective] | None = None
) -> dict[str, Tensor]:
    """grad_theta D for every candidate D (key -> flattened gradient). A user objective D gets the
    [N, H] token log-probs of every response under theta (differentiable), pi_old and pi_ref."""
    seq_ref = prob.ref_tok.sum(1)                                            # log pi_ref(y)
    cond_ref = torch.log_softmax(prob.ref, -1)                               # [n_prefix, V]
    # [n_prefix] pi_old(prefix)
    w_old = prob.ar.prefix_logp(prob.old).exp()
    out = {
        f"seq-{d}": _grad(
            lambda th, d=d: divergence(d, prob.tokens(th).sum(1), seq_ref), prob.theta
        )
        for d in ("rkl", "urkl", "fkl", "ufkl")
    }
    # sum_t E_{y<t ~ pi_old} KL_t = sum over prefixes p of pi_old(p) KL(pi(.|p), pi_ref(.|p))
    out["tok-rkl"] = _grad(
        lambda th: (w_old * kl.reverse_kl(torch.log_softmax(th, -1), cond_ref)).sum(), prob.theta
    )
    out["tok-fkl"] = _grad(
        lambda th: (w_old * kl.forward_kl(torch.log_softmax(th, -1), cond_ref)).sum(), prob.theta
    )
    out["no-kl"] = torch.zeros_like(out["tok-rkl"])
    for name, D in (objectives or {}).items():
        g = _grad(lambda th, D=D: D(prob.tokens(th), prob.old_tok, prob.ref_tok), prob.theta)
        if not bool(torch.isfinite(g).all()):   # a NaN would reach the combination fit's solver
            raise ValueError(f"objective {name}: its gradient is not finite on the "
                             f"{list(prob.old_tok.shape)} log-probs of every response")
        out[f"user:{name}"] = g
    return out


def reward_grad(prob: Problem) -> Tensor:
    """grad_theta E_{pi_theta}[R] = grad sum_y pi_theta(y) R(y)."""
    return _grad(lambda th: (prob.tokens(th).sum(1).exp() * prob.R).sum(), prob.theta)


def rel_err(g: Tensor, t: Tensor) -> float:
    """||g - t|| / max(||g||, ||t||, ZERO_NORM): 0 for equal vectors, up to 2, and 1 vs a zero
    target."""
    return float((g - t).norm()) / max(float(g.norm()), float(t.norm()), ZERO_NORM)


# ---------------------------------------------------------------------------
# one case, and the whole audit
# ---------------------------------------------------------------------------

@dataclass
class Case:
    """One (setting, horizon) of one audit: its problem, targets, and further draws for the fit."""
    setting: Setting
    horizon: int
    prob: Problem
    cands: dict[str, Tensor]
    g_reward: Tensor
    draws: list = field(default_factory=list)    # [(Problem, cands)], built on first use


def closest_class(errs: dict[str, float], targets: dict[str, Tensor]) -> list[str]:
    """The candidate nearest to the KL part together with every candidate of the same gradient
    (to MATCH_TOL), sorted: those are one objective here (UKL = KL for normalized policies; Σt =
    sequence where they coincide), and which of them is nearest is decided by float rounding (it
    differs between CPUs), so all are named."""
    best = min(errs, key=errs.get)
    return sorted(k for k in errs if rel_err(targets[k], targets[best]) <= MATCH_TOL)


def audit_case(adapter: Adapter, prob: Problem, cands: dict[str, Tensor], g_reward: Tensor,
               tol: float = MATCH_TOL) -> dict:
    """Reward-part error and KL-part verdict of one adapter on one problem (single candidates)."""
    g_kl = expected_grad(adapter, prob, torch.zeros_like(prob.R))
    g_r = expected_grad(adapter, prob, prob.R) - g_kl
    errs = {}
    for key, gd in cands.items():
        # loss follows E[R] - beta D
        errs[key] = rel_err(g_kl, adapter.beta * gd)
        if key != "no-kl":
            # loss follows E[R] + beta D
            errs["-" + key] = rel_err(g_kl, -adapter.beta * gd)
    # judged at float64 first; a loss that computes below float64 is judged at its own precision
    # only where nothing matches to 1e-10 (so a label "at float32 precision" means the precision
    # mattered)
    matches, judged_at = sorted(k for k, e in errs.items() if e <= MATCH_TOL), MATCH_TOL
    if not matches and tol > MATCH_TOL:
        matches, judged_at = sorted(k for k, e in errs.items() if e <= tol), tol
    targets = {k: adapter.beta * gd for k, gd in cands.items()}
    targets |= {"-" + k: -t for k, t in targets.items() if k != "no-kl"}
    closest = closest_class(errs, targets)
    reward_err = rel_err(g_r, -g_reward)
    return {
        "reward_rel_err": reward_err,
        "reward_exact": reward_err <= tol,
        "kl_matches": matches,
        "kl_judged_at": judged_at,
        "kl_closest": closest,
        "kl_closest_err": min(errs[k] for k in closest),
        "kl_all_zero": all(float(gd.norm()) < ZERO_NORM for gd in cands.values()),
        "kl_grad_norm": float(g_kl.norm()),
        "kl_errs": errs,
        "grad_kl_part": g_kl.tolist(),
        "grad_reward_part": g_r.tolist(),
        "grad_reward_target": (-g_reward).tolist(),
        "kl_targets": {k: (adapter.beta * v).tolist() for k, v in cands.items() if k != "no-kl"},
    }
