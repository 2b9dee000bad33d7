"""rpg-plot: draw and compare rpg-train runs.

    rpg-plot RUN [RUN ...] [--out FILE.png] [--smooth N]

Each RUN is an rpg-train output folder (its metrics.jsonl). One figure, six panels against the
training step: reward, accuracy (dots: the task's evaluations, eval_*), KL(pi_theta || pi_old)
(kl_old), entropy, clip fractions (low / high / dual bound) and response length; the runs are
overlaid in one color each, named in the legend. Each curve is a trailing mean over N steps
(--smooth; default about 1/20 of the run) drawn over the raw values. The table printed at the end
holds every run's final step, its last metrics and its last evaluation.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from rpg_ref.strict_json import step_rows
from rpg_ref.trainer import run_folder

PANELS = (  # (title, metric keys drawn in it, y label)
    ("reward", ("reward",), "mean reward"),
    ("accuracy", ("accuracy",), "fraction correct"),
    ("KL(π_θ ‖ π_old)", ("kl_old",), "token-mean KL"),
    ("entropy", ("entropy",), "nats per token"),
    ("clip fractions", ("clip_frac_low", "clip_frac_high", "clip_frac_dual"), "fraction of tokens"),
    ("response length", ("response_len",), "tokens"),
)
CLIP_STYLES = {"clip_frac_low": "-", "clip_frac_high": "--", "clip_frac_dual": ":"}
TABLE_KEYS = ("reward", "accuracy", "kl_old", "entropy", "clip_frac_low", "clip_frac_high",
              "response_len")


def read_run(folder: Path) -> list[dict]:
    """The complete rows of FOLDER/metrics.jsonl (a row cut short by a kill is left out)."""
    path = folder / "metrics.jsonl"
    rows = [row for _, row, _ in step_rows(path)] if path.is_file() else []  # bad row: file:line
    if rows:
        return rows
    if run_folder.in_use(folder):  # a live rpg-train holds the folder
        when = ("before its first step" if (folder / "config.json").is_file() else
                "still setting up (building its policy: a warm start, a model load)")
        raise ValueError(f"{folder}: an rpg-train run that is running, {when}: no completed "
                         f"step to plot yet; plot it again once its first step is done")
    if (folder / "config.json").is_file():
        raise ValueError(f"{folder}: an rpg-train run that stopped before completing a step: "
                         f"nothing to plot; continue it with rpg-train --resume {folder}")
    why = "no such folder" if not folder.exists() else "no metrics.jsonl in it"
    raise ValueError(
        f"{folder}: {why} (pass rpg-train output folders, e.g. runs/seq-rpg-reinforce-urkl-s0)"
    )


def labels_for(folders: list[Path]) -> list[str]:
    """Folder names, with parent folders added until every label is distinct."""
    depth = 1
    while True:
        labels = ["/".join(f.resolve().parts[-depth:]) for f in folders]
        if len(set(labels)) == len(labels) or depth > 8:
            return labels
        depth += 1


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` finite values (NaN where none is finite yet)."""
    out, buf = [], []
    for v in values:
        if v is not None and math.isfinite(v):
            buf.append(v)
            buf = buf[-window:]
        out.append(sum(buf) / len(buf) if buf else math.nan)
    return out


def series(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [(r["step"], float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
    return [s for s, _ in pts], [v for _, v in pts]


def final_table(runs: dict[str, list[dict]]) -> str:
    """One line per run: last step, the last row's metrics and the last evaluation's."""
    evals = sorted({k for rows in runs.values() for r in rows for k in r if k.startswith("eval_")})
    head = ["run", "steps", *TABLE_KEYS, *evals]
    lines = [head]
    for label, rows in runs.items():
        last = rows[-1]
        cells = [label, str(last["step"])]
        for k in TABLE_KEYS:
            cells.append(_fmt(last.get(k)))
        for k in evals:
            seen = [r[k] for r in rows if k in r]
            cells.append(_fmt(seen[-1] if seen else None))
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def _fmt(v) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:.4g}"


def plot(runs: dict[str, list[dict]], out: Path, window: int | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), constrained_layout=True)
    for ax, (title, keys, ylabel) in zip(axes.flat, PANELS):
        for i, rows in enumerate(runs.values()):
            color = colors[i % len(colors)]
            w = window or max(1, len(rows) // 20)
            for key in keys:
                steps, vals = series(rows, key)
                if not steps:
                    continue
                style = CLIP_STYLES.get(key, "-")
                if w > 1:
                    ax.plot(steps, vals, style, color=color, alpha=0.25, linewidth=0.8)
                ax.plot(steps, smooth(vals, w), style, color=color, linewidth=1.8)
            if title == "accuracy":  # the task's evaluations as dots, one marker per eval key
                for j, key in enumerate(sorted({k for r in rows for k in r
                                                if k.startswith("eval_") and _is_rate(k)})):
                    steps, vals = series(rows, key)
                    ax.plot(steps, vals, "osD^v"[j % 5], color=color, markersize=6,
                            markeredgecolor="black", markeredgewidth=0.5)
        if title == "clip fractions":
            for key, style in CLIP_STYLES.items():
                ax.plot([], [], style, color="gray", label=key.removeprefix("clip_frac_"))
            ax.legend(loc="upper right", fontsize=8, title="bound", title_fontsize=8)
        if title == "accuracy":
            title = "accuracy (line: sampled; dots: eval_*)"
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colors[i % len(colors)], linewidth=2.5)
               for i in range(len(runs))]
    fig.legend(handles, list(runs), loc="outside lower center", ncol=min(len(runs), 4), fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _is_rate(key: str) -> bool:
    """eval_* keys on the accuracy scale (greedy accuracy, mean@k, pass@k), not lengths."""
    return "accuracy" in key or "mean@" in key or "pass@" in key


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rpg-plot", description=__doc__.split("\n\n")[2],
                                 allow_abbrev=False)
    ap.add_argument("runs", nargs="+", metavar="RUN", help="rpg-train output folders")
    ap.add_argument("--out", default="rpg-plot.png", help="image file (default rpg-plot.png; .png, "
                    ".pdf or .svg)")
    ap.add_argument(
        "--smooth",
        type=int,
        default=0,
        help="trailing-mean window in steps (0 = about 1/20 of each run; 1 = raw values)",
    )
    a = ap.parse_args(argv)
    if a.smooth < 0:
        print("rpg-plot: --smooth must be >= 0", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("rpg-plot: needs matplotlib: pip install 'rpg-ref[plots]'", file=sys.stderr)
        return 2
    folders = [Path(r) for r in a.runs]
    try:
        runs = {label: read_run(f) for label, f in zip(labels_for(folders), folders)}
    except ValueError as e:
        print(f"rpg-plot: {e}", file=sys.stderr)
        return 2
    path = plot(runs, Path(a.out), a.smooth or None)
    print(final_table(runs))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
