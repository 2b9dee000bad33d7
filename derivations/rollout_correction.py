"""Beyond the paper: rollout correction for a sampler mu that is not pi_old.

The paper's identities hold for samples from pi_old: E_old[grad L] = -grad J. A trainer recomputes
log pi_old itself but takes its samples from an engine whose distribution mu may differ (bf16 vLLM
vs an fp32 trainer). rpg_ref.trainer.rollout_correction weights each sample's loss by r = pi_old /
mu (capped or masked above C); the losses take the weight as ``sample_weight``. Checked here,
through rpg_ref.core.losses and rpg_ref.trainer.rollout_correction, by float64 enumeration (1e-10)
and Monte Carlo:

  (exact)  no cap, one weight per sample: E_mu[r grad L] = E_old[grad L], so = -grad J for every
           rpg loss. A sample is one outcome of a K = 6 softmax (pi_old of mass Z_old = 1.3,
           pi_ref = pi_old or not), or a whole response of the V = 3, L = 3 autoregressive policy
           of token_sequence.py at level="sequence" (r = prod_t r_t). A token-level loss weighted
           per response gets back exactly its own E_old expectation.
  (token)  per-token weights r_t on a token-level loss are biased:
               E_mu[sum_t r_t grad l_t] = E_old[sum_t grad l_t] + B,
               B = E_mu[sum_t r_t (1 - prod_{s != t} r_s) grad l_t];
           when l_t depends on y_<=t only (the KL part, A = 0) the future ratios drop out
           (E_mu[prod_{s>t} r_s | y_<=t] = 1): B = E_mu[sum_t r_t (1 - prod_{s<t} r_s) grad l_t],
           which is 0 when mu and pi_old differ only in the last token's distribution. The reward
           part (A depends on the whole response) keeps the suffix term.
  (cap)    with cap C, r = pi_old / mu:
           tis  min(r, C)    E_mu[grad] = -grad J - sum_{x: r > C} (pi_old(x) - C mu(x)) grad l(x)
           mis  r 1{r <= C}  E_mu[grad] = -grad J - sum_{x: r > C} pi_old(x) grad l(x)
           i.e. -E_mu[(r - C)_+ grad l] and -E_mu[r 1{r > C} grad l].
"""

from __future__ import annotations

import math

import torch

from rpg_ref.core.losses import get_loss
from rpg_ref.trainer.rollout_correction import importance_weights

from . import paper
from ._core import DTYPE, Checker, claim, jac, make_problem, mc_n, rel_err, row_grads
from .token_sequence import AR, RPG_LOSSES, sequence_grad, token_logp

Z_OLD = 1.3


# ---------------------------------------------------------------------------
# one-outcome samples (K-outcome softmax)
# ---------------------------------------------------------------------------

def k_problem(seed: int, ref_dist):
    """make_problem's pi_theta, pi_old (mass Z_OLD), pi_ref, R, beta, plus a sampler mu: the
    normalized pi_old moved by 0.7 N(0, 1) in logit space."""
    P = make_problem(K=6, seed=seed, z_old=Z_OLD, dist=0.9, ref_dist=ref_dist)
    g = torch.Generator().manual_seed(1000 + seed)
    mu_logp = torch.log_softmax(P.old_logp + 0.7 * torch.randn(6, generator=g, dtype=DTYPE), -1)
    return P, mu_logp


def k_weights(P, mu_logp, mode="tis", cap=math.inf):
    K = len(mu_logp)
    w, _ = importance_weights(
        P.old_logp.view(K, 1),
        mu_logp.view(K, 1),
        torch.ones(K, 1, dtype=DTYPE),
        mode=mode,
        level="sequence",
        cap=cap,
    )
    return w                                                                      # [K]


def k_expected_grad(name, P, dist_logp, weight=None, clip=None):
    """(sum_x dist(x) grad [c(x) l(x)], G [K, K] per-outcome gradients of c(x) l(x)): one loss call
    on the [K, 1] batch of every outcome, c = weight (None: 1)."""
    K = P.logits.shape[0]
    th = P.logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(th, -1)
    ref = None if P.ref_logp is None else P.ref_logp.view(K, 1)
    dl = row_grads(
        get_loss(name),
        logp.view(K, 1),
        P.old_logp.view(K, 1),
        P.R,
        torch.ones(K, 1, dtype=DTYPE),
        beta=P.beta,
        ref_logp=ref,
        clip=clip,
        sample_weight=weight,
    )   # [K, 1]
    G = dl * jac(logp, th)                                                        # [K, K]
    return dist_logp.exp() @ G, G


def minus_grad_j(name, P):
    th = P.logits.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(
        paper.objective_torch(name.rsplit("-", 1)[1], th, P.old_logp, P.R, P.beta, P.ref_logp), th
    )
    return -g


def cap_coef(mode: str, cap: float, old_logp, mu_logp):
    """The closed forms' coefficients, from the probabilities themselves (not from the weights):
    bias = -sum_x coef(x) grad l(x), coef = (pi_old - C mu) 1{r > C} (tis), pi_old 1{r > C}
    (mis)."""
    p_old, p_mu = old_logp.exp(), mu_logp.exp()
    over = p_old > cap * p_mu                                                     # r > C
    return torch.where(over, p_old - cap * p_mu if mode == "tis" else p_old, 0.0)


def cap_bias(mode: str, cap: float, old_logp, mu_logp, G):
    """(-sum_x coef(x) G[x], number of samples above the cap); G: per-sample gradients of l."""
    coef = cap_coef(mode, cap, old_logp, mu_logp)
    return -(coef @ G), int((coef > 0).sum())


def cap_between(r, q: float) -> float:
    """A cap >= 1 halfway between two neighbouring ratios near the q-quantile of r: some samples
    above it, some below, none on it (where masking's weight jumps)."""
    s = r.sort().values
    i = min(max(int(q * len(s)), 1), len(s) - 1)
    return max(1.0, float(s[i - 1] + s[i]) / 2)


def k_mc(ck: Checker, label, name, P, mu_logp, weight, exact, G, n: int, seed: int):
    """N outcomes from mu, ONE weighted loss call on the [N, 1] batch; its gradient is the mean of
    the per-outcome gradients G[x_i] (asserted), compared with ``exact`` by z-scores."""
    idx = torch.multinomial(
        mu_logp.exp(), n, replacement=True, generator=torch.Generator().manual_seed(seed)
    )
    th = P.logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(th, -1)[idx].view(n, 1)
    ref = None if P.ref_logp is None else P.ref_logp[idx].view(n, 1)
    loss, _ = get_loss(name)(
        logp,
        P.old_logp[idx].view(n, 1),
        P.R[idx],
        torch.ones(n, 1, dtype=DTYPE),
        beta=P.beta,
        ref_logp=ref,
        sample_weight=weight[idx],
    )
    (g,) = torch.autograd.grad(loss, th)
    ck.fact(f"{label}: batched weighted gradient == mean of per-outcome gradients",
            float((g - G[idx].mean(0)).abs().max()) <= 1e-12, quiet=True)
    ck.mc(f"{label}: samples from mu, weighted", G[idx], exact)


# ---------------------------------------------------------------------------
# whole responses (V = 3, L = 3 autoregressive policy: 27 responses)
# ---------------------------------------------------------------------------

def ar_setting(seed: int = 0, mu_dist: float = 0.5, last_token_only: bool = False):
    """theta (off-policy), log pi_old, log pi_ref, log mu per token [27, 3], R [27]. mu: pi_old's
    logits moved by mu_dist N(0, 1), on every prefix or (last_token_only) on the length-2
    prefixes."""
    g = torch.Generator().manual_seed(seed)
    n, V = AR.n_prefix, AR.V
    th_old = torch.randn(n, V, generator=g, dtype=DTYPE)
    theta = th_old + 0.7 * torch.randn(n, V, generator=g, dtype=DTYPE)
    th_ref = th_old + 0.8 * torch.randn(n, V, generator=g, dtype=DTYPE)
    shift = mu_dist * torch.randn(n, V, generator=g, dtype=DTYPE)
    if last_token_only:
        shift[: n - V ** (AR.L - 1)] = 0                  # prefixes shorter than L - 1: mu = pi_old
    R = torch.randn(len(AR.seqs), generator=g, dtype=DTYPE)
    old, ref, mu = (token_logp(t).detach() for t in (th_old, th_ref, th_old + shift))
    return theta, old, ref, mu, R


def _row_token_grads(name, level, theta, old_tok, ref_tok, adv, beta, weight=None):
    """(theta as a leaf, token log-probs [27, 3], d loss / d token log-prob [27, 3]): one loss
    call on the 27 responses (agg seq-mean-token-sum), per-row gradients (_core.row_grads)."""
    th = theta.detach().clone().requires_grad_(True)
    tok = token_logp(th)  # [27, 3]
    dl = row_grads(get_loss(name), tok, old_tok, adv, torch.ones_like(tok), beta=beta,
                   ref_logp=ref_tok, level=level, agg="seq-mean-token-sum",
                   sample_weight=weight)  # [27, 3]
    return th, tok, dl


def ar_expected_grad(name, level, theta, old_tok, ref_tok, dist_tok, adv, beta, weight=None):
    """sum_y dist(y) grad [c(y) loss(y)]: the per-row gradients reweighted by dist(y) and chained
    to the logits table."""
    th, tok, dl = _row_token_grads(name, level, theta, old_tok, ref_tok, adv, beta, weight)
    (g,) = torch.autograd.grad((dist_tok.sum(1).exp()[:, None] * dl * tok).sum(), th)
    return g.reshape(-1)


def ar_token_bias(name, theta, old_tok, ref_tok, mu_tok, adv, beta, prefix_only: bool):
    """B = E_mu[sum_t r_t (1 - prod_{s != t} r_s) grad l_t] (prefix_only: prod over s < t), from
    the unweighted token-level loss's per-token gradients (token t's term depends on log pi(y_t)
    only)."""
    th, tok, dl = _row_token_grads(name, "token", theta, old_tok, ref_tok, adv, beta)  # unweighted
    log_r = old_tok - mu_tok                                                      # [27, 3]
    others = log_r.cumsum(1) - log_r if prefix_only else log_r.sum(1, keepdim=True) - log_r
    coef = mu_tok.sum(1).exp()[:, None] * log_r.exp() * (1 - others.exp())      # [27, 3]
    (g,) = torch.autograd.grad((coef * dl * tok).sum(), th)
    return g.reshape(-1)


def ar_weights(old_tok, mu_tok, level, mode="tis", cap=math.inf):
    w, _ = importance_weights(
        old_tok, mu_tok, torch.ones_like(old_tok), mode=mode, level=level, cap=cap
    )
    return w


# ---------------------------------------------------------------------------
# the claims
# ---------------------------------------------------------------------------

@claim(
    "rollout-correction-exact",
    "sec:offpolicy_policy_gradients",
    "Beyond the paper: with samples from a sampler mu != pi_old, weighting each sample's loss by "
    "r = pi_old/mu (no cap) gives E_mu[grad r L] = -grad J for every rpg loss (one-token samples; "
    "whole responses at level 'sequence'); unweighted, E_mu[grad L] != -grad J.",
)
def check_rollout_correction_exact(ck: Checker, fast: bool) -> None:
    for ref_dist in (None, 0.8):
        P, mu = k_problem(seed=3, ref_dist=ref_dist)
        tag = f"pi_ref {'= pi_old' if ref_dist is None else '!= pi_old'}"
        for name in RPG_LOSSES:
            target = minus_grad_j(name, P)
            for mode in ("tis", "mis"):              # cap inf: both are plain importance sampling
                g, _ = k_expected_grad(name, P, mu, k_weights(P, mu, mode))
                ck.exact(f"{name} {tag} {mode} cap=inf: E_mu[grad r L] == -grad J", g, target)
            g_raw, _ = k_expected_grad(name, P, mu)
            ck.fact(
                f"{name} {tag}: unweighted E_mu[grad L] != -grad J",
                rel_err(g_raw, target) > 1e-2,
                f"rel err {rel_err(g_raw, target):.3g}",
                quiet=True,
            )
            # any loss, clipped too: E_mu[r grad L] = E_old[grad L]
            clip = (0.2, 0.28, 3.0)
            g_clip, _ = k_expected_grad(name, P, mu, k_weights(P, mu), clip=clip)
            ck.exact(f"{name} {tag} clipped: E_mu[grad r L] == E_old[grad L]", g_clip,
                     k_expected_grad(name, P, P.old_logp, clip=clip)[0])
    # whole responses: sequence-level weights on sequence-level losses, every rpg loss
    theta, old_tok, ref_tok, mu_tok, R = ar_setting()
    w_seq = ar_weights(old_tok, mu_tok, "sequence")                               # [27]
    for ref_name, ref in (("pi_ref = pi_old", old_tok), ("pi_ref != pi_old", ref_tok)):
        for name in RPG_LOSSES:
            target = -sequence_grad(name.rsplit("-", 1)[1], theta, ref, R, 0.5)
            g = ar_expected_grad(name, "sequence", theta, old_tok, ref, mu_tok, R, 0.5, w_seq)
            ck.exact(f"{name} level=sequence {ref_name}: E_mu[grad r L] == -grad J_seq", g, target)
            g_tok = ar_expected_grad(name, "token", theta, old_tok, ref, mu_tok, R, 0.5, w_seq)
            ck.exact(
                f"{name} level=token, weight per response {ref_name}: E_mu == E_old of the token "
                "loss",
                g_tok,
                ar_expected_grad(name, "token", theta, old_tok, ref, old_tok, R, 0.5),
            )
    P, mu = k_problem(seed=3, ref_dist=0.8)
    for name in ("rpg-urkl", "rpg-reinforce-fkl"):
        w = k_weights(P, mu)
        g, G = k_expected_grad(name, P, mu, w)
        k_mc(ck, name, name, P, mu, w, minus_grad_j(name, P), G, mc_n(fast), seed=71)
    ck.note("symbolic: n/a (E_mu[(pi_old/mu) f] = sum_x pi_old(x) f(x) is one line; the checks are "
            "that the library applies it: float64 enumeration and Monte Carlo)")


@claim(
    "rollout-correction-token-level",
    "sec:offpolicy_policy_gradients",
    "Beyond the paper: per-token weights r_t on a token-level loss give E_old[grad L] + B, "
    "B = E_mu[sum_t r_t (1 - prod_{s!=t} r_s) grad l_t]; for the KL part (l_t a function of y_<=t) "
    "only the prefix ratios s < t enter B, which vanishes when mu differs from pi_old in the last "
    "token only.",
)
def check_rollout_correction_token_level(ck: Checker, fast: bool) -> None:
    theta, old_tok, ref_tok, mu_tok, R = ar_setting()
    w_tok = ar_weights(old_tok, mu_tok, "token")                                  # [27, 3]
    zero = torch.zeros_like(R)
    worst = {}
    for name in RPG_LOSSES:
        for comp, adv, beta in (("both", R, 0.5), ("KL part", zero, 1.0)):
            got = ar_expected_grad(name, "token", theta, old_tok, ref_tok, mu_tok, adv, beta, w_tok)
            e_old = ar_expected_grad(name, "token", theta, old_tok, ref_tok, old_tok, adv, beta)
            bias = ar_token_bias(
                name, theta, old_tok, ref_tok, mu_tok, adv, beta, prefix_only=False
            )
            ck.exact(f"{name} {comp}: E_mu[sum r_t grad l_t] == E_old + B", got, e_old + bias)
            prefix = ar_token_bias(
                name, theta, old_tok, ref_tok, mu_tok, adv, beta, prefix_only=True
            )
            if comp == "KL part":
                ck.exact(f"{name} KL part: B == prefix-only B", bias, prefix)
            else:
                ck.fact(
                    f"{name} reward and KL: the suffix ratios matter (B != prefix-only B)",
                    rel_err(prefix, bias) > 1e-3,
                    f"rel diff {rel_err(prefix, bias):.3g}",
                    quiet=True,
                )
            ck.fact(
                f"{name} {comp}: token-level weights are biased here",
                rel_err(got, e_old) > 1e-3,
                f"rel err {rel_err(got, e_old):.3g}",
                quiet=True,
            )
            worst[comp] = max(worst.get(comp, 0.0), rel_err(got, e_old))
    theta, old_tok, ref_tok, mu_tok, R = ar_setting(last_token_only=True)
    w_tok = ar_weights(old_tok, mu_tok, "token")
    for name in RPG_LOSSES:
        got = ar_expected_grad(name, "token", theta, old_tok, ref_tok, mu_tok, zero, 1.0, w_tok)
        ck.exact(f"{name} KL part, mu != pi_old in the last token only: exact",
                 got, ar_expected_grad(name, "token", theta, old_tok, ref_tok, old_tok, zero, 1.0))
    ck.note(f"relative bias of token-level weights (mu = pi_old's logits + 0.5 N(0,1) per prefix): "
            f"reward and KL up to {worst['both']:.2g}, KL part up to {worst['KL part']:.2g}")
    ck.note("symbolic: n/a (float64 enumeration of all 27 responses)")


@claim(
    "rollout-correction-cap",
    "sec:offpolicy_policy_gradients",
    "Beyond the paper: with cap C, truncated weights min(r, C) give E_mu[grad] = -grad J - "
    "E_mu[(r - C)_+ grad l] and masked weights r 1{r <= C} give -grad J - E_mu[r 1{r > C} grad l], "
    "for every rpg loss.",
)
def check_rollout_correction_cap(ck: Checker, fast: bool) -> None:
    for ref_dist in (None, 0.8):
        P, mu = k_problem(seed=3, ref_dist=ref_dist)
        r = (P.old_logp - mu).exp()
        cap = cap_between(r, 0.5)
        for name in RPG_LOSSES:
            target = minus_grad_j(name, P)
            # unweighted per-outcome
            _, G = k_expected_grad(name, P, mu)
            for mode in ("tis", "mis"):
                g, _ = k_expected_grad(name, P, mu, k_weights(P, mu, mode, cap))
                bias, n_over = cap_bias(mode, cap, P.old_logp, mu, G)
                ck.fact(f"cap {cap:.3g}: some outcomes capped, some not", 0 < n_over < len(r),
                        f"{n_over} of {len(r)} above", quiet=True)
                ck.exact(
                    f"{name} ref_dist={ref_dist} {mode} C={cap:.3g}: E_mu[grad] == -grad J + bias",
                    g,
                    target + bias,
                )
                ck.fact(
                    f"{name} {mode}: the bias is not 0",
                    float(bias.norm()) > 1e-3 * float(target.norm()),
                    f"|bias| {float(bias.norm()):.3g}",
                    quiet=True,
                )
    theta, old_tok, ref_tok, mu_tok, R = ar_setting()
    cap = cap_between((old_tok - mu_tok).sum(1).exp(), 0.7)
    for name in RPG_LOSSES:
        target = -sequence_grad(name.rsplit("-", 1)[1], theta, ref_tok, R, 0.5)
        for mode in ("tis", "mis"):
            g = ar_expected_grad(name, "sequence", theta, old_tok, ref_tok, mu_tok, R, 0.5,
                                 ar_weights(old_tok, mu_tok, "sequence", mode, cap))
            # the bias is linear in the per-response gradients: one backward through the unweighted
            # loss, each response weighted by its coefficient (as a pseudo-distribution)
            coef_log = cap_coef(mode, cap, old_tok.sum(1), mu_tok.sum(1)).log()
            bias = -ar_expected_grad(name, "sequence", theta, old_tok, ref_tok,
                                     coef_log[:, None] / AR.L * torch.ones_like(old_tok), R, 0.5)
            ck.exact(f"{name} level=sequence {mode} C={cap:.3g}: E_mu[grad] == -grad J_seq + bias",
                     g, target + bias)
    P, mu = k_problem(seed=3, ref_dist=0.8)
    cap = cap_between((P.old_logp - mu).exp(), 0.5)
    w = k_weights(P, mu, "tis", cap)
    _, G0 = k_expected_grad("rpg-reinforce-urkl", P, mu)
    _, G = k_expected_grad("rpg-reinforce-urkl", P, mu, w)
    exact = minus_grad_j("rpg-reinforce-urkl", P) + cap_bias("tis", cap, P.old_logp, mu, G0)[0]
    k_mc(ck, f"rpg-reinforce-urkl tis C={cap:.3g}", "rpg-reinforce-urkl", P, mu, w, exact, G,
         mc_n(fast), seed=73)
    ck.note("symbolic: n/a (min(r, C) = r - (r - C)_+ and r 1{r <= C} = r - r 1{r > C}; "
            "float64 enumeration and Monte Carlo through the library)")
