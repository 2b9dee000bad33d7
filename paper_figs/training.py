"""Training dynamics and Last/Best tables from small_scale/ logs, in the shape of the paper's
fig:main_8k / fig:ablation_clip / fig:ablation_kl and tab:main_table_4k.

Two sources, one shape. A study (small_scale/studies/<exp>.json, run by small_scale/study/runner.py)
keeps one row per finished run in small_scale/results/<exp>.jsonl: its ``series`` are the metrics
rows the figures draw, its ``summary`` the trainer's summary.json, its cells the runs. Beside it,
the legacy log layout, one file per experiment, <logs>/<exp>.jsonl (written by
small_scale/run_experiments.py); an experiment is read from its legacy log where there is one,
else from its study (``load_experiment``). One JSON object a line:

    {"experiment": {...}}                        the experiment's config (runs, groups, seeds)
    {"invocation": {...}}                        the command that last wrote the file
    {"run": R, "seed": k, "config": {...}}       the trainer's config.json of run R, seed k
    {"run": R, "seed": k, "summary": {...}}      its summary.json (final row, eval, bandit optimum)
    {"run": R, "seed": k, "metrics": {...}}      one metrics.jsonl row (trimmed to the keys the
                                                 experiment lists), in step order

The trainer's metric names are mapped to panels by ``PANELS`` (the one adapter between the
trainer and the figures). Spread over seeds: a thin line per seed under the thick line of their
mean (seeds share their warm start across runs, so a min..max band would hide one run's seeds
under the others'); tables give mean +- sample std over seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from rpg_ref import strict_json

from ._common import REPO_ROOT, plt, save
from .study_rows import read_study_rows

DEFAULT_LOGS = REPO_ROOT / "small_scale" / "logs"

# panel -> (candidate metric keys in metrics.jsonl, axis label). First key present wins.
PANELS = {
    "eval_accuracy": (("eval_greedy_accuracy", "eval_accuracy"), "held-out accuracy (greedy)"),
    "accuracy": (("accuracy",), "train accuracy (samples of $\\pi_{old}$)"),
    "reward": (("reward",), "reward (critic score)"),
    "entropy": (("entropy",), "entropy (token mean)"),
    "response_len": (("response_len", "response_length"), "response length (tokens)"),
    "kl_old": (("kl_old",), "KL$(\\pi_\\theta\\|\\pi_{old})$ per token"),
    "expected_reward": (("eval_expected_reward",), "expected reward $E_{\\pi_\\theta}[R]$"),
    "p_best": (("eval_p_best",), "probability of the best arm"),
    "kl_ref": (("kl_ref",), "KL$(\\pi_{old}\\|\\pi_{ref})$ (k3)"),
    # derived (bandit_gap_panel), not a logged key:
    "optimum_gap": ((), "$|E_{\\pi_\\theta}[R] - E_{\\pi^*}[R]|$, $\\pi^*$ = analytic optimum"),
}
LOG_PANELS = ("optimum_gap",)
SEQ_PANELS = ("eval_accuracy", "accuracy", "reward", "entropy", "response_len", "kl_old")
BANDIT_PANELS = ("expected_reward", "p_best", "entropy", "kl_ref")
TRAIN_SMOOTH = 5      # Last/Best of per-step train metrics use a trailing mean over this many steps


# ----------------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------------

def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if line.strip():
            try:
                rows.append(strict_json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i + 1}: not a JSON object ({e})") from e
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def read_experiment_log(path: Path) -> dict:
    """{"experiment", "invocation", "runs": {run: {seed: {"config", "summary", "metrics"}}}} of one
    experiment's log file (layout in the module docstring); seeds in increasing order."""
    out, runs = {"experiment": None, "invocation": None}, {}
    for rec in read_jsonl(path):
        if "run" not in rec:
            out.update({k: v for k, v in rec.items() if k in out})
            continue
        kind = next((k for k in ("config", "summary", "metrics") if k in rec), None)
        if kind is None or "seed" not in rec:
            raise ValueError(
                f"{path}: a record without seed and config/summary/metrics: {rec!r:.120}"
            )
        seed = runs.setdefault(rec["run"], {}).setdefault(
            rec["seed"], {"config": None, "summary": None, "metrics": []})
        if kind == "metrics":
            seed["metrics"].append(rec["metrics"])
        else:
            seed[kind] = rec[kind]
    if out["experiment"] is None:
        raise ValueError(f"{path}: no experiment record")
    out["runs"] = {r: dict(sorted(seeds.items())) for r, seeds in runs.items()}
    return out


def load_study(exp: str, root: Path) -> dict | None:
    """A study's results in the shape of an experiment log (None when there are none): the study
    file root/studies/<exp>.json gives the runs (its cells, labels and groups), the rows of
    root/results/<exp>.jsonl their seeds (series as metrics, summary)."""
    spec_path = root / "studies" / f"{exp}.json"
    if not spec_path.is_file():
        return None
    spec = {**json.loads(spec_path.read_text()), "name": exp}
    rows = read_study_rows(root / "results" / f"{exp}.jsonl", spec)
    if not rows:
        return None
    runs = {}
    for r in sorted(rows, key=lambda r: r["seed"]):
        runs.setdefault(r["cell"], {})[r["seed"]] = {
            "config": None, "summary": r["summary"], "metrics": r["series"]}
    return {"experiment": {"description": spec.get("description", ""),
                           "runs": {c: {"label": v.get("label", c)}
                                    for c, v in spec["cells"].items()},
                           "groups": spec.get("groups", {})},
            "invocation": None, "runs": runs}


def load_experiment(exp: str, logs=DEFAULT_LOGS) -> dict:
    """{"spec": the experiment's config, "runs": {run: [{"seed", "metrics", "summary"}]}} in the
    spec's run order, from the legacy log <logs>/<exp>.jsonl or else from the study <exp> beside
    ``logs`` (<logs>/../results, <logs>/../studies). A run listed in the spec without logs is an
    error naming the command to make them."""
    path = Path(logs) / f"{exp}.jsonl"
    make = f"python -m small_scale.study {exp}"
    log = read_experiment_log(path) if path.exists() else load_study(exp, Path(logs).parent)
    if log is None:
        raise FileNotFoundError(f"no logs for experiment {exp!r}: neither {path} nor its study's "
                                f"results; run: {make}")
    spec, runs = log["experiment"], {}
    for run in spec["runs"]:
        seeds = {s: r for s, r in log["runs"].get(run, {}).items() if r["metrics"]}
        if not seeds:
            raise FileNotFoundError(
                f"experiment {exp!r}: run {run!r} has no metrics rows; run: {make}"
            )
        runs[run] = [{"seed": s, "metrics": r["metrics"], "summary": r["summary"]}
                     for s, r in seeds.items()]
    return {"spec": spec, "runs": runs}


def _key(rows: list[dict], panel: str) -> str | None:
    for k in PANELS[panel][0]:
        if any(k in r for r in rows):
            return k
    return None


def series(recs: list[dict], panel: str) -> dict | None:
    """Steps and values [n_seeds, n_steps] of one panel's metric; None if the metric is absent.
    Seeds must have logged it at the same steps (a shorter or broken run is an error)."""
    key = _key(recs[0]["metrics"], panel)
    if key is None:
        return None
    per_seed = []
    for r in recs:
        pts = [
            (row["step"], row[key]) for row in r["metrics"] if key in row and row[key] is not None
        ]
        per_seed.append(pts)
    steps = [p[0] for p in per_seed[0]]
    for r, pts in zip(recs, per_seed):
        if [p[0] for p in pts] != steps:
            raise ValueError(
                f"seed {r['seed']} logged {key!r} at different steps than seed "
                f"{recs[0]['seed']} ({len(pts)} vs {len(steps)} points): incomplete run?"
            )
    vals = np.asarray([[p[1] for p in pts] for pts in per_seed], dtype=float)
    return {"key": key, "step": np.asarray(steps), "values": vals}


def dynamics_data(exp: str, runs=None, panels=SEQ_PANELS, logs=DEFAULT_LOGS) -> dict:
    """{panel: {run: {key, step, values [S, T], mean, lo, hi}}} for the given runs (default: all);
    ``seeds[run]`` names the seed of each row of ``values``."""
    ex = load_experiment(exp, logs)
    runs = list(ex["runs"]) if runs is None else list(runs)
    missing = [r for r in runs if r not in ex["runs"]]
    if missing:
        raise ValueError(f"experiment {exp!r} has no runs {missing}; it has {list(ex['runs'])}")
    out = {
        "exp": exp,
        "runs": runs,
        "labels": {r: ex["spec"]["runs"][r].get("label", r) for r in runs},
        "n_seeds": {r: len(ex["runs"][r]) for r in runs},
        "seeds": {r: [rec["seed"] for rec in ex["runs"][r]] for r in runs},
        "panels": {},
    }
    for panel in panels:
        cur = {}
        for run in runs:
            s = series(ex["runs"][run], panel)
            if s is not None:
                s.update(mean=s["values"].mean(0), lo=s["values"].min(0), hi=s["values"].max(0))
                cur[run] = s
        if cur:
            out["panels"][panel] = cur
    return out


def bandit_gap_panel(exp: str = "bandit", logs=DEFAULT_LOGS) -> dict:
    """{run: series} of |E_theta[R] - E_{pi*}[R]| per seed at the evaluation steps, pi* the seed's
    analytic KL-regularized optimum (summary.json), for the runs that have one."""
    ex = load_experiment(exp, logs)
    out = {}
    for run, recs in ex["runs"].items():
        if any(r["summary"] is None or r["summary"].get("optimum") is None for r in recs):
            continue
        s = series(recs, "expected_reward")
        target = np.asarray(
            [np.dot(r["summary"]["optimum"], r["summary"]["rewards"]) for r in recs]
        )
        v = np.abs(s["values"] - target[:, None])                       # [S, T]
        out[run] = {"key": "optimum_gap", "step": s["step"], "values": v,
                    "mean": v.mean(0), "lo": v.min(0), "hi": v.max(0)}
    return out


def _trailing_mean(v: np.ndarray, k: int) -> np.ndarray:
    """Trailing mean over the last k points (fewer at the start), along the last axis."""
    c = np.cumsum(np.pad(v, [(0, 0)] * (v.ndim - 1) + [(1, 0)]), axis=-1)
    idx = np.arange(1, v.shape[-1] + 1)
    lo = np.maximum(idx - k, 0)
    return (c[..., idx] - c[..., lo]) / (idx - lo)


def last_best_data(
    exp: str, metrics=("eval_accuracy", "accuracy"), runs=None, logs=DEFAULT_LOGS
) -> dict:
    """tab:main_table_4k's shape: per run and metric, Last (value at the final logged step) and
    Best (max over logged steps), each mean and sample std over seeds (and per seed:
    ``last_values``, ``best_values`` in the order of ``seeds``). Eval metrics are used as logged;
    per-step train metrics first get a trailing mean over TRAIN_SMOOTH steps."""
    d = dynamics_data(exp, runs, metrics, logs)
    rows = {}
    for run in d["runs"]:
        rows[run] = {}
        for m in metrics:
            s = d["panels"].get(m, {}).get(run)
            if s is None:
                raise ValueError(f"{exp}/{run}: metric {m!r} ({PANELS[m][0]}) not in its logs")
            v = (
                s["values"]
                if s["key"].startswith("eval_")
                else _trailing_mean(s["values"], TRAIN_SMOOTH)
            )
            last, best = v[:, -1], v.max(1)
            sd = (lambda a: float(a.std(ddof=1)) if len(a) > 1 else float("nan"))
            rows[run][m] = {"last": float(last.mean()), "last_std": sd(last),
                            "best": float(best.mean()), "best_std": sd(best), "n_seeds": len(last),
                            "final_step": int(s["step"][-1]),
                            "seeds": d["seeds"][run],
                            "last_values": last.tolist(), "best_values": best.tolist()}
    return {"exp": exp, "metrics": list(metrics), "labels": d["labels"], "rows": rows}


def gain_data(
    exp: str, metric: str = "accuracy", k: int = 10, runs=None, logs=DEFAULT_LOGS
) -> dict:
    """Per run and seed: mean of ``metric`` over the last k logged steps minus its mean over the
    first k (how much training moved it). Seeds share their warm start across runs, so
    differences between runs are paired by seed."""
    d = dynamics_data(exp, runs, (metric,), logs)
    rows = {}
    for run in d["runs"]:
        v = d["panels"][metric][run]["values"]                              # [S, T]
        if v.shape[1] < 2 * k:
            raise ValueError(f"{exp}/{run}: {v.shape[1]} logged steps, need >= {2 * k} for k={k}")
        rows[run] = v[:, -k:].mean(1) - v[:, :k].mean(1)
    return {"exp": exp, "metric": metric, "k": k, "labels": d["labels"], "rows": rows}


def gain_markdown(g: dict) -> str:
    lines = [
        (f"| Method | gain in {PANELS[g['metric']][1]} (last {g['k']} − first {g['k']} steps), per "
         "seed | mean |"),
        "|---|---|---|",
    ]
    for run, v in g["rows"].items():
        lines.append(
            f"| {g['labels'][run]} | {', '.join(f'{x:+.3f}' for x in v)} | {v.mean():+.3f} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------

def _ranks(table: dict, m: str, field: str) -> dict:
    order = sorted(table["rows"], key=lambda r: -table["rows"][r][m][field])
    return {r: i for i, r in enumerate(order)}


def _cell(table, run, m, field, fmt_best, fmt_second):
    c = table["rows"][run][m]
    txt = (
        f"{c[field]:.3f} ± {c[field + '_std']:.3f}"
        if not math.isnan(c[field + "_std"])
        else f"{c[field]:.3f}"
    )
    rank = _ranks(table, m, field)[run]
    return fmt_best(txt) if rank == 0 else fmt_second(txt) if rank == 1 else txt


def to_markdown(table: dict) -> str:
    heads = [PANELS[m][1] for m in table["metrics"]]
    lines = ["| Method | " + " | ".join(f"{h} Last | {h} Best" for h in heads) + " |",
             "|---|" + "---|---|" * len(heads)]
    for run in table["rows"]:
        cells = []
        for m in table["metrics"]:
            for f in ("last", "best"):
                cells.append(_cell(table, run, m, f, lambda t: f"**{t}**", lambda t: f"<u>{t}</u>"))
        lines.append(f"| {table['labels'][run]} | " + " | ".join(cells) + " |")
    n = {c["n_seeds"] for r in table["rows"].values() for c in r.values()}
    lines.append("")
    lines.append(
        f"Mean ± sample std over {'/'.join(map(str, sorted(n)))} seeds. Best column value in bold, "
        f"second underlined. Last: value at the final step; Best: maximum over logged steps "
        f"(train metrics: trailing mean over {TRAIN_SMOOTH} steps first)."
    )
    return "\n".join(lines) + "\n"


def to_latex(table: dict) -> str:
    ms = table["metrics"]
    esc = lambda s: s.replace("_", r"\_").replace("%", r"\%")
    lines = [
        r"\begin{tabular}{l|" + "|".join(["cc"] * len(ms)) + "}",
        r"\toprule",
        r"\multicolumn{1}{c|}{\multirow{2}{*}{\textbf{Method}}} & "
        + " & ".join(rf"\multicolumn{{2}}{{c}}{{\textbf{{{esc(PANELS[m][1])}}}}}" for m in ms)
        + r" \\",
        " & ".join([""] + [r"\textbf{Last} & \textbf{Best}"] * len(ms)) + r" \\",
        r"\midrule",
    ]
    for run in table["rows"]:
        cells = [
            _cell(table, run, m, f, lambda t: rf"\textbf{{{t}}}", lambda t: rf"\underline{{{t}}}")
            for m in ms
            for f in ("last", "best")
        ]
        lines.append(
            esc(table["labels"][run])
            + " & "
            + " & ".join(c.replace("±", r"$\pm$") for c in cells)
            + r" \\"
        )
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def bandit_table_data(exp: str = "bandit", logs=DEFAULT_LOGS) -> dict:
    """Per run: final total-variation distance to the analytic KL-regularized optimum and the
    final expected reward (mean, std, values over seeds), from the trainer's summaries."""
    ex = load_experiment(exp, logs)
    rows = {}
    for run, recs in ex["runs"].items():
        if any(r["summary"] is None for r in recs):
            raise ValueError(f"{exp}/{run}: a seed has no summary (unfinished run?)")
        tv = [r["summary"].get("tv_distance") for r in recs]
        er = [float(np.dot(r["summary"]["policy"], r["summary"]["rewards"])) for r in recs]
        # each seed has its own random pi_ref, hence its own optimum
        opt = [r["summary"].get("optimum") for r in recs]
        rows[run] = {
            "label": ex["spec"]["runs"][run].get("label", run),
            "tv": None if any(t is None for t in tv) else np.asarray(tv, float),
            "expected_reward": np.asarray(er),
            "optimum_reward": None
            if any(o is None for o in opt)
            else np.asarray([float(np.dot(o, r["summary"]["rewards"])) for o, r in zip(opt, recs)]),
            "note": recs[0]["summary"].get("optimum_note", ""),
        }
    return {"exp": exp, "rows": rows}


def bandit_markdown(t: dict) -> str:
    lines = [("| Method | TV to optimum (mean ± std) | max TV over seeds | E[R] final | "
             "E[R] final − E[R] at optimum (max abs over seeds) | fixed point |"),
             "|---|---|---|---|---|---|"]
    for r in t["rows"].values():
        sd = (lambda a: a.std(ddof=1) if len(a) > 1 else 0.0)
        tv = "n/a" if r["tv"] is None else f"{r['tv'].mean():.4f} ± {sd(r['tv']):.4f}"
        mx = "n/a" if r["tv"] is None else f"{r['tv'].max():.4f}"
        gap = ("n/a" if r["optimum_reward"] is None else
               f"{np.abs(r['expected_reward'] - r['optimum_reward']).max():.1e}")
        er = f"{r['expected_reward'].mean():.4f} ± {sd(r['expected_reward']):.4f}"
        lines.append(f"| {r['label']} | {tv} | {mx} | {er} | {gap} | {r['note']} |")
    n = {len(r["expected_reward"]) for r in t["rows"].values()}
    lines += [
        "",
        (
            f"Over {'/'.join(map(str, sorted(n)))} seeds; each seed draws its own initial policy = "
            "pi_ref, hence its own optimum. TV = total-variation distance between the final "
            "policy and "
            "the analytic argmax of E_p[R] - beta D(p, pi_ref) "
            "(rpg_ref.trainer.train.kl_regularized_optimum)."
        ),
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# drawing
# ----------------------------------------------------------------------------------------------

def _linestyle(run: str) -> str:
    """RPG-REINFORCE dashed, RPG solid, baselines dotted (the families at a glance)."""
    if run.startswith("rpg-reinforce"):
        return "--"
    if run.startswith("rpg-") or not any(
        run.startswith(b) for b in ("grpo", "dapo", "reinforce++")
    ):
        return "-"
    return ":"


def plot_dynamics(data: dict, out_dir=None, name: str = "dynamics", title: str = ""):
    panels = list(data["panels"])
    ncol = 3
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.1 * nrow), squeeze=False)
    n = len(data["runs"])
    cmap = plt.get_cmap("tab20" if n > 10 else "tab10")
    colors = [cmap(i % cmap.N) for i in range(n)]
    for ax, panel in zip(axes.flat, panels):
        for run, c in zip(data["runs"], colors):
            s = data["panels"][panel].get(run)
            if s is None:
                continue
            # each seed thin: seeds share their warm start across runs, so they form one bundle
            # per seed, and a band from the lowest to the highest seed would cover the others
            ax.plot(s["step"], s["values"].T, color=c, lw=0.5, alpha=0.35)
            ax.plot(s["step"], s["mean"], color=c, lw=1.6, ls=_linestyle(run),
                    marker="o" if len(s["step"]) < 12 else None,
                    ms=3, label=f"{data['labels'][run]} (n={data['n_seeds'][run]})")
        if panel in LOG_PANELS:
            ax.set_yscale("log")
        ax.set_title(PANELS[panel][1], fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    h, lab = max((ax.get_legend_handles_labels() for ax in axes.flat), key=lambda hl: len(hl[1]))
    fig.legend(
        h, lab, loc="lower center", ncol=min(4, len(lab)), fontsize=8, bbox_to_anchor=(0.5, -0.02)
    )
    fig.suptitle(title + "  (thick line: mean over seeds; thin lines: each seed)", fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.025 * math.ceil(len(lab) / 4), 1, 1))
    return save(fig, out_dir, name)


def plot_bandit_tv(table: dict, out_dir=None, name: str = "bandit_tv_to_optimum"):
    runs = [r for r in table["rows"].values() if r["tv"] is not None]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for i, r in enumerate(runs):
        ax.bar(i, r["tv"].mean(), color="tab:blue", alpha=0.6)
        ax.scatter(np.full(len(r["tv"]), i), r["tv"], color="k", s=10, zorder=3)
    ax.set_xticks(range(len(runs)), [r["label"] for r in runs], rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("TV(final policy, analytic optimum)")
    ax.set_title(
        "bandit, fixed reference: distance to argmax E[R] - beta D (bars: mean, dots: seeds)",
        fontsize=9,
    )
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return save(fig, out_dir, name)
