"""rpg-figs / python -m paper_figs: regenerate the figures and tables into paper_figs/out/.

    rpg-figs                      every figure (log-based ones need small_scale/logs: committed)
    rpg-figs --only NAME [...]    some of them (--list shows the names)
    rpg-figs --out DIR --logs DIR
    rpg-figs --skip-missing-logs  render what can be rendered when an experiment has no logs

Installed from a wheel (no clone around it), the output goes to ./rpg-figs-out, and the logs come
with a clone of the repository only: --logs CLONE/small_scale/logs (default ./small_scale/logs).
The figures of your own rpg-train runs: rpg-plot RUN [RUN ...] (rpg_ref/plot.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

CLONE = Path(__file__).resolve().parent.parent       # a clone's root holds pyproject.toml
IN_CLONE = (CLONE / "pyproject.toml").is_file()
OUT = CLONE / "paper_figs" / "out" if IN_CLONE else Path("rpg-figs-out")
# paper_figs.training.DEFAULT_LOGS in a clone; installed, a clone's layout under the current folder
LOGS = CLONE / "small_scale" / "logs" if IN_CLONE else Path("small_scale", "logs")


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="rpg-figs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", metavar="NAME", help="render only these figures")
    p.add_argument("--out", default=str(OUT), help=f"output folder (default {OUT})")
    p.add_argument("--logs", default=str(LOGS), help="small_scale logs folder")
    p.add_argument("--list", action="store_true", help="list the figures and exit")
    p.add_argument("--skip-missing-logs", action="store_true",
                   help="report and skip figures whose experiment has no logs instead of failing")
    a = p.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:  # every figure module draws with it
        print("rpg-figs: needs matplotlib: pip install 'rpg-ref[plots]'", file=sys.stderr)
        return 2
    from . import FIGURES, render

    if a.list:
        for f in FIGURES.values():
            print(
                f"{f.name:45s} {f.paper_label}"
                + (f"  [logs: {f.experiment}]" if f.experiment else "")
            )
        return 0
    logs = Path(a.logs)
    user_runs = sorted(m.parent for pattern in ("metrics.jsonl", "*/metrics.jsonl")
                       for m in logs.glob(pattern))
    # rpg-train runs, not small_scale logs
    if user_runs and not any(logs.glob("*/experiment.json")):
        runs = " ".join(str(r) for r in user_runs[:4]) + (" ..." if len(user_runs) > 4 else "")
        print(f"rpg-figs: {logs} holds rpg-train runs, not small_scale/run_experiments.py logs; "
              f"draw and compare them with: rpg-plot {runs} --out runs/compare.png",
              file=sys.stderr)
        return 2
    names = a.only or list(FIGURES)
    bad = [n for n in names if n not in FIGURES]
    if bad:
        print(f"rpg-figs: unknown figure(s) {bad}; valid: {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    need_logs = [n for n in names if FIGURES[n].experiment]
    if need_logs and not logs.is_dir() and not a.skip_missing_logs:
        where = "" if IN_CLONE else " (they come with a clone of the repository, not the package)"
        print(f"rpg-figs: no logs folder {logs}{where}: pass --logs CLONE/small_scale/logs, or "
              f"--skip-missing-logs to render only the figures computed from code", file=sys.stderr)
        return 2
    skipped = []
    for n in names:
        t0 = time.perf_counter()
        try:
            paths = render(n, a.out, a.logs)
        except FileNotFoundError as e:
            if not a.skip_missing_logs:
                print(f"rpg-figs: {n}: {e}", file=sys.stderr)
                return 1
            skipped.append(n)
            print(f"SKIPPED {n}: {e}")
            continue
        except ValueError as e:   # a log or results row that is not what it should be
            print(f"rpg-figs: {n}: {e}", file=sys.stderr)
            return 2
        print(f"{n}: {', '.join(str(Path(x)) for x in paths)} ({time.perf_counter() - t0:.1f}s)")
    if skipped:
        print(f"skipped (no logs): {', '.join(skipped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
