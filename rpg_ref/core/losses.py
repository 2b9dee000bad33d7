"""Every surrogate loss of the RPG paper and its baselines, written as the paper writes it.

This module is the specification and the code that trains: each loss is one function of the
paper's per-sample quantities (Section 3 (sec:offpolicy_policy_gradients)), registered under its
literal name, and ``LOSSES[name](...)`` runs that function, differentiated by autograd. The paper
is cited as "Proposition 3.2 (prop:...)": the PDF's number, then the LaTeX label
(derivations/paper_numbers.txt). A unit x, sampled from the behaviour policy pi_old, is a token
(``level="token"``, as verl and the paper's code apply the losses) or a whole response
(``level="sequence"``):

    w       = pi_theta(x) / pi_old(x)      importance ratio          (differentiable)
    log_rho = log(pi_theta(x) / pi_ref(x)) log-ratio to the reference (differentiable)
    u       = pi_ref(x)  / pi_old(x)       = w / rho                 (constant)
    A       = advantages (R - b; pass R itself for the paper's literal formulas)

Beyond the paper, which assumes pi_ref = pi_old (u = 1, rho = w): with ``ref_logp`` every rpg loss
keeps E_old[grad L] = -grad J, J = E_theta[A] - beta D(pi_theta, pi_ref), because its KL part d(x)
has E_old[d] = D for every theta. Each d is the paper's term up to a theta-independent constant
(same gradient), chosen so that ``stats["kl"]`` estimates D itself (rpg_ref/core/divergences.py).

Numerics: inputs are upcast to at least float32; log-ratios are clamped to +-LOG_RATIO_CLAMP
before exp() (outside, value and gradient are those at the clamp: finite, the weight saturates);
bad input raises a ValueError naming the argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
)

__all__ = ["AGGREGATIONS", "LEVELS", "LOG_RATIO_CLAMP", "LOSSES", "SPECS", "Loss", "LossOptions",
           "LossSpec", "UnitLoss", "Units", "aggregate", "check_beta", "dual_clip", "get_loss",
           "parse_clip", "register_loss", "resolve_options", "rpg_style_clip"]

LOG_RATIO_CLAMP = 40.0  # e^40 ~ 2.4e17; products of two such ratios stay finite in float32

LOSSES: dict[str, Loss] = {}  # name -> Loss: Loss.__call__, then the registered formula
SPECS: dict[str, LossSpec] = {}


def get_loss(name: str) -> Loss:
    """Return the loss function registered under ``name``; ValueError lists valid names."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


# --- a loss's options, resolved and checked ---

def resolve_options(name: str, *, beta, clip=None, level: str = "token", agg: str = "token-mean",
                    no_clip: bool = False, run: bool = False) -> LossOptions:
    """The options of the loss ``name`` checked (a one-line ValueError for the first violation)
    and resolved: clip=None means the loss's default_clip. ``beta`` is the loss's own KL
    coefficient; with run=True it is a training run's, and goes to the reward where the loss puts
    its KL there (reinforce++: reward_beta), else to the loss."""
    get_loss(name)                                      # an unknown name lists the valid ones
    spec = SPECS[name]
    check_beta(beta)
    reward_beta = 0.0
    if run and spec.kl_in_reward:
        beta, reward_beta = 0.0, beta
    if beta != 0 and not spec.has_kl:
        raise ValueError(f"{name} has no KL term; got beta={beta}: use beta=0")
    if beta != 0 and spec.kl_in_reward:
        raise ValueError(f"{name} puts its k1 KL penalty into the reward: pass beta to "
                         f"rpg_ref.core.advantages.reinforce_pp and call the loss with beta=0; "
                         f"got beta={beta}")
    eps = parse_clip(clip)
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
    eps = eps if eps is not None else parse_clip(spec.default_clip)
    bounds = None if eps is None else (1.0 - eps[0], 1.0 + eps[1], eps[2])
    return LossOptions(name, float(beta), float(reward_beta), bounds, level, agg)


# --- the per-unit quantities, and how per-unit values become one number ---

@dataclass
class Units:
    """The paper's per-sample quantities, one entry per unit: [B, T] tokens or [B, 1] responses."""
    logp: Tensor            # log pi_theta(x): the only input with a gradient (ell = -logp)
    w: Tensor               # pi_theta / pi_old
    log_rho: Tensor         # log(pi_theta / pi_ref)
    u: Tensor               # pi_ref / pi_old, constant (ones when pi_ref = pi_old)
    A: Tensor               # advantages, constant: [B, 1] or [B, T]


def units(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor,
          mask: Tensor, level: str) -> Units:
    """Each unit's quantities from per-token log-probs [B, T]; a response's log-ratios are the sums
    of its tokens'. Beyond +-LOG_RATIO_CLAMP a log-ratio takes the value at the clamp and keeps
    derivative 1 in log pi_theta, so that value and gradient are the formula's at the clamp."""
    def unit(t):                                                            # a token, or a response
        return t if level == "token" else (t * mask).sum(1, keepdim=True)

    def clamped(t):
        return t + (t.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) - t).detach()

    log_w = clamped(unit(logp - old_logp))
    log_rho = log_w if ref_logp is None else clamped(unit(logp - ref_logp))
    u = (torch.ones_like(log_w) if ref_logp is None else
         unit(ref_logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp())
    A = advantages[:, None] if advantages.dim() == 1 else advantages
    return Units(logp=unit(logp), w=log_w.exp(), log_rho=log_rho, u=u.detach(), A=A)


def aggregate(values: Tensor, mask: Tensor, level: str, agg: str) -> Tensor:
    """One number from per-unit values ([B, T] tokens or [B, 1] responses; a response counts as its
    tokens' sum): token-mean = sum / tokens; seq-mean-token-mean = mean over responses of sum /
    the response's tokens; seq-mean-token-sum = mean over responses of sum."""
    n = mask.sum(1)                                                         # [B] tokens per row
    rows = (values * mask).sum(1) if level == "token" else values[:, 0]     # [B] each row's sum
    if agg == "token-mean":
        return rows.sum() / n.sum()
    return (rows / n).mean() if agg == "seq-mean-token-mean" else rows.mean()


UNIT_MEAN = {"token": "token-mean", "sequence": "seq-mean-token-sum"}   # the mean over units


# --- the two clipping algorithms ---

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


def fully_differentiable(x: Units, d: Tensor, beta: float, bounds: tuple | None) -> UnitLoss:
    """L = -w A + beta d, or Algorithm 1's dual clip of L = -w A_hat with the differentiable
    regularized advantage A_hat = A - beta d/w, so that nothing clipped gives L. (The algorithm's
    example A_hat_RKL = A - beta(log w + 1) contradicts its unclipped line by beta*w:
    derivations/ERRATA.md.)"""
    if bounds is None:
        return UnitLoss(-x.w * x.A + beta * d)                              # L = -w A + beta d
    return dual_clip(x.w, x.A - beta * d / x.w, bounds)                     # A_hat = A - beta d/w


def reinforce(x: Units, c_kl: Tensor, bounds: tuple | None) -> UnitLoss:
    """L = -SG(w A') log pi_theta with w A' = w A + C_KL (C_KL: the KL part of the weight), or
    its RPG-Style Clip."""
    if bounds is None:
        return UnitLoss(-(x.w * x.A + c_kl).detach() * x.logp)              # -SG(w A + C_KL) log pi
    return rpg_style_clip(x, c_kl, bounds)


def kl_term(x: Units, kl: str) -> Tensor:
    """d(x) of the row ``kl`` of DIVERGENCES: E_old[d] = D(pi_theta, pi_ref) for every theta."""
    return DIVERGENCES[kl].estimate(x.w, x.log_rho, x.u)


# --- registry: the call every loss shares ---

@dataclass(frozen=True)
class Loss:
    """A registered loss, LOSSES[name]: its formula (a function of this module, written as the
    paper writes it) and the path every loss shares, ``__call__``: the inputs checked, the units
    built, the formula called, its per-unit loss aggregated, the statistics (detached). The
    gradient is autograd's, through the formula.

    Call: (logp, old_logp, advantages, mask, *, beta=0, ref_logp=None, clip=None, level="token",
    agg="token-mean", sample_weight=None, options=None). logp, old_logp, mask (0/1, a token in
    every row), ref_logp: [B, T]; ref_logp None means pi_ref = pi_old (the paper). advantages: [B]
    or [B, T] ([B] at level "sequence"). clip: (eps_low, eps_high, c), c None/inf: no dual clip.
    agg: token-mean, seq-mean-token-mean or seq-mean-token-sum. sample_weight: None, or a constant
    weight >= 0 of each unit's loss term before aggregation, [B, T] (level "token") or [B] (one per
    response, any level): the rollout correction's pi_old / pi_sampler
    (rpg_ref.trainer.rollout_correction). options: a LossOptions resolved for this loss
    (rpg_ref.core.losses.resolve_options) instead of beta, clip, level and agg: a trainer resolves
    them once and passes them to every call.
    Returns (loss, stats): stats are detached 0-dim tensors clip_frac_low, clip_frac_high,
    clip_frac_dual, ratio_mean, kl (the divergence estimate, mean over units) and kl_old (token-mean
    estimate of KL(pi_theta || pi_old)).
    """

    spec: LossSpec
    formula: Callable  # formula(x: Units, beta, bounds) -> (UnitLoss, kl), e.g. rpg_reinforce_urkl

    def __call__(self, logp, old_logp, advantages, mask, *, beta=0.0, ref_logp=None, clip=None,
                 level="token", agg="token-mean", sample_weight=None, options=None):
        name = self.spec.name
        if options is None:
            options = resolve_options(name, beta=beta, clip=clip, level=level, agg=agg)
        elif not isinstance(options, LossOptions) or options.loss != name:
            raise ValueError(f"{name}: options must be a LossOptions resolved for {name} "
                             f"(rpg_ref.core.losses.resolve_options), got {options!r}")
        elif (beta, clip, level, agg) != (0.0, None, "token", "token-mean"):
            raise ValueError(f"{name}: give options or beta/clip/level/agg, not both")
        check_tensors(logp, old_logp, advantages, mask, ref_logp, options.level)
        check_sample_weight(sample_weight, logp, options.level)
        dt = torch.promote_types(logp.dtype, torch.float32)                 # at least float32
        lp, m = logp.to(dt), mask.to(dt)
        old, adv = old_logp.detach().to(dt), advantages.detach().to(dt)
        ref = None if ref_logp is None else ref_logp.detach().to(dt)
        log_w_tok = (lp - old).detach()                                     # [B, T] per token
        checks = data_checks(mask, m.sum(1), log_w_tok,
                             None if ref is None else lp.detach() - ref, adv)
        refuse_bad_data(checks, logp, old_logp, advantages, mask, ref_logp)

        x = units(lp, old, ref, adv, m, options.level)
        out, kl = self.formula(x, options.beta, options.bounds)             # the paper's loss
        unit_loss = out.loss                                                # [B, T] or [B, 1]
        if sample_weight is not None:               # each unit's term times its constant weight
            sw = sample_weight.detach().to(dt)
            unit_loss = unit_loss * (sw[:, None] if sw.dim() == 1 else sw)
        loss = aggregate(unit_loss, m, options.level, options.agg)

        def mean(t):                                    # over units; a missing clip branch: 0
            t = torch.zeros_like(x.w) if t is None else t.detach().to(dt)
            return aggregate(t, m, options.level, UNIT_MEAN[options.level])

        log_w_tok = log_w_tok.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl_old = DIVERGENCES["urkl"].estimate(log_w_tok.exp(), log_w_tok, 1.0)  # pi_ref = pi_old
        return loss.to(logp.dtype), {
            "clip_frac_low": mean(out.low), "clip_frac_high": mean(out.high),
            "clip_frac_dual": mean(out.dual), "ratio_mean": mean(x.w), "kl": mean(kl),
            "kl_old": aggregate(kl_old, m, "token", "token-mean")}  # per token at any level


def register_loss(name: str, *, paper: str, **fields) -> Callable:
    """Decorator: register ``formula(x: Units, beta, bounds) -> (UnitLoss, kl)`` as
    LOSSES[name] = Loss(its spec, formula) (``paper``: its paper_label, ``fields``: the other
    LossSpec fields), and return the formula unchanged. bounds = (1 - eps_low, 1 + eps_high,
    c or None) or None; kl = the units' KL estimate d, stats["kl"]."""
    spec = LossSpec(name=name, paper_label=paper, **fields)

    def register(formula: Callable) -> Callable:
        LOSSES[name], SPECS[name] = Loss(spec, formula), spec
        return formula
    return register


# --- fully differentiable family: L = -w A + beta d, clipped as -w A_hat, A_hat = A - beta d/w ---

@register_loss("rpg-fkl", family="rpg", kl="fkl", advantage="group-mean",
               paper="prop:policy_gradient_forward_kl")
def rpg_fkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, forward KL(pi_ref || pi_theta)
    (Proposition E.1 (prop:policy_gradient_forward_kl); Table 4 (tab:off-policy-loss-normalized),
    row Forward KL: E_old[-w R - beta log pi_theta])."""
    d = kl_term(x, "fkl")                                   # d = -u log rho
    return fully_differentiable(x, d, beta, bounds), d      # L = -w A - beta u log rho


@register_loss("rpg-rkl", family="rpg", kl="rkl", advantage="group-mean",
               paper="prop:policy_gradient_reverse_kl")
def rpg_rkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, reverse KL(pi_theta || pi_ref)
    (Proposition E.3 (prop:policy_gradient_reverse_kl); Table 4 (tab:off-policy-loss-normalized),
    row Reverse KL: E_old[w (-R + beta log w)])."""
    d = kl_term(x, "rkl")                                   # d = w log rho
    return fully_differentiable(x, d, beta, bounds), d      # L = -w A + beta w log rho


@register_loss("rpg-ufkl", family="rpg", kl="ufkl", advantage="group-mean",
               paper="prop:policy_gradient_unormalized_forward_kl")
def rpg_ufkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, unnormalized forward KL UKL(pi_ref || pi_theta)
    (Proposition 3.2 (prop:policy_gradient_unormalized_forward_kl); Table 1 (tab:off-policy-loss),
    row Forward (UFKL): Z_old E[-w R + beta (w - log w - 1)])."""
    d = kl_term(x, "ufkl")                                  # d = u k3(rho) = w - u - u log rho
    return fully_differentiable(x, d, beta, bounds), d      # L = -w A + beta (w - u - u log rho)


@register_loss("rpg-urkl", family="rpg", kl="urkl", advantage="group-mean",
               paper="prop:policy_gradient_unormalized_reverse_kl")
def rpg_urkl(x: Units, beta: float, bounds):
    """Fully differentiable RPG loss, unnormalized reverse KL UKL(pi_theta || pi_ref)
    (Proposition 3.6 (prop:policy_gradient_unormalized_reverse_kl); Table 1 (tab:off-policy-loss),
    row Reverse (URKL): Z_old E[-w R + beta (w log w - w)]; d is the paper's term + u, a
    constant)."""
    d = kl_term(x, "urkl")                                  # d = w k3(1/rho) = u - w + w log rho
    return fully_differentiable(x, d, beta, bounds), d      # L = -w A + beta (u - w + w log rho)


# --- REINFORCE-style family: L = -SG(w A + C_KL) log pi_theta, C_KL = -beta dd/dlog pi_theta
# (the gradient of beta d is -C_KL grad log pi_theta); stats["kl"]: the d above ---

@register_loss("rpg-reinforce-fkl", family="rpg-reinforce", kl="fkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_fkl")
def rpg_reinforce_fkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, forward KL
    (Proposition F.1 (prop:offpolicy_reinforce_loss_fkl): -E_old[SG(w R + beta) log pi_theta])."""
    c_kl = beta * x.u                                       # w A' = w A + beta u
    return reinforce(x, c_kl, bounds), kl_term(x, "fkl")


@register_loss("rpg-reinforce-rkl", family="rpg-reinforce", kl="rkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_rkl")
def rpg_reinforce_rkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, reverse KL (Proposition F.4 (prop:offpolicy_reinforce_loss_rkl),
    Eq. (F.2) (eq:loss_rkl_offpolicy_reinforce):
    -E_old[SG(w (R - beta log w - beta)) log pi_theta])."""
    c_kl = -beta * x.w * (x.log_rho + 1.0)                  # w A' = w (A - beta (log rho + 1))
    return reinforce(x, c_kl, bounds), kl_term(x, "rkl")


@register_loss("rpg-reinforce-ufkl", family="rpg-reinforce", kl="ufkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_ufkl")
def rpg_reinforce_ufkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, unnormalized forward KL
    (Proposition F.3 (prop:offpolicy_reinforce_loss_ufkl); Table 2 (tab:off-policy-loss-reinforce),
    row Forward (UFKL):
    -E[SG(Z_old (w R - beta (w - 1))) log pi_theta])."""
    c_kl = -beta * (x.w - x.u)                              # w A' = w A - beta (w - u)
    return reinforce(x, c_kl, bounds), kl_term(x, "ufkl")


@register_loss("rpg-reinforce-urkl", family="rpg-reinforce", kl="urkl",
               advantage="group-mean", paper="prop:offpolicy_reinforce_loss_urkl")
def rpg_reinforce_urkl(x: Units, beta: float, bounds):
    """REINFORCE-style RPG loss, unnormalized reverse KL
    (Proposition F.5 (prop:offpolicy_reinforce_loss_urkl); Table 2 (tab:off-policy-loss-reinforce),
    row Reverse (URKL):
    -E[SG(Z_old w (R - beta log w)) log pi_theta])."""
    c_kl = -beta * x.w * x.log_rho                          # w A' = w (A - beta log rho)
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
