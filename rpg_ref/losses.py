"""Every surrogate loss of the RPG paper and its baselines, written as the paper writes it.

This module is the specification: each loss is one function of the paper's per-sample quantities
(sec:offpolicy_policy_gradients), registered under its literal name. A unit x, sampled from the
behaviour policy pi_old, is a token (``level="token"``, as verl and the paper's code apply the
losses) or a whole response (``level="sequence"``):

    w   = pi_theta(x) / pi_old(x)      importance ratio          (differentiable)
    rho = pi_theta(x) / pi_ref(x)      ratio to the reference    (differentiable)
    u   = pi_ref(x)  / pi_old(x)       = w / rho                 (constant)
    A   = advantages (R - b; pass R itself for the paper's literal formulas)

``LOSSES[name](...)`` runs the closed-form kernel of rpg_ref/losses_fused.py (faster; the same
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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from rpg_ref import losses_fused

__all__ = ["AGGREGATIONS", "LEVELS", "LOG_RATIO_CLAMP", "LOSSES", "SPECS", "LossSpec", "UnitLoss",
           "Units", "check_beta", "check_options", "default_beta", "dual_clip", "get_loss", "loss_beta",
           "parse_clip", "register_loss", "rpg_style_clip"]

LOG_RATIO_CLAMP = 40.0  # e^40 ~ 2.4e17; products of two such ratios stay finite in float32
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LEVELS = ("token", "sequence")
IMPLS = ("fused", "reference")


@dataclass(frozen=True, kw_only=True)
class LossSpec:
    """What a trainer needs to know about a loss besides calling it."""
    name: str
    family: str                 # "rpg" (fully differentiable), "rpg-reinforce" or "baseline"
    advantage: str              # default estimator in rpg_ref.advantages.ADVANTAGES
    paper_label: str
    divergence: str | None = None   # D whose gradient the KL term has in expectation, any theta
    kl_in_reward: bool = False  # the KL goes into the advantage: the loss takes beta = 0
    has_kl: bool = True         # False only for dapo (no KL anywhere)
    default_clip: tuple | None = None   # used when clip=None; such (PPO-type) losses always clip

    @property
    def always_clips(self) -> bool:
        return self.default_clip is not None


LOSSES: dict[str, Callable] = {}
SPECS: dict[str, LossSpec] = {}


def get_loss(name: str) -> Callable:
    """Return the loss function registered under ``name``; ValueError lists valid names."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


# --- rules about a loss's options, stated once: the losses, the trainer and verl call them ---

def parse_clip(values) -> tuple[float, float, float | None] | None:
    """(eps_low, eps_high[, c]) as numbers or strings -> (eps_low, eps_high, c or None), checked:
    0 < eps_low < 1, 0 < eps_high finite, c > 1 (None or 'inf': no dual bound). None -> None."""
    if values is None:
        return None
    if not isinstance(values, (tuple, list)) or len(values) not in (2, 3):
        raise ValueError(f"clip must be (eps_low, eps_high) or (eps_low, eps_high, c), "
                         f"got {values!r}")

    def number(what, v):
        try:
            return math.inf if what == "c" and v is None else float(v)
        except (TypeError, ValueError):
            raise ValueError(f"clip {what} must be a number ('inf' allowed for c), "
                             f"got {v!r}") from None

    eps_low, eps_high = number("eps_low", values[0]), number("eps_high", values[1])
    c = number("c", values[2]) if len(values) == 3 else math.inf
    if not 0.0 < eps_low < 1.0:
        raise ValueError(f"clip eps_low must be in (0, 1) (the lower ratio bound 1 - eps_low must "
                         f"be positive), got {eps_low}")
    if not 0.0 < eps_high < math.inf:
        raise ValueError(f"clip eps_high must be > 0 and finite, got {eps_high}")
    if not c > 1.0:
        raise ValueError(f"dual-clip c must be > 1 (None or inf: no dual bound), got {c}")
    return eps_low, eps_high, None if c == math.inf else c


def check_beta(beta) -> None:
    """A KL coefficient is a finite number >= 0 (for the losses and for the KL in the reward)."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (
            math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")


def check_options(name: str, *, beta, clip=None, level: str = "token", agg: str = "token-mean",
                  no_clip: bool = False) -> None:
    """Refuse bad options of the loss ``name``: a one-line ValueError for the first violation."""
    spec = get_loss(name).spec
    check_beta(beta)
    if beta != 0 and not spec.has_kl:
        raise ValueError(f"{name} has no KL term; got beta={beta}: use beta=0")
    if beta != 0 and spec.kl_in_reward:
        raise ValueError(f"{name} puts its k1 KL penalty into the reward: pass beta to "
                         f"rpg_ref.advantages.reinforce_pp and call the loss with beta=0; "
                         f"got beta={beta}")
    parse_clip(clip)
    if no_clip and clip is not None:
        raise ValueError(f"clip {clip} and no_clip together: give one of them")
    if no_clip and spec.always_clips:
        raise ValueError(f"no_clip: {name} is a PPO-type loss that always clips; pass a wide clip "
                         f"instead, e.g. (0.99, 100)")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    if level == "sequence" and spec.kl_in_reward:
        raise ValueError(f"{name} has token-level advantages and cannot run at level='sequence'")


def loss_beta(name: str, beta: float) -> float:
    """The beta the loss itself receives: 0 where the KL lives in the reward (reinforce++: beta,
    checked here, goes to rpg_ref.advantages.reinforce_pp), else beta."""
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
    """Algorithm alg:offpolicy_rpg_ppo_dualclip, (lo, hi, c) = (1 - eps_low, 1 + eps_high, c):
        A_hat >= 0:  max(-w A_hat, -clip(w, lo, hi) A_hat)
        A_hat <  0:  min(max(-w A_hat, -clip(w, lo, hi) A_hat), -c A_hat)
    No gradient flows through w on a clipped segment; it still flows through A_hat when A_hat
    depends on theta (fig:ppo_dualclip_loss_vis caption)."""
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
    """RPG-Style Clip, Algorithm alg:offpolicy_rpg_rf_ppo_dualclip_v1, of L = -SG(w A') log pi
    with w A' = w A + C_KL, branching on psi = A' ell (ell = -log pi_theta). Flat segments (no
    gradient) as drawn dotted in fig:offpolicy_rpg_rf_ppo_dualclip_v1:
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
    agg="token-mean", sample_weight=None, impl="fused"). logp, old_logp, mask (0/1, a token in
    every row), ref_logp: [B, T]; ref_logp None means pi_ref = pi_old (the paper). advantages: [B]
    or [B, T] ([B] at level "sequence"). clip: (eps_low, eps_high, c), c None/inf: no dual clip.
    agg: token-mean, seq-mean-token-mean or seq-mean-token-sum. sample_weight: None, or a constant
    weight >= 0 of each unit's loss term before aggregation, [B, T] (level "token") or [B] (one per
    response, any level): the rollout correction's pi_old / pi_sampler (rpg_ref.rollout_correction).
    impl: "fused" or "reference" (autograd).
    Returns (loss, stats): stats are detached 0-dim tensors clip_frac_low, clip_frac_high,
    clip_frac_dual, ratio_mean, kl (the divergence estimate, mean over units) and kl_old
    (token-mean estimate of KL(pi_theta || pi_old)).
    """


def register_loss(name: str, *, paper: str, **fields) -> Callable:
    """Decorator: register ``formula(x: Units, beta, bounds) -> (UnitLoss, kl)`` as LOSSES[name]
    (``paper``: its paper_label, ``fields``: the other LossSpec fields). bounds = (1 - eps_low,
    1 + eps_high, c or None) or None; kl = the units' divergence estimate, stats["kl"]."""
    spec = LossSpec(name=name, paper_label=paper, **fields)

    def register(formula: Callable) -> Callable:
        def loss_fn(logp, old_logp, advantages, mask, *, beta=0.0, ref_logp=None, clip=None,
                    level="token", agg="token-mean", sample_weight=None, impl="fused"):
            return _loss(spec, formula, logp, old_logp, advantages, mask, beta=beta,
                         ref_logp=ref_logp, clip=clip, level=level, agg=agg,
                         sample_weight=sample_weight, impl=impl)
        loss_fn.__name__ = loss_fn.__qualname__ = formula.__name__
        loss_fn.__doc__ = formula.__doc__.strip() + _CALL_DOC
        loss_fn.spec, loss_fn.formula = spec, formula
        LOSSES[name], SPECS[name] = loss_fn, spec
        return formula
    return register


def _loss(spec: LossSpec, formula, logp, old_logp, advantages, mask, *, beta, ref_logp, clip,
          level, agg, sample_weight, impl):
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    check_options(spec.name, beta=beta, clip=clip, level=level, agg=agg)
    losses_fused.check_tensors(logp, old_logp, advantages, mask, ref_logp, level)
    losses_fused.check_sample_weight(sample_weight, logp, level)
    eps = parse_clip(spec.default_clip if clip is None else clip)
    bounds = None if eps is None else (1.0 - eps[0], 1.0 + eps[1], eps[2])
    if impl == "fused" and spec.name in losses_fused.KERNELS:
        return losses_fused.fused_loss(spec.name, logp, old_logp, advantages, mask, ref_logp,
                                       beta=float(beta), bounds=bounds, level=level, agg=agg,
                                       clamp=LOG_RATIO_CLAMP, sample_weight=sample_weight)
    return reference_loss(formula, logp, old_logp, advantages, mask, ref_logp, float(beta), bounds,
                          level, agg, sample_weight)


def reference_loss(formula, logp, old_logp, advantages, mask, ref_logp, beta: float, bounds,
                   level: str, agg: str, sample_weight=None):
    """formula's units, loss and statistics through autograd: what a level, an aggregation and
    each statistic mean (the fused kernel answers to this). Options and shapes: checked by _loss."""
    dt = torch.promote_types(logp.dtype, torch.float32)                     # at least float32
    lp, m = logp.to(dt), mask.to(dt)
    old, adv = old_logp.detach().to(dt), advantages.detach().to(dt)
    ref = None if ref_logp is None else ref_logp.detach().to(dt)
    n = m.sum(1)                                                            # [B] tokens per row
    checks = losses_fused.data_checks(mask, n, (lp - old).detach(),
                                      None if ref is None else (lp - ref).detach(), adv)
    losses_fused.refuse_bad_data(checks, logp, old_logp, advantages, mask, ref_logp)

    def unit(t):                                                            # a token, or a response
        return t if level == "token" else (t * m).sum(1, keepdim=True)

    def clamped(t):                                     # the value at the clamp, t's gradient
        return t + (t.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) - t).detach()

    log_w = clamped(unit(lp - old))
    log_rho = log_w if ref is None else clamped(unit(lp - ref))
    x = Units(logp=unit(lp), w=log_w.exp(), log_rho=log_rho, rho=log_rho.exp(),
              u=torch.ones_like(log_w) if ref is None else clamped(unit(ref - old)).exp(),
              A=adv[:, None] if adv.dim() == 1 else adv)
    out, kl = formula(x, beta, bounds)
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


# --- fully differentiable family: L = -w A + beta d ---

@register_loss("rpg-fkl", family="rpg", divergence="fkl", advantage="group-mean",
               paper="prop:policy_gradient_forward_kl")
def rpg_fkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, forward KL(pi_ref || pi_theta)
    (prop:policy_gradient_forward_kl; tab:off-policy-loss-normalized, row Forward KL:
    E_old[-w R - beta log pi_theta])."""
    kl = -x.u * x.log_rho                                   # d = -u log rho
    loss = -x.w * x.A + beta * kl                           # L = -w A - beta u log rho
    return fully_differentiable(x, loss, bounds), kl


@register_loss("rpg-rkl", family="rpg", divergence="rkl", advantage="group-mean",
               paper="prop:policy_gradient_reverse_kl")
def rpg_rkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, reverse KL(pi_theta || pi_ref)
    (prop:policy_gradient_reverse_kl; tab:off-policy-loss-normalized, row Reverse KL:
    E_old[w (-R + beta log w)])."""
    kl = x.w * x.log_rho                                    # d = w log rho
    loss = -x.w * x.A + beta * kl                           # L = -w A + beta w log rho
    return fully_differentiable(x, loss, bounds), kl


@register_loss("rpg-ufkl", family="rpg", divergence="ufkl", advantage="group-mean",
               paper="prop:policy_gradient_unormalized_forward_kl")
def rpg_ufkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, unnormalized forward KL UKL(pi_ref || pi_theta)
    (prop:policy_gradient_unormalized_forward_kl; tab:off-policy-loss, row Forward (UFKL):
    Z_old E[-w R + beta (w - log w - 1)])."""
    kl = x.w - x.u - x.u * x.log_rho                        # d = u k3(rho), u rho = w
    loss = -x.w * x.A + beta * kl                           # L = -w A + beta (w - u - u log rho)
    return fully_differentiable(x, loss, bounds), kl


@register_loss("rpg-urkl", family="rpg", divergence="urkl", advantage="group-mean",
               paper="prop:policy_gradient_unormalized_reverse_kl")
def rpg_urkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, unnormalized reverse KL UKL(pi_theta || pi_ref)
    (prop:policy_gradient_unormalized_reverse_kl; tab:off-policy-loss, row Reverse (URKL):
    Z_old E[-w R + beta (w log w - w)]; d is the paper's term + u, a constant)."""
    kl = x.u - x.w + x.w * x.log_rho                        # d = w k3(1/rho), w / rho = u
    loss = -x.w * x.A + beta * kl                           # L = -w A + beta (u - w + w log rho)
    return fully_differentiable(x, loss, bounds), kl


# --- REINFORCE-style family: L = -SG(w A + C_KL) log pi_theta; stats["kl"]: the d above ---

@register_loss("rpg-reinforce-fkl", family="rpg-reinforce", divergence="fkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_fkl")
def rpg_reinforce_fkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, forward KL (prop:offpolicy_reinforce_loss_fkl:
    -E_old[SG(w R + beta) log pi_theta])."""
    c_kl = beta * x.u                                       # w A' = w A + beta u
    return reinforce(x, c_kl, bounds), -x.u * x.log_rho


@register_loss("rpg-reinforce-rkl", family="rpg-reinforce", divergence="rkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_rkl")
def rpg_reinforce_rkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, reverse KL (prop:offpolicy_reinforce_loss_rkl,
    eq:loss_rkl_offpolicy_reinforce: -E_old[SG(w (R - beta log w - beta)) log pi_theta])."""
    c_kl = -beta * x.w * (x.log_rho + 1)                    # w A' = w (A - beta (log rho + 1))
    return reinforce(x, c_kl, bounds), x.w * x.log_rho


@register_loss("rpg-reinforce-ufkl", family="rpg-reinforce", divergence="ufkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_ufkl")
def rpg_reinforce_ufkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, unnormalized forward KL (prop:offpolicy_reinforce_loss_ufkl;
    tab:off-policy-loss-reinforce, row Forward (UFKL):
    -E[SG(Z_old (w R - beta (w - 1))) log pi_theta])."""
    c_kl = -beta * (x.w - x.u)                              # w A' = w A - beta (w - u)
    return reinforce(x, c_kl, bounds), x.w - x.u - x.u * x.log_rho


@register_loss("rpg-reinforce-urkl", family="rpg-reinforce", divergence="urkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_urkl")
def rpg_reinforce_urkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, unnormalized reverse KL (prop:offpolicy_reinforce_loss_urkl;
    tab:off-policy-loss-reinforce, row Reverse (URKL):
    -E[SG(Z_old w (R - beta log w)) log pi_theta])."""
    c_kl = -beta * x.w * x.log_rho                          # w A' = w (A - beta log rho)
    return reinforce(x, c_kl, bounds), x.u - x.w + x.w * x.log_rho


# --- PPO-clip baselines: they always clip (clip=None means their default_clip) ---

@register_loss("grpo", family="baseline", advantage="group-mean-std",
               default_clip=(0.2, 0.2, None), paper="subsec:grpo_main")
def grpo(x: Units, beta: float, bounds):
    """GRPO as published (subsec:grpo_main, J_GRPO): PPO clip on A plus beta k3(pi_ref/pi_theta)
    per token, no importance weight. Its expected gradient is not grad UKL off-policy."""
    kl = 1 / x.rho - 1 + x.log_rho                          # k3(pi_ref / pi_theta)
    out = dual_clip(x.w, x.A, bounds)
    return out._replace(loss=out.loss + beta * kl), kl      # clip term + beta k3


@register_loss("grpo-corrected", family="baseline", divergence="urkl", advantage="group-mean-std",
               default_clip=(0.2, 0.2, None), paper="subsec:grpo_main")
def grpo_corrected(x: Units, beta: float, bounds):
    """GRPO with the paper's corrected KL term (subsec:grpo_main, KL_GRPO-corrected): PPO clip on A
    plus beta w k3(pi_ref/pi_theta), unbiased for UKL(pi_theta || pi_ref) for every theta."""
    kl = x.u - x.w + x.w * x.log_rho                        # w k3(pi_ref / pi_theta)
    out = dual_clip(x.w, x.A, bounds)
    return out._replace(loss=out.loss + beta * kl), kl      # clip term + beta w k3


@register_loss("reinforce++-baseline", family="baseline", advantage="reinforce++-baseline",
               kl_in_reward=True, default_clip=(0.2, 0.2, None), paper="")
@register_loss("reinforce++", family="baseline", advantage="reinforce++", kl_in_reward=True,
               default_clip=(0.2, 0.2, None), paper="")
@register_loss("dapo", family="baseline", advantage="group-mean-std", has_kl=False,
               default_clip=(0.2, 0.28, None), paper="")
def ppo_clip(x: Units, beta: float, bounds):
    """PPO clip on A with no KL term in the loss (beta must be 0). dapo (Yu et al. 2025):
    clip-higher (default eps (0.2, 0.28)), no KL anywhere. reinforce++ (Hu et al. 2025,
    arXiv:2501.03262): token advantages from rpg_ref.advantages.reinforce_pp (k1 KL to pi_ref in
    the reward, return to go, batch whitening; reinforce++-baseline subtracts the group-mean
    reward first). stats["kl"] reports the UKL(pi_theta || pi_ref) estimate w k3(1/rho)."""
    return dual_clip(x.w, x.A, bounds), x.u - x.w + x.w * x.log_rho
