"""The transcription of the paper's results tables (derivations/paper_tables.py ->
paper_figs/paper_results.json) and the table checks (derivations/tables.py).

The parser is tested on a small LaTeX table written here with known cells, marks and lines; the
committed JSON is compared with a fresh parse of the paper when the paper is present
($RPG_PAPER_TEX, else ../shared/paper/rpg_paper.tex); the checks are shown to fail when the
transcription departs from the documented errata.
"""

import copy
import json

import pytest
from needs import needs_paper_tex

from derivations import paper_tables as pt
from derivations import tables
from paper_figs.paper_results import main as transcribe_main

SECTIONS = r"""\begin{abstract}We gain $+3$ points and reach 41\% (weight decay 0.1, clip 0.28).\end{abstract}
\section{Introduction} Nothing quoted. % 0.9999 in a comment
\section{Experiments} The best Last is 0.5000.
\begin{figure}0.7777\end{figure}
\section{Conclusion} Done.
\section{Additional Experiment Results} See 0.1000.
\section{Proofs} 0.3333 is not in a text section."""  # noqa: E501
TOY = r"""\begin{table}[t]
\caption{Scores with 4k context length. The highest score in each column is \textbf{bolded}, and the second highest is \underline{underlined}.}
\begin{tabular}{l|cc|cc}
\toprule
\multicolumn{1}{c|}{\multirow{2}{*}{\textbf{Method}}} & \multicolumn{2}{c|}{\textbf{B1}} & \multicolumn{2}{c}{\textbf{B2}} \\
\cmidrule(lr){2-3} \cmidrule(lr){4-5}
\multicolumn{1}{c|}{} & \textbf{Last} & \textbf{Best} & \textbf{Last} & \textbf{Best} \\
\midrule
{Base} & 0.1000 & \underline{0.2000} & 0.3000 & 0.3000 \\ % Base & 0.9 & 0.9 \\
\midrule
\rowcolor{LightCyan!20!}
{RPG-X} & \textbf{0.5000} & \textbf{0.4000} & -- & \textbf{0.6000} \\
\bottomrule
\end{tabular}
\label{tab:toy}
\end{table}
\begin{table}\caption{Formulas.}\label{tab:formulas}\begin{tabular}{cc} $a$ & $b$ \\ \end{tabular}\end{table}
"""  # noqa: E501
TOY_LINE = {"Base": 9, "RPG-X": 12}            # lines of the body rows in TOY (1-based)


@pytest.fixture(scope="module")
def toy():
    return pt.transcribe(TOY + SECTIONS)


def test_parser_reads_cells_marks_lines_and_headers(toy):
    """Every body cell of the toy table with its method, (benchmark, metric) from the
    multicolumn header, value, printed text, bold/underline and line; comments ignored; the row
    colour kept; a dash is a missing value; the formula table is listed as not a results table."""
    (t,) = toy["tables"]
    assert t["label"] == "tab:toy" and t["caption_line"] == 2 and t["begin_line"] == 1
    assert t["setting"] == {"context": "4k", "model": None}
    assert t["marks"] == {"bold": "highest", "underline": "second highest"}
    assert [(c["benchmark"], c["metric"]) for c in t["columns"]] == [("B1", "Last"), ("B1", "Best"),
                                                                    ("B2", "Last"), ("B2", "Best")]
    assert [(r["method"], r["line"], r["block"], r["rowcolor"]) for r in t["rows"]] == [
        ("Base", 9, 0, None), ("RPG-X", 12, 1, "LightCyan!20!")]
    got = {
        (c["method"], c["benchmark"], c["metric"]): (
            c["value"],
            c["text"],
            c["bold"],
            c["underline"],
            c["line"],
        )
        for c in toy["cells"]
    }
    assert got == {
        ("Base", "B1", "Last"): (0.1, "0.1000", False, False, 9),
        ("Base", "B1", "Best"): (0.2, "0.2000", False, True, 9),
        ("Base", "B2", "Last"): (0.3, "0.3000", False, False, 9),
        ("Base", "B2", "Best"): (0.3, "0.3000", False, False, 9),
        ("RPG-X", "B1", "Last"): (0.5, "0.5000", True, False, 12),
        ("RPG-X", "B1", "Best"): (0.4, "0.4000", True, False, 12),
        ("RPG-X", "B2", "Last"): (None, "--", False, False, 12),
        ("RPG-X", "B2", "Best"): (0.6, "0.6000", True, False, 12),
    }
    assert toy["other_tables"] == [{"label": "tab:formulas", "begin_line": 17,
                                    "reason": "no numeric body cells (a table of formulas)"}]


def test_parser_text_numbers(toy):
    """Percentages, signed points and >= 3-digit decimals in the text sections, with their line;
    not 0.1 / 0.28 (hyperparameters), not numbers in comments, figures or other sections."""
    got = [(n["section"], n["kind"], n["text"], n["value"]) for n in toy["text_numbers"]]
    assert got == [("abstract", "points", "+3", 3.0), ("abstract", "percent", "41\\%", 41.0),
                   ("sec:experiments", "decimal", "0.5000", 0.5),
                   ("sec:additional_exp", "decimal", "0.1000", 0.1)]
    assert [n["line"] for n in toy["text_numbers"]] == [18, 18, 20, 23]
    assert toy["text_numbers"][2]["context"] == "The best Last is 0.5000."


def test_parser_refuses_malformed_tables():
    """A results table whose row has a cell too few, a non-number, or no label: one error naming
    the line."""
    bad_cell = TOY.replace(r"{Base} & 0.1000 & \underline{0.2000} & 0.3000 & 0.3000",
                           r"{Base} & 0.1000 & \underline{0.2000} & 0.3000 & abc")
    with pytest.raises(pt.TexError, match=r"line 9: tab:toy: cell 'abc'"):
        pt.transcribe(bad_cell + SECTIONS)
    short = TOY.replace(
        r"{Base} & 0.1000 & \underline{0.2000} & 0.3000 & 0.3000", r"{Base} & 0.1000 & 0.3000"
    )
    with pytest.raises(pt.TexError, match=r"line 9: tab:toy: row has 3 cells, the header has 5"):
        pt.transcribe(short + SECTIONS)
    with pytest.raises(pt.TexError, match="without \\\\label"):
        pt.transcribe(TOY.replace(r"\label{tab:toy}", "") + SECTIONS)
    with pytest.raises(pt.TexError, match="sec:conclusion"):
        pt.transcribe(TOY + SECTIONS.replace(r"\section{Conclusion}", r"\section{Summary}"))


def test_predicates_best_below_last_marks_ranks(toy):
    """Best < Last found where it is (RPG-X on B1); marks vs ranks: B1 Last's 0.1000 is the
    second highest of its column but not underlined; ties share a rank."""
    assert pt.best_below_last(toy) == [{"table": "tab:toy", "method": "RPG-X", "benchmark": "B1",
                                        "last": "0.5000", "best": "0.4000", "line": 12}]
    mism = [
        (m["method"], m["benchmark"], m["metric"], m["mark"], m["printed"], m["rank"])
        for m in pt.mark_mismatches(toy)
    ]
    assert mism == [("Base", "B1", "Last", "underline", False, 2),
                    ("Base", "B2", "Last", "bold", False, 1),       # the only number of B2 Last
                    ("Base", "B2", "Best", "underline", False, 2)]
    col = [{"value": v} for v in (0.5, 0.5, 0.3, 0.2)]
    assert [pt.rank(col, c) for c in col] == [1, 1, 2, 3]
    assert [pt.family(m) for m in ("RPG-REINFORCE-UFKL", "RPG-URKL", "DAPO", "REINFORCE++")] == [
        "rpg-reinforce", "rpg", "baseline", "baseline"]


def test_average_columns_checked_to_printed_rounding():
    """An 'Avg.' column is the mean of the other columns of its metric, rounded to its decimals."""
    res = {
        "tables": [{"label": "t", "marks": {}}],
        "cells": [
            {
                "table": "t",
                "method": m,
                "benchmark": b,
                "metric": "Last",
                "value": v,
                "text": f"{v:.2f}",
                "decimals": 2,
                "line": i,
            }
            for i, (m, b, v) in enumerate(
                [
                    ("a", "X", 0.10),
                    ("a", "Y", 0.24),
                    ("a", "Avg.", 0.17),
                    ("b", "X", 0.30),
                    ("b", "Y", 0.50),
                    ("b", "Avg.", 0.41),
                ]
            )
        ],
    }
    got = [(a["method"], a["ok"], round(a["mean"], 10)) for a in pt.average_columns(res)]
    assert got == [("a", True, 0.17), ("b", False, 0.4)]


@needs_paper_tex
def test_committed_transcription_matches_the_paper():
    """Re-parsing rpg_paper.tex gives exactly the committed paper_figs/paper_results.json."""
    path = pt.paper_tex_path()
    if not path.is_file():
        pytest.skip(
            f"rpg_paper.tex not found at {path}: set {pt.PAPER_ENV} to the paper's LaTeX source"
        )
    assert pt.dumps(pt.transcribe(pt.read_tex(path))) == pt.RESULTS_JSON.read_text(
        encoding="utf-8"
    ), "paper_figs/paper_results.json is stale: run python -m paper_figs.paper_results"


def test_committed_transcription_spot_values():
    """A few entries read off the paper by eye (tab:main_table_8k l.780, tab:main_table_7b l.1843,
    tab:main_table_4k_2 l.1702) are in the committed file as printed."""
    res = pt.load()
    c = pt.cell(res, "tab:main_table_8k", "RPG-URKL", "AIME25", "Last")
    assert (c["text"], c["line"], c["bold"], c["underline"]) == ("0.5261", 780, False, False)
    c = pt.cell(res, "tab:main_table_7b", "RPG-REINFORCE-URKL", "AIME25", "Last")
    assert (c["text"], c["line"], c["underline"]) == ("0.0813", 1843, True)
    c = pt.cell(res, "tab:main_table_4k_2", "REINFORCE++", "OlympiadBench", "Best")
    assert (c["text"], c["bold"]) == ("0.6202", True)
    assert len(res["cells"]) == 6 * 6 + 8 * 6 + 6 * 4 + 8 * 4 + 12 * 6


def _run_with(monkeypatch, check, res):
    monkeypatch.setattr(tables, "load_results", lambda: res)
    return check(fast=True)


def test_checks_fail_when_a_documented_erratum_disappears(monkeypatch):
    """Correcting the 8k typo (0.5261 -> 0.4261) makes E11 and E12 no longer reproduce: both
    checks FAIL (the errata entries would be stale), they do not silently pass."""
    res = copy.deepcopy(pt.load())
    c = pt.cell(res, "tab:main_table_8k", "RPG-URKL", "AIME25", "Last")
    c["text"], c["value"] = "0.4261", 0.4261
    for check in (tables.check_best_ge_last, tables.check_caption_marks):
        row = _run_with(monkeypatch, check, res)
        assert row["status"] == "FAIL" and any("not reproduced" in d for d in row["detail"]), row


def test_checks_fail_on_an_undocumented_violation(monkeypatch):
    """A new Best < Last, a wrong bold, a clash between 4k tables or a quoted number nobody
    claimed is a FAIL, not an erratum."""
    base = pt.load()
    res = copy.deepcopy(base)
    c = pt.cell(res, "tab:main_table_2k", "GRPO", "AIME24", "Best")
    c["value"], c["text"] = 0.2000, "0.2000"
    assert _run_with(monkeypatch, tables.check_best_ge_last, res)["status"] == "FAIL"
    res = copy.deepcopy(base)
    pt.cell(res, "tab:main_table_7b", "GRPO", "AMC23", "Last")["bold"] = True
    assert _run_with(monkeypatch, tables.check_caption_marks, res)["status"] == "FAIL"
    res = copy.deepcopy(base)
    res["cells"].append({**pt.cell(res, "tab:main_table_4k", "DAPO", "AIME24", "Last"),
                         "table": "tab:main_table_4k_2", "text": "0.4000", "value": 0.4})
    assert _run_with(monkeypatch, tables.check_cross_table, res)["status"] == "FAIL"
    res = copy.deepcopy(base)
    res["text_numbers"].append(
        {
            "line": 805,
            "section": "sec:experiments",
            "kind": "percent",
            "text": "60\\%",
            "value": 60.0,
            "context": "x",
        }
    )
    assert _run_with(monkeypatch, tables.check_text_claims, res)["status"] == "FAIL"
    res = copy.deepcopy(base)
    pt.cell(res, "tab:main_table_4k", "RPG-REINFORCE-URKL", "AIME24", "Best")["text"] = "0.4530"
    assert _run_with(monkeypatch, tables.check_text_claims, res)["status"] == "FAIL"


def test_margin_claim_is_the_largest_family_margin():
    """The '+6 over DAPO' claim is evaluated as the largest RPG-REINFORCE - DAPO difference, same
    table/benchmark/metric, over AIME24/25: 0.4125 - 0.3510 at 4k (tab:main_table_4k
    l.1625/1616)."""
    claim = next(c for c in tables.CLAIMS if isinstance(c, tables.MarginClaim))
    top, c, b = claim.margins(pt.load())[0]
    assert (c["table"], c["method"], c["benchmark"], c["metric"]) == (
        "tab:main_table_4k",
        "RPG-REINFORCE-URKL",
        "AIME25",
        "Last",
    )
    assert abs(top - 100 * (0.4125 - 0.3510)) < 1e-9 and b["method"] == "DAPO"


def test_cli_missing_paper_and_stale_file(tmp_path, capsys, monkeypatch):
    """No paper: one line naming the variable to set, exit 2, nothing written. --check on a
    stale file: exit 1. A fresh write then --check: exit 0."""
    out = tmp_path / "r.json"
    monkeypatch.setenv(pt.PAPER_ENV, str(tmp_path / "missing.tex"))
    assert transcribe_main(["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and pt.PAPER_ENV in err[0] and not out.exists()
    tex = tmp_path / "p.tex"
    tex.write_text(TOY + SECTIONS)
    assert transcribe_main(["--tex", str(tex), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["tables"][0]["label"] == "tab:toy"
    assert transcribe_main(["--tex", str(tex), "--out", str(out), "--check"]) == 0
    out.write_text("{}")
    assert transcribe_main(["--tex", str(tex), "--out", str(out), "--check"]) == 1
    tex.write_text(TOY.replace("0.3000 & 0.3000", "0.3000 & abc") + SECTIONS)
    assert transcribe_main(["--tex", str(tex), "--out", str(out)]) == 2
    assert "line 9" in capsys.readouterr().err
