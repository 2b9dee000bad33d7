"""python -m paper_figs.paper_results [--tex PATH] [--out PATH] [--check]

Transcribe the paper's results tables and the numbers its text quotes from the LaTeX into
paper_figs/paper_results.json (derivations.paper_tables.transcribe; nothing typed by hand).
The paper is read from --tex, else $RPG_PAPER_TEX, else <repo>/../shared/paper/rpg_paper.tex.
--check compares instead of writing and exits 1 if the committed file is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from derivations import paper_tables as pt


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m paper_figs.paper_results", description=__doc__.split("\n\n")[1]
    )
    ap.add_argument(
        "--tex",
        help=f"rpg_paper.tex (default ${pt.PAPER_ENV}, else {pt.DEFAULT_TEX.name} "
        "in ../shared/paper/ next to the repository)",
    )
    ap.add_argument(
        "--out",
        default=str(pt.RESULTS_JSON),
        help="output JSON (default paper_figs/paper_results.json)",
    )
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    a = ap.parse_args(argv)
    try:
        tex = pt.read_tex(a.tex)
        res = pt.transcribe(tex)
    except (FileNotFoundError, pt.TexError) as e:
        print(f"paper_results: {e}", file=sys.stderr)
        return 2
    text = pt.dumps(res)
    out = Path(a.out)
    if a.check:
        if not out.is_file():
            print(
                f"paper_results: {out} does not exist; run without --check to write it",
                file=sys.stderr,
            )
            return 1
        if out.read_text(encoding="utf-8") != text:
            print(
                f"paper_results: {out} is stale (the paper or the parser changed); run without "
                "--check"
            )
            return 1
        print(f"{out}: up to date")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"{out}: {len(res['tables'])} results tables, {len(res['cells'])} cells, "
          f"{len(res['text_numbers'])} numbers quoted in the text; other tables: "
          f"{', '.join(str(t['label']) for t in res['other_tables'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
