"""A study counts only the rows of its own file: a row run with other arguments than the study
file gives its cell and seed, or under another version of the file, is refused in one line (exit
2) by the runner (--dry-run, --status, a run) and the analysis (one study, --all, --all --check),
naming the file, what differs and how to fix it; RESULTS.md is untouched. --all --check fails on
a generated block that its rows no longer give. The runner starts no study whose study file or
comparison rules are not committed."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("scipy", reason="the study analysis needs scipy (pip install -e '.[study]')")

from study_runs import as_run  # tests/ is on sys.path under pytest

import small_scale.study.analysis as A
import small_scale.study.files as S
import small_scale.study.runner as R


def copy_of(tmp_path: Path, names: tuple) -> tuple[Path, Path]:
    """tmp/studies, tmp/results: copies of the committed studies ``names`` and their rows, and
    tmp/RESULTS.md with their generated blocks."""
    for sub in ("studies", "results"):
        (tmp_path / sub).mkdir()
    text, blocks = A.RESULTS_MD.read_text(), []
    for name in names:
        shutil.copy(S.STUDIES / f"{name}.json", tmp_path / "studies")
        shutil.copy(S.RESULTS / f"{name}.jsonl", tmp_path / "results")
        if A.begin(name) in text:
            blocks.append(text[text.index(A.begin(name)):text.index(A.end(name))
                               + len(A.end(name))])
    (tmp_path / "RESULTS.md").write_text("\n\n".join(blocks) + "\n")
    return tmp_path, tmp_path / "RESULTS.md"


def refusals(root: Path, capsys, study: str) -> list[tuple[str, int, str]]:
    """(command, exit code, stderr) of each reader of ``study`` in ``root``."""
    common = ["--results", str(root / "results"), "--studies", str(root / "studies")]
    calls = {"analysis STUDY": lambda: A.main([study, *common]),
             "analysis --all": lambda: A.main(["--all", *common, "--out", str(root / "out"),
                                                "--results-md", str(root / "RESULTS.md")]),
             "analysis --all --check": lambda: A.main(["--all", "--check", *common,
                                                        "--results-md", str(root / "RESULTS.md")]),
             "runner --dry-run": lambda: R.main([study, "--dry-run", *common, "--runs",
                                                 str(root / "runs")]),
             "runner --status": lambda: R.main([study, "--status", *common, "--runs",
                                                str(root / "runs")]),
             "runner": lambda: R.main([study, "--nice", "0", *common, "--runs",
                                       str(root / "runs"), "--allow-uncommitted"])}
    out = []
    for name, call in calls.items():
        code = call()
        got = capsys.readouterr()
        assert got.out == "", (name, got.out)
        out.append((name, code, got.err))
    return out


def assert_refused_everywhere(root, md, capsys, study, *words):
    before = md.read_bytes()
    for name, code, err in refusals(root, capsys, study):
        assert code == 2 and err.count("\n") == 1, (name, code, err)
        assert all(w in err for w in words), (name, err)
        assert "rerun its rows" in err and "new study file" in err, (name, err)
    assert md.read_bytes() == before and not (root / "out").exists()
    assert not (root / "runs").exists()


def test_the_committed_rows_are_their_study_files_own():
    """Every committed row was run with the arguments its study file gives it now, under the
    file's version or one the file declares (A and B: seed counts raised by their pre-registered
    rule before those seeds ran)."""
    for path in sorted(S.STUDIES.glob("*.json")):
        spec = S.load_study(path.stem)
        rows = S.read_rows(S.results_path(path.stem), spec)
        S.check_provenance(S.results_path(path.stem), spec, rows)
        assert all(v.strip() for v in spec["earlier_versions"].values())


def test_a_row_run_with_another_lr_is_refused_everywhere(tmp_path, capsys):
    """Line 3 of C's rows gets another --lr in its argv: each reader refuses it, naming
    file:line, the flag with both values, and the fix."""
    root, md = copy_of(tmp_path, ("C", "carry-calibration"))
    path = root / "results" / "C.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[2])
    i = row["argv"].index("--lr")
    was, row["argv"][i + 1] = row["argv"][i + 1], "0.123"
    lines[2] = json.dumps(row) + "\n"
    path.write_text("".join(lines))
    assert_refused_everywhere(root, md, capsys, "C", f"C.jsonl:3: {row['cell']} s{row['seed']}",
                              f"ran --lr 0.123 where the study file says --lr {was}")


def test_a_row_of_another_study_file_version_is_refused_everywhere(tmp_path, capsys):
    """A row whose study_sha256 is not the study file's (nor a version it declares) is refused."""
    root, md = copy_of(tmp_path, ("C", "carry-calibration"))
    path = root / "results" / "C.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[4])
    row["study_sha256"] = "0" * 64
    lines[4] = json.dumps(row) + "\n"
    path.write_text("".join(lines))
    assert_refused_everywhere(root, md, capsys, "C", "C.jsonl:5:",
                              "was run under another version of", "sha256 000000000000")


def test_a_study_file_changed_after_its_rows_is_refused_everywhere(tmp_path, capsys):
    """A cell's lr changed in the study file after its rows landed: refused at line 1 (the rows
    were made under another version of the file) until the rows are rerun or the change is a
    new study."""
    root, md = copy_of(tmp_path, ("C", "carry-calibration"))
    spec_path = root / "studies" / "C.json"
    spec = json.loads(spec_path.read_text())
    cell = next(iter(spec["cells"]))
    spec["cells"][cell].setdefault("args", {})["lr"] = 0.5
    spec_path.write_text(json.dumps(spec, indent=1))
    assert_refused_everywhere(root, md, capsys, "C", "C.jsonl:1:",
                              "was run under another version of", "C.json")


def git(repo: Path, *args) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


def toy(root: Path, lr: float = 0.01) -> Path:
    path = root / "studies" / "toy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"common": {"preset": "bandit", "steps": 2, "lr": lr}, "seeds": 1,
                                "cells": {"a": {"args": {"algo": "grpo"}}},
                                "outcomes": {"r": {"key": "reward", "reduce": "last"}}}))
    return path


def test_a_changed_study_file_is_named_with_what_changed_and_a_declared_version_counts(tmp_path):
    """In git, the refusal names the keys that changed since the rows' version; the same file
    listing that version in earlier_versions (with its reason) counts them again, as long as the
    rows' arguments are still the file's."""
    git(tmp_path, "init", "-q")
    path = toy(tmp_path)
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "toy")
    old = S.load_study("toy", tmp_path / "studies")
    row = as_run(old, {"cell": "a", "seed": 0})
    spec = json.loads(path.read_text())
    spec["description"] = "the toy, described"
    path.write_text(json.dumps(spec))
    new = S.load_study("toy", tmp_path / "studies")
    with pytest.raises(S.StudyError, match=r"toy\.jsonl:1: a s0 was run under another version of "
                                           r".*toy\.json .*changed since: description\)"):
        S.check_provenance(tmp_path / "toy.jsonl", new, [row])
    spec["earlier_versions"] = {old["sha256"]: "only the description differs"}
    path.write_text(json.dumps(spec))
    S.check_provenance(tmp_path / "toy.jsonl", S.load_study("toy", tmp_path / "studies"), [row])
    spec["common"]["lr"] = 0.02   # the declared version's rows no longer have the file's lr
    path.write_text(json.dumps(spec))
    with pytest.raises(S.StudyError, match=re.escape("ran --lr 0.01 where the study file says "
                                                     "--lr 0.02")):
        S.check_provenance(tmp_path / "toy.jsonl", S.load_study("toy", tmp_path / "studies"),
                           [row])


def test_check_fails_on_each_block_its_rows_no_longer_give(tmp_path, capsys):
    """C's rows emptied: --all --check names C's block and the testbeds block (one line each,
    exit 1); --all refuses to write (exit 2); RESULTS.md is untouched by both. A row of C removed:
    its block differs (exit 1)."""
    root = tmp_path
    for sub in ("studies", "results"):
        shutil.copytree(getattr(S, sub.upper()), root / sub)
    md = root / "RESULTS.md"
    shutil.copy(A.RESULTS_MD, md)
    common = ["--results", str(root / "results"), "--studies", str(root / "studies"),
              "--results-md", str(md), "--out", str(root / "out")]
    assert A.main(["--all", "--check", *common]) == 0
    capsys.readouterr()
    rows = (root / "results" / "C.jsonl").read_text()
    (root / "results" / "C.jsonl").write_text("")
    before = md.read_bytes()
    assert A.main(["--all", "--check", *common]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[2].split(" stands")[0] for line in err] == ["block testbeds",
                                                                          "block C"], err
    assert all("restore the rows" in line for line in err), err
    assert A.main(["--all", *common]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 2
    assert md.read_bytes() == before and not (root / "out").exists()
    (root / "results" / "C.jsonl").write_text(rows.split("\n", 1)[1])
    assert A.main(["--all", "--check", *common]) == 1
    err = capsys.readouterr().err.splitlines()
    assert any("block C is not what its rows give" in line for line in err), err
    assert md.read_bytes() == before


def test_the_runner_starts_no_study_whose_rules_are_not_committed(tmp_path, tmp_path_factory,
                                                                 capsys):
    """Untracked, then modified, study file (and a testbeds file naming the study): one line,
    exit 2, nothing run; outside git: the same, unless --allow-uncommitted (which tests use)."""
    git(tmp_path, "init", "-q")
    toy(tmp_path)
    args = ["toy", "--studies", str(tmp_path / "studies"), "--results", str(tmp_path / "results"),
            "--runs", str(tmp_path / "runs"), "--nice", "0"]
    assert R.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "toy.json is untracked: commit the study file" in err, err
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "toy")
    toy(tmp_path, lr=0.02)
    assert R.main(args) == 2
    assert "toy.json has changes that are not committed: commit" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
    assert R.main([*args, "--dry-run"]) == 0   # a look at the plan is not a run
    capsys.readouterr()
    git(tmp_path, "commit", "-qam", "toy at lr 0.02")
    spec = S.load_study("toy", tmp_path / "studies")
    assert S.uncommitted(S.rules_of(spec, tmp_path / "testbeds.json")) is None
    (tmp_path / "testbeds.json").write_text(json.dumps({"rows": [{"x": {"study": "toy"}}]}))
    assert S.rules_of(spec, tmp_path / "testbeds.json")[1] == tmp_path / "testbeds.json"
    assert S.uncommitted(S.rules_of(spec, tmp_path / "testbeds.json")).endswith(
        "testbeds.json is untracked")
    outside = tmp_path_factory.mktemp("outside")   # no git repository around it
    toy(outside)
    assert R.main(["toy", "--studies", str(outside / "studies"), "--runs", str(outside / "runs"),
                   "--results", str(outside / "results")]) == 2
    assert "toy.json is not in a git repository: commit" in capsys.readouterr().err


def test_the_runner_writes_the_command_the_committed_rows_hold():
    """For every committed row, the runner's command for its job is the row's argv, flag for flag
    and folder for folder: a study that was running when the runner moved resumes from its rows
    and its run folders."""
    for path in sorted(S.STUDIES.glob("*.json")):
        spec = S.load_study(path.stem)
        rows = S.read_rows(S.results_path(path.stem), spec)
        if not rows:    # a study not started yet (its calibration may still be landing)
            continue
        calibrated = (S.calibrated_values(study=spec["calibration"])
                      if S.needs_calibration(spec) else None)
        jobs = {(j.cell, j.seed): j for j in R.jobs_of(spec, R.RUNS, calibrated)}
        for row in rows:
            assert row["argv"] == [*S.COMMAND, *jobs[row["cell"], row["seed"]].argv], row
