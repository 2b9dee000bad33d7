"""rpg-audit: which objective does a policy-gradient loss really optimize?

    python -m rpg_ref.audit [--only NAME ...] [--horizons H ...] [--markdown FILE] [--json FILE]
    (console script: rpg-audit)

A loss is wrapped as an ``Adapter``: ``loss(logp, old_logp, ref_logp, advantages, mask) -> scalar``
on a batch of B responses of length H (log-probs and mask [B, H], advantages [B]), plus the KL
coefficient ``beta`` it uses. The audit computes its exact expected gradient under pi_old,

    g = sum_y pi_old(y) grad_theta loss({y})          (every response y enumerated, float64)

on a small autoregressive softmax policy (vocabulary 3, responses of length H = 1, 2, 3, tabular
logits for every prefix: rpg_ref.exact.Autoregressive), and names the objective it is the gradient of:

    reward part   g(A = R) - g(A = 0)   vs  -grad E_{pi_theta}[R]                (sequence level)
    KL part       g(A = 0)              vs  +beta grad D, i.e. the loss follows E[R] - beta D, for
        D = KL(pi||ref), UKL(pi||ref), KL(ref||pi), UKL(ref||pi)   over whole responses, and
            sum_t KL(pi||ref), sum_t KL(ref||pi)                   per position t, prefixes ~ pi_old
            (the token-level sums people optimize; their prefix weights are not differentiated),
            0 (no KL), and each D with the opposite sign ("-D": the loss *raises* D).

A candidate matches when ||g - t|| <= MATCH_TOL * max(||g||, ||t||, ZERO_NORM); otherwise the closest
candidate and that relative error are reported. Settings: theta = theta_old or not, times
pi_ref = pi_old or not, times H.

Conventions (docs/audit.md says why each is harmless):
* A loss must be a mean over the responses of its batch: then its expected gradient does not
  depend on the batch size. ``audit`` checks it (one batched call vs separate calls) per adapter.
* Aggregation seq-mean-token-sum: a response's loss is the sum of its token losses, the scale of
  the sequence-level objectives. token-mean and seq-mean-token-mean divide a fixed-length loss by H.
* The advantages passed are the rewards R(y) (no baseline; a baseline changes no expected gradient
  of a normalized policy).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from rpg_ref import kl
from rpg_ref.audit_adapters import BETA, Adapter, all_adapters
from rpg_ref.exact import Autoregressive, divergence

__all__ = ["BETA", "HORIZONS", "SETTINGS", "Adapter", "Problem", "Setting", "audit", "candidate_grads",
           "default_adapters", "expected_grad", "format_table", "make_problem", "to_markdown"]

DTYPE = torch.float64
VOCAB = 3
HORIZONS = (1, 2, 3)
OFF_POLICY_STEP = 0.5      # theta = theta_old + 0.5 N(0, 1) per logit in the off-policy settings
REF_STEP = 0.8             # theta_ref = theta_old + 0.8 N(0, 1) per logit where pi_ref != pi_old
MATCH_TOL = 1e-10
ZERO_NORM = 1e-4           # shorter gradients count as 0 (the settings' others are > 1e-2: tested)

LABELS = {"seq-rkl": "KL(π‖ref)", "seq-urkl": "UKL(π‖ref)", "seq-fkl": "KL(ref‖π)",
          "seq-ufkl": "UKL(ref‖π)", "tok-rkl": "Σt KL(π‖ref)", "tok-fkl": "Σt KL(ref‖π)",
          "no-kl": "0 (no KL)"}


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


@dataclass
class Problem:
    """Logits tables [n_prefix, V] of pi_theta, pi_old and pi_ref, and a reward per response."""
    ar: Autoregressive
    theta: Tensor
    old: Tensor
    ref: Tensor
    R: Tensor                       # [V^H]

    def __post_init__(self):
        self.old_tok, self.ref_tok = self.tokens(self.old), self.tokens(self.ref)   # [V^H, H] constants

    def tokens(self, logits: Tensor) -> Tensor:
        return self.ar.token_logp(logits)                                    # [V^H, H]


def make_problem(setting: Setting, horizon: int, seed: int = 0) -> Problem:
    """Random float64 policies; the four settings of one (horizon, seed) share theta_old and R."""
    g = torch.Generator().manual_seed(1000 * seed + horizon)
    ar = Autoregressive(VOCAB, horizon)
    shape = (ar.n_prefix, VOCAB)
    old = torch.randn(shape, generator=g, dtype=DTYPE)
    theta = old + OFF_POLICY_STEP * torch.randn(shape, generator=g, dtype=DTYPE)
    ref = old + REF_STEP * torch.randn(shape, generator=g, dtype=DTYPE)
    R = torch.randn(len(ar.seqs), generator=g, dtype=DTYPE)
    return Problem(ar, old if setting.on_policy else theta, old, old if setting.ref_is_old else ref, R)


# ---------------------------------------------------------------------------
# exact expected gradient of a loss
# ---------------------------------------------------------------------------

def _call(adapter: Adapter, prob: Problem, logp: Tensor, adv: Tensor, rows=slice(None)) -> Tensor:
    return adapter.loss(logp, prob.old_tok[rows], prob.ref_tok[rows], adv[rows], torch.ones_like(logp))


def response_grads(adapter: Adapter, prob: Problem, logp: Tensor, adv: Tensor) -> Tensor:
    """[N, H] d loss({y}) / d log pi(y_t | y_<t) for every response y, from ONE call on the batch
    of all N responses: a mean over responses has batch gradient = response gradient / N."""
    leaf = logp.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(_call(adapter, prob, leaf, adv), leaf, allow_unused=True)
    return torch.zeros_like(leaf) if g is None else g * len(leaf)


def expected_grad(adapter: Adapter, prob: Problem, adv: Tensor) -> Tensor:
    """sum_y pi_old(y) grad_theta loss({y}), flattened over the logits table."""
    th = prob.theta.detach().clone().requires_grad_(True)
    tok = prob.tokens(th)                                                    # [N, H]
    p_old = prob.old_tok.sum(1).exp()                                        # [N] pi_old(y)
    d_tok = response_grads(adapter, prob, tok, adv)                          # [N, H]
    (g,) = torch.autograd.grad((p_old[:, None] * d_tok * tok).sum(), th)     # chain rule to theta
    return g.reshape(-1)


def check_mean_over_responses(adapter: Adapter, prob: Problem) -> None:
    """The per-response gradients read off one batched call equal separate one-response calls."""
    tok = prob.tokens(prob.theta)
    batched = response_grads(adapter, prob, tok, prob.R)
    for y in range(len(tok)):
        leaf = tok[y:y + 1].detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(_call(adapter, prob, leaf, prob.R, slice(y, y + 1)), leaf, allow_unused=True)
        single = torch.zeros_like(leaf[0]) if g is None else g[0]
        diff = float((single - batched[y]).abs().max())
        if diff > MATCH_TOL * max(1.0, float(single.abs().max())):
            raise ValueError(f"{adapter.name}: the loss of a batch is not the mean of its responses' losses "
                             f"(response {y}: its gradient alone and in the batch differ by {diff:.3g}); "
                             f"aggregate with seq-mean-token-sum or token-mean")


# ---------------------------------------------------------------------------
# candidate objectives
# ---------------------------------------------------------------------------

def _grad(f: Callable[[Tensor], Tensor], theta: Tensor) -> Tensor:
    th = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(th), th)
    return g.reshape(-1)


def candidate_grads(prob: Problem) -> dict[str, Tensor]:
    """grad_theta D for every candidate D (key -> flattened gradient)."""
    seq_ref = prob.ref_tok.sum(1)                                            # log pi_ref(y)
    cond_ref = torch.log_softmax(prob.ref, -1)                               # [n_prefix, V]
    w_old = prob.ar.prefix_logp(prob.old).exp()                              # [n_prefix] pi_old(prefix)
    out = {f"seq-{d}": _grad(lambda th, d=d: divergence(d, prob.tokens(th).sum(1), seq_ref), prob.theta)
           for d in ("rkl", "urkl", "fkl", "ufkl")}
    # sum_t E_{y<t ~ pi_old} KL_t = sum over prefixes p of pi_old(p) KL(pi(.|p), pi_ref(.|p))
    out["tok-rkl"] = _grad(lambda th: (w_old * kl.reverse_kl(torch.log_softmax(th, -1), cond_ref)).sum(),
                           prob.theta)
    out["tok-fkl"] = _grad(lambda th: (w_old * kl.forward_kl(torch.log_softmax(th, -1), cond_ref)).sum(),
                           prob.theta)
    out["no-kl"] = torch.zeros_like(out["tok-rkl"])
    return out


def reward_grad(prob: Problem) -> Tensor:
    """grad_theta E_{pi_theta}[R] = grad sum_y pi_theta(y) R(y)."""
    return _grad(lambda th: (prob.tokens(th).sum(1).exp() * prob.R).sum(), prob.theta)


def rel_err(g: Tensor, t: Tensor) -> float:
    """||g - t|| / max(||g||, ||t||, ZERO_NORM): 0 for equal vectors, up to 2, and 1 vs a zero target."""
    return float((g - t).norm()) / max(float(g.norm()), float(t.norm()), ZERO_NORM)


# ---------------------------------------------------------------------------
# one case, and the whole audit
# ---------------------------------------------------------------------------

def audit_case(adapter: Adapter, prob: Problem, cands: dict[str, Tensor], g_reward: Tensor) -> dict:
    """Reward-part error and KL-part verdict of one adapter on one problem."""
    g_kl = expected_grad(adapter, prob, torch.zeros_like(prob.R))
    g_r = expected_grad(adapter, prob, prob.R) - g_kl
    errs = {}
    for key, gd in cands.items():
        errs[key] = rel_err(g_kl, adapter.beta * gd)                        # loss follows E[R] - beta D
        if key != "no-kl":
            errs["-" + key] = rel_err(g_kl, -adapter.beta * gd)             # loss follows E[R] + beta D
    matches = sorted(k for k, e in errs.items() if e <= MATCH_TOL)
    closest = min(errs, key=errs.get)
    reward_err = rel_err(g_r, -g_reward)
    return {"reward_rel_err": reward_err, "reward_exact": reward_err <= MATCH_TOL,
            "kl_matches": matches, "kl_closest": closest, "kl_closest_err": errs[closest],
            "kl_all_zero": all(float(gd.norm()) < ZERO_NORM for gd in cands.values()),
            "kl_grad_norm": float(g_kl.norm()), "kl_errs": errs}


def audit(adapters: list[Adapter], horizons=HORIZONS, seed: int = 0) -> list[dict]:
    """One row per adapter x setting x horizon (dicts, JSON-ready)."""
    problems = {(s, h): make_problem(s, h, seed) for s in SETTINGS for h in horizons}
    targets = {k: (candidate_grads(p), reward_grad(p)) for k, p in problems.items()}
    rows = []
    for ad in adapters:
        check_mean_over_responses(ad, problems[(SETTINGS[-1], max(horizons))])
        for s in SETTINGS:
            for h in horizons:
                row = {"loss": ad.name, "level": ad.level, "code": ad.code, "own_code": ad.own_code,
                       "library": ad.library, "on_policy": s.on_policy, "ref_is_old": s.ref_is_old,
                       "horizon": h, "beta": ad.beta, "note": ad.note}
                rows.append(row | audit_case(ad, problems[(s, h)], *targets[(s, h)]))
    return rows


def default_adapters() -> tuple[list[Adapter], list[str]]:
    """Every built-in adapter that can run here, and notes on those that cannot."""
    return all_adapters()


# ---------------------------------------------------------------------------
# verdicts as text
# ---------------------------------------------------------------------------

def describe(matches: list[str]) -> str:
    """Matched candidates as one phrase; U and normalized KL merge as (U)KL, sequence = token as '= Σt'."""
    parts = []
    for sign in ("", "-"):
        for d, arrow in (("rkl", "π‖ref"), ("fkl", "ref‖π")):
            seq = [u for u in ("", "u") if f"{sign}seq-{u}{d}" in matches]
            tok = f"{sign}tok-{d}" in matches
            name = {2: "(U)KL", 1: "UKL" if seq == ["u"] else "KL", 0: ""}[len(seq)]
            if seq:
                parts.append(f"{sign}{name}({arrow})" + (" = Σt" if tok else ""))
            elif tok:
                parts.append(f"{sign}Σt KL({arrow})")
    if "no-kl" in matches:
        parts.append("0 (no KL)")
    return "; ".join(parts)


def kl_cell(row: dict) -> str:
    if row["kl_all_zero"] and row["kl_grad_norm"] < ZERO_NORM:
        return "0 (every D: 0)"
    if row["kl_matches"]:
        return describe(row["kl_matches"])
    c = row["kl_closest"]
    sign, key = ("-", c[1:]) if c.startswith("-") else ("", c)
    return f"none (closest {sign}{LABELS[key]}: {row['kl_closest_err']:.2g})"


def reward_cell(rows: list[dict]) -> str:
    if all(r["reward_exact"] for r in rows):
        return "exact"
    return " / ".join("exact" if r["reward_exact"] else f"{r['reward_rel_err']:.2g}" for r in rows)


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and lines: one line per loss x (theta, pi_ref) setting, the horizons side by side."""
    hs = sorted({r["horizon"] for r in rows})
    head = ["loss", "level", "code", "θ", "π_ref", f"reward part (H={'/'.join(map(str, hs))})"]
    head += [f"KL part, H={h}" for h in hs]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["loss"], r["level"], r["code"], r["on_policy"], r["ref_is_old"]), []).append(r)
    lines = []
    for (name, level, code, on, ref_old), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["horizon"])
        s = Setting(on, ref_old)
        lines.append([name, level, code, s.theta, s.ref, reward_cell(rs)] + [kl_cell(r) for r in rs])
    return head, lines


def format_table(rows: list[dict]) -> str:
    head, lines = table(rows)
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    out = [" | ".join(c.ljust(w) for c, w in zip(x, widths)) for x in [head, *lines]]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


LEGEND = """\
Reward part: relative error of g(A=R) - g(A=0) against -∇E[R] (sequence level); "exact" = within 1e-10.
KL part: the D for which the loss's expected gradient at A=0 equals β∇D, i.e. the loss follows E[R] - β·D.
(U)KL = KL and UKL give the same gradient (both are normalized here); "= Σt": the sequence divergence and the
per-position sum coincide in this setting; "-D": the loss raises D (it follows E[R] + β·D); "none": no candidate
within 1e-10, closest candidate and ||g - t|| / max(||g||, ||t||, 1e-4); "0 (every D: 0)": the KL gradient and every
candidate's vanish (θ = θ_old, π_ref = π_old)."""


def to_markdown(rows: list[dict]) -> str:
    head, lines = table(rows)
    esc = lambda c: c.replace("|", "\\|")
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(esc(c) for c in x) + " |" for x in lines]
    return LEGEND + "\n\n" + "\n".join(md) + "\n"


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------

def _bad_output(path: str | None, flag: str) -> str | None:
    if path is not None and not Path(path).resolve().parent.is_dir():
        return f"{flag} {path}: directory {Path(path).parent} does not exist"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rpg-audit", description="Which objective does each loss's exact "
                                 "expected gradient follow? (docs/audit.md)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="adapters whose name contains NAME")
    ap.add_argument("--horizons", nargs="+", type=int, default=list(HORIZONS), metavar="H",
                    help="response lengths, 1..4 (default 1 2 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random policies (default 0)")
    ap.add_argument("--markdown", metavar="FILE", help="write the table as markdown")
    ap.add_argument("--json", metavar="FILE", help="write every row (per horizon, all errors) as JSON")
    ap.add_argument("--list", action="store_true", help="list the adapters and exit")
    args = ap.parse_args(argv)
    errors = [_bad_output(args.markdown, "--markdown"), _bad_output(args.json, "--json")]
    if any(not 1 <= h <= 4 for h in args.horizons):
        errors.insert(0, f"--horizons must be in 1..4 (3^H responses each), got {args.horizons}")
    if args.seed < 0:
        errors.insert(0, f"--seed must be >= 0, got {args.seed}")
    for err in filter(None, errors):
        ap.exit(2, f"rpg-audit: error: {err}\n")
    adapters, notes = default_adapters()
    if args.only:
        adapters = [a for a in adapters if any(s in a.name for s in args.only)]
        if not adapters:
            ap.exit(2, f"rpg-audit: error: no adapter name contains any of {args.only}; see --list\n")
    if args.list:
        print("\n".join(f"{a.name} [{a.level}] ({a.code})" for a in adapters))
        return 0
    torch.set_num_threads(1)                   # tiny tensors: more threads only add synchronization
    rows = audit(adapters, tuple(sorted(set(args.horizons))), args.seed)
    print(format_table(rows))
    print("\n" + LEGEND)
    for n in notes:
        print(f"note: {n}")
    if args.markdown:
        Path(args.markdown).write_text(to_markdown(rows), encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
