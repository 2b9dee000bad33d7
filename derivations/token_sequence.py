"""Item 9: token-level vs sequence-level application of the losses.

The paper's math treats a whole response y as the sample x (w = pi_theta(y)/pi_old(y)); verl and
the paper's code apply the losses per token (ratios per token). On a small autoregressive policy
(vocabulary 3, length 3: all 27 responses enumerated, tabular logits for each of the 13
prefixes), we compute exactly

    E_{y ~ pi_old}[grad loss(y)]     (loss called on the 27 responses, weighted by pi_old(y))

for every rpg loss at level="token" and level="sequence" (agg "seq-mean-token-sum": a response's
loss is the sum of its token losses), and compare with -grad J_seq, the gradient of the
sequence-level objective J_seq = E_{pi_theta}[R] - beta D(pi_theta, pi_ref) over the 27 responses.
Settings: on-policy (theta = theta_old) or off-policy; pi_ref = pi_old or not; components
reward only (beta = 0), KL only (A = 0, beta = 1), and both.
"""

from __future__ import annotations

import torch

from rpg_ref.core.exact import Autoregressive
from rpg_ref.core.losses import get_loss

from . import paper
from ._core import DTYPE, Checker, claim, cosine, mc_n, rel_err, row_grads

V, L = 3, 3
AR = Autoregressive(V, L)
SEQS = AR.seqs                                                                    # [27, 3]
# prefix index of token t of each response: () -> 0, (a) -> 1 + a, (a, b) -> 4 + 3a + b
PREFIX = AR.prefix
N_PREFIX = AR.n_prefix
RPG_LOSSES = ("rpg-fkl", "rpg-ufkl", "rpg-rkl", "rpg-urkl",
              "rpg-reinforce-fkl", "rpg-reinforce-ufkl", "rpg-reinforce-rkl", "rpg-reinforce-urkl")
# KL target: UKL(pi_theta || pi_ref); their own default clip
BASELINES = ("grpo", "grpo-corrected")
SETTINGS = (
    "on-policy, ref=old",
    "on-policy, ref!=old",
    "off-policy, ref=old",
    "off-policy, ref!=old",
)
COMPONENTS = {"reward": (1.0, 0.0), "kl": (0.0, 1.0), "both": (1.0, 0.5)}   # (scale of A, beta)


def token_logp(theta: torch.Tensor) -> torch.Tensor:
    """[27, 3] log pi(y_t | y_<t) for every response, from tabular logits theta [13, 3]."""
    return AR.token_logp(theta)


def _setting(name: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    th_old = torch.randn(N_PREFIX, V, generator=g, dtype=DTYPE)
    th_off = th_old + 0.7 * torch.randn(N_PREFIX, V, generator=g, dtype=DTYPE)
    th_ref = th_old + 0.8 * torch.randn(N_PREFIX, V, generator=g, dtype=DTYPE)
    R = torch.randn(len(SEQS), generator=g, dtype=DTYPE)
    theta = th_old if name.startswith("on") else th_off
    ref = th_old if name.endswith("ref=old") else th_ref
    return theta, token_logp(th_old).detach(), token_logp(ref).detach(), R


def loss_expected_grad(name: str, level: str, theta, old_tok, ref_tok, adv, beta) -> torch.Tensor:
    """sum_y pi_old(y) grad loss(y): one loss call on all 27 responses, per-row gradients
    reweighted by pi_old(y), chained through the token log-probs to theta [13, 3]."""
    th = theta.detach().clone().requires_grad_(True)
    tok = token_logp(th)                                                          # [27, 3]
    ones = torch.ones_like(tok)
    dl = row_grads(
        get_loss(name),
        tok,
        old_tok,
        adv,
        ones,
        beta=beta,
        ref_logp=ref_tok,
        level=level,
        agg="seq-mean-token-sum",
    )                                     # [27, 3]
    p_old = old_tok.sum(1).exp()                                                  # [27]
    (g,) = torch.autograd.grad((p_old[:, None] * dl * tok).sum(), th)
    return g.reshape(-1)


def sequence_grad(div: str, theta, ref_tok, R, beta) -> torch.Tensor:
    """grad J_seq: J_seq = sum_y pi_theta(y) R(y) - beta D(pi_theta, pi_ref) over the 27
    responses."""
    th = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(
        paper.objective_logp(div, token_logp(th).sum(1), ref_tok.sum(1), R, beta), th
    )
    return g.reshape(-1)


def predicted_exact(name: str, level: str, setting: str, component: str) -> bool:
    """Where the derivation says the token-level gradient is exact (rpg losses)."""
    if level == "sequence":
        return True
    on, ref_old = setting.startswith("on"), setting.endswith("ref=old")
    reward_ok = on                                       # per-token ratios are 1 only on-policy
    div = name.rsplit("-", 1)[1]
    # FKL/UFKL: sum_t E_{y<t~old} E_{y_t~ref}[grad log pi] equals the sequence gradient iff prefixes
    # are drawn as under pi_ref, i.e. pi_ref = pi_old. RKL/URKL miss the future log-ratio terms;
    # exact only where both sides vanish (theta = theta_old = ref).
    kl_ok = ref_old if div in ("fkl", "ufkl") else (on and ref_old)
    return {"reward": reward_ok, "kl": kl_ok, "both": reward_ok and kl_ok}[component]


def token_vs_sequence_table(seed: int = 0, losses=RPG_LOSSES + BASELINES) -> list[dict]:
    """Rows {loss, level, setting, component, rel_err, cosine, exact}: the expected gradient of
    each loss vs -grad J_seq (target divergence: the loss's own; UKL(theta||ref) for grpo*)."""
    rows = []
    for setting in SETTINGS:
        theta, old_tok, ref_tok, R = _setting(setting, seed)
        for name in losses:
            div = "urkl" if name.startswith("grpo") else name.rsplit("-", 1)[1]
            for comp, (a_scale, beta) in COMPONENTS.items():
                target = -sequence_grad(div, theta, ref_tok, a_scale * R, beta)
                for level in ("token", "sequence"):
                    g = loss_expected_grad(name, level, theta, old_tok, ref_tok, a_scale * R, beta)
                    zero = float(target.norm()) < 1e-13
                    err = float((g - target).norm()) if zero else rel_err(g, target)
                    rows.append(
                        {
                            "loss": name,
                            "level": level,
                            "setting": setting,
                            "component": comp,
                            "rel_err": err,
                            "cosine": None if zero else cosine(g, target),
                            "exact": err < 1e-10,
                            "target_is_zero": zero,
                        }
                    )
    return rows


@claim(
    "token-vs-sequence",
    "sec:offpolicy_policy_gradients",
    "Applied per token (as verl and the paper's code do), which losses give the exact gradient of "
    "the "
    "sequence-level objective? Exact: all rpg losses at level='sequence'; at token level only "
    "on-policy "
    "with pi_ref = pi_old, plus the FKL/UFKL KL term whenever pi_ref = pi_old.",
)
def check_token_vs_sequence(ck: Checker, fast: bool) -> None:
    rows = token_vs_sequence_table(
        losses=RPG_LOSSES[:4] + BASELINES if fast else RPG_LOSSES + BASELINES
    )
    for r in rows:
        if r["loss"] in BASELINES:
            continue
        pred = predicted_exact(r["loss"], r["level"], r["setting"], r["component"])
        ck.fact(
            f"{r['loss']} {r['level']} [{r['setting']}] {r['component']}: exact={pred}",
            r["exact"] == pred,
            f"rel err {r['rel_err']:.3g}",
            quiet=True,
        )
    seq = [r for r in rows if r["level"] == "sequence" and r["loss"] in RPG_LOSSES]
    ck.exact(
        "level='sequence', every rpg loss, setting and component: E[grad] == -grad J_seq (rel)",
        max(r["rel_err"] for r in seq),
        0.0,
    )
    # Monte Carlo: responses y ~ pi_old, one batched loss call, vs the exact token-level expectation
    theta, old_tok, ref_tok, R = _setting("off-policy, ref!=old")
    n = mc_n(fast)
    idx = torch.multinomial(
        old_tok.sum(1).exp(), n, replacement=True, generator=torch.Generator().manual_seed(61)
    )
    for name in ("rpg-urkl", "rpg-reinforce-fkl"):
        exact = loss_expected_grad(name, "token", theta, old_tok, ref_tok, R, 0.5)
        th = theta.detach().clone().requires_grad_(True)
        tok = token_logp(th)
        dl = row_grads(
            get_loss(name),
            tok,
            old_tok,
            R,
            torch.ones_like(tok),
            beta=0.5,
            ref_logp=ref_tok,
            level="token",
            agg="seq-mean-token-sum",
        )  # [27, 3]
        G = torch.stack(  # [27, 39] per-response grads
            [
                torch.autograd.grad((dl[y] * tok[y]).sum(), th, retain_graph=True)[0].reshape(-1)
                for y in range(len(SEQS))
            ]
        )
        loss, _ = get_loss(name)(
            token_logp(th)[idx],
            old_tok[idx],
            R[idx],
            torch.ones(n, L, dtype=DTYPE),
            beta=0.5,
            ref_logp=ref_tok[idx],
            level="token",
            agg="seq-mean-token-sum",
        )
        (g_batch,) = torch.autograd.grad(loss, th)
        ck.fact(f"{name}: batched gradient == mean of per-response gradients",
                float((g_batch.reshape(-1) - G[idx].mean(0)).abs().max()) < 1e-12, quiet=True)
        ck.mc(f"{name} token level, off-policy, responses ~ pi_old", G[idx], exact)
    ck.note("symbolic: n/a (the exact side enumerates all 27 responses in float64)")
    misses = [r for r in rows if r["level"] == "token" and not r["exact"]]
    worst = max(misses, key=lambda r: r["rel_err"])
    ck.note(
        f"token level: {sum(r['exact'] for r in rows if r['level'] == 'token')} of "
        f"{sum(r['level'] == 'token' for r in rows)} (loss, setting, component) cases exact; "
        "worst miss "
        f"{worst['loss']} [{worst['setting']}] {worst['component']}: rel err {worst['rel_err']:.3g}"
    )
    for r in rows:
        if r["loss"] in BASELINES and r["component"] == "kl":
            ck.note(
                f"{r['loss']} {r['level']} [{r['setting']}] KL vs grad UKL(theta||ref): rel err "
                f"{r['rel_err']:.3g}"
            )
