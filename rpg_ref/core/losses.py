"""Every surrogate loss of the RPG paper and its baselines, written as the paper writes it.

This module is the specification: each loss is one function of the paper's per-sample quantities
(Section 3 (sec:offpolicy_policy_gradients)), registered under its literal name; the paper is cited
as "Proposition 3.2 (prop:...)": the PDF's number, then the LaTeX label
(derivations/paper_numbers.txt). A unit x, sampled from the behaviour policy pi_old, is a token
(``level="token"``, as verl and the paper's code apply the losses) or a whole response
(``level="sequence"``):

    w   = pi_theta(x) / pi_old(x)      importance ratio          (differentiable)
    rho = pi_theta(x) / pi_ref(x)      ratio to the reference    (differentiable)
    u   = pi_ref(x)  / pi_old(x)       = w / rho                 (constant)
    A   = advantages (R - b; pass R itself for the paper's literal formulas)

``LOSSES[name](...)`` runs the closed-form kernel of rpg_ref/core/losses_fused.py (faster; the same
values, gradients and statistics to 1e-12: tests/test_losses_reference.py); ``impl="reference"``
runs the functions below through autograd.

Beyond the paper, which assumes pi_ref = pi_old (u = 1, rho = w): with ``ref_logp`` every rpg loss
keeps E_old[grad L] = -grad J, J = E_theta[A] - beta D(pi_theta, pi_ref), because its KL part d(x)
has E_old[d] = D for every theta. Each d is the paper's term up to a theta-independent constant
(same gradient), chosen so that ``stats["kl"]`` estimates D itself.

Numerics: inputs are upcast to at least float32; log-ratios are clamped to +-LOG_RATIO_CLAMP
before exp() (outside, value and gradient are those at the clamp: finite, the weight saturates);
bad input raises a ValueError naming the argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch
from torch import Tensor

from rpg_ref.core.divergences import DIVERGENCES
from rpg_ref.core.loss_checks import (
    check_sample_weight,
    check_tensors,
    data_checks,
    refuse_bad_data,
)
from rpg_ref.core.loss_spec import (
    AGGREGATIONS,
    LEVELS,
    LossOptions,
    LossSpec,
    check_beta,
    parse_clip,
    resolve,
)
from rpg_ref.core.losses_fused import FUSED_LOSSES, fused_loss

__all__ = ["AGGREGATIONS", "LEVELS", "LOG_RATIO_CLAMP", "LOSSES", "SPECS", "LossOptions",
           "LossSpec", "UnitLoss", "Units", "cached_options", "check_beta", "check_options",
           "default_beta", "dual_clip", "get_loss", "loss_beta", "parse_clip", "register_loss",
           "rpg_style_clip", "run_options"]

LOG_RATIO_CLAMP = 40.0  # e^40 ~ 2.4e17; products of two such ratios stay finite in float32
IMPLS = ("fused", "reference")

LOSSES: dict[str, Callable] = {}
SPECS: dict[str, LossSpec] = {}


def get_loss(name: str) -> Callable:
    """Return the loss function registered under ``name``; ValueError lists valid names."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


# --- a loss's options by its name (the rules themselves: rpg_ref/core/loss_spec.py) ---

def check_options(name: str, *, beta, clip=None, level: str = "token", agg: str = "token-mean",
                  no_clip: bool = False) -> LossOptions:
    """Refuse bad options of the loss ``name`` (a one-line ValueError for the first violation);
    return them resolved. ``beta`` is the loss's own (see loss_beta)."""
    spec = get_loss(name).spec
    return resolve(spec, beta=beta, clip=clip, level=level, agg=agg, no_clip=no_clip)


def run_options(name: str, *, beta, clip=None, level: str = "token", agg: str = "token-mean",
                no_clip: bool = False) -> LossOptions:
    """The options of a training run, whose ``beta`` is the user's KL coefficient: it goes to the
    reward where the loss puts its KL there (reinforce++: reward_beta), else to the loss."""
    spec = get_loss(name).spec
    return resolve(spec, beta=beta, clip=clip, level=level, agg=agg, no_clip=no_clip, run=True)


@lru_cache(maxsize=256, typed=True)
def _cached_options(name, beta, clip, level, agg) -> LossOptions:
    return check_options(name, beta=beta, clip=clip, level=level, agg=agg)


def cached_options(name: str, *, beta, clip=None, level: str = "token",
                   agg: str = "token-mean") -> LossOptions:
    """check_options, remembered: a library call's loose options are resolved on their first use
    and looked up after that (nothing is re-parsed per micro-batch)."""
    key = tuple(clip) if isinstance(clip, list) else clip
    try:
        hash((name, beta, key, level, agg))
    except TypeError:                                   # unhashable: refused (or resolved) afresh
        return check_options(name, beta=beta, clip=clip, level=level, agg=agg)
    return _cached_options(name, beta, key, level, agg)


def loss_beta(name: str, beta: float) -> float:
    """The beta the loss itself receives: 0 where the KL lives in the reward (reinforce++: beta,
    checked here, goes to rpg_ref.core.advantages.reinforce_pp), else beta."""
    check_beta(beta)
    return 0.0 if get_loss(name).spec.kl_in_reward else beta


def default_beta(name: str, beta: float) -> float:
    """The beta to use when the user gave none: 0 for a loss with no KL at all (dapo), else beta."""
    return beta if get_loss(name).spec.has_kl else 0.0


# --- the per-unit quantities and the two clipping algorithms ---

@dataclass
class Units:
    """The paper's per-sample quantities, one entry per unit: [B, T] tokens or [B, 1] responses."""
    logp: Tensor            # log pi_theta(x): the only input with a gradient (ell = -logp)
    w: Tensor               # pi_theta / pi_old
    log_rho: Tensor         # log(pi_theta / pi_ref)
    rho: Tensor
    u: Tensor               # pi_ref / pi_old, constant (ones when pi_ref = pi_old)
    A: Tensor               # advantages, constant: [B, 1] or [B, T]


class UnitLoss(NamedTuple):
    """Per-unit loss and the clip branch each unit took (None: the branch does not exist)."""
    loss: Tensor
    low: Tensor | None = None
    high: Tensor | None = None
    dual: Tensor | None = None


def dual_clip(w: Tensor, A_hat: Tensor, bounds: tuple) -> UnitLoss:
    """Algorithm 1 (alg:offpolicy_rpg_ppo_dualclip), (lo, hi, c) = (1 - eps_low, 1 + eps_high, c):
        A_hat >= 0:  max(-w A_hat, -clip(w, lo, hi) A_hat)
        A_hat <  0:  min(max(-w A_hat, -clip(w, lo, hi) A_hat), -c A_hat)
    No gradient flows through w on a clipped segment; it still flows through A_hat when A_hat
    depends on theta (Figure 2 (fig:ppo_dualclip_loss_vis) caption)."""
    lo, hi, c = bounds
    plain, clipped = -w * A_hat, -w.clamp(lo, hi) * A_hat
    took_clip = clipped > plain
    loss = torch.where(took_clip, clipped, plain)                           # max(-w Â, -clip(w) Â)
    neg = A_hat < 0
    dual = None if c is None else neg & (-c * A_hat < loss)
    if dual is not None:
        loss = torch.where(dual, -c * A_hat, loss)                          # min(., -c Â) for Â < 0
    return UnitLoss(loss, low=neg & took_clip, high=~neg & took_clip, dual=dual)


def rpg_style_clip(x: Units, c_kl: Tensor, bounds: tuple) -> UnitLoss:
    """RPG-Style Clip, Algorithm 2 (alg:offpolicy_rpg_rf_ppo_dualclip_v1), of L = -SG(w A') log pi
    with w A' = w A + C_KL, branching on psi = A' ell (ell = -log pi_theta). Flat segments (no
    gradient) as drawn dotted in Figure 3 (fig:offpolicy_rpg_rf_ppo_dualclip_v1):
        psi >= 0:  w <  hi -> ell SG(w A')               w >= hi    -> SG(ell) (A hi + C_KL)
        psi <  0:  w <= lo -> SG(ell) (A lo + C_KL)      lo < w < c -> ell SG(w A')
                                                         w >= c     -> SG(ell) (A c + C_KL)"""
    lo, hi, c = bounds
    w, c_kl, ell = x.w.detach(), c_kl.detach(), -x.logp
    weight = w * x.A + c_kl                                                 # w A' = w A + C_KL
    pos = weight * ell.detach() >= 0                                        # psi >= 0 (as w > 0)
    high, low = pos & (w >= hi), ~pos & (w <= lo)
    dual = None if c is None else ~pos & (w >= c)
    w_flat = w.clamp(lo, hi) if dual is None else torch.where(dual, c, w.clamp(lo, hi))
    flat = high | low if dual is None else high | low | dual
    loss = torch.where(flat, (x.A * w_flat + c_kl) * ell.detach(), weight * ell)
    return UnitLoss(loss, low=low, high=high, dual=dual)


def fully_differentiable(x: Units, loss: Tensor, bounds: tuple | None) -> UnitLoss:
    """L itself, or Algorithm 1's dual clip with the differentiable A_hat = -L/w = A - beta d/w, so
    that nothing clipped gives L exactly. (The algorithm's example A_hat_RKL = A - beta(log w + 1)
    contradicts its unclipped line by beta*w: derivations/ERRATA.md.)"""
    return UnitLoss(loss) if bounds is None else dual_clip(x.w, -loss / x.w, bounds)


def reinforce(x: Units, c_kl: Tensor, bounds: tuple | None) -> UnitLoss:
    """L = -SG(w A') log pi_theta with w A' = w A + C_KL (C_KL: the KL part of the weight), or
    its RPG-Style Clip."""
    if bounds is None:
        return UnitLoss(-(x.w * x.A + c_kl).detach() * x.logp)              # -SG(w A + C_KL) log pi
    return rpg_style_clip(x, c_kl, bounds)


# --- registry, and the call both implementations share ---

_CALL_DOC = """

    Call: (logp, old_logp, advantages, mask, *, beta=0, ref_logp=None, clip=None, level="token",
    agg="token-mean", sample_weight=None, impl="fused", options=None). logp, old_logp, mask (0/1,
    a token in every row), ref_logp: [B, T]; ref_logp None means pi_ref = pi_old (the paper).
    advantages: [B] or [B, T] ([B] at level "sequence"). clip: (eps_low, eps_high, c), c None/inf:
    no dual clip. agg: token-mean, seq-mean-token-mean or seq-mean-token-sum. sample_weight: None,
    or a constant weight >= 0 of each unit's loss term before aggregation, [B, T] (level "token")
    or [B] (one per response, any level): the rollout correction's pi_old / pi_sampler
    (rpg_ref.trainer.rollout_correction). impl: "fused" or "reference" (autograd). options: a
    LossOptions resolved once for this loss (rpg_ref.core.losses.check_options or run_options),
    instead of beta, clip, level and agg (a trainer's per-call path).
    Returns (loss, stats): stats are detached 0-dim tensors clip_frac_low, clip_frac_high,
    clip_frac_dual, ratio_mean, kl (the divergence estimate, mean over units) and kl_old (token-mean
    estimate of KL(pi_theta || pi_old)).
    """


def register_loss(name: str, *, paper: str, **fields) -> Callable:
    """Decorator: register ``formula(x: Units, beta, bounds) -> (UnitLoss, kl)`` as LOSSES[name]
    (``paper``: its paper_label, ``fields``: the other LossSpec fields). bounds = (1 - eps_low,
    1 + eps_high, c or None) or None; kl = the units' KL estimate d, stats["kl"]."""
    spec = LossSpec(name=name, paper_label=paper, **fields)

    def register(formula: Callable) -> Callable:
        def loss_fn(logp, old_logp, advantages, mask, *, beta=0.0, ref_logp=None, clip=None,
                    level="token", agg="token-mean", sample_weight=None, impl="fused",
                    options=None):
            if impl not in IMPLS:
                raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
            if options is None:
                options = cached_options(name, beta=beta, clip=clip, level=level, agg=agg)
            elif not isinstance(options, LossOptions) or options.loss != name:
                raise ValueError(f"{name}: options must be a LossOptions resolved for {name} "
                                 f"(rpg_ref.core.losses.check_options), got {options!r}")
            elif (beta, clip, level, agg) != (0.0, None, "token", "token-mean"):
                raise ValueError(f"{name}: give options or beta/clip/level/agg, not both")
            check_tensors(logp, old_logp, advantages, mask, ref_logp, options.level)
            check_sample_weight(sample_weight, logp, options.level)
            if impl == "fused" and name in FUSED_LOSSES:
                return fused_loss(spec, options, logp, old_logp, advantages, mask, ref_logp,
                                  clamp=LOG_RATIO_CLAMP, sample_weight=sample_weight)
            return reference_loss(formula, options, logp, old_logp, advantages, mask, ref_logp,
                                  sample_weight)
        loss_fn.__name__ = loss_fn.__qualname__ = formula.__name__
        loss_fn.__doc__ = formula.__doc__.strip() + _CALL_DOC
        loss_fn.spec, loss_fn.formula = spec, formula
        LOSSES[name], SPECS[name] = loss_fn, spec
        return formula
    return register


def reference_loss(formula, opts: LossOptions, logp, old_logp, advantages, mask, ref_logp,
                   sample_weight=None):
    """formula's units, loss and statistics through autograd: what a level, an aggregation and
    each statistic mean (the fused kernel answers to this). Shapes: checked by the caller."""
    level, agg = opts.level, opts.agg
    dt = torch.promote_types(logp.dtype, torch.float32)                     # at least float32
    lp, m = logp.to(dt), mask.to(dt)
    old, adv = old_logp.detach().to(dt), advantages.detach().to(dt)
    ref = None if ref_logp is None else ref_logp.detach().to(dt)
    n = m.sum(1)                                                            # [B] tokens per row
    checks = data_checks(mask, n, (lp - old).detach(), None if ref is None else (lp - ref).detach(),
                         adv)
    refuse_bad_data(checks, logp, old_logp, advantages, mask, ref_logp)

    def unit(t):                                                            # a token, or a response
        return t if level == "token" else (t * m).sum(1, keepdim=True)

    def clamped(t):                                     # the value at the clamp, t's gradient
        return t + (t.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) - t).detach()

    log_w = clamped(unit(lp - old))
    log_rho = log_w if ref is None else clamped(unit(lp - ref))
    x = Units(logp=unit(lp), w=log_w.exp(), log_rho=log_rho, rho=log_rho.exp(),
              u=torch.ones_like(log_w) if ref is None else clamped(unit(ref - old)).exp(),
              A=adv[:, None] if adv.dim() == 1 else adv)
    out, kl = formula(x, opts.beta, opts.bounds)
    unit_loss = out.loss                                                    # [B, T] or [B, 1]
    if sample_weight is not None:                   # each unit's term times its constant weight
        sw = sample_weight.detach().to(dt)
        unit_loss = unit_loss * (sw[:, None] if sw.dim() == 1 else sw)

    rows = (unit_loss * m).sum(1) if level == "token" else unit_loss[:, 0]  # [B] token-sums
    loss = (rows.sum() / n.sum() if agg == "token-mean" else
            (rows / n).mean() if agg == "seq-mean-token-mean" else rows.mean())

    def mean(t):                                        # over units; a missing clip branch: 0
        t = torch.zeros_like(log_w) if t is None else t.detach().to(dt)
        return (t * m).sum() / n.sum() if level == "token" else t.mean()

    lw_t = (lp - old).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)     # per token at any level
    w_t = lw_t.exp()
    return loss.to(logp.dtype), {
        "clip_frac_low": mean(out.low), "clip_frac_high": mean(out.high),
        "clip_frac_dual": mean(out.dual), "ratio_mean": mean(x.w), "kl": mean(kl),
        "kl_old": ((w_t * lw_t - w_t + 1) * m).sum() / n.sum()}            # E_old[w log w - w + 1]


# --- the KL term d of a loss, from the one table of rpg_ref/core/divergences.py ---

def kl_term(x: Units, kl: str) -> Tensor:
    """d(x) of the row ``kl`` of DIVERGENCES: E_old[d] = D(pi_theta, pi_ref) for every theta."""
    return DIVERGENCES[kl].estimate(x.w, x.log_rho, x.u)


def kl_weight(x: Units, kl: str, beta: float) -> Tensor:
    """C_KL = -beta w h, h = (dd / d log pi_theta) / w (the row's score): the KL part of a REINFORCE
    weight w A' = w A + C_KL, so that -C_KL grad log pi_theta = beta grad d."""
    return -beta * x.w * DIVERGENCES[kl].score(x.w, x.log_rho, x.u / x.w)


# --- fully differentiable family: L = -w A + beta d ---

@register_loss("rpg-fkl", family="rpg", kl="fkl", advantage="group-mean",
               paper="prop:policy_gradient_forward_kl")
def rpg_fkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, forward KL(pi_ref || pi_theta)
    (Proposition E.1 (prop:policy_gradient_forward_kl); Table 4 (tab:off-policy-loss-normalized),
    row Forward KL: E_old[-w R - beta log pi_theta])."""
    d = kl_term(x, "fkl")                                   # d = -u log rho
    loss = -x.w * x.A + beta * d                            # L = -w A - beta u log rho
    return fully_differentiable(x, loss, bounds), d


@register_loss("rpg-rkl", family="rpg", kl="rkl", advantage="group-mean",
               paper="prop:policy_gradient_reverse_kl")
def rpg_rkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, reverse KL(pi_theta || pi_ref)
    (Proposition E.3 (prop:policy_gradient_reverse_kl); Table 4 (tab:off-policy-loss-normalized),
    row Reverse KL: E_old[w (-R + beta log w)])."""
    d = kl_term(x, "rkl")                                   # d = w log rho
    loss = -x.w * x.A + beta * d                            # L = -w A + beta w log rho
    return fully_differentiable(x, loss, bounds), d


@register_loss("rpg-ufkl", family="rpg", kl="ufkl", advantage="group-mean",
               paper="prop:policy_gradient_unormalized_forward_kl")
def rpg_ufkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, unnormalized forward KL UKL(pi_ref || pi_theta)
    (Proposition 3.2 (prop:policy_gradient_unormalized_forward_kl); Table 1 (tab:off-policy-loss),
    row Forward (UFKL): Z_old E[-w R + beta (w - log w - 1)])."""
    d = kl_term(x, "ufkl")                                  # d = w - u - u log rho = u k3(rho)
    loss = -x.w * x.A + beta * d                            # L = -w A + beta (w - u - u log rho)
    return fully_differentiable(x, loss, bounds), d


@register_loss("rpg-urkl", family="rpg", kl="urkl", advantage="group-mean",
               paper="prop:policy_gradient_unormalized_reverse_kl")
def rpg_urkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, unnormalized reverse KL UKL(pi_theta || pi_ref)
    (Proposition 3.6 (prop:policy_gradient_unormalized_reverse_kl); Table 1 (tab:off-policy-loss),
    row Reverse (URKL): Z_old E[-w R + beta (w log w - w)]; d is the paper's term + u, a
    constant)."""
    d = kl_term(x, "urkl")                                  # d = u - w + w log rho = w k3(1/rho)
    loss = -x.w * x.A + beta * d                            # L = -w A + beta (u - w + w log rho)
    return fully_differentiable(x, loss, bounds), d


# --- REINFORCE-style family: L = -SG(w A + C_KL) log pi_theta; stats["kl"]: the d above ---

@register_loss("rpg-reinforce-fkl", family="rpg-reinforce", kl="fkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_fkl")
def rpg_reinforce_fkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, forward KL
    (Proposition F.1 (prop:offpolicy_reinforce_loss_fkl): -E_old[SG(w R + beta) log pi_theta])."""
    c_kl = kl_weight(x, "fkl", beta)                        # w A' = w A + beta u
    return reinforce(x, c_kl, bounds), kl_term(x, "fkl")


@register_loss("rpg-reinforce-rkl", family="rpg-reinforce", kl="rkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_rkl")
def rpg_reinforce_rkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, reverse KL (Proposition F.4 (prop:offpolicy_reinforce_loss_rkl),
    Eq. (F.2) (eq:loss_rkl_offpolicy_reinforce):
    -E_old[SG(w (R - beta log w - beta)) log pi_theta])."""
    c_kl = kl_weight(x, "rkl", beta)                        # w A' = w (A - beta (log rho + 1))
    return reinforce(x, c_kl, bounds), kl_term(x, "rkl")


@register_loss("rpg-reinforce-ufkl", family="rpg-reinforce", kl="ufkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_ufkl")
def rpg_reinforce_ufkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, unnormalized forward KL
    (Proposition F.3 (prop:offpolicy_reinforce_loss_ufkl); Table 2 (tab:off-policy-loss-reinforce),
    row Forward (UFKL):
    -E[SG(Z_old (w R - beta (w - 1))) log pi_theta])."""
    c_kl = kl_weight(x, "ufkl", beta)                       # w A' = w A - beta (w - u)
    return reinforce(x, c_kl, bounds), kl_term(x, "ufkl")


@register_loss("rpg-reinforce-urkl", family="rpg-reinforce", kl="urkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_urkl")
def rpg_reinforce_urkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, unnormalized reverse KL
    (Proposition F.5 (prop:offpolicy_reinforce_loss_urkl); Table 2 (tab:off-policy-loss-reinforce),
    row Reverse (URKL):
    -E[SG(Z_old w (R - beta log w)) log pi_theta])."""
    c_kl = kl_weight(x, "urkl", beta)                       # w A' = w (A - beta log rho)
    return reinforce(x, c_kl, bounds), kl_term(x, "urkl")


# --- PPO-clip baselines: they always clip (clip=None means their default_clip) ---

@register_loss("grpo", family="baseline", kl="k3", advantage="group-mean-std",
               default_clip=(0.2, 0.2, None), paper="subsec:grpo_main")
def grpo(x: Units, beta: float, bounds):
    """GRPO as published (Section 2.2 (subsec:grpo_main), J_GRPO): PPO clip on A plus
    beta k3(pi_ref/pi_theta) per token, no importance weight. Its expected gradient is not
    grad UKL off-policy."""
    d = kl_term(x, "k3")                                    # k3(pi_ref/pi_theta)
    out = dual_clip(x.w, x.A, bounds)
    return out._replace(loss=out.loss + beta * d), d        # clip term + beta k3


@register_loss("grpo-corrected", family="baseline", kl="urkl", advantage="group-mean-std",
               default_clip=(0.2, 0.2, None), paper="subsec:grpo_main")
def grpo_corrected(x: Units, beta: float, bounds):
    """GRPO with the paper's corrected KL term (Section 2.2 (subsec:grpo_main), KL_GRPO-corrected):
    PPO clip on A plus beta w k3(pi_ref/pi_theta), unbiased for UKL(pi_theta || pi_ref) for every
    theta."""
    d = kl_term(x, "urkl")                                  # w k3(pi_ref / pi_theta)
    out = dual_clip(x.w, x.A, bounds)
    return out._replace(loss=out.loss + beta * d), d        # clip term + beta w k3


@register_loss("reinforce++-baseline", family="baseline", kl="urkl",
               advantage="reinforce++-baseline", kl_in_reward=True, default_clip=(0.2, 0.2, None),
               paper="")
@register_loss("reinforce++", family="baseline", kl="urkl", advantage="reinforce++",
               kl_in_reward=True, default_clip=(0.2, 0.2, None), paper="")
@register_loss("dapo", family="baseline", kl="urkl", advantage="group-mean-std", has_kl=False,
               default_clip=(0.2, 0.28, None), paper="")
def ppo_clip(x: Units, beta: float, bounds):
    """PPO clip on A with no KL term in the loss (beta must be 0). dapo (Yu et al. 2025):
    clip-higher (default eps (0.2, 0.28)), no KL anywhere. reinforce++ (Hu et al. 2025,
    arXiv:2501.03262): token advantages from rpg_ref.core.advantages.reinforce_pp (k1 KL to pi_ref
    in the reward, return to go, batch whitening; reinforce++-baseline subtracts the group-mean
    reward first). stats["kl"] reports the UKL(pi_theta || pi_ref) estimate w k3(1/rho)."""
    return dual_clip(x.w, x.A, bounds), kl_term(x, "urkl")
