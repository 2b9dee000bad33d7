"""Item 10: the paper's results tables and the numbers its text quotes (tab:main_table_*).

The checks read the committed transcription ``paper_figs/paper_results.json`` (parsed from the
LaTeX by ``derivations.paper_tables``), so they run without the paper; with the paper present
(``$RPG_PAPER_TEX``) ``tables-transcription`` also re-parses it and requires the same result.

What must hold by construction or by the captions' own words:
  * Best (maximum over training) >= Last (the value at the last step) for every method/benchmark;
  * bold = the column's highest value, underline = the second highest (the captions say so);
  * an average column = the mean of its columns (to the printed rounding);
  * a method/setting reported in two tables has the same numbers;
  * every number the text quotes is a table entry (and the rank the text gives it holds).
Where the paper breaks one of them, the check reproduces exactly the documented violation
(status ERRATUM, derivations/ERRATA.md E11-E13) and fails on any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import paper_tables as pt
from ._core import Checker, claim

RESULTS_TABLES = (
    "tab:main_table_8k",
    "tab:main_table_4k",
    "tab:main_table_2k",
    "tab:main_table_4k_2",
    "tab:main_table_7b",
)
FORMULA_TABLES = (
    "tab:off-policy-loss",
    "tab:off-policy-loss-reinforce",
    "tab:off-policy-loss-normalized",
)
# tables that report the same runs (same caption setting): 4k on AIME/AMC and on Minerva/Olympiad
SHARED_SETTINGS = {("4k", None): ("tab:main_table_4k", "tab:main_table_4k_2")}

# The documented violations, exactly as the checks find them.
ERRATA_BEST_BELOW_LAST = {
    ("tab:main_table_8k", "RPG-URKL", "AIME25", "0.5261", "0.4938", 780): "E11"
}
ERRATA_MARKS = {("tab:main_table_8k", "AIME25", "Last"): ("E12", frozenset({
    ("RPG-URKL", "bold", False, 1), ("RPG-REINFORCE-URKL", "bold", True, 2),
    ("RPG-REINFORCE-URKL", "underline", False, 2), ("RPG-REINFORCE-UFKL", "underline", True, 3)}))}


# ---------------------------------------------------------------------------
# the numbers the text quotes, one claim each (identified by reading; lines of rpg_paper.tex)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CellClaim:
    """The text quotes a table entry verbatim ("0.4531"); ``rank`` = the rank the text gives it
    in its column (1 = "best"/"top", 2 = "second"), None if it states none."""
    line: int
    text: str
    table: str
    method: str
    benchmark: str
    metric: str
    rank: int | None = None

    def evaluate(self, res) -> tuple[bool, str]:
        c = pt.cell(res, self.table, self.method, self.benchmark, self.metric)
        col = pt.columns(res, self.table)[(self.benchmark, self.metric)]
        r = pt.rank(col, c)
        ok = c["text"] == self.text and (self.rank is None or r == self.rank)
        said = "" if self.rank is None else f", said to rank {self.rank}"
        return ok, (
            f"l.{self.line} quotes {self.text}{said}: {self.table} l.{c['line']} {self.method} "
            f"{self.benchmark} {self.metric} = {c['text']}, rank {r}"
        )


@dataclass(frozen=True)
class PercentClaim:
    """The text quotes a percentage for a method family on a benchmark: some entry of that
    family rounds to it (round(100 v) == quoted)."""
    line: int
    text: str
    table: str
    family: str
    benchmark: str

    def evaluate(self, res) -> tuple[bool, str]:
        pct = float(self.text.rstrip("%").rstrip("\\"))
        hits = [c for c in pt.cells_of(res, self.table) if pt.family(c["method"]) == self.family
                and c["benchmark"] == self.benchmark and round(100 * c["value"]) == pct]
        where = (
            "; ".join(f"{c['method']} {c['metric']} {c['text']} (l.{c['line']})" for c in hits)
            or "none"
        )
        return bool(hits), (
            f"l.{self.line} quotes {self.text} for {self.family} on {self.benchmark}: "
            f"entries of {self.table} that round to it: {where}"
        )


@dataclass(frozen=True)
class MarginClaim:
    """"up to +N points over <baseline>": the largest (family entry - baseline entry), same table,
    benchmark and metric, over every table reporting both, in points, rounds to N."""
    line: int
    text: str
    family: str
    baseline: str
    benchmarks: tuple

    def margins(self, res) -> list[tuple[float, dict, dict]]:
        out = []
        for t in res["tables"]:
            cells = pt.cells_of(res, t["label"])
            base = {(c["benchmark"], c["metric"]): c for c in cells if c["method"] == self.baseline}
            for c in cells:
                b = base.get((c["benchmark"], c["metric"]))
                if (
                    b
                    and pt.family(c["method"]) == self.family
                    and c["benchmark"] in self.benchmarks
                ):
                    out.append((100 * (c["value"] - b["value"]), c, b))
        return sorted(out, key=lambda m: -m[0])

    def evaluate(self, res) -> tuple[bool, str]:
        (top, c, b), *_ = self.margins(res)
        n = float(self.text.lstrip("+"))
        return round(top) == n, (
            f"l.{self.line} quotes {self.text} points over {self.baseline}: the largest "
            f"margin is {top:+.2f} ({c['table']} {c['method']} {c['benchmark']} "
            f"{c['metric']} {c['text']} l.{c['line']} vs {b['text']} l.{b['line']})"
        )


@dataclass(frozen=True)
class ExternalClaim:
    """A number attributed to something no table reports (documented as an erratum)."""
    line: int
    text: str
    subject: str
    erratum: str

    def evaluate(self, res) -> tuple[bool, str]:
        in_tables = any(
            self.subject.lower() in r["method"].lower() for t in res["tables"] for r in t["rows"]
        )
        return in_tables, (
            f"l.{self.line} quotes {self.text} for {self.subject}, which is a row of "
            f"{'a' if in_tables else 'no'} results table"
        )


@dataclass(frozen=True)
class RankClaim:
    """A rank the text states without a number (``quote`` is the phrase)."""
    line: int
    quote: str
    table: str
    method: str
    benchmark: str
    metric: str
    rank: int

    def evaluate(self, res) -> tuple[bool, str]:
        c = pt.cell(res, self.table, self.method, self.benchmark, self.metric)
        r = pt.rank(pt.columns(res, self.table)[(self.benchmark, self.metric)], c)
        return r == self.rank, (f"l.{self.line} \"{self.quote}\": {self.method} {self.benchmark} "
                                f"{self.metric} {c['text']} ranks {r} (said {self.rank})")


_8K, _4K, _2K = "tab:main_table_8k", "tab:main_table_4k", "tab:main_table_2k"
_RF_URKL, _RF_UFKL = "RPG-REINFORCE-URKL", "RPG-REINFORCE-UFKL"
_MARGIN = dict(family="rpg-reinforce", baseline="DAPO", benchmarks=("AIME24", "AIME25"))
_QWEN = dict(subject="Qwen3-4B-Instruct", erratum="E13")
CLAIMS = (
    # abstract
    MarginClaim(60, "+6", **_MARGIN),
    PercentClaim(60, "52\\%", _8K, "rpg-reinforce", "AIME25"),
    ExternalClaim(60, "47\\%", **_QWEN),
    # introduction, contributions
    MarginClaim(262, "+6", **_MARGIN),
    PercentClaim(263, "52\\%", _8K, "rpg-reinforce", "AIME25"),
    ExternalClaim(263, "47\\%", **_QWEN),
    # sec:experiments, Results and Discussion
    PercentClaim(805, "52\\%", _8K, "rpg-reinforce", "AIME25"),
    ExternalClaim(805, "47\\%", **_QWEN),
    # sec:additional_exp, 4k (tab:main_table_4k)
    CellClaim(1566, "0.4531", _4K, _RF_URKL, "AIME24", "Best", rank=1),
    CellClaim(1566, "0.4458", _4K, _RF_URKL, "AIME24", "Last", rank=1),
    CellClaim(1566, "0.4281", _4K, _RF_UFKL, "AIME24", "Last", rank=2),
    CellClaim(1566, "0.4313", _4K, _RF_URKL, "AIME25", "Best", rank=1),
    CellClaim(1566, "0.4125", _4K, _RF_URKL, "AIME25", "Last"),  # "a strong Last score"
    RankClaim(
        1566, "RPG-REINFORCE-UFKL is second only to that", _4K, _RF_UFKL, "AIME25", "Best", 2
    ),
    # sec:additional_exp, 2k (tab:main_table_2k)
    CellClaim(1568, "0.3625", _2K, _RF_UFKL, "AIME24", "Best", rank=1),
    CellClaim(1568, "0.3083", _2K, _RF_UFKL, "AIME25", "Best", rank=1),
    CellClaim(1568, "0.2927", _2K, _RF_UFKL, "AIME25", "Last", rank=1),
    CellClaim(1568, "0.3427", _2K, "RPG-UFKL", "AIME24", "Last", rank=1),
    CellClaim(1568, "0.2833", _2K, "RPG-UFKL", "AIME25", "Last", rank=2),
)


def load_results() -> dict:
    return pt.load()


# ---------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------

@claim(
    "tables-transcription",
    "tab:main_table_* (transcription)",
    "Every results table of the paper is transcribed in full from the LaTeX: the five tables "
    "tab:main_table_{8k,4k,2k,4k_2,7b}, every (method, benchmark, Last/Best) cell a number in [0, "
    "1] "
    "printed with 4 decimals; the other tables hold formulas; re-parsing the paper (when present) "
    "gives the committed file",
)
def check_transcription(ck: Checker, fast: bool) -> None:
    res = load_results()
    labels = tuple(t["label"] for t in res["tables"])
    ck.fact("results tables found", sorted(labels) == sorted(RESULTS_TABLES), f"{labels}")
    other = tuple(t["label"] for t in res["other_tables"])
    ck.fact(
        "the other table environments are formula tables",
        sorted(other) == sorted(FORMULA_TABLES),
        f"{other}",
    )
    for t in res["tables"]:
        cells = pt.cells_of(res, t["label"])
        grid = {(c["method"], c["benchmark"], c["metric"]) for c in cells}
        full = {
            (r["method"], col["benchmark"], col["metric"])
            for r in t["rows"]
            for col in t["columns"]
        }
        ck.fact(
            f"{t['label']}: full grid",
            grid == full and len(cells) == len(full),
            f"{len(t['rows'])} methods x {len(t['columns'])} columns = {len(cells)} cells",
            quiet=True,
        )
        ck.fact(
            f"{t['label']}: every column is Last or Best",
            {col["metric"] for col in t["columns"]} == {"Last", "Best"},
            f"{t['columns']}",
            quiet=True,
        )
        bad = [
            c for c in cells if c["value"] is None or not 0 <= c["value"] <= 1 or c["decimals"] != 4
        ]
        ck.fact(
            f"{t['label']}: numbers in [0, 1] with 4 decimals", not bad, f"{bad[:3]}", quiet=True
        )
        ck.note(
            f"{t['label']} (l.{t['begin_line']}, setting {t['setting']}): {len(t['rows'])} "
            "methods x "
            f"{len(t['columns'])} columns"
        )
    try:
        tex = pt.read_tex()
    except FileNotFoundError:
        ck.note(
            f"paper not found at {pt.paper_tex_path()} (set {pt.PAPER_ENV}): checked the committed "
            "transcription only"
        )
        return
    fresh = pt.transcribe(tex)
    diff = [k for k in fresh if fresh[k] != res.get(k)]
    ck.fact(f"re-parsing {pt.paper_tex_path().name} gives the committed transcription", not diff,
            f"keys that differ: {diff}; regenerate with `{pt.GENERATED_BY}`" if diff else "")


@claim("tables-best-ge-last", "tab:main_table_* (Best >= Last)",
       "In every table, a method's Best score (maximum over training) is at least its Last score "
       "(the score at the 400th step), for every benchmark")
def check_best_ge_last(ck: Checker, fast: bool) -> None:
    res = load_results()
    found = {(v["table"], v["method"], v["benchmark"], v["last"], v["best"], v["line"]): v
             for v in pt.best_below_last(res)}
    n = sum(1 for c in res["cells"] if c["metric"] == "Last")
    ck.note(f"{n} (method, benchmark) pairs compared over {len(res['tables'])} tables")
    for key, e in ERRATA_BEST_BELOW_LAST.items():
        table, method, bench, last, best, line = key
        ck.erratum(f"{e} {table} l.{line}", key in found,
                   f"{method} {bench}: Last {last} > Best {best}")
    extra = [k for k in found if k not in ERRATA_BEST_BELOW_LAST]
    ck.fact("no other Best < Last", not extra, f"undocumented: {extra}" if extra else "")


@claim(
    "tables-caption-marks",
    "tab:main_table_* (captions)",
    "As every caption says, the highest value of each column is bold and the second highest "
    "underlined; RPG rows share one highlight colour, RPG-REINFORCE rows another, baselines none",
)
def check_caption_marks(ck: Checker, fast: bool) -> None:
    res = load_results()
    by_col = {}
    for m in pt.mark_mismatches(res):
        by_col.setdefault((m["table"], m["benchmark"], m["metric"]), set()).add(
            (m["method"], m["mark"], m["printed"], m["rank"]))
    n = sum(len(t["columns"]) for t in res["tables"])
    ck.note(f"{n} columns over {len(res['tables'])} tables; ties share a mark")
    for t in res["tables"]:
        ck.fact(
            f"{t['label']}: caption states bold = highest, underline = second highest",
            t["marks"] == {"bold": "highest", "underline": "second highest"},
            f"{t['marks']}",
            quiet=True,
        )
    for key, (e, expect) in ERRATA_MARKS.items():
        got = by_col.get(key, set())
        table, bench, metric = key
        lines = sorted(
            {
                c["line"]
                for c in pt.cells_of(res, table)
                if (c["benchmark"], c["metric"]) == (bench, metric)
                and any(c["method"] == x[0] for x in expect)
            }
        )
        ck.erratum(
            f"{e} {table} {bench} {metric} (l.{', '.join(map(str, lines))})",
            got == expect,
            "; ".join(
                f"{meth} rank {r}: {'printed' if p else 'no'} {mark}"
                for meth, mark, p, r in sorted(got)
            )
            or "no mismatch found",
        )
    extra = {k: v for k, v in by_col.items() if k not in ERRATA_MARKS}
    ck.fact(
        "no other column's marks disagree with its values",
        not extra,
        f"undocumented: {extra}" if extra else "",
    )
    for t in res["tables"]:
        colours = {}
        for r in t["rows"]:
            colours.setdefault(pt.family(r["method"]), set()).add(r["rowcolor"])
        ok = (
            colours.get("baseline", {None}) == {None}
            and len(colours.get("rpg", ())) == 1
            and len(colours.get("rpg-reinforce", ())) == 1
            and None not in colours["rpg"] | colours["rpg-reinforce"]
            and colours["rpg"] != colours["rpg-reinforce"]
        )
        ck.fact(f"{t['label']}: one highlight per family", ok, f"{colours}", quiet=True)


@claim("tables-average-columns", "tab:main_table_* (averages)",
       "Any average column equals the mean of the columns it averages, to the printed rounding")
def check_average_columns(ck: Checker, fast: bool) -> None:
    res = load_results()
    avgs = pt.average_columns(res)
    bad = [a for a in avgs if not a["ok"]]
    ck.fact("every average entry is the mean of its row's columns", not bad, f"{bad}", quiet=True)
    ck.note(
        f"{len(avgs)} average entries checked"
        if avgs
        else f"no column is headed Avg/Average/Mean in the {len(res['tables'])} tables: nothing "
             "to average"
    )


@claim("tables-cross-table", "tab:main_table_* (across tables)",
       "A method reported in two tables of the same setting (model, context length) has the same "
       "numbers; tables of one setting report the same methods")
def check_cross_table(ck: Checker, fast: bool) -> None:
    res = load_results()
    groups = {}
    for t in res["tables"]:
        groups.setdefault((t["setting"]["context"], t["setting"]["model"]), []).append(t["label"])
    shared = {k: tuple(v) for k, v in groups.items() if len(v) > 1}
    ck.fact("settings reported by more than one table", shared == SHARED_SETTINGS, f"{shared}")
    for setting, labels in shared.items():
        tabs = [pt.table(res, lb) for lb in labels]
        methods = [[r["method"] for r in t["rows"]] for t in tabs]
        ck.fact(
            f"{' and '.join(labels)} (setting {setting}) list the same methods in the same order",
            all(m == methods[0] for m in methods),
            f"{methods}" if any(m != methods[0] for m in methods) else f"{len(methods[0])} methods",
        )
        seen = {}
        for lb in labels:
            for c in pt.cells_of(res, lb):
                seen.setdefault((c["method"], c["benchmark"], c["metric"]), []).append(
                    (lb, c["text"], c["line"])
                )
        twice = {k: v for k, v in seen.items() if len(v) > 1}
        clash = {k: v for k, v in twice.items() if len({x[1] for x in v}) > 1}
        ck.fact("entries reported twice agree", not clash, f"{clash}", quiet=True)
        benches = [sorted({c["benchmark"] for c in pt.cells_of(res, lb)}) for lb in labels]
        ck.note(f"{labels}: {len(twice)} entries reported twice; benchmarks {benches}")
    rest = sorted(lb for v in groups.values() if len(v) == 1 for lb in v)
    ck.note(f"one table per setting: {rest}")


@claim(
    "tables-text-claims",
    "abstract, sec:* (quoted numbers)",
    "Every number the abstract, introduction, experiments and additional results quote is a table "
    "entry (or, for a percentage or a margin, follows from the table entries) and has the rank the "
    "text gives it",
)
def check_text_claims(ck: Checker, fast: bool) -> None:
    res = load_results()
    quoted = {(n["line"], n["text"]) for n in res["text_numbers"]}
    claimed = {(c.line, c.text) for c in CLAIMS if not isinstance(c, RankClaim)}
    ck.fact("every quoted number has a claim in derivations/tables.py CLAIMS", quoted <= claimed,
            f"unclaimed: {sorted(quoted - claimed)}", quiet=True)
    ck.fact(
        "every claim's number is in the text",
        claimed <= quoted,
        f"not found: {sorted(claimed - quoted)}",
        quiet=True,
    )
    ck.note(
        f"{len(quoted)} numbers quoted in {sorted({n['section'] for n in res['text_numbers']})}"
    )
    external = {}
    for c in CLAIMS:
        ok, detail = c.evaluate(res)
        if isinstance(c, ExternalClaim):
            external.setdefault(c.erratum, []).append((c, ok, detail))
        else:
            ck.fact(detail, ok)
    for e, items in external.items():
        lines = ", ".join(f"l.{c.line}" for c, _, _ in items)
        ck.erratum(
            f"{e} ({lines})",
            not any(ok for _, ok, _ in items),
            f"{items[0][0].text} for {items[0][0].subject} is in no table; quoted at {lines}",
        )
    for t in res["tables"]:
        tops = []
        for (bench, metric), col in pt.columns(res, t["label"]).items():
            top = [c["method"] for c in col if pt.rank(col, c) == 1]
            tops.append(f"{bench} {metric}: {'/'.join(top)}")
        ck.note(f"column leaders (by value) in {t['label']}: " + "; ".join(tops))
