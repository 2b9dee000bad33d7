"""The paper's results tables drawn from paper_figs/paper_results.json, and the small-scale seq
results set beside them.

* ``bars_data(label)``: per benchmark, Last and Best bars per method (the paper's numbers), the
  marks the paper printed, the strongest baseline's Last/Best (drawn as lines across the panel),
  and where the table contradicts itself (Best < Last, a bold/underline that is not the
  column's 1st/2nd value) -- the same predicates the checks use (derivations.paper_tables).
* ``side_by_side_data(logs)``: the paper's AIME columns (8k and 4k) and the seq task's held-out
  accuracy in one Last/Best table, plus ``replication_rows``: the paper's comparative claims
  evaluated the same way on the small-scale logs, with a paired t-test over seeds.

Needs the derivations package (sympy) for the transcription's predicates; the other figures of
paper_figs do not.
"""

from __future__ import annotations

import math

import numpy as np

from derivations import paper_tables as pt
from derivations import tables as table_checks

from . import training
from ._common import plt, save

FAMILY_COLORS = {"baseline": "tab:orange", "rpg": "#4a62e0", "rpg-reinforce": "#1f9e7a"}
FAMILY_NAMES = {"baseline": "baselines", "rpg": "RPG", "rpg-reinforce": "RPG-REINFORCE"}
CONTRADICTION = "red"
METRICS = ("Last", "Best")
# the paper's AIME columns set beside the small-scale held-out accuracy (the seq experiment has
# fig:main_8k's and tab:main_table_4k's shape)
PAPER_COLUMNS = (("tab:main_table_8k", "AIME24"), ("tab:main_table_8k", "AIME25"),
                 ("tab:main_table_4k", "AIME24"), ("tab:main_table_4k", "AIME25"))
SMALL_METRIC = "eval_accuracy"
_BASELINE_ORDER = ("REINFORCE++-Baseline", "REINFORCE++", "GRPO", "DAPO")
_DIV_ORDER = ("FKL", "RKL", "UFKL", "URKL")


def short(label: str) -> str:
    return label.replace("tab:main_table_", "")


def method_order(methods) -> list:
    """Baselines (the paper's order), then RPG-*, then RPG-REINFORCE-*, each by divergence."""
    def key(m):
        fam = pt.family(m)
        rank = {"baseline": 0, "rpg": 1, "rpg-reinforce": 2}[fam]
        sub = m.rsplit("-", 1)[-1].upper()
        idx = (
            (_BASELINE_ORDER.index(m) if m in _BASELINE_ORDER else len(_BASELINE_ORDER))
            if fam == "baseline"
            else (_DIV_ORDER.index(sub) if sub in _DIV_ORDER else len(_DIV_ORDER))
        )
        return rank, idx, m
    return sorted(dict.fromkeys(methods), key=key)


# ---------------------------------------------------------------------------
# one table as grouped bars
# ---------------------------------------------------------------------------

def _contradiction_text(m: dict) -> str:
    if m["mark"] == "bold":
        return f"bold but rank {m['rank']}" if m["printed"] else "highest, not bold"
    return f"underlined but rank {m['rank']}" if m["printed"] else "2nd highest, not underlined"


def bars_data(label: str, results: dict | None = None) -> dict:
    """The numbers behind one table's figure (no matplotlib)."""
    res = pt.load() if results is None else results
    t = pt.table(res, label)
    methods = [r["method"] for r in t["rows"]]
    benches = list(dict.fromkeys(c["benchmark"] for c in t["columns"]))
    cols = pt.columns(res, label)
    bars, marks, baseline_best = {}, {}, {}
    for b in benches:
        bars[b], marks[b], baseline_best[b] = {}, {}, {}
        for metric in METRICS:
            by_method = {c["method"]: c for c in cols[(b, metric)]}
            bars[b][metric] = [by_method[m]["value"] for m in methods]
            marks[b][metric] = [
                (
                    "bold"
                    if by_method[m]["bold"]
                    else "underline"
                    if by_method[m]["underline"]
                    else None
                )
                for m in methods
            ]
            base = [
                c
                for c in cols[(b, metric)]
                if pt.family(c["method"]) == "baseline" and c["value"] is not None
            ]
            top = max(base, key=lambda c: c["value"]) if base else None
            baseline_best[b][metric] = (
                None if top is None else {"method": top["method"], "value": top["value"]}
            )
    contradictions = []
    for v in pt.best_below_last(res):
        if v["table"] == label:
            for metric in METRICS:
                contradictions.append(
                    {
                        "benchmark": v["benchmark"],
                        "method": v["method"],
                        "metric": metric,
                        "kind": "Best < Last",
                        "line": v["line"],
                        "text": f"Best {v['best']} < Last {v['last']}",
                    }
                )
    for m in pt.mark_mismatches(res):
        if m["table"] == label:
            contradictions.append(
                {
                    "benchmark": m["benchmark"],
                    "method": m["method"],
                    "metric": m["metric"],
                    "kind": "mark",
                    "line": m["line"],
                    "text": _contradiction_text(m),
                }
            )
    return {
        "table": label,
        "caption_line": t["caption_line"],
        "setting": t["setting"],
        "methods": methods,
        "family": {m: pt.family(m) for m in methods},
        "benchmarks": benches,
        "bars": bars,
        "marks": marks,
        "baseline_best": baseline_best,
        "contradictions": contradictions,
    }


def _draw_bars(
    ax, methods, families, last, best, *, last_err=None, best_err=None, marks=None, flagged=()
):
    """Last (solid) and Best (hatched) bars per method in its family's colour; None = no bar."""
    x = np.arange(len(methods))
    w = 0.38
    for i, m in enumerate(methods):
        col = FAMILY_COLORS[families[m]]
        for j, (vals, errs, metric) in enumerate(
            ((last, last_err, "Last"), (best, best_err, "Best"))
        ):
            v = vals[i]
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            bad = (m, metric) in flagged
            ax.bar(
                x[i] + (j - 0.5) * w,
                v,
                w,
                color=col,
                alpha=1.0 if metric == "Last" else 0.45,
                hatch=None if metric == "Last" else "//",
                edgecolor=CONTRADICTION if bad else col,
                linewidth=2.2 if bad else 0.6,
                yerr=None if errs is None else errs[i],
                error_kw={"elinewidth": 0.8, "capsize": 2},
            )
            if marks and marks[metric][i]:
                ax.text(x[i] + (j - 0.5) * w, v, "1st" if marks[metric][i] == "bold" else "2nd",
                        ha="center", va="bottom", fontsize=6, fontweight="bold")
    ax.set_xticks(x, methods, rotation=40, ha="right", fontsize=7)
    for tick, m in zip(ax.get_xticklabels(), methods):
        tick.set_color(FAMILY_COLORS[families[m]])


def _ylim(ax, values):
    vals = [v for v in values if v is not None and not math.isnan(v)]
    lo, hi = min(vals), max(vals)
    pad = 0.15 * (hi - lo or 0.05)
    bottom = max(0.0, lo - 3 * pad)
    bottom = 0.0 if bottom < 0.25 * lo else bottom          # close to 0: start bars at 0
    ax.set_ylim(bottom, hi + 2 * pad)
    return bottom


def _legend(fig, extra=()):
    from matplotlib.patches import Patch
    handles = [Patch(color=c, label=FAMILY_NAMES[f]) for f, c in FAMILY_COLORS.items()]
    handles += [Patch(facecolor="white", edgecolor="k", label="Last (solid)"),
                Patch(facecolor="white", edgecolor="k", hatch="//", label="Best (hatched)")]
    handles += list(extra)
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=len(handles),
        fontsize=7,
        bbox_to_anchor=(0.5, -0.02),
    )


def plot_bars(d: dict, out_dir, name: str | None = None):
    from matplotlib.lines import Line2D
    benches = d["benchmarks"]
    fig, axes = plt.subplots(1, len(benches), figsize=(4.3 * len(benches), 3.8), squeeze=False)
    flagged = {(c["method"], c["metric"], c["benchmark"]) for c in d["contradictions"]}
    # (benchmark, method) -> its contradictions, numbered in the footer
    groups = {}
    for c in d["contradictions"]:
        texts = groups.setdefault((c["benchmark"], c["method"]), [])
        if f"{c['text']} (l.{c['line']})" not in texts:
            texts.append(f"{c['text']} (l.{c['line']})")
    for ax, b in zip(axes[0], benches):
        mine = {(m, met) for m, met, bb in flagged if bb == b}
        _draw_bars(ax, d["methods"], d["family"], d["bars"][b]["Last"], d["bars"][b]["Best"],
                   marks=d["marks"][b], flagged=mine)
        bottom = _ylim(ax, d["bars"][b]["Last"] + d["bars"][b]["Best"])
        for metric, ls in (("Last", "--"), ("Best", ":")):
            top = d["baseline_best"][b][metric]
            if top:
                ax.axhline(top["value"], color=FAMILY_COLORS["baseline"], ls=ls, lw=1.1)
        for k, (bb, m) in enumerate(groups, 1):
            if bb == b:
                i = d["methods"].index(m)
                v = max(
                    x for x in (d["bars"][b]["Last"][i], d["bars"][b]["Best"][i]) if x is not None
                )
                ax.annotate(f"!{k}", (i, v), xytext=(0, 9), textcoords="offset points", ha="center",
                            va="bottom", fontsize=8, color=CONTRADICTION, fontweight="bold")
        ax.set_title(b + ("" if bottom == 0 else f"  (y from {bottom:.2f})"), fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    extra = [Line2D([], [], color=FAMILY_COLORS["baseline"], ls="--", label="best baseline, Last"),
             Line2D([], [], color=FAMILY_COLORS["baseline"], ls=":", label="best baseline, Best")]
    if d["contradictions"]:
        from matplotlib.patches import Patch

        extra.append(
            Patch(
                facecolor="white",
                edgecolor=CONTRADICTION,
                lw=2,
                label="contradicts the table/caption",
            )
        )
    _legend(fig, extra)
    footer = [
        f"!{k} {b} {m}: " + "; ".join(texts) for k, ((b, m), texts) in enumerate(groups.items(), 1)
    ]
    if footer:
        fig.text(0.01, -0.04, "\n".join(footer), fontsize=7, color=CONTRADICTION, va="top")
    setting = ", ".join(f"{k} {v}" for k, v in d["setting"].items() if v)
    fig.suptitle(f"{d['table']} (caption l.{d['caption_line']}; {setting}): the paper's numbers; "
                 "'1st'/'2nd' = the paper's bold/underline", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return save(fig, out_dir, name or f"paper_{d['table'].removeprefix('tab:')}")


# ---------------------------------------------------------------------------
# the paper beside the small-scale seq task
# ---------------------------------------------------------------------------

def t_quantile(p: float, df: int) -> float:
    """Student-t quantile by bisection on the CDF (Simpson's rule on the density)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x, n=4000):
        h = x / n
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def paired(diffs) -> dict:
    """Mean, sample std and t = mean / (std / sqrt(n)) of per-seed differences; the two-sided 95%
    threshold; verdict 'replicates' (t > threshold), 'contradicted' (t < -threshold) or
    'not resolved'."""
    d = np.asarray(diffs, float)
    n = len(d)
    mean, sd = float(d.mean()), float(d.std(ddof=1)) if n > 1 else float("nan")
    crit = t_quantile(0.975, n - 1) if n > 1 else float("inf")
    t = (
        mean / (sd / math.sqrt(n))
        if n > 1 and sd > 0
        else (math.copysign(math.inf, mean) if mean else 0.0)
    )
    verdict = "replicates" if t > crit else "contradicted" if t < -crit else "not resolved"
    return {"n": n, "mean": mean, "std": sd, "t": t, "crit": crit, "verdict": verdict}


def _small(logs) -> dict:
    """{label: {"Last": [per seed], "Best": [...], "seeds": [...]}} of the seq task's held-out
    accuracy."""
    t = training.last_best_data("seq", metrics=(SMALL_METRIC,), logs=logs)
    out = {}
    for run, row in t["rows"].items():
        c = row[SMALL_METRIC]
        out[t["labels"][run]] = {
            "Last": c["last_values"],
            "Best": c["best_values"],
            "seeds": c["seeds"],
        }
    return out


def _diff(small, a, b, metric):
    """Per-seed a - b (paired by seed: the runs of a seed share their warm start)."""
    sa, sb = (
        dict(zip(small[a]["seeds"], small[a][metric])),
        dict(zip(small[b]["seeds"], small[b][metric])),
    )
    common = sorted(set(sa) & set(sb))
    return [sa[s] - sb[s] for s in common]


def replication_rows(logs=training.DEFAULT_LOGS, results: dict | None = None) -> list[dict]:
    """The paper's comparative claims, each measured on the paper's tables and, the same way, on
    the small-scale held-out accuracy (paired over seeds). The small-scale side picks the method
    pair with the largest mean difference, as the paper's "up to" does, which favours
    replication."""
    res = pt.load() if results is None else results
    small = _small(logs)
    fam = {m: pt.family(m) for m in small}
    rows = []
    # 1. "+6 points over DAPO" (abstract l.60, introduction l.262)
    margin = next(c for c in table_checks.CLAIMS if isinstance(c, table_checks.MarginClaim))
    top, c, _ = margin.margins(res)[0]
    paper = (f"up to {margin.text} quoted; largest {top:+.2f} ({short(c['table'])} {c['method']} "
             f"{c['benchmark']} {c['metric']})")
    cands = (
        [(m, metric) for m in small if fam[m] == "rpg-reinforce" for metric in METRICS]
        if "DAPO" in small
        else []
    )
    rows.append(
        _row(
            f"RPG-REINFORCE beats DAPO by up to {margin.text} points (l.{margin.line})",
            paper,
            small,
            [(m, "DAPO", metric) for m, metric in cands],
        )
    )
    # 2. "superiority over baselines including GRPO and DAPO" (l.805)
    n_cols = n_win = 0
    for t in res["tables"]:
        for col in pt.columns(res, t["label"]).values():
            base = [x["value"] for x in col if x["method"] in ("GRPO", "DAPO")]
            ours = [x["value"] for x in col if pt.family(x["method"]) != "baseline"]
            if base and ours:
                n_cols += 1
                n_win += max(ours) > max(base)
    ours = [m for m in small if fam[m] != "baseline"]
    base = [m for m in small if m in ("GRPO", "DAPO")]
    rows.append(
        _row(
            "an RPG method beats GRPO and DAPO (l.805)",
            f"in {n_win} of {n_cols} columns the best RPG/RPG-REINFORCE entry beats the better of "
            "GRPO, DAPO",
            small,
            [(o, bb, metric) for metric in METRICS for o in ours for bb in base],
            minimax=True,
        )
    )
    # 3. "RPG-REINFORCE variants have the strongest results across settings" (l.805)
    lead = []
    for t in res["tables"]:
        cols = pt.columns(res, t["label"])
        won = sum(
            any(pt.family(x["method"]) == "rpg-reinforce" and pt.rank(col, x) == 1 for x in col)
            for col in cols.values()
        )
        lead.append(f"{short(t['label'])} {won}/{len(cols)}")
    rf = [m for m in small if fam[m] == "rpg-reinforce"]
    others = [m for m in small if fam[m] != "rpg-reinforce"]
    rows.append(
        _row(
            "RPG-REINFORCE strongest across settings (l.805)",
            "columns led (by value) by an RPG-REINFORCE entry: " + ", ".join(lead),
            small,
            [(r, o, metric) for metric in METRICS for r in rf for o in others],
            minimax=True,
        )
    )
    return rows


def _row(claim, paper, small, pairs, minimax=False) -> dict:
    """Evaluate ``pairs`` (a, b, metric) on the small-scale logs, paired over seeds. Plain: the
    pair with the largest mean difference. minimax: per metric, the best a (by mean) against the
    best b (by mean); the verdict is 'replicates' only if it does for both metrics."""
    if not pairs:
        return {
            "claim": claim,
            "paper": paper,
            "small": "the methods are not in the seq experiment",
            "verdict": "not tested",
            "stats": [],
        }
    mean = {m: {met: float(np.mean(v[met])) for met in METRICS} for m, v in small.items()}
    if minimax:
        pairs = [
            (
                max({p[0] for p in pairs if p[2] == metric}, key=lambda m: mean[m][metric]),
                max({p[1] for p in pairs if p[2] == metric}, key=lambda m: mean[m][metric]),
                metric,
            )
            for metric in METRICS
        ]
    stats = [
        {"a": a, "b": b, "metric": metric, **paired(_diff(small, a, b, metric))}
        for a, b, metric in pairs
    ]
    if not minimax:
        stats = [max(stats, key=lambda s: s["mean"])]
    txt = "; ".join(
        f"{s['a']} − {s['b']}, held-out {s['metric']}: {100 * s['mean']:+.1f} ± "
        f"{100 * s['std']:.1f} "
        f"points, t = {s['t']:.2f}"
        for s in stats
    )
    txt += f" ({stats[0]['n']} paired seeds; |t| > {stats[0]['crit']:.2f} needed)"
    verdicts = {s["verdict"] for s in stats}
    verdict = verdicts.pop() if len(verdicts) == 1 else "mixed: " + ", ".join(
        f"{s['metric']} {s['verdict']}" for s in stats)
    return {"claim": claim, "paper": paper, "small": txt, "verdict": verdict, "stats": stats}


def side_by_side_data(logs=training.DEFAULT_LOGS, results: dict | None = None) -> dict:
    """Rows = the union of the paper's methods (PAPER_COLUMNS) and the seq task's runs; for each,
    Last/Best of every paper column (as printed, with the paper's marks) and of the small-scale
    held-out accuracy (mean ± std over seeds)."""
    res = pt.load() if results is None else results
    small = _small(logs)
    methods = method_order([c["method"] for lb, bench in PAPER_COLUMNS for c in pt.cells_of(res, lb)
                            if c["benchmark"] == bench] + list(small))
    paper = {}
    for lb, bench in PAPER_COLUMNS:
        for metric in METRICS:
            by = {c["method"]: c for c in pt.columns(res, lb)[(bench, metric)]}
            paper[(lb, bench, metric)] = [by.get(m) for m in methods]
    sm = {
        metric: [
            (
                float(np.mean(small[m][metric])),
                float(np.std(small[m][metric], ddof=1))
                if len(small[m][metric]) > 1
                else float("nan"),
            )
            if m in small
            else None
            for m in methods
        ]
        for metric in METRICS
    }
    return {"methods": methods, "family": {m: pt.family(m) for m in methods}, "paper": paper,
            "small": sm, "n_seeds": sorted({len(v["Last"]) for v in small.values()}),
            "claims": replication_rows(logs, res)}


def side_by_side_markdown(d: dict) -> str:
    heads = [f"{short(lb)} {bench} {metric}" for lb, bench in PAPER_COLUMNS for metric in METRICS]
    heads += [f"small-scale held-out {metric}" for metric in METRICS]
    lines = ["| Method | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    small_rank = {}
    for metric in METRICS:
        vals = sorted({round(v[0], 3) for v in d["small"][metric] if v}, reverse=True)
        small_rank[metric] = vals
    for i, m in enumerate(d["methods"]):
        cells = []
        for lb, bench in PAPER_COLUMNS:
            for metric in METRICS:
                c = d["paper"][(lb, bench, metric)][i]
                cells.append("—" if c is None else f"**{c['text']}**" if c["bold"]
                             else f"<u>{c['text']}</u>" if c["underline"] else c["text"])
        for metric in METRICS:
            v = d["small"][metric][i]
            if v is None:
                cells.append("—")
                continue
            txt = f"{v[0]:.3f} ± {v[1]:.3f}"
            r = small_rank[metric].index(round(v[0], 3))
            cells.append(f"**{txt}**" if r == 0 else f"<u>{txt}</u>" if r == 1 else txt)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    n = "/".join(map(str, d["n_seeds"]))
    lines += [
        "",
        (
            "Paper columns: as printed, with the paper's own bold/underline "
            "(derivations/ERRATA.md E11-E12 "
            "for the 8k AIME25 column). Small scale: the seq task's greedy held-out accuracy, "
            "mean ± sample "
            f"std over {n} seeds, bold/underline = 1st/2nd by mean; — = not run. The benchmarks "
            "differ "
            "(AIME vs 2-digit addition): compare orderings, not values."
        ),
        "",
        "| claim (paper) | in the paper's tables | at small scale (seq task) | verdict |",
        "|---|---|---|---|",
    ]
    for r in d["claims"]:
        lines.append(f"| {r['claim']} | {r['paper']} | {r['small']} | {r['verdict']} |")
    lines += [
        "",
        (
            "Verdict: paired t-test over seeds (two-sided 5%); 'replicates' needs the small-scale "
            "difference in the paper's direction with |t| above the threshold, 'contradicted' the "
            "opposite, otherwise 'not resolved'. Row 1 takes the RPG-REINFORCE method and metric "
            "with the "
            "largest mean margin (selected, as the paper's \"up to\"; this favours 'replicates'); "
            "rows 2-3 "
            "compare the best method of each side by mean, per metric, as the paper's columns do."
        ),
    ]
    return "\n".join(lines) + "\n"


def plot_side_by_side(d: dict, out_dir, name: str = "paper_vs_small_scale"):
    methods = d["methods"]
    fig, axes = plt.subplots(2, 3, figsize=(13.5, 8.2))
    axes = list(axes.flat)
    for ax, (lb, bench) in zip(axes, PAPER_COLUMNS):
        last = [None if c is None else c["value"] for c in d["paper"][(lb, bench, "Last")]]
        best = [None if c is None else c["value"] for c in d["paper"][(lb, bench, "Best")]]
        _draw_bars(ax, methods, d["family"], last, best)
        bottom = _ylim(ax, [v for v in last + best if v is not None])
        ax.set_title(f"paper {short(lb)} {bench} (y from {bottom:.2f})", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    ax = axes[len(PAPER_COLUMNS)]
    mean = {m: [None if v is None else v[0] for v in d["small"][m]] for m in METRICS}
    err = {
        m: [0.0 if v is None or math.isnan(v[1]) else v[1] for v in d["small"][m]] for m in METRICS
    }
    _draw_bars(
        ax,
        methods,
        d["family"],
        mean["Last"],
        mean["Best"],
        last_err=err["Last"],
        best_err=err["Best"],
    )
    ends = [
        v + s * k
        for m in METRICS
        for v, s in zip(mean[m], err[m])
        if v is not None
        for k in (-1, 1)
    ]
    bottom = _ylim(ax, ends)
    ax.set_title(
        f"small scale: seq held-out accuracy, ± std over seeds (y from {bottom:.2f})", fontsize=9
    )
    ax.grid(alpha=0.3, axis="y")
    for ax in axes[len(PAPER_COLUMNS) + 1:]:
        ax.axis("off")
    _legend(fig)
    fig.suptitle(
        "the paper's AIME results beside the small-scale seq task (same methods, same Last/Best "
        "format; no bar = not run)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save(fig, out_dir, name)
