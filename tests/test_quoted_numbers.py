"""Numbers quoted in prose (the README, small_scale/RESULTS.md's hand-written paragraphs, the docs)
are recomputed here from the committed rows (small_scale/results/<study>.jsonl) and the study
files, so that prose cannot drift from data.

QUOTES lists (file, the quoted text with {} where the number stands, how to recompute the number):
the recomputed number, formatted into the text, must occur in the file. A changed row, a rerun
study or an edited sentence fails here until the prose says what the rows say. The
recomputation is written here from the rows and scipy, apart from small_scale/analysis.py (which
writes RESULTS.md's generated blocks and is checked against them in test_study_analysis.py):
paired differences by seed, the seeds the study file's warm-start rule excludes left out, the
95 % interval from the t distribution.

To quote a new number: add a line to QUOTES (or to a template below), then write the number.
"""

import json
import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest

stats = pytest.importorskip("scipy.stats", reason="needs the study extra (scipy)")
from scipy import optimize

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "small_scale" / "results"
STUDIES = ROOT / "small_scale" / "studies"
RESULTS_MD = RMD = "small_scale/RESULTS.md"


@cache
def rows(study: str) -> tuple:
    path = RESULTS / f"{study}.jsonl"
    return tuple(json.loads(line) for line in path.open()) if path.exists() else ()


@cache
def spec(study: str) -> dict:
    return json.loads((STUDIES / f"{study}.json").read_text())


@cache
def excluded(study: str) -> frozenset:
    """Seeds the study file's pre-registered rule drops: its reference cell's outcome below the
    bound."""
    rule = spec(study)["analysis"].get("exclude")
    if not rule:
        return frozenset()
    return frozenset(r["seed"] for r in rows(study) if r["cell"] == rule["reference_cell"]
                     and r["outcomes"][rule["outcome"]] < rule["below"])


def by_seed(study: str, cell: str, outcome: str = "heldout") -> dict:
    """{seed: outcome}; "drop" is heldout_first - heldout_min (the fall from the first evaluation
    to the lowest)."""
    def value(o):
        return o["heldout_first"] - o["heldout_min"] if outcome == "drop" else o[outcome]
    return {r["seed"]: value(r["outcomes"]) for r in rows(study)
            if r["cell"] == cell and r["seed"] not in excluded(study)}


def paired(study: str, a: str, b: str, outcome: str = "heldout",
           then: tuple | None = None) -> np.ndarray:
    """Per-seed differences a - b; with ``then`` = (c, d): (a - b) - (c - d), an interaction."""
    cells = [a, b, *(then or ())]
    vals = [by_seed(study, c, outcome) for c in cells]
    seeds = sorted(set.intersection(*(set(v) for v in vals)))
    d = np.array([vals[0][s] - vals[1][s] for s in seeds])
    if then:
        d = d - np.array([vals[2][s] - vals[3][s] for s in seeds])
    return d


def mean(study, a, b, outcome="heldout", then=None) -> float:
    return float(paired(study, a, b, outcome, then).mean())


def bound(study, a, b, outcome="heldout") -> float:
    """The larger |end| of the paired 95 % t interval: "no difference larger than" it."""
    d = paired(study, a, b, outcome)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return float(max(abs(d.mean() - half), abs(d.mean() + half)))


def sd_of_pairs(study, a, b, outcome="heldout") -> float:
    return float(paired(study, a, b, outcome).std(ddof=1))


def standardized_mde(n: int, alpha: float, power: float = 0.8) -> float:
    """The difference, in standard deviations of the paired differences, that a two-sided paired
    t test on n seeds at level alpha detects with the given power (noncentral t)."""
    tc = stats.t.ppf(1 - alpha / 2, n - 1)
    reach = lambda nc: stats.nct.sf(tc, n - 1, nc) + stats.nct.sf(tc, n - 1, -nc) - power
    return float(optimize.brentq(reach, 0.0, 50.0) / np.sqrt(n))


def cell_mean(study, cell, outcome="heldout") -> float:
    return float(np.mean(list(by_seed(study, cell, outcome).values())))


def seeds_per_cell(study: str) -> int:
    """The paired seeds every cell has after the exclusion (one number, or the test fails)."""
    counts = {len(by_seed(study, c)) for c in spec(study)["cells"]}
    assert len(counts) == 1, f"{study}: cells differ in seed count {counts}"
    return counts.pop()


def table_cpu_h() -> list[float]:
    """The CPU-h column of RESULTS.md's table of studies (a cell may hold "0.22, 0.08")."""
    table = _md_table(RESULTS_MD, "| study | what it settles | runs | CPU-h |")
    return [float(x) for row in table for x in row[3].split(",")]


def _md_table(path: str, header: str) -> list[list[str]]:
    text = (ROOT / path).read_text()
    lines = text.split(header + "\n", 1)[1].splitlines()[1:]
    table = []
    for line in lines:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip("|").split("|")])
    return table


C = "C"
# (file, quoted text with {} for the number, the number from the rows)
QUOTES = [
    # RESULTS.md, the study table's prose
    (RMD, "{:.1f} CPU-h in all", lambda: sum(table_cpu_h())),
    # RESULTS.md, "What study C says" (each of its numbers is also one a generated block prints:
    # tests/test_readings.py)
    (RMD, "21 paired seeds in every cell", lambda: seeds_per_cell(C)),
    (RMD, "On-policy RL ends {:+.3f}", lambda: mean(C, "urkl-u1", "warm-start")),
    (RMD, "beta 0\n  ({:+.3f} [", lambda: mean(C, "urkl-u1", "urkl-b0-u1")),
    (RMD, "URKL + RPG-Style Clip ends {:+.3f} [", lambda: mean(C, "urkl-u16", "warm-start")),
    (RMD, "GRPO {:+.3f} [", lambda: mean(C, "grpo-u16", "warm-start")),
    (RMD, "and DAPO {:+.3f} [", lambda: mean(C, "dapo-u16", "warm-start")),
    (RMD, "({} / 21 seeds below it)", lambda: int((paired(C, "urkl-u16", "warm-start") < 0).sum())),
    (RMD, "URKL + clip {:+.3f} over DAPO", lambda: mean(C, "urkl-u16", "dapo-u16")),
    (RMD, "against GRPO it ends {:.3f} lower", lambda: mean(C, "grpo-u16", "urkl-u16")),
    (RMD, "(within {:.3f} for URKL + clip", lambda: bound(C, "urkl-lag4-coupled", "urkl-lag4-tis")),
    (RMD, "differs by {:+.3f} [", lambda: mean(C, "urkl-iter-b3.0x-u4", "urkl-frozen-b3.0x-u4",
                                              "drop")),
    (RMD, "lowest held-out is {:.3f} higher", lambda: mean(
        C, "urkl-iter-b3.0x-u4", "urkl-frozen-b3.0x-u4", "heldout_min")),
    (RMD, "it is already {:+.3f} [", lambda: mean(
        C, "urkl-iter-b3.0x-u4", "urkl-frozen-b3.0x-u4", "heldout_first")),
    (RMD, "TIS helps URKL + clip with the stale sampler ({:+.3f})", lambda: mean(
        C, "urkl-lag4-tis", "urkl-lag4")),
    (RMD, "URKL\n  ends {:.3f} above UFKL", lambda: mean(C, "urkl-u4", "ufkl-u4")),
    # docs/carry_task.md, the power of study C stated before its runs
    ("docs/carry_task.md", "beta 0.1 vs 0 at cost 0.02: {:.3f}", lambda: sd_of_pairs(
        "carry-calibration", "c0.02-b0.1", "c0.02-b0.0")),
    ("docs/carry_task.md", "beta 0.3 vs 0.1: {:.3f}", lambda: sd_of_pairs(
        "carry-calibration", "c0.02-b0.3", "c0.02-b0.1")),
    ("docs/carry_task.md", "cost 0.03 vs 0.02 at\nbeta 0.1: {:.3f}", lambda: sd_of_pairs(
        "carry-calibration", "c0.03-b0.1", "c0.02-b0.1")),
    ("docs/carry_task.md", "and {:.2f} between RL and its warm start", lambda: sd_of_pairs(
        "carry-calibration", "c0.02-b0.1", "warm-start")),
    ("docs/carry_task.md", "a standardized difference of {:.2f} (alpha 0.05)", lambda:
     standardized_mde(20, 0.05)),
    ("docs/carry_task.md", "{:.2f} (alpha 0.05 / 6,", lambda: standardized_mde(20, 0.05 / 6)),
    ("docs/carry_task.md", "and {:.2f} (alpha 0.05 / 21,", lambda: standardized_mde(20, 0.05 / 21)),
    # notebook 7 quotes study C
    ("notebooks/07_off_policy_on_the_bandit.py", "decoupled loss ({:+.2f} held-out)", lambda: mean(
        C, "urkl-lag4-tis", "urkl-lag4")),
    # README, the study paragraph
    ("README.md", "on-policy RL adds {:+.3f} over the warm start", lambda: mean(
        C, "urkl-u1", "warm-start")),
    ("README.md", "URKL + clip ends {:+.3f} [", lambda: mean(C, "urkl-u16", "warm-start")),
    ("README.md", "GRPO {:+.3f}, and", lambda: mean(C, "grpo-u16", "warm-start")),
    ("README.md", "DAPO {:+.3f}, driven", lambda: mean(C, "dapo-u16", "warm-start")),
    ("README.md", "URKL + clip {:+.3f} over DAPO", lambda: mean(C, "urkl-u16", "dapo-u16")),
    ("README.md", "({} paired seeds per cell), RPG-Style", lambda: seeds_per_cell("A")),
    ("README.md", "study C, {} paired seeds", lambda: seeds_per_cell(C)),
]


@pytest.mark.parametrize("path, quote, recompute", QUOTES,
                         ids=[f"{p}: {q[:40]!r}" for p, q, _ in QUOTES])
def test_quoted_number_is_the_rows(path, quote, recompute):
    """The prose quotes the number the committed rows give (formatted as the prose writes it)."""
    expected = quote.format(recompute())
    text = (ROOT / path).read_text()
    assert expected in text, (f"{path} should say {expected!r} (recomputed from the committed "
                              f"rows); its text has drifted from the data, or the quote moved")


def test_the_study_table_is_the_rows():
    """RESULTS.md's table of studies: each study's runs are its committed rows, and its CPU-h
    the sum of their cpu_s (every row, the excluded seeds' too: what running it cost)."""
    table = _md_table(RESULTS_MD, "| study | what it settles | runs | CPU-h |")
    assert len(table) >= 7
    for row in table:
        names = re.findall(r"`([^`]+)`", row[0])
        for name, runs, cpu_h in zip(names, row[2].split(","), row[3].split(","), strict=True):
            assert int(runs) == len(rows(name)), (name, runs)
            cost = sum(r["cpu_s"] for r in rows(name)) / 3600
            assert cpu_h.strip() == f"{cost:.2f}", (name, cpu_h, cost)


def test_every_study_is_complete_as_results_md_says():
    """"Every study is complete" but those RESULTS.md names as still landing: each cell of each
    other study has every planned seed the exclusion rule keeps (the study file's plan)."""
    text = (ROOT / RESULTS_MD).read_text()
    assert "Every study is complete but those still landing" in text
    landing = set(re.findall(r"`([^`]+)`", text.split("Still landing:", 1)[1].split("\n\n")[0]))
    for path in sorted(STUDIES.glob("*.json")):
        study = path.stem
        if study in landing:
            continue
        s = spec(study)
        for cell, body in s["cells"].items():
            first = s.get("first_seed", 0)
            planned = set(range(first, first + body.get("seeds", s["seeds"]))) - excluded(study)
            done = {r["seed"] for r in rows(study) if r["cell"] == cell}
            assert planned <= done, f"{study}/{cell}: seeds {sorted(planned - done)} not run"


def test_a_drifted_quote_fails():
    """The check can fail: a number one unit off in its last digit is not in the text."""
    path, quote, recompute = QUOTES[6]
    wrong = quote.format(recompute() + 0.001)
    assert wrong not in (ROOT / path).read_text()
