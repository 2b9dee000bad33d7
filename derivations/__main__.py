"""python -m derivations [--fast] [--json FILE] [--only ID ...] [-v]   (console script: rpg-verify)

Runs every registered check and prints one line per claim:
status | label | claim | symbolic | exact max err | MC max |z| | seconds.
Exit status 1 if any check fails (ERRATUM rows -- documented errors of the paper that the check
reproduces -- are not failures).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from . import run_all
from ._core import ALPHA

# the errata file (package data): as named in a clone, else where the package installed it
_HERE = Path(__file__).resolve().parent
ERRATA = ("derivations/ERRATA.md" if (_HERE.parent / "pyproject.toml").is_file()
          else str(_HERE / "ERRATA.md"))


def _num(x, spec):
    return "-" if x is None else format(x, spec)


def format_table(rows: list[dict], claim_width: int = 58, timings: bool = True) -> str:
    """The rows as an aligned text table. ``timings=False`` drops the seconds column (the
    notebooks store their printed output, which should not change from run to run)."""
    head = ("status", "label", "claim", "symbolic", "exact max err", "MC max |z|", "seconds")
    lines = [head]
    for r in rows:
        claim = (
            r["claim"] if len(r["claim"]) <= claim_width else r["claim"][: claim_width - 3] + "..."
        )
        lines.append(
            (
                r["status"],
                r["label"],
                claim,
                r["symbolic"],
                _num(r["exact_max_err"], ".1e"),
                _num(r["mc_max_z"], ".2f"),
                f"{r['seconds']:.2f}",
            )
        )
    if not timings:
        lines = [line[:-1] for line in lines]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(lines[0]))]
    out = [" | ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def _progress(i: int, n: int, check) -> None:
    """One status line on stderr, rewritten before each check (the table comes at the end)."""
    print(f"\r\033[Krpg-verify: [{i + 1}/{n}] {check.label}", end="", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rpg-verify", description=__doc__.split("\n\n")[1])
    ap.add_argument(
        "--fast", action="store_true", help="smaller Monte-Carlo samples and grids (CI)"
    )
    ap.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    ap.add_argument(
        "--only", nargs="+", metavar="ID", help="run checks whose id or label contains ID"
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="print each check's findings")
    args = ap.parse_args(argv)

    torch.set_num_threads(min(2, torch.get_num_threads()))
    t0 = time.perf_counter()
    live = sys.stderr.isatty()  # a terminal: one status line, rewritten (logs get the table only)
    rows = run_all(fast=args.fast, only=args.only, on_check=_progress if live else None)
    if live:
        print("\r\033[K", end="", file=sys.stderr, flush=True)  # clear the status line
    total = time.perf_counter() - t0
    if not rows:
        raise SystemExit(f"no check matches --only {args.only}")
    print(format_table(rows))
    failed = [r for r in rows if not r["passed"]]
    errata = [r for r in rows if r["status"] == "ERRATUM"]
    for r in rows:
        if args.verbose or not r["passed"]:
            print(f"\n[{r['status']}] {r['id']} ({r['label']})")
            for d in r["detail"]:
                print("  - " + d.replace("\n", "\n    "))
    print(f"\n{len(rows)} checks, {len(failed)} failed, {len(errata)} reproduce documented errata "
          f"({ERRATA}); Monte-Carlo false-failure rate {ALPHA:g} per comparison; "
          f"{'fast' if args.fast else 'full'} run {total:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
