"""The paper's results tables and the numbers its text quotes, transcribed from the LaTeX.

``transcribe(tex)`` parses ``rpg_paper.tex`` (no number is typed by hand) into one dict, written to
``paper_figs/paper_results.json`` by ``python -m paper_figs.paper_results``:

* ``tables``: every ``table`` environment whose tabular body holds numbers: label, caption (as
  printed, with its line), the setting the caption names (context length, model), the mark
  convention the caption states (bold = highest, underline = second highest), the columns
  (benchmark, metric: from the multicolumn header rows), the rows (method, line, row colour,
  the ``\\midrule`` block it sits in);
* ``cells``: one entry per body cell: table, method, benchmark, metric, value, the text as
  printed, bold, underline, line;
* ``other_tables``: the remaining ``table`` environments (formula tables) and why they are not
  results;
* ``text_numbers``: every result-like number (a percentage, a decimal with >= 3 digits, a signed
  "+N") in the text of the abstract, the introduction, the experiments and the additional results
  (tables, figures and comments excluded), with its line and sentence.

The checks built on it are in ``derivations/tables.py``; the predicates they share with the
figures (Best >= Last, marks vs ranks, ranks in a column) are here, on plain dicts, so the
figures and the checks cannot disagree about what a violation is.

Line numbers are 1-based lines of ``rpg_paper.tex``. Where the paper is: ``$RPG_PAPER_TEX``, else
``<repo>/../shared/paper/rpg_paper.tex``. The paper itself is not part of this repository.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PAPER_ENV = "RPG_PAPER_TEX"
DEFAULT_TEX = REPO_ROOT.parent / "shared" / "paper" / "rpg_paper.tex"
RESULTS_JSON = REPO_ROOT / "paper_figs" / "paper_results.json"
GENERATED_BY = "python -m paper_figs.paper_results"

# Text sections whose quoted numbers are transcribed: (name, start marker, end marker regex).
TEXT_SECTIONS = (
    ("abstract", r"\\begin\{abstract\}", r"\\end\{abstract\}"),
    ("sec:introduction", r"\\section\{Introduction\}", r"\\section\{"),
    ("sec:experiments", r"\\section\{Experiments\}", r"\\section\{"),
    ("sec:conclusion", r"\\section\{Conclusion\}", r"\\section\*?\{"),
    ("sec:additional_exp", r"\\section\{Additional Experiment Results\}", r"\\section\{"),
)
# Result-like numbers in prose. Decimals need >= 3 digits so that clip ratios (0.2, 0.28) and
# weight decays (0.1) are not taken for results.
NUMBER_PATTERNS = (
    ("percent", re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*\\%")),
    ("decimal", re.compile(r"(?<![\w.])(\d\.\d{3,})(?![\d])")),
    ("points", re.compile(r"(?<![\w.+])\+\s*(\d+(?:\.\d+)?)(?![\d.])")),
)
MISSING = {"-", "--", "---", "n/a", "N/A", "$-$"}


class TexError(ValueError):
    """The LaTeX does not have the shape the transcription expects (message names the line)."""


def paper_tex_path() -> Path:
    """Where the paper is expected: $RPG_PAPER_TEX, else <repo>/../shared/paper/rpg_paper.tex."""
    env = os.environ.get(PAPER_ENV)
    return Path(env) if env else DEFAULT_TEX


# ---------------------------------------------------------------------------
# low-level LaTeX scanning on offsets (so every piece keeps its line number)
# ---------------------------------------------------------------------------

def blank_comments(tex: str) -> str:
    """Replace every comment (an unescaped % to the end of its line) by spaces: same offsets."""
    out = list(tex)
    i, n = 0, len(tex)
    while i < n:
        c = tex[i]
        if c == "\\":
            i += 2                       # an escaped character (\%, \\, \{ ...) is never a comment
            continue
        if c == "%":
            j = tex.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
            continue
        i += 1
    return "".join(out)


class Source:
    """The (comment-blanked) text with offset -> line lookup."""

    def __init__(self, tex: str):
        self.raw = tex
        self.text = blank_comments(tex)
        self._starts = [0] + [m.end() for m in re.finditer("\n", tex)]

    def line(self, pos: int) -> int:
        return bisect.bisect_right(self._starts, pos)

    def error(self, pos: int, msg: str) -> TexError:
        return TexError(f"rpg_paper.tex line {self.line(pos)}: {msg}")


def match_brace(text: str, open_pos: int) -> int:
    """Offset just past the '}' closing the '{' at open_pos."""
    depth = 0
    i = open_pos
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise TexError(f"unbalanced brace opened at offset {open_pos}")


def split_top(text: str, start: int, end: int, sep: str) -> list[tuple[int, int]]:
    """Spans of text[start:end] split at ``sep`` outside braces (sep is '&' or '\\\\')."""
    spans, depth, i, last = [], 0, start, start
    while i < end:
        if text.startswith(sep, i) and depth == 0 and (sep != "&" or text[i - 1] != "\\"):
            spans.append((last, i))
            i += len(sep)
            last = i
            continue
        c = text[i]
        if c == "\\" and sep == "&":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        i += 1
    spans.append((last, end))
    return spans


def environments(src: Source, name: str) -> list[tuple[int, int, int, int]]:
    """(begin, body_start, body_end, end) of every \\begin{name} ... \\end{name} (not nested)."""
    out = []
    for m in re.finditer(r"\\begin\{" + re.escape(name) + r"\*?\}", src.text):
        e = re.compile(r"\\end\{" + re.escape(name) + r"\*?\}").search(src.text, m.end())
        if e is None:
            raise src.error(m.start(), f"\\begin{{{name}}} without \\end{{{name}}}")
        out.append((m.start(), m.end(), e.start(), e.end()))
    return out


def command_arg(src: Source, start: int, end: int, cmd: str) -> tuple[str, int] | None:
    """(argument, offset of the command) of the first \\cmd{...} in [start, end), or None."""
    m = re.compile(r"\\" + cmd + r"\s*\{").search(src.text, start, end)
    if m is None:
        return None
    close = match_brace(src.text, m.end() - 1)
    return src.text[m.end():close - 1], m.start()


# Commands that may precede a row's first cell and carry no content: rules and the row colour.
_LEADING = re.compile(
    r"\s*(\\(?:toprule|midrule|bottomrule|hline)\b|\\cmidrule(?:\([^)]*\))?\{[^}]*\}"
    r"|\\cline\{[^}]*\}|\\rowcolor(?:\[[^\]]*\])?\{[^}]*\})"
)
_WRAPPERS = re.compile(r"^\\(textbf|underline|textit|emph|mathbf)\s*\{")


def strip_leading(text: str, a: int, b: int) -> tuple[int, list[str]]:
    """Skip rules and \\rowcolor at the start of a row; returns (content start, commands seen)."""
    seen = []
    while True:
        m = _LEADING.match(text, a, b)
        if not m:
            return a, seen
        seen.append(m.group(1))
        a = m.end()


def unwrap(cell: str) -> tuple[str, set]:
    """Strip \\textbf{..}, \\underline{..}, \\multicolumn/\\multirow and bare braces around a
    cell; returns (inner text, {"bold", "underline", ...} of the wrappers met)."""
    s, marks = cell.strip(), set()
    while True:
        m = re.match(r"^\\multicolumn\{\d+\}\{[^}]*\}\{", s) or re.match(
            r"^\\multirow\{[^}]*\}\{[^}]*\}\{", s
        )
        if m and match_brace(s, m.end() - 1) == len(s):
            s = s[m.end():-1].strip()
            continue
        m = _WRAPPERS.match(s)
        if m and match_brace(s, m.end() - 1) == len(s):
            marks.add(
                {"textbf": "bold", "mathbf": "bold", "underline": "underline"}.get(
                    m.group(1), m.group(1)
                )
            )
            s = s[m.end():-1].strip()
            continue
        if s.startswith("{") and match_brace(s, 0) == len(s):
            s = s[1:-1].strip()
            continue
        return s, marks


def _multicolumn_span(cell: str) -> int:
    m = re.match(r"^\s*\\multicolumn\{(\d+)\}", cell)
    return int(m.group(1)) if m else 1


# ---------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------

_NUMBER = re.compile(r"^-?\d+(?:\.(\d+))?$")


def _caption_setting(caption: str) -> dict:
    ctx = re.search(r"(\d+)\s*[kK]\s+context length", caption)
    model = re.search(r"with\s+(Qwen[-\w.]+)\s+model", caption)
    return {
        "context": f"{ctx.group(1)}k" if ctx else None,
        "model": model.group(1) if model else None,
    }


def _caption_marks(caption: str) -> dict:
    marks = {}
    if re.search(r"highest score in each column is \\textbf\{bolded\}", caption):
        marks["bold"] = "highest"
    if re.search(r"second highest is \\underline\{underlined\}", caption):
        marks["underline"] = "second highest"
    return marks


def parse_table(src: Source, begin: int, body_start: int, body_end: int) -> dict | None:
    """One table environment -> {"table": {...}, "cells": [...]}, or None if its tabular holds
    no numbers (a formula table); raises TexError naming the line for a malformed results table."""
    text = src.text
    label = command_arg(src, body_start, body_end, "label")
    caption = command_arg(src, body_start, body_end, "caption")
    tab = re.compile(r"\\begin\{tabular\}\s*\{").search(text, body_start, body_end)
    if tab is None:
        return None
    spec_end = match_brace(text, tab.end() - 1)
    tab_end = text.find("\\end{tabular}", spec_end, body_end)
    if tab_end < 0:
        raise src.error(tab.start(), "\\begin{tabular} without \\end{tabular}")
    rows = []                                      # (content start, end, leading commands)
    for a, b in split_top(text, spec_end, tab_end, "\\\\"):
        a2, seen = strip_leading(text, a, b)
        rows.append((a2, b, seen))
    rows = [r for r in rows if text[r[0]:r[1]].strip() or r[2]]
    # body rows: cells after the first one are numbers. Header rows: everything before the first
    # row preceded by \midrule that has numeric cells.
    parsed = []
    for a, b, seen in rows:
        spans = split_top(text, a, b, "&")
        cells = [(x, y, text[x:y]) for x, y in spans]
        numeric = [c for c in cells[1:] if _NUMBER.match(unwrap(c[2])[0])]
        parsed.append((a, b, seen, cells, bool(numeric)))
    if not any(p[4] for p in parsed):
        return None
    if label is None:
        raise src.error(begin, "results table without \\label")
    if caption is None:
        raise src.error(begin, f"{label[0]}: results table without \\caption")
    first_body = next(i for i, p in enumerate(parsed) if p[4])
    header, body = parsed[:first_body], [p for p in parsed[first_body:] if text[p[0]:p[1]].strip()]
    # columns from the header rows: expand \multicolumn spans, one label per level
    levels = []
    for _a, _b, _seen, cells, _ in header:
        expanded = []
        for x, _y, c in cells:
            name = unwrap(c)[0]
            expanded += [(name, src.line(x))] * _multicolumn_span(c)
        levels.append(expanded)
    ncols = len(levels[-1]) if levels else len(body[0][3])
    for lv in levels:
        if len(lv) != ncols:
            raise src.error(
                header[0][0], f"{label[0]}: header rows have {len(lv)} and {ncols} columns"
            )
    columns = []
    for j in range(1, ncols):
        names = [lv[j][0] for lv in levels if lv[j][0]]
        columns.append({"index": j, "benchmark": names[0] if names else f"column {j}",
                        "metric": names[-1] if len(names) > 1 else None,
                        "header_line": levels[0][j][1] if levels else None})
    lab = label[0]
    out_rows, out_cells, block = [], [], 0
    for _a, _b, seen, cells, _ in body:
        if any(s.startswith("\\midrule") for s in seen) and out_rows:
            block += 1
        color = next(
            (re.search(r"\{([^}]*)\}", s).group(1) for s in seen if s.startswith("\\rowcolor")),
            None,
        )
        first = cells[0][0] + len(cells[0][2]) - len(cells[0][2].lstrip())
        if len(cells) != ncols:
            raise src.error(first, f"{lab}: row has {len(cells)} cells, the header has {ncols}")
        method = unwrap(cells[0][2])[0]
        out_rows.append(
            {"method": method, "line": src.line(first), "block": block, "rowcolor": color}
        )
        for col, (x, _y, c) in zip(columns, cells[1:]):
            inner, marks = unwrap(c)
            pos = x + len(c) - len(c.lstrip())
            m = _NUMBER.match(inner)
            if m is None and inner not in MISSING:
                raise src.error(
                    pos,
                    f"{lab}: cell {inner!r} ({method}, {col['benchmark']} {col['metric']}) "
                    "is neither a number nor a missing-value dash",
                )
            out_cells.append({"table": lab, "method": method, "benchmark": col["benchmark"],
                              "metric": col["metric"], "value": float(inner) if m else None,
                              "text": inner, "decimals": len(m.group(1) or "") if m else None,
                              "bold": "bold" in marks, "underline": "underline" in marks,
                              "line": src.line(pos)})
    methods = [r["method"] for r in out_rows]
    if len(set(methods)) != len(methods):
        raise src.error(body[0][0], f"{lab}: a method appears twice: {methods}")
    cap = " ".join(caption[0].split())
    table = {"label": lab, "begin_line": src.line(begin), "label_line": src.line(label[1]),
             "caption": cap, "caption_line": src.line(caption[1]),
             "setting": _caption_setting(cap), "marks": _caption_marks(cap),
             "columns": columns, "rows": out_rows}
    return {"table": table, "cells": out_cells}


# ---------------------------------------------------------------------------
# numbers quoted in the text
# ---------------------------------------------------------------------------

def _blank_spans(text: str, spans: Iterable[tuple[int, int]]) -> str:
    out = list(text)
    for a, b in spans:
        out[a:b] = [c if c == "\n" else " " for c in text[a:b]]
    return "".join(out)


_SENTENCE_END = re.compile(r"[.?!](?=\s)|\\item\b|\n\s*\n")


def _sentence(text: str, pos: int, floor: int = 0, width: int = 240) -> str:
    """The sentence (or list item) around pos, not before ``floor``, at most ``width`` characters
    each side."""
    lo = max(floor, pos - width)
    ends = [m.end() for m in _SENTENCE_END.finditer(text, lo, pos)]
    lo = ends[-1] if ends else lo
    m = _SENTENCE_END.search(text, pos, pos + width)
    hi = m.end() if m and m.group(0) in ".?!" else (m.start() if m else min(len(text), pos + width))
    return " ".join(text[lo:hi].split())


def text_numbers(src: Source) -> list[dict]:
    """Result-like numbers in the text sections (TEXT_SECTIONS), figures/tables excluded."""
    floats = [
        (b, e) for env in ("table", "figure", "algorithm") for b, _, _, e in environments(src, env)
    ]
    text = _blank_spans(src.text, floats)
    out = []
    for name, start, stop in TEXT_SECTIONS:
        m = re.compile(start).search(text)
        if m is None:
            raise TexError(f"rpg_paper.tex: section marker {start!r} ({name}) not found")
        e = re.compile(stop).search(text, m.end())
        end = e.start() if e else len(text)
        for kind, pat in NUMBER_PATTERNS:
            for n in pat.finditer(text, m.end(), end):
                out.append({"line": src.line(n.start()), "section": name, "kind": kind,
                            "text": n.group(0).strip(), "value": float(n.group(1)),
                            "context": _sentence(text, n.start(), floor=m.end())})
    out.sort(key=lambda r: (r["line"], r["text"]))
    return out


# ---------------------------------------------------------------------------
# the whole transcription
# ---------------------------------------------------------------------------

def transcribe(tex: str) -> dict:
    """rpg_paper.tex (its text) -> the dict stored in paper_figs/paper_results.json."""
    src = Source(tex)
    tables, cells, other = [], [], []
    for begin, bs, be, _ in environments(src, "table"):
        t = parse_table(src, begin, bs, be)
        if t is None:
            label = command_arg(src, bs, be, "label")
            other.append({"label": label[0] if label else None, "begin_line": src.line(begin),
                          "reason": "no numeric body cells (a table of formulas)"})
            continue
        tables.append(t["table"])
        cells += t["cells"]
    labels = [t["label"] for t in tables]
    if len(set(labels)) != len(labels):
        raise TexError(f"rpg_paper.tex: two results tables share a label: {labels}")
    return {
        "source": "rpg_paper.tex",
        "source_sha256": hashlib.sha256(tex.encode()).hexdigest(),
        "source_lines": len(tex.splitlines()),
        "generated_by": GENERATED_BY,
        "tables": tables,
        "cells": cells,
        "other_tables": other,
        "text_numbers": text_numbers(src),
    }


def dumps(results: dict) -> str:
    """JSON with one cell / text number / row per line (diffs stay readable)."""
    def block(key, items, indent=" "):
        inner = (",\n" + indent + " ").join(json.dumps(x, ensure_ascii=False) for x in items)
        return f'{indent}"{key}": [\n{indent} {inner}\n{indent}]'

    parts = [
        f' "{k}": {json.dumps(results[k])}'
        for k in ("source", "source_sha256", "source_lines", "generated_by")
    ]
    tables = []
    for t in results["tables"]:
        head = ", ".join(
            f'"{k}": {json.dumps(t[k], ensure_ascii=False)}'
            for k in t
            if k not in ("columns", "rows")
        )
        tables.append("  {" + head + ",\n" + block("columns", t["columns"], "   ") + ",\n"
                      + block("rows", t["rows"], "   ") + "}")
    parts.append(' "tables": [\n' + ",\n".join(tables) + "\n ]")
    for key in ("cells", "other_tables", "text_numbers"):
        parts.append(block(key, results[key]))
    return "{\n" + ",\n".join(parts) + "\n}\n"


def read_tex(path=None) -> str:
    """The paper's LaTeX; FileNotFoundError with the fix when it is absent."""
    p = Path(path) if path else paper_tex_path()
    if not p.is_file():
        raise FileNotFoundError(
            f"rpg_paper.tex not found at {p}: set {PAPER_ENV}=/path/to/rpg_paper.tex "
            "(the paper is not part of this repository)"
        )
    return p.read_text(encoding="utf-8")


def load(path=RESULTS_JSON) -> dict:
    """The committed transcription (paper_figs/paper_results.json)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: run `{GENERATED_BY}` with {PAPER_ENV} set")
    return json.loads(p.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------
# predicates shared by the checks (derivations/tables.py) and the figures (paper_figs)
# ---------------------------------------------------------------------------

def table(results: dict, label: str) -> dict:
    for t in results["tables"]:
        if t["label"] == label:
            return t
    raise KeyError(f"no results table {label!r}; tables: {[t['label'] for t in results['tables']]}")


def cells_of(results: dict, label: str) -> list[dict]:
    return [c for c in results["cells"] if c["table"] == label]


def cell(results: dict, label: str, method: str, benchmark: str, metric: str | None) -> dict:
    for c in cells_of(results, label):
        if (c["method"], c["benchmark"], c["metric"]) == (method, benchmark, metric):
            return c
    raise KeyError(f"{label} has no cell ({method}, {benchmark}, {metric})")


def family(method: str) -> str:
    """'rpg-reinforce', 'rpg' or 'baseline', from the method's name."""
    m = method.upper()
    if m.startswith("RPG-REINFORCE"):
        return "rpg-reinforce"
    return "rpg" if m.startswith("RPG") else "baseline"


def columns(results: dict, label: str) -> dict:
    """{(benchmark, metric): [cells in row order]} of one table."""
    out = {}
    for c in cells_of(results, label):
        out.setdefault((c["benchmark"], c["metric"]), []).append(c)
    return out


def rank(col: list[dict], c: dict) -> int:
    """1 + the number of distinct values above c's in its column (ties share a rank)."""
    return 1 + len({x["value"] for x in col if x["value"] is not None and x["value"] > c["value"]})


def best_below_last(results: dict) -> list[dict]:
    """Every (table, method, benchmark) whose Best is smaller than its Last."""
    out = []
    for t in results["tables"]:
        by_key = {
            (c["method"], c["benchmark"], c["metric"]): c for c in cells_of(results, t["label"])
        }
        for (method, bench, metric), last in by_key.items():
            best = by_key.get((method, bench, "Best"))
            if metric == "Last" and best and None not in (last["value"], best["value"]) \
                    and best["value"] < last["value"]:
                out.append({"table": t["label"], "method": method, "benchmark": bench,
                            "last": last["text"], "best": best["text"], "line": last["line"]})
    return out


def mark_mismatches(results: dict) -> list[dict]:
    """Cells whose bold/underline disagrees with the caption's convention (bold = the column's
    highest value, underline = the second highest distinct value; ties share the mark)."""
    out = []
    for t in results["tables"]:
        conv = t["marks"]
        for (bench, metric), col in columns(results, t["label"]).items():
            for c in col:
                if c["value"] is None:
                    continue
                r = rank(col, c)
                want = {
                    "bold": "bold" in conv and r == 1,
                    "underline": "underline" in conv and r == 2,
                }
                for mark in ("bold", "underline"):
                    if mark in conv and c[mark] != want[mark]:
                        out.append({"table": t["label"], "method": c["method"], "benchmark": bench,
                                    "metric": metric, "value": c["text"], "mark": mark,
                                    "printed": c[mark], "rank": r, "line": c["line"]})
    return out


def average_columns(results: dict) -> list[dict]:
    """Columns headed Avg/Average/Mean, each with its check: the mean of the other columns of the
    same metric, rounded to the printed decimals, must equal the printed value."""
    out = []
    for t in results["tables"]:
        cols = columns(results, t["label"])
        for (bench, metric), col in cols.items():
            if not re.fullmatch(r"(?i)avg\.?|average|mean", bench or ""):
                continue
            parts = [k for k in cols if k[1] == metric and k != (bench, metric)]
            for c in col:
                vals = [
                    next(x for x in cols[k] if x["method"] == c["method"])["value"] for k in parts
                ]
                mean = sum(vals) / len(vals)
                out.append(
                    {
                        "table": t["label"],
                        "method": c["method"],
                        "metric": metric,
                        "printed": c["text"],
                        "mean": mean,
                        "ok": round(mean, c["decimals"]) == c["value"],
                        "line": c["line"],
                    }
                )
    return out
