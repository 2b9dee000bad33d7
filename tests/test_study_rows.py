"""A results row that is not data is refused by every reader of a study (analysis.py, study.py,
the figures) in one line naming file:line and the field, before anything is written; a torn last
line is reported, and said again when the runner cuts it off. Each case edits one line of a copy
of the committed study A (small_scale/results/A.jsonl, line 3: cell dapo-u1, seed 0)."""

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("scipy", reason="the study analysis needs scipy (pip install -e '.[study]')")


import small_scale.study.analysis as A
import small_scale.study.files as S
import small_scale.study.runner as study
from paper_figs.training import load_study as figures_study


def copy_of_a(tmp_path: Path) -> tuple[Path, list]:
    """tmp/studies/A.json, tmp/results/A.jsonl, copies of the committed ones (with the calibration
    study whose choices A's arguments read), and tmp/RESULTS.md with their two generated blocks;
    the results' lines."""
    (tmp_path / "studies").mkdir()
    (tmp_path / "results").mkdir()
    for name in ("A", "calibration"):
        shutil.copy(S.STUDIES / f"{name}.json", tmp_path / "studies" / f"{name}.json")
    shutil.copy(S.RESULTS / "calibration.jsonl", tmp_path / "results" / "calibration.jsonl")
    text = A.RESULTS_MD.read_text()
    (tmp_path / "RESULTS.md").write_text("".join(
        text[text.index(A.begin(name)):text.index(A.end(name)) + len(A.end(name))] + "\n"
        for name in ("A", "calibration")))
    lines = (S.RESULTS / "A.jsonl").read_text().splitlines(keepends=True)
    row = json.loads(lines[2])
    assert (row["cell"], row["seed"]) == ("dapo-u1", 0)
    return tmp_path, lines


def edited(row: dict, how: str) -> str:
    """Line 3 edited as ``how`` says (bare NaN as Python's json writes it, "inf" as the runner's
    strict JSON does)."""
    out = dict(row, outcomes=dict(row["outcomes"]))
    if how == "nan":
        return json.dumps(out).replace(f'"heldout": {row["outcomes"]["heldout"]}',
                                       '"heldout": NaN') + "\n"
    if how == "inf":
        out["outcomes"]["heldout"] = "inf"
    elif how == "missing":
        del out["outcomes"]["heldout"]
    elif how == "null":
        out["outcomes"]["heldout"] = None
    elif how == "seed":
        out["seed"] = 999
    elif how == "cell":
        out["cell"] = "dapo-u2"
    elif how == "cpu":
        out["cpu_s"] = "nan"
    elif how == "series":
        del out["series"]
    return json.dumps(out) + "\n"


BAD = {  # how line 3 is edited -> (line named, what the message says of it)
    "nan": (3, "outcome 'heldout' is nan, not a finite number or null"),
    "inf": (3, "outcome 'heldout' is inf, not a finite number or null"),
    "missing": (3, "outcome 'heldout' is missing"),
    "null": (3, "outcome 'heldout' is null, and the analysis decides with it"),
    "seed": (3, "seed 999 of cell 'dapo-u1' is not planned (the study file plans seeds 0-33)"),
    "cell": (3, "cell 'dapo-u2' is not a cell of study A"),
    "cpu": (3, "cpu_s is nan, not a finite number >= 0"),
    "series": (3, "series is missing or not a list (the run's metrics rows the figures read)"),
    "duplicate": (659, "cell 'dapo-u1' seed 0 again (first at line 3)"),
}


@pytest.mark.parametrize("how", sorted(BAD))
def test_a_bad_row_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, how):
    root, lines = copy_of_a(tmp_path)
    if how == "duplicate":
        lines.append(lines[2])
    else:
        lines[2] = edited(json.loads(lines[2]), how)
    results = root / "results" / "A.jsonl"
    results.write_text("".join(lines))
    md_before = (root / "RESULTS.md").read_bytes()
    line, what = BAD[how]
    want = re.compile(rf"{re.escape(str(results))}:{line}: {re.escape(what)}; fix or remove "
                      rf"that line \(a removed row's run is done again by python -m "
                      rf"small_scale.study\)")
    common = ["--results", str(root / "results"), "--studies", str(root / "studies")]
    assert A.main(["--all", *common, "--out", str(root / "out"),
                   "--results-md", str(root / "RESULTS.md")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and want.fullmatch(err.strip().removeprefix(
        "small_scale.study.analysis: ")), err
    assert (root / "RESULTS.md").read_bytes() == md_before and not (root / "out").exists()
    for prog, argv in (("small_scale.study.analysis", ["A", *common]),
                       ("small_scale.study", ["A", "--status", *common, "--runs",
                                              str(root / "runs")])):
        assert (A.main if prog.endswith("analysis") else study.main)(argv) == 2
        out = capsys.readouterr()
        assert out.out == "" and want.fullmatch(out.err.strip().removeprefix(f"{prog}: ")), out
    with pytest.raises(ValueError, match=re.escape(what)):
        figures_study("A", root)


def test_null_is_taken_only_for_an_outcome_the_analysis_does_not_decide_with(tmp_path):
    """The committed rows carry rc_ess_mean = null (no rollout correction in those runs: the key
    was never logged) and are read; an entropy_last of null is read too; heldout (the analysis's
    outcome, its exclusion and its collapse rule) of null is not."""
    root, lines = copy_of_a(tmp_path)
    committed = S.read_rows(S.RESULTS / "A.jsonl", S.load_study("A"))
    assert all((r["outcomes"]["rc_ess_mean"] is None) == ("--rollout-correction" not in r["argv"])
               for r in committed) and committed[0]["outcomes"]["rc_ess_mean"] is None
    row = json.loads(lines[2])
    row["outcomes"]["entropy_last"] = None
    lines[2] = json.dumps(row) + "\n"
    (root / "results" / "A.jsonl").write_text("".join(lines))
    spec = S.load_study("A", root / "studies")
    got = S.read_rows(root / "results" / "A.jsonl", spec)
    assert len(got) == len(committed) and got[2]["outcomes"]["entropy_last"] is None
    row["outcomes"]["heldout"] = None
    lines[2] = json.dumps(row) + "\n"
    (root / "results" / "A.jsonl").write_text("".join(lines))
    with pytest.raises(S.StudyError, match=r"A\.jsonl:3: outcome 'heldout' is null"):
        S.read_rows(root / "results" / "A.jsonl", spec)


def test_a_torn_last_line_is_reported_and_the_runner_says_it_cuts_it_off(tmp_path, capsys):
    """A last line without its newline (a kill mid-write) is left out with one note naming
    file:line (the tables are those of the complete rows: --check passes), and the runner's next
    append says that it cut it off."""
    root, lines = copy_of_a(tmp_path)
    results = root / "results" / "A.jsonl"
    results.write_text("".join(lines) + lines[5][:40])
    assert A.main(["--all", "--check", "--results", str(root / "results"), "--studies",
                   str(root / "studies"), "--results-md", str(root / "RESULTS.md")]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [f"note: {results}:{len(lines) + 1}: the last line is cut short (a "
                                "write stopped by a kill, or one in progress): left out; the "
                                "runner cuts it off before its next row (a run without its row is "
                                "run again)"], err
    study.append_row(results, json.loads(lines[5]) | {"seed": 33, "cell": "urkl-clip-lag8"})
    err = capsys.readouterr().err
    assert err.startswith(f"small_scale.study: {results}:{len(lines) + 1}: cut off a torn last "
                          "line (40 bytes, a write stopped by a kill)"), err
    assert results.read_text().count("\n") == len(lines) + 1


def test_the_word_inf_of_a_command_line_reads_back_as_the_word(tmp_path):
    """--clip EPS_LOW EPS_HIGH inf (no dual bound) in a row's argv: strict_json reads the string
    "inf" as a float, and the reader gives the command line's word back, so the row stays a
    command (its argv a list of strings) and equals what the runner would write."""
    from paper_figs.study_rows import read_study_rows
    from rpg_ref import strict_json
    argv = ["python", "-m", "rpg_ref.cli", "--clip", "0.1", "0.14", "inf", "--seed", "0"]
    path = tmp_path / "r.jsonl"
    path.write_text(strict_json.dumps({"cell": "a", "seed": 0, "argv": argv}) + "\n")
    assert strict_json.loads(path.read_text())["argv"][6] == float("inf")  # what it works around
    assert read_study_rows(path)[0]["argv"] == argv
