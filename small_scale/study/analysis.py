"""Analyse a study's results as its study file pre-registered: paired-by-seed contrasts with 95 %
t intervals, Holm-corrected families, interactions (difference of differences), collapse rates
with an exact paired test, the minimum detectable effect, and one verdict per contrast.

    python -m small_scale.study.analysis A               # the report of study A (markdown, stdout)
    python -m small_scale.study.analysis --all           # every study with results: reports and
                                                   # figures into paper_figs/out/study/, and the
                                                   # generated blocks of small_scale/RESULTS.md
    python -m small_scale.study.analysis --all --check   # exit 1 if RESULTS.md differs from them

Statistics (scipy.stats; nothing here is a hand-written distribution):
- a contrast is a signed sum of cells per seed, d_s = sum(+cells) - sum(-cells), over the seeds
  every cell of it has (paired): a - b, or the interaction (a_hi - b_hi) - (a_lo - b_lo);
- mean of d with a 95 % t interval (scipy.stats.t), two-sided one-sample t test of d = 0 (=
  scipy.stats.ttest_rel for a - b); the Wilcoxon signed-rank p (scipy.stats.wilcoxon) beside it as
  a check that does not assume normal differences;
- Holm's step-down correction within each family (primary, secondary, collapse), at level alpha;
- the minimum detectable effect: the |mean difference| that the two-sided paired t test at the
  family's Bonferroni level alpha/m (Holm's first step; alpha for a family of one) detects with
  power 0.8 at the observed standard deviation of d, exact from the noncentral t
  (scipy.stats.nct), not a normal approximation;
- collapse: a run collapsed when its outcome is below ``below`` times the same seed's outcome in
  the reference cell (the warm start), or below ``floor``; rates with Clopper-Pearson 95 %
  intervals (scipy.stats.binomtest), compared by McNemar's exact test: a binomial test on the
  discordant seeds (scipy.stats.binomtest, p = 1/2).

Exclusion (a study's ``exclude``): seeds whose warm start, measured by the reference cell before
any RL step, solves fewer than ``below`` of the held-out problems leave every table and test (a
rule on a pre-treatment measure, so no cell can influence who is excluded); the report names
them.

Verdicts (pre-registered, ``verdict``): a contrast whose claim has a direction is "supported at
this scale" when its Holm-adjusted p < alpha and the mean difference has the claimed sign,
"contradicted at this scale" when p < alpha with the opposite sign, else "no difference larger
than X", X = the larger |end| of its 95 % interval (differences beyond X are excluded at 95 %).
A two-sided claim ("they differ") is supported or gets "no difference larger than X". Nothing is
ranked: cells are never ordered by a difference that is not significant. A verdict is given only
when every contrast of its Holm family has every planned seed (excluded ones out): until then the
contrast reads "pending (n of N seeds)", or "pending (its family's other contrasts are landing)"
when its own seeds are in but Holm's adjustment still depends on p-values to come.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

import small_scale.study.files as S

try:  # the study extra: one line naming it, not a traceback
    import matplotlib  # noqa: F401  (the figures of --all: paper_figs._common)
    from scipy import optimize, stats
except ModuleNotFoundError as e:
    print(f"small_scale.study.analysis: {e.name} is not installed: pip install -e '.[study]' "
          f"(the study extra: scipy, matplotlib)", file=sys.stderr)
    raise SystemExit(2) from None

OUT = S.ROOT / "paper_figs" / "out" / "study"
RESULTS_MD = S.HERE / "RESULTS.md"
SIDES = ("greater", "less", "two-sided")
SUPPORTED, CONTRADICTED = "supported at this scale", "contradicted at this scale"
POWER = 0.8
CONFIDENCE = 0.95
NAMES = {"fkl": "forward", "rkl": "reverse"}


# ----------------------------------------------------------------------------------------------
# statistics
# ----------------------------------------------------------------------------------------------

def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values: sorted ascending, p_(i) * (m - i + 1) (i from 1),
    made non-decreasing and capped at 1; returned in the input's order."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adj, run = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (m - rank) * p[i]))
        adj[i] = run
    return adj


def mde(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """The |mean difference| a two-sided one-sample t test (n paired differences of standard
    deviation sd) at level alpha detects with the given power: the noncentrality nc solving
    P(|T| > t_crit) = power, T ~ noncentral t(n - 1, nc), times sd / sqrt(n)."""
    if n < 2 or not sd > 0:
        return math.nan
    df = n - 1
    tc = stats.t.ppf(1 - alpha / 2, df)
    # P(T < -tc) as P(-T > tc) with -T ~ nct(df, -nc): scipy's nct.cdf far in the lower tail
    # returns NaN (e.g. df 17, nc 13), its sf does not
    pw = lambda nc: stats.nct.sf(tc, df, nc) + stats.nct.sf(tc, df, -nc) - power
    hi = tc + 3.0
    while pw(hi) < 0:   # power rises with nc: widen the bracket until it holds the root
        hi *= 2
    return optimize.brentq(pw, 0.0, hi, xtol=1e-10) * sd / math.sqrt(n)


def one_sample(d: np.ndarray, robust: bool = True) -> dict:
    """Mean of the paired differences d with its 95 % t interval, the two-sided t test and
    (robust) the Wilcoxon signed-rank p of d = 0."""
    n = len(d)
    mean = float(d.mean()) if n else math.nan
    sd = float(d.std(ddof=1)) if n > 1 else math.nan
    out = {"n": n, "mean": mean, "sd": sd, "lo": math.nan, "hi": math.nan, "p": math.nan,
           "p_wilcoxon": math.nan}
    if n < 2:
        return out
    if sd == 0:   # every seed gives the same difference: no spread to test against
        out.update(lo=mean, hi=mean, p=1.0 if mean == 0 else 0.0,
                   p_wilcoxon=1.0 if mean == 0 else math.nan)
        return out
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    out.update(lo=mean - half, hi=mean + half,
               p=float(stats.ttest_1samp(d, 0.0).pvalue))
    if robust and np.any(d != 0):
        out["p_wilcoxon"] = float(stats.wilcoxon(d).pvalue)
    return out


def verdict(mean: float, lo: float, hi: float, p_adj: float, alpha: float, sides: str,
            fmt: str = "{:.3f}") -> str:
    """The pre-registered wording (module docstring)."""
    if sides not in SIDES:
        raise ValueError(f"sides must be one of {SIDES}, got {sides!r}")
    if math.isnan(p_adj):
        return "not enough paired seeds"
    if p_adj < alpha:
        if sides == "two-sided" or (mean > 0) == (sides == "greater"):
            return SUPPORTED
        return CONTRADICTED
    return "no difference larger than " + fmt.format(max(abs(lo), abs(hi)))


def mcnemar_exact(a: dict, b: dict) -> dict:
    """Collapse of cell a vs cell b, paired by seed ({seed: bool}): the rates, their difference
    and McNemar's exact p (binomial test of the discordant seeds at 1/2)."""
    seeds = sorted(set(a) & set(b))
    n01 = sum(a[s] and not b[s] for s in seeds)    # a collapsed, b did not
    n10 = sum(b[s] and not a[s] for s in seeds)
    p = float(stats.binomtest(n01, n01 + n10, 0.5).pvalue) if n01 + n10 else 1.0
    ra = sum(a[s] for s in seeds) / len(seeds) if seeds else math.nan
    rb = sum(b[s] for s in seeds) / len(seeds) if seeds else math.nan
    return {"n": len(seeds), "rate_a": ra, "rate_b": rb, "mean": ra - rb, "a_only": n01,
            "b_only": n10, "p": p}


def rate_ci(k: int, n: int) -> tuple:
    """Clopper-Pearson 95 % interval of k/n."""
    ci = stats.binomtest(k, n).proportion_ci(CONFIDENCE, method="exact")
    return float(ci.low), float(ci.high)


# ----------------------------------------------------------------------------------------------
# a study's results
# ----------------------------------------------------------------------------------------------

def weights(contrast: dict) -> dict:
    """{cell: +1 / -1}: "a" - "b", or "interaction" [[a_hi, b_hi], [a_lo, b_lo]] =
    (a_hi - b_hi) - (a_lo - b_lo)."""
    if "interaction" in contrast:
        (a_hi, b_hi), (a_lo, b_lo) = contrast["interaction"]
        w = {}
        for c, s in ((a_hi, 1), (b_hi, -1), (a_lo, -1), (b_lo, 1)):
            w[c] = w.get(c, 0) + s
        return {c: s for c, s in w.items() if s}
    return {contrast["a"]: 1, contrast["b"]: -1}


def paired_differences(vals: dict, w: dict) -> tuple:
    """(seeds, d [n]) over the seeds every cell of the contrast has."""
    missing = [c for c in w if c not in vals]
    if missing:
        return [], np.zeros(0)
    seeds = sorted(set.intersection(*(set(vals[c]) for c in w)))
    d = np.asarray([sum(s * vals[c][k] for c, s in w.items()) for k in seeds], dtype=float)
    return seeds, d


def contrast_family(rows: list[dict], contrasts: list[dict], default_outcome: str,
                    alpha: float, detail: bool = True) -> list[dict]:
    """Every contrast of one family: its paired test, Holm across the family, verdict, and
    (detail) the Wilcoxon p and the MDE, which the verdict does not use."""
    res = []
    for c in contrasts:
        outcome = c.get("outcome", default_outcome)
        seeds, d = paired_differences(S.values(rows, outcome), weights(c))
        res.append({**c, "outcome": outcome, "seeds": seeds, **one_sample(d, detail)})
    adj = holm([r["p"] if not math.isnan(r["p"]) else 1.0 for r in res])
    m = len(res)
    for r, pa in zip(res, adj):
        r["p_holm"] = pa if not math.isnan(r["p"]) else math.nan
        r["mde"] = mde(r["sd"], r["n"], alpha / m) if detail else math.nan
        r["verdict"] = verdict(r["mean"], r["lo"], r["hi"], r["p_holm"], alpha,
                               r.get("sides", "two-sided"))
    return res


def withhold_unfinished(family: list[dict], cells: dict) -> list[dict]:
    """Mark each contrast of a Holm family ``final`` only when every contrast of the family has
    every planned seed of its cells (``cells``: analyse's per-cell counts); otherwise replace the
    verdict by "pending" (module docstring): an interim verdict would be a peek at a pre-registered
    test, and Holm's adjustment of a finished contrast still depends on the others' p-values."""
    for r in family:
        r["planned"] = min(cells[c]["planned"] for c in weights(r))
    done = all(r["n"] >= r["planned"] for r in family)
    for r in family:
        r["final"] = done
        if not done:
            r["pending"] = (f"{r['n']} of {r['planned']} seeds" if r["n"] < r["planned"]
                            else "its family's other contrasts are landing")
            r["verdict"] = f"pending ({r['pending']})"
    return family


def collapsed(rows: list[dict], rule: dict) -> dict:
    """{cell: {seed: bool}}: outcome < below * the seed's reference-cell outcome, or < floor."""
    vals = S.values(rows, rule["outcome"])
    ref = vals.get(rule.get("reference_cell"), {})
    out = {}
    for cell, per_seed in vals.items():
        if cell == rule.get("reference_cell"):
            continue
        for s, v in per_seed.items():
            bad = v < rule.get("floor", -math.inf)
            if "below" in rule:
                if s not in ref:
                    continue    # no warm-start measure for this seed (yet)
                bad = bad or v < rule["below"] * ref[s]
            out.setdefault(cell, {})[s] = bool(bad)
    return out


def collapse_family(rows, rule: dict, contrasts: list[dict], alpha: float) -> dict:
    flags = collapsed(rows, rule)
    rates = {c: {"k": sum(f.values()), "n": len(f), "ci": rate_ci(sum(f.values()), len(f))}
             for c, f in flags.items()}
    res = [{**c, **mcnemar_exact(flags.get(c["a"], {}), flags.get(c["b"], {}))}
           for c in contrasts]
    for r, pa in zip(res, holm([r["p"] for r in res])):
        r["p_holm"] = pa
        # a rate difference's interval: the verdict's X is the larger of the two rates' ranges
        r["verdict"] = verdict(r["mean"], -1.0, 1.0, pa, alpha, r.get("sides", "two-sided"))
        if not r["verdict"].startswith(("supported", "contradicted")):
            r["verdict"] = (f"no difference detected ({r['a_only']} vs {r['b_only']} discordant "
                            f"seeds of {r['n']})")
    return {"rates": rates, "contrasts": res}


def analyse(spec: dict, rows: list[dict]) -> dict:
    """Everything the report shows, from the study's pre-registered analysis section."""
    an = spec.get("analysis", {})
    alpha = an.get("alpha", 0.05)
    outcome = an.get("outcome")
    dropped = S.excluded_seeds(rows, an.get("exclude"))
    n_all = len(rows)
    every_row, rows = rows, [r for r in rows if r["seed"] not in dropped]
    out = {"study": spec["name"], "alpha": alpha, "outcome": outcome, "excluded": dropped,
           "n_rows": n_all, "cells": {}}
    for cell in spec["cells"]:
        mine = [r for r in rows if r["cell"] == cell]
        v = [r["outcomes"].get(outcome) for r in mine if outcome]
        v = np.asarray([x for x in v if x is not None], float)
        out["cells"][cell] = {
            "label": spec["cells"][cell].get("label", cell), "n": len(mine),
            "planned": sum(s not in dropped for s in S.planned_seeds(spec, cell)),
            "mean": float(v.mean()) if len(v) else None,
            "sd": float(v.std(ddof=1)) if len(v) > 1 else None,
            "cpu_s": float(np.mean([r["cpu_s"] for r in mine])) if mine else None}
    for fam in ("primary", "secondary"):
        out[fam] = withhold_unfinished(contrast_family(rows, an.get(fam, []), outcome, alpha),
                                       out["cells"])
    if "collapse" in an:
        out["collapse"] = collapse_family(rows, an["collapse"], an.get("collapse_contrasts", []),
                                          alpha)
        withhold_unfinished(out["collapse"]["contrasts"], out["cells"])
    if "select" in an:
        out["select"] = S.select(spec, every_row)
    if "optima" in an:
        out["optima"] = optima(rows, an["optima"], spec)
    out["cpu_h"] = sum(r["cpu_s"] for r in rows) / 3600
    out["wall_h"] = sum(r["wall_s"] for r in rows) / 3600
    out["env"] = sorted({(r.get("commit") or "?")[:10] + (" (dirty)" if r.get("dirty") else "")
                         + f", torch {r.get('torch')}, transformers {r.get('transformers')}, "
                         f"{r.get('cpu')}" for r in rows})
    return out


# ----------------------------------------------------------------------------------------------
# the bandit: which KL-regularized optimum each loss reaches
# ----------------------------------------------------------------------------------------------

def optima(rows: list[dict], cells: list, spec: dict) -> dict:
    """Per cell and seed: the total-variation distance of the final policy to the analytic
    optimum of E_p[R] - beta KL(ref || p) (forward) and of E_p[R] - beta KL(p || ref) (reverse),
    from each run's summary (policy, ref_policy, rewards, beta)."""
    from rpg_ref.tasks.bandit import kl_regularized_optimum
    out = {}
    for r in rows:
        if r["cell"] not in cells:
            continue
        sm = r["summary"]
        p = np.asarray(sm["policy"], float)
        tv = {d: float(0.5 * np.abs(p - kl_regularized_optimum(
            np.asarray(sm["ref_policy"]), np.asarray(sm["rewards"]), sm["beta"], d)).sum())
              for d in ("fkl", "rkl")}
        out.setdefault(r["cell"], {})[r["seed"]] = tv
    return {c: out[c] for c in cells if c in out}


def optima_rows(a: dict) -> list[str]:
    L = ["| cell | seeds | TV to the forward-KL optimum (mean, max) | TV to the reverse-KL optimum "
         "(mean, max) |", "|---|---|---|---|"]
    for cell, per_seed in a["optima"].items():
        f = [v["fkl"] for v in per_seed.values()]
        r = [v["rkl"] for v in per_seed.values()]
        L.append(f"| {a['cells'][cell]['label']} | {len(f)} | {np.mean(f):.4f}, {max(f):.4f} | "
                 f"{np.mean(r):.4f}, {max(r):.4f} |")
    return L


# ----------------------------------------------------------------------------------------------
# the report
# ----------------------------------------------------------------------------------------------

def _f(x, fmt="{:+.3f}"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _p(p):
    return "n/a" if p is None or math.isnan(p) else ("<0.001" if p < 1e-3 else f"{p:.3f}")


def contrast_rows(res: list[dict]) -> list[str]:
    lines = ["| contrast | outcome | n | mean diff [95 % CI] | p (t) | p Holm | p (Wilcoxon) | "
             "MDE | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res:
        lines.append(f"| {r.get('claim', r['name'])} | {r['outcome']} | {r['n']} | "
                     f"{_f(r['mean'])} [{_f(r['lo'])}, {_f(r['hi'])}] | {_p(r['p'])} | "
                     f"{_p(r['p_holm'])} | {_p(r['p_wilcoxon'])} | {_f(r['mde'], '{:.3f}')} | "
                     f"{r['verdict']} |")
    return lines


def report(a: dict) -> str:
    """The study's tables as markdown (what RESULTS.md pastes)."""
    ex = (f"; seeds excluded by the pre-registered warm-start rule: {a['excluded']}"
          if a["excluded"] else "")
    L = [f"Study `{a['study']}`: {a['n_rows']} runs; alpha = {a['alpha']}; primary outcome "
         f"`{a['outcome']}`{ex}.", "",
         "| cell | runs / planned (excluded seeds out) | mean outcome | sd over seeds "
         "| CPU s per run |",
         "|---|---|---|---|---|"]
    for c in a["cells"].values():
        L.append(f"| {c['label']} | {c['n']} / {c['planned']} | {_f(c['mean'], '{:.3f}')} | "
                 f"{_f(c['sd'], '{:.3f}')} | {_f(c['cpu_s'], '{:.1f}')} |")
    for fam in ("primary", "secondary"):
        if a[fam]:
            L += ["", f"{fam.capitalize()} contrasts (paired by seed; Holm within the family):",
                  "", *contrast_rows(a[fam])]
    if "collapse" in a:
        L += ["", "Collapse rates (Clopper-Pearson 95 % CI):", "",
              "| cell | collapsed / runs | rate [95 % CI] |", "|---|---|---|"]
        for cell, r in a["collapse"]["rates"].items():
            L.append(f"| {a['cells'][cell]['label']} | {r['k']} / {r['n']} | "
                     f"{r['k'] / r['n']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] |")
        if a["collapse"]["contrasts"]:
            L += ["", "| contrast | n | rate a − rate b | discordant (a only / b only) | "
                  "p (McNemar exact) | p Holm | verdict |", "|---|---|---|---|---|---|---|"]
            for r in a["collapse"]["contrasts"]:
                L.append(f"| {r.get('claim', r['name'])} | {r['n']} | {_f(r['mean'], '{:+.2f}')}"
                         f" | {r['a_only']} / {r['b_only']} | {_p(r['p'])} | {_p(r['p_holm'])} "
                         f"| {r['verdict']} |")
    if "select" in a:
        L += ["", "Calibration choices:", "", "| value | candidate | score | floored | n |",
              "|---|---|---|---|---|"]
        for name, s in a["select"].items():
            for v, c in s["candidates"].items():
                extra = (f" (gain {c['gain']:+.3f}, job {c['job']:+.3f})" if "job" in c else
                         f" (gain {c['gain']:+.3f}, clip binds {c['bind']:.3f})" if "bind" in c
                         else "")
                L.append(f"| {name} | {v} | {c['score']:.3f}{extra} | {c['floored']:.2f} | "
                         f"{c['n']} |")
            L.append(f"| {name} | **chosen: {s['choice']}** | "
                     f"{'inside' if s['inside_range'] else 'outside'} the range | | "
                     f"{'complete' if s['complete'] else 'incomplete'} |")
    if "optima" in a:
        L += ["", "Distance of the final policy to each KL-regularized optimum "
              "(rpg_ref.tasks.bandit.kl_regularized_optimum; each seed draws its own pi_ref):",
              "", *optima_rows(a)]
    L += ["", f"Cost: {a['cpu_h']:.2f} CPU-h, {a['wall_h']:.2f} h summed run wall time. "
          f"Code and machine: {'; '.join(a['env'])}."]
    return "\n".join(L) + "\n"


# ----------------------------------------------------------------------------------------------
# figures
# ----------------------------------------------------------------------------------------------

def plot_levels(spec: dict, a: dict, out: Path) -> list[Path]:
    """Each contrast family named in analysis.figures: the mean difference with its 95 % CI
    against the off-policy level (one line per comparison), and the collapse rates."""
    from paper_figs._common import plt, save
    paths = []
    for fig_spec in spec.get("analysis", {}).get("figures", []):
        by_name = {r["name"]: r for r in a["primary"] + a["secondary"]}
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        levels = fig_spec["levels"]
        for k, (label, names) in enumerate(fig_spec["lines"].items()):
            x = np.arange(len(levels)) + 0.08 * (k - (len(fig_spec["lines"]) - 1) / 2)
            r = [by_name.get(n) for n in names]
            m = np.asarray([q["mean"] if q else np.nan for q in r])
            lo = np.asarray([q["lo"] if q else np.nan for q in r])
            hi = np.asarray([q["hi"] if q else np.nan for q in r])
            ax.errorbar(x, m, yerr=[m - lo, hi - m], marker="o", capsize=3, label=label)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(levels)), levels)
        ax.set_xlabel(fig_spec.get("xlabel", "off-policy level"))
        ax.set_ylabel(fig_spec.get("ylabel", f"difference in {a['outcome']}"))
        ax.set_title(fig_spec["title"] + " (mean, 95 % CI over paired seeds)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths += save(fig, out, f"{spec['name']}_{fig_spec['name']}")
    if a.get("optima"):
        cells = list(a["optima"])
        fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(cells)), 3.4))
        for i, cell in enumerate(cells):
            for j, (d, color) in enumerate((("fkl", "tab:blue"), ("rkl", "tab:orange"))):
                v = [x[d] for x in a["optima"][cell].values()]
                ax.bar(i + 0.4 * j - 0.2, np.mean(v), 0.38, color=color, alpha=0.6,
                       label=None if i else f"TV to the {NAMES[d]}-KL optimum")
                ax.scatter(np.full(len(v), i + 0.4 * j - 0.2), v, color="k", s=8, zorder=3)
        ax.set_xticks(range(len(cells)), [a["cells"][c]["label"] for c in cells], rotation=40,
                      ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("TV(final policy, optimum)")
        ax.set_title(f"{spec['name']}: which KL-regularized optimum each loss reaches "
                     "(bars: mean, dots: seeds)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths += save(fig, out, f"{spec['name']}_optima")
    if a.get("collapse", {}).get("rates"):
        rates = a["collapse"]["rates"]
        # horizontal bars: the cells' labels are long and read left to right
        fig, ax = plt.subplots(figsize=(9.0, 1.2 + 0.28 * len(rates)))
        for i, (_cell, r) in enumerate(rates.items()):
            p = r["k"] / r["n"]
            ax.barh(i, p, color="tab:red", alpha=0.6)
            ax.errorbar(p, i, xerr=[[p - r["ci"][0]], [r["ci"][1] - p]], color="k", capsize=3)
        ax.set_yticks(range(len(rates)), [a["cells"][c]["label"] for c in rates], fontsize=7)
        ax.invert_yaxis()   # the study file's order, top to bottom
        ax.set_xlabel("collapse rate")
        ax.set_xlim(0, 1)
        ax.set_title(f"{spec['name']}: collapse rates (Clopper-Pearson 95 % CI)", fontsize=9)
        fig.tight_layout()
        paths += save(fig, out, f"{spec['name']}_collapse")
    return paths


# ----------------------------------------------------------------------------------------------
# RESULTS.md: generated blocks
# ----------------------------------------------------------------------------------------------

TESTBEDS = S.TESTBEDS


def claim_side(entry: dict, studies: dict) -> dict:
    """One side of a testbeds row: its study and its contrast's result (whose ``final`` says
    whether its verdict is given); or the reason the testbed cannot express the claim
    ({"why": ...})."""
    if "why" in entry:
        return {"why": entry["why"]}
    name, contrast = entry["study"], entry["contrast"]
    a = studies[name]
    found = [r for r in a["primary"] + a["secondary"] if r["name"] == contrast]
    if not found:
        raise S.StudyError(f"{TESTBEDS.name}: study {name} has no contrast {contrast!r}")
    r = found[0]
    return {"r": r, "study": name}


def verdict_class(r: dict) -> str:
    """'+' or '-' for a significant difference (its sign), '0' for none detected."""
    if r["verdict"] in (SUPPORTED, CONTRADICTED):
        return "+" if r["mean"] > 0 else "-"
    return "0"


def between_testbeds(a: dict, b: dict) -> tuple[float, float, float]:
    """The difference of two testbeds' estimates, a - b, with its 95 % Welch interval: each
    side's standard error is its paired t interval's half-width over t(0.975, n - 1) (the seeds of
    two testbeds are not paired)."""
    def se(r):
        return (r["hi"] - r["lo"]) / 2 / stats.t.ppf(0.975, r["n"] - 1)
    ra, rb = a["r"], b["r"]
    sa, sb = se(ra), se(rb)
    d, s2 = ra["mean"] - rb["mean"], sa ** 2 + sb ** 2
    df = s2 ** 2 / (sa ** 4 / (ra["n"] - 1) + sb ** 4 / (rb["n"] - 1)) if s2 > 0 else math.inf
    half = stats.t.ppf(0.975, df) * math.sqrt(s2)
    return d, d - half, d + half


def agreement(*sides: dict) -> str:
    """The testbeds row's last column: "replicated" only where every testbed ran the claim to
    every planned seed and found a difference of the same sign; "no difference on either" (on
    any, for more than two) where all found none; "pending" while a study's seeds are still
    landing; "one testbed only" where a testbed cannot express the claim. Where the verdicts
    differ, the difference of the testbeds' estimates with its 95 % interval (between_testbeds)
    tells which kind: "the testbeds disagree" when an interval excludes 0 (the pair whose interval
    lies farthest from 0 is shown), "same sign, significance differs" when every estimate has one
    sign and every interval holds 0, else "opposite signs, within the noise"."""
    if any("why" in side for side in sides):
        return "one testbed only"
    for side in sides:
        if not side["r"]["final"]:
            return f"pending ({side['study']}: {side['r']['pending']})"
    found = {verdict_class(side["r"]) for side in sides}
    if len(found) == 1:
        none = "no difference on either" if len(sides) == 2 else "no difference on any"
        return none if found == {"0"} else "**replicated**"
    pairs = [(a, b, *between_testbeds(a, b)) for i, a in enumerate(sides) for b in sides[i + 1:]]
    a, b, d, lo, hi = max(pairs, key=lambda p: max(p[3], -p[4]))   # lo > 0 or hi < 0: apart
    shown = f"{a['study']} - {b['study']} {_f(d)} [{_f(lo)}, {_f(hi)}]"
    if lo > 0 or hi < 0:
        return f"the testbeds disagree ({shown})"
    signs = {math.copysign(1, side["r"]["mean"]) for side in sides}
    if len(signs) == 1:
        return f"same sign, significance differs ({shown})"
    return f"opposite signs, within the noise ({shown})"


def two_testbeds_report(studies: dict, path: Path) -> str | None:
    """The claims of testbeds.json, each with its contrast on every testbed the file names
    (``testbeds``: key and column header; a row holds one entry per testbed); None unless every
    study it names has results (a results folder of one study leaves it alone)."""
    def cell(side: dict) -> str:
        if "why" in side:
            return side["why"]
        r = side["r"]
        if r["n"] == 0:
            return f"{side['study']}: not yet run"
        return (f"{side['study']}: {_f(r['mean'])} [{_f(r['lo'])}, {_f(r['hi'])}], n = {r['n']}; "
                f"{r['verdict']}")
    spec = json.loads(path.read_text())
    beds = spec.get("testbeds")
    if not (isinstance(beds, dict) and len(beds) >= 2):
        raise S.StudyError(f"{path.name}: 'testbeds' must map each testbed's key to its column's "
                           f"header, two or more")
    for row in spec["rows"]:
        if set(beds) - set(row):
            raise S.StudyError(f"{path.name}: the row {row['claim']!r} has no entry for "
                               f"{sorted(set(beds) - set(row))}")
    named = {row[k]["study"] for row in spec["rows"] for k in beds if "study" in row[k]}
    if not named <= set(studies):
        return None
    last = "both" if len(beds) == 2 else "all"
    L = ["| claim | " + " | ".join(beds.values()) + f" | {last} |",
         "|---|" + "---|" * (len(beds) + 1)]
    for row in spec["rows"]:
        sides = [claim_side(row[k], studies) for k in beds]
        L.append(f"| {row['claim']} | " + " | ".join(map(cell, sides))
                 + f" | {agreement(*sides)} |")
    return "\n".join(L) + "\n"


def begin(study: str) -> str:
    return f"<!-- generated: python -m small_scale.study.analysis --all ({study}) -->"


def end(study: str) -> str:
    return f"<!-- end generated ({study}) -->"


def marked(text: str) -> list[str]:
    """The names of the generated blocks in ``text``, in order."""
    return re.findall(re.escape(begin("@")).replace("@", "(.+?)"), text)


def body_of(text: str, name: str) -> str:
    """What stands between block ``name``'s markers."""
    return text.split(begin(name), 1)[1].split(end(name), 1)[0]


def stale_blocks(text: str, blocks: dict, results) -> list[tuple[str, str]]:
    """(block, why) for each generated block of ``text`` that ``blocks`` does not give as it
    stands: "unmade" when nothing makes it (its study has no rows: the tables would outlive
    them), "differs" when its tables are not what the rows give. An empty block (its markers
    with nothing between them) is a study not started: it stands without rows."""
    out = []
    for name in marked(text):
        if end(name) not in text:
            out.append((name, f"unmade: block {name} has no end marker {end(name)}"))
        elif name not in blocks and not body_of(text, name).strip():
            continue
        elif name not in blocks:
            why = ("a study it names has no rows" if name == "testbeds" else
                   f"{S.shown(S.results_path(name, results))} has no rows")
            out.append((name, f"unmade: block {name} stands, but {why}; restore the rows (git "
                              f"checkout) or remove the block"))
        elif between(text, begin(name), end(name), blocks[name]) != text:
            out.append((name, f"differs: block {name} is not what its rows give; run: python -m "
                              f"small_scale.study.analysis --all"))
    return out


def fill_blocks(text: str, blocks: dict) -> str:
    """RESULTS.md with each study's block (between its begin and end markers) replaced by its
    report; a study without markers gets none."""
    for study, body in blocks.items():
        b, e = begin(study), end(study)
        if b in text and e in text:
            text = between(text, b, e, body)
    return text


def between(text: str, b: str, e: str, body: str) -> str:
    """``text`` with what stands between the markers ``b`` and ``e`` replaced by ``body``."""
    i, j = text.index(b) + len(b), text.index(e)
    return text[:i] + "\n" + body + text[j:]


def analysed(results=S.RESULTS, studies=S.STUDIES) -> dict:
    """{study: (spec, analysis)} of every study with results: every row of every results file is
    read and checked before anything is analysed (a bad row: StudyError, nothing written)."""
    out = {}
    for name in [p.stem for p in sorted(Path(studies).glob("*.json"))]:
        if not S.results_path(name, results).exists():
            continue
        spec = S.load_study(name, studies)
        rows = S.read_rows(S.results_path(name, results), spec)
        S.check_provenance(S.results_path(name, results), spec, rows)
        if rows:
            out[name] = (spec, rows)
    return {name: (spec, analyse(spec, rows)) for name, (spec, rows) in out.items()}


def generated(results=S.RESULTS, studies=S.STUDIES) -> dict:
    """{study: report} of every study with results."""
    return {name: report(a) for name, (_, a) in analysed(results, studies).items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m small_scale.study.analysis",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("study", nargs="?", help="one study's report to stdout")
    ap.add_argument("--all", action="store_true", help="every study with results")
    ap.add_argument("--check", action="store_true", help="with --all: only compare RESULTS.md")
    ap.add_argument("--json", action="store_true", help="the analysis as JSON instead")
    ap.add_argument("--results", default=str(S.RESULTS))
    ap.add_argument("--studies", default=str(S.STUDIES), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(OUT), help="figures and reports (with --all)")
    ap.add_argument("--results-md", default=str(RESULTS_MD), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if bool(a.study) == a.all:
        ap.error("name one study, or --all")
    try:
        if a.study:
            spec = S.load_study(a.study, a.studies)
            path = S.results_path(a.study, a.results)
            rows = S.read_rows(path, spec)
            S.check_provenance(path, spec, rows)
            res = analyse(spec, rows)
            print(json.dumps(res, indent=1, default=str) if a.json else report(res))
            return 0
        studies = analysed(a.results, a.studies)
    except S.StudyError as e:
        print(f"small_scale.study.analysis: {e}", file=sys.stderr)
        return 2
    blocks = {name: report(res) for name, (_, res) in studies.items()}
    try:
        both = two_testbeds_report({name: res for name, (_, res) in studies.items()}, TESTBEDS)
    except S.StudyError as e:
        print(f"small_scale.study.analysis: {e}", file=sys.stderr)
        return 2
    if both is not None:
        blocks["testbeds"] = both
    md = Path(a.results_md)
    text = md.read_text()
    new = fill_blocks(text, blocks)
    stale = stale_blocks(text, blocks, a.results)
    unmade = [why for _, why in stale if why.startswith("unmade")]
    if a.check or unmade:   # nothing is written while a block has no rows to make it
        for _, why in (stale if a.check else [(None, w) for w in unmade]):
            print(f"small_scale.study.analysis: {S.shown(md)}: {why.split(': ', 1)[1]}",
                  file=sys.stderr)
        return (1 if a.check else 2) if stale else 0
    out = Path(a.out)
    for name, (spec, res) in studies.items():
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.md").write_text(blocks[name])
        for p in [out / f"{name}.md"] + plot_levels(spec, res, out):
            print(p)
    if new != text:
        md.write_text(new)
        print(f"rewrote the generated blocks of {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
