"""Rerun committed study runs from their rows and compare: what a reader does to check a study.

    python -m small_scale.study.rerun C --runs 3              # 3 runs of study C drawn at random
    python -m small_scale.study.rerun C --pick urkl-u1:4      # cell urkl-u1, seed 4

Each chosen row's own command (its ``argv``: the rpg-train flags it ran with) is run again in a
scratch folder, with a fresh warm-start cache, and its pre-registered outcomes are recomputed from
the new metrics (study.outcomes) and set beside the committed ones. The same code (the row's
``commit``) on the same CPU model gives every outcome identical, bit for bit; another CPU model
rounds differently and samples its own trajectory, so the values differ while the study's
verdicts (its distributions over seeds) are what should carry. Exit status 0 when every rerun
matches, 1 when one differs (the table says which outcome, by how much, and on which CPU each
ran), 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from rpg_ref import strict_json
from small_scale.study.files import (
    RESULTS,
    ROOT,
    STUDIES,
    StudyError,
    load_study,
    read_rows,
    results_path,
)
from small_scale.study.runner import environment, outcomes


def rerun(row: dict, spec: dict, scratch: Path) -> dict:
    """Run the row's command again under ``scratch``; its recomputed outcomes."""
    argv = list(row["argv"][3:])   # after "python -m rpg_ref.cli"
    out = scratch / f"{row['cell']}-s{row['seed']}"
    argv[argv.index("--out") + 1] = str(out)
    argv[argv.index("--cache-dir") + 1] = str(scratch / "cache")
    done = subprocess.run([sys.executable, "-m", "rpg_ref.cli", *argv], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        raise StudyError(f"{row['cell']} s{row['seed']}: rpg-train exited {done.returncode}: "
                         f"{tail}")
    metrics = [strict_json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()
               if x.strip()]
    return outcomes(metrics, spec["outcomes"])


def compare(committed: dict, again: dict) -> list[tuple]:
    """(outcome, committed, rerun) for each outcome that differs."""
    return [(k, committed.get(k), again.get(k)) for k in sorted(set(committed) | set(again))
            if committed.get(k) != again.get(k)]


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m small_scale.study.rerun",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("study", help="a study with committed rows: small_scale/results/<study>.jsonl")
    ap.add_argument("--runs", type=int, default=1, help="how many rows to draw at random")
    ap.add_argument("--seed", type=int, default=0, help="the draw's seed")
    ap.add_argument("--pick", nargs="+", default=[], metavar="CELL:SEED",
                    help="these rows instead of a random draw")
    ap.add_argument("--results", default=str(RESULTS), help="folder of <study>.jsonl")
    ap.add_argument("--studies", default=str(STUDIES), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        spec = load_study(a.study, a.studies)
        rows = read_rows(results_path(a.study, a.results), spec)
        if not rows:
            raise StudyError(f"study {a.study} has no committed rows to rerun")
        if a.pick:
            index = {f"{r['cell']}:{r['seed']}": r for r in rows}
            missing = [p for p in a.pick if p not in index]
            if missing:
                raise StudyError(f"no committed rows {missing} (write CELL:SEED, e.g. "
                                 f"{next(iter(index))})")
            chosen = [index[p] for p in a.pick]
        else:
            if not 1 <= a.runs <= len(rows):
                raise StudyError(f"--runs must be in [1, {len(rows)}], got {a.runs}")
            chosen = random.Random(a.seed).sample(rows, a.runs)
        here = environment()
        differ = 0
        with tempfile.TemporaryDirectory(prefix="rerun-") as scratch:
            for row in chosen:
                diff = compare(row["outcomes"], rerun(row, spec, Path(scratch)))
                differ += bool(diff)
                what = ("identical" if not diff else "; ".join(
                    f"{k} {x} -> {y}" for k, x, y in diff))
                print(f"{row['cell']} s{row['seed']}: {what}  (committed: "
                      f"{(row.get('commit') or '?')[:10]} on {row.get('cpu')}; rerun: "
                      f"{(here['commit'] or '?')[:10]}"
                      f"{' (dirty)' if here['dirty'] else ''} on {here['cpu']})", flush=True)
    except StudyError as e:
        print(f"small_scale.study.rerun: {e}", file=sys.stderr)
        return 2
    print(f"{len(chosen) - differ} of {len(chosen)} reruns identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
