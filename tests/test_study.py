"""small_scale/study/runner.py: study files are checked before anything runs, jobs run in the
pre-registered order with paired seeds, the results file survives a torn write, a killed study
resumes where it was, and two runners never run one (cell, seed) twice."""

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from study_runs import as_run  # tests/ is on sys.path under pytest

import small_scale.study.files as F
import small_scale.study.runner as S

ROOT = Path(__file__).resolve().parent.parent


def module(name: str, *args) -> list:
    """The command line of ``python -m small_scale.<name> ARGS``, run from the repository's root
    (the cwd of every call below)."""
    return [sys.executable, "-m", f"small_scale.{name}", *args]


def write_study(root: Path, name="toy", **over) -> Path:
    """A bandit study that trains in about a second per run."""
    spec = {
        "description": "test",
        "common": {"preset": "bandit", "ref": "init", "steps": 12, "group_size": 64,
                   "mini_batch_size": 64, "eval_every": 4, "save_every": 4},
        "seeds": 2,
        "cells": {"a": {"args": {"algo": "rpg-urkl"}},
                  "b": {"args": {"algo": "rpg-ufkl"}},
                  "c": {"role": "secondary", "seeds": 1, "args": {"algo": "grpo"}},
                  "r": {"role": "reference", "seeds": 1, "args": {"algo": "grpo", "steps": 1}}},
        "outcomes": {"p_best": {"key": "eval_p_best", "reduce": "last", "k": 2},
                     "reward": {"key": "reward", "reduce": "mean"}},
        "series": {"keys": ["reward"], "every": 4},
    }
    spec.update(over)
    (root / "studies").mkdir(parents=True, exist_ok=True)
    (root / "studies" / f"{name}.json").write_text(json.dumps(spec))
    return root


def cli(root: Path, study: str, *args) -> list:
    """The runner on a study in ``root`` (a folder outside git: --allow-uncommitted)."""
    return module("study", study, *args, "--studies", str(root / "studies"), "--results",
                  str(root / "results"), "--runs", str(root / "runs"), "--allow-uncommitted")


def run(root, *args, study="toy"):
    return subprocess.run(cli(root, study, *args), capture_output=True, text=True, timeout=600,
                          cwd=ROOT)


# ----------------------------------------------------------------------------------------------
# the study file and the job list
# ----------------------------------------------------------------------------------------------

def test_jobs_are_seed_major_primary_first_with_paired_seeds(tmp_path):
    write_study(tmp_path, seed_flags=["seed"])
    spec = S.load_study("toy", tmp_path / "studies")
    jobs = S.jobs_of(spec, tmp_path / "runs")
    assert [(j.cell, j.seed) for j in jobs] == [("a", 0), ("b", 0), ("r", 0), ("a", 1), ("b", 1),
                                                ("c", 0)]
    a1 = jobs[3].argv
    assert a1[a1.index("--seed") + 1] == "1" and a1[a1.index("--algo") + 1] == "rpg-urkl"
    assert a1[a1.index("--out") + 1] == str(tmp_path / "runs" / "toy" / "a" / "s1")
    # the study's flags first, verbatim, then the runner's
    assert a1[:2] == ["--preset", "bandit"] and a1[-3:] == ["--threads", "1", "--no-progress"]
    # seed_flags: every listed flag takes the seed index
    spec["seed_flags"] = ["seed", "init_seed"]
    argv = S.jobs_of(spec, tmp_path / "runs")[3].argv
    assert argv[argv.index("--init-seed") + 1] == "1" and argv[argv.index("--seed") + 1] == "1"


def test_seeds_the_exclusion_rule_drops_are_not_run_in_other_cells(tmp_path):
    """Once the reference cell's run of a seed is below the pre-registered ``exclude`` bar, that
    seed's jobs in every other cell are left out of --dry-run, --status and the run; a seed at or
    above the bar, or without its reference run yet, still runs."""
    cells = {"a": {"args": {"algo": "rpg-urkl"}}, "b": {"args": {"algo": "rpg-ufkl"}},
             "c": {"role": "secondary", "seeds": 1, "args": {"algo": "grpo"}},
             "r": {"role": "reference", "args": {"algo": "grpo", "steps": 1}}}
    write_study(tmp_path, seeds=3, cells=cells, analysis={
        "outcome": "p_best", "exclude": {"outcome": "p_best", "below": 0.5, "reference_cell": "r"}})
    spec = S.load_study("toy", tmp_path / "studies")
    jobs = S.jobs_of(spec, tmp_path / "runs")
    rows = [as_run(spec, {"cell": "r", "seed": s, "outcomes": {"p_best": v, "reward": 0.5},
                          "resumed_from_step": 0, "cpu_s": 1.0, "wall_s": 1.0})
            for s, v in [(0, 0.1), (1, 0.5)]]   # seed 2: not measured yet
    assert S.skipped_keys(spec, jobs, rows) == {("a", 0), ("b", 0), ("c", 0)}
    results = tmp_path / "results" / "toy.jsonl"
    results.parent.mkdir(parents=True)
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dry = run(tmp_path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "not run: 3 jobs of the seeds the warm-start rule excludes [0]" in dry.stdout
    pending = [ln.split(":")[0] for ln in dry.stdout.splitlines() if ": python -m" in ln]
    assert pending == ["a s1", "b s1", "a s2", "b s2", "r s2"] and "5 of 7 runs" in dry.stdout
    st = run(tmp_path, "--status")
    assert "toy: 2/7 runs done" in st.stdout, st.stdout
    assert "not run: 3 jobs of the seeds the warm-start rule excludes [0]" in st.stdout


@pytest.mark.parametrize("over, message", [
    ({"cells": {"a": {"args": {"seed": 3}}}}, r"sets \['seed'\]"),
    ({"common": {"out": "x"}}, r"sets \['out'\]"),
    ({"cells": {"a": {"role": "main"}}}, "role must be one of"),
    ({"cells": {"a": {"seeds": 0}}}, "seeds must be an integer"),
    ({"cells": {"a": {"flags": {}}}}, "unknown keys"),
    ({"outcomes": {"x": {"key": "reward", "reduce": "median"}}}, "reduce in"),
    ({"extra": 1}, "unknown keys"),
    ({"seed_flags": ["rl_seed"]}, "seed_flags"),
])
def test_bad_study_files_are_refused(tmp_path, over, message):
    write_study(tmp_path, **over)
    with pytest.raises(S.StudyError, match=message):
        S.load_study("toy", tmp_path / "studies")


def test_bad_flags_refused_in_one_line_before_anything_runs(tmp_path):
    write_study(tmp_path, cells={"a": {"args": {"algo": "rpg-urkl", "no_such_flag": 3}}})
    r = run(tmp_path, "--workers", "2")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "cell 'a'" in r.stderr and "no-such-flag" in r.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs" / "toy").exists()
    r = run(tmp_path, study="nope")
    assert r.returncode == 2 and r.stderr.startswith("small_scale.study: no study 'nope'")
    assert r.stderr.count("\n") == 1


def test_calibrated_values_are_substituted():
    args = {"lr": {"calibrated": "lr", "times": 0.25}, "beta": {"calibrated": "beta"}, "x": 1}
    assert F.resolve_calibrated(args, {"lr": 4e-4, "beta": 0.1}) == {"lr": 1e-4, "beta": 0.1,
                                                                     "x": 1}
    with pytest.raises(S.StudyError, match="not chosen yet"):
        F.resolve_calibrated(args, None)
    with pytest.raises(S.StudyError, match="calibrated"):
        F.resolve_calibrated({"lr": {"value": 1}}, {})


def test_calibrated_items_of_a_list_flag_are_substituted():
    """--clip eps_low eps_high c with calibrated items: each dict item replaced, the rest kept;
    the study then needs its calibration."""
    args = {"clip": [{"calibrated": "eps"}, {"calibrated": "eps", "times": 1.4}, 3.0]}
    assert F.resolve_calibrated(args, {"eps": 0.1}) == {"clip": [0.1, 0.14, 3.0]}
    with pytest.raises(S.StudyError, match="--clip needs the calibration's 'eps'"):
        F.resolve_calibrated(args, {})
    assert F.needs_calibration({"common": args, "cells": {"a": {}}})
    assert not F.needs_calibration({"common": {"clip": [0.2, 0.28, 3.0]}, "cells": {"a": {}}})


def test_outcomes_and_series():
    rows = [{"step": t, "reward": float(t), **({"eval_acc": t / 10} if t % 2 == 0 else {})}
            for t in range(1, 8)]
    rules = {"last2": {"key": "eval_acc", "reduce": "last", "k": 2},   # steps 4, 6
             "mean": {"key": "reward", "reduce": "mean"}, "first": {"key": "eval_acc",
                                                                  "reduce": "first"},
             "max": {"key": "reward", "reduce": "max"}, "none": {"key": "nope", "reduce": "mean"}}
    assert S.outcomes(rows, rules) == {"last2": 0.5, "mean": 4.0, "first": 0.2, "max": 7.0,
                                       "none": None}
    kept = S.series(rows, ["reward"], 3)
    assert [r["step"] for r in kept] == [2, 3, 4, 6, 7]      # every 3rd, evals, the last
    assert kept[0] == {"step": 2, "reward": 2.0, "eval_acc": 0.2}


def test_drop_is_the_fall_from_the_first_evaluation_to_the_lowest():
    """drop = first - min: 0.6 - 0.3 after a rise and a fall; 0 for a run that only rises (its
    first value is its lowest)."""
    rule = {"drop": {"key": "e", "reduce": "drop"}}
    fell = [{"step": t, "e": v} for t, v in enumerate((0.6, 0.8, 0.3, 0.5))]
    assert S.outcomes(fell, rule)["drop"] == pytest.approx(0.3, abs=1e-15)
    assert S.outcomes([{"e": v} for v in (0.2, 0.4, 0.9)], rule) == {"drop": 0.0}


# ----------------------------------------------------------------------------------------------
# the results file
# ----------------------------------------------------------------------------------------------

def test_torn_last_line_is_dropped_and_cut_before_the_next_row(tmp_path):
    p = tmp_path / "r.jsonl"
    S.append_row(p, {"cell": "a", "seed": 0, "x": 1})
    with open(p, "ab") as f:
        f.write(b'{"cell": "a", "seed": 1, "x"')               # a kill mid-write
    assert [r["seed"] for r in S.read_rows(p)] == [0]
    S.append_row(p, {"cell": "a", "seed": 1, "x": 2})
    assert p.read_text().count("\n") == 2
    assert [(r["seed"], r["x"]) for r in S.read_rows(p)] == [(0, 1), (1, 2)]
    p.write_text('{"cell": "a", "seed": 0}\nnot json\n{"cell": "a", "seed": 1}\n')
    with pytest.raises(S.StudyError, match=r"r\.jsonl:2: not a JSON object"):
        S.read_rows(p)
    assert S.read_rows(tmp_path / "none.jsonl") == []


# ----------------------------------------------------------------------------------------------
# running
# ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_study_runs_every_job_once_and_records_what_ran(tmp_path):
    """Two workers run the 6 jobs; each row carries the exact argv, outcomes, series, commit and
    versions; a second invocation has nothing to do; --status and --dry-run agree."""
    write_study(tmp_path)
    r = run(tmp_path, "--dry-run")
    assert r.returncode == 0 and "6 of 6 runs pending" in r.stdout
    r = run(tmp_path, "--workers", "2")
    assert r.returncode == 0, r.stderr
    rows = S.read_rows(tmp_path / "results" / "toy.jsonl")
    assert sorted((x["cell"], x["seed"]) for x in rows) == [("a", 0), ("a", 1), ("b", 0),
                                                            ("b", 1), ("c", 0), ("r", 0)]
    row = next(x for x in rows if x["cell"] == "b" and x["seed"] == 1)
    assert row["argv"][:3] == ["python", "-m", "rpg_ref.cli"]
    assert row["argv"][row["argv"].index("--algo") + 1] == "rpg-ufkl"
    assert row["argv"][row["argv"].index("--seed") + 1] == "1"
    metrics = [json.loads(x) for x in
               (tmp_path / "runs" / "toy" / "b" / "s1" / "metrics.jsonl").read_text().splitlines()]
    evals = [m["eval_p_best"] for m in metrics if "eval_p_best" in m]
    assert row["outcomes"]["p_best"] == pytest.approx((evals[-1] + evals[-2]) / 2, abs=1e-12)
    assert [s["step"] for s in row["series"]] == [4, 8, 12]
    assert row["summary"]["tv_distance"] is not None and "config" not in row["summary"]
    assert len(row["commit"]) == 40 and isinstance(row["dirty"], bool)
    assert row["torch"] and row["cpu"] and row["cpu_s"] > 0 and row["resumed_from_step"] == 0
    assert row["study_sha256"] == S.load_study("toy", tmp_path / "studies")["sha256"]
    again = run(tmp_path)
    assert again.returncode == 0 and "0 pending" in again.stdout
    st = run(tmp_path, "--status")
    assert "toy: 6/6 runs done; about 0.00 CPU-h left" in st.stdout



def runner_at_its_first_checkpoint(tmp_path) -> tuple:
    """Studies "plain" (run to its end here) and "kill" (its runner started, returned once its
    one run has a checkpoint): a 300-step bandit run each, checkpoints every 5 steps. Returns
    the runner's process and a deadline 240 s ahead."""
    common = {"preset": "bandit", "ref": "init", "steps": 300, "group_size": 256,
              "mini_batch_size": 128, "eval_every": 25, "save_every": 5}
    cells = {"a": {"args": {"algo": "rpg-urkl"}}}
    for name in ("kill", "plain"):
        write_study(tmp_path, name, common=common, seeds=1, cells=cells)
    plain = run(tmp_path, study="plain")
    assert plain.returncode == 0, plain.stderr
    p = subprocess.Popen(cli(tmp_path, "kill"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT)
    latest = tmp_path / "runs" / "kill" / "a" / "s0" / "checkpoints" / "LATEST"
    deadline = time.time() + 240
    while not latest.exists() and time.time() < deadline:
        time.sleep(0.2)
    return p, deadline


@pytest.mark.slow
def test_killed_study_resumes_and_matches_an_uninterrupted_run(tmp_path):
    """SIGTERM to the runner mid-run: the run stops at a step boundary with a checkpoint, the
    runner exits without a row; the same command resumes it (--resume) and its outcomes equal
    those of the same job run without interruption."""
    p, _ = runner_at_its_first_checkpoint(tmp_path)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "run the same command to continue" in err
    assert S.read_rows(tmp_path / "results" / "kill.jsonl") == []
    r = run(tmp_path, study="kill")
    assert r.returncode == 0, r.stderr
    (row,) = S.read_rows(tmp_path / "results" / "kill.jsonl")
    (ref,) = S.read_rows(tmp_path / "results" / "plain.jsonl")
    assert row["resumed_from_step"] > 0
    assert row["outcomes"] == ref["outcomes"]
    assert row["summary"]["policy"] == ref["summary"]["policy"]
    commands = [x for x in (tmp_path / "runs" / "kill" / "a" / "s0.log").read_text().splitlines()
                if x.startswith("$ ")]
    assert len(commands) == 2 and commands[1].endswith("--resume " + str(
        tmp_path / "runs" / "kill" / "a" / "s0") + " --no-progress")


@pytest.mark.slow
def test_two_runners_never_run_a_job_twice(tmp_path):
    """Two runner processes on one study at once: every (cell, seed) is run by exactly one of
    them (one command line per job in its log, one row per job)."""
    write_study(tmp_path)
    ps = [subprocess.Popen(cli(tmp_path, "toy"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, cwd=ROOT) for _ in range(2)]
    for p in ps:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    rows = S.read_rows(tmp_path / "results" / "toy.jsonl")
    assert len(rows) == 6 and len({(r["cell"], r["seed"]) for r in rows}) == 6
    for log in (tmp_path / "runs" / "toy").glob("*/s*.log"):
        assert log.read_text().count("$ ") == 1, log


@pytest.mark.slow
def test_a_claimed_job_is_left_to_its_holder(tmp_path):
    """While another process holds a job's lock, the runner runs everything else and leaves that
    job pending."""
    write_study(tmp_path, seeds=1, cells={"a": {"args": {"algo": "rpg-urkl"}},
                                          "b": {"args": {"algo": "rpg-ufkl"}}})
    lock = tmp_path / "runs" / "toy" / "a" / "s0.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert [(x["cell"], x["seed"]) for x in S.read_rows(tmp_path / "results" / "toy.jsonl")] == [
        ("b", 0)]
    assert "1 of 2 runs pending" in run(tmp_path, "--dry-run").stdout


@pytest.mark.slow
def test_a_run_folder_of_other_flags_is_refused(tmp_path):
    """A run folder left by an earlier version of the study (other flags) is not resumed as if it
    were this job's."""
    write_study(tmp_path, seeds=1, cells={"a": {"args": {"algo": "rpg-urkl"}}})
    folder = tmp_path / "runs" / "toy" / "a" / "s0"
    spec = S.load_study("toy", tmp_path / "studies")
    argv = S.jobs_of(spec, tmp_path / "runs")[0].argv
    argv[argv.index("--steps") + 1] = "20"
    from rpg_ref.cli import main as train_main
    assert train_main(argv) == 0
    r = run(tmp_path)
    assert r.returncode == 1 and "other values of ['steps']" in r.stderr, r.stderr
    assert os.path.exists(folder / "summary.json")


def test_rerun_replays_committed_rows_and_names_what_differs(tmp_path):
    """python -m small_scale.study.rerun runs a committed row's own command again: identical
    outcomes on this machine (exit 0); a committed value edited by hand is named with both values
    (exit 1); a row that is not committed is one line (exit 2)."""
    write_study(tmp_path, seeds=1, cells={"a": {"args": {"algo": "rpg-urkl"}}})
    assert run(tmp_path).returncode == 0
    rerun = [*module("study.rerun"), "toy", "--studies",
             str(tmp_path / "studies"), "--results", str(tmp_path / "results")]
    r = subprocess.run([*rerun, "--runs", "1"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0 and "a s0: identical" in r.stdout, r.stdout + r.stderr
    path = tmp_path / "results" / "toy.jsonl"
    row = json.loads(path.read_text())
    row["outcomes"]["reward"] += 0.5
    path.write_text(json.dumps(row) + "\n")
    r = subprocess.run([*rerun, "--pick", "a:0"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 1 and f"reward {row['outcomes']['reward']} -> " in r.stdout, r.stdout
    r = subprocess.run([*rerun, "--pick", "a:7"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 2 and r.stderr.startswith(
        "small_scale.study.rerun: no committed rows ['a:7']")


def test_committed_study_files_are_consistent(tmp_path):
    """Every committed study file loads; its analysis names only its own cells and outcomes;
    primary contrasts rest on >= 20 paired seeds; each calibration's candidates exist; the values
    a study reads are choices of the calibration it names; the bandit study's flags pass
    rpg-train's own parser (the seq and carry studies use --init-seed, checked by study.py before
    a run)."""
    import small_scale.study.analysis as A
    names = sorted(p.stem for p in S.STUDIES.glob("*.json"))
    assert names == ["A", "B", "C", "D", "D-calibration", "ablation", "bandit", "calibration",
                     "carry-calibration", "seq", "smollm2-calibration"]
    cals = {}
    for name in names:
        spec = S.load_study(name)
        cells, outcomes, an = spec["cells"], spec["outcomes"], spec.get("analysis", {})
        assert an.get("outcome") in outcomes, name
        for fam in ("primary", "secondary", "collapse_contrasts"):
            for c in an.get(fam, []):
                assert set(A.weights(c)) <= set(cells), (name, c)
                assert c.get("outcome", an["outcome"]) in outcomes, (name, c)
                assert c["sides"] in A.SIDES, (name, c)
                if fam == "primary":
                    assert all(cells[x]["seeds"] >= 20 for x in A.weights(c)), (name, c)
            names_ = [c["name"] for c in an.get(fam, [])]
            assert len(names_) == len(set(names_)), (name, fam)
        by_name = {c["name"] for c in an.get("primary", []) + an.get("secondary", [])}
        for fig in an.get("figures", []):
            for line in fig["lines"].values():
                assert set(line) <= by_name and len(line) == len(fig["levels"]), (name, fig)
        if "collapse" in an:
            assert an["collapse"]["reference_cell"] in cells
        used = {x["calibrated"] for a in [spec["common"]] + [c.get("args", {})
                                                              for c in cells.values()]
                for v in a.values() for x in (v if isinstance(v, list) else [v])
                if isinstance(x, dict)}
        if used:
            cal = cals.setdefault(spec["calibration"], S.load_study(spec["calibration"]))
            chosen = {n for key in cal["analysis"]["select"] for n in key.split(",")}
            assert used <= chosen, name
            jobs = S.jobs_of(spec, tmp_path, dict.fromkeys(chosen, 0.25))
            assert all("{" not in " ".join(j.argv) for j in jobs)
            # a calibration runs on seeds of its own when it chooses for a study on seeds 0..
            if spec["calibration"] != "calibration":
                assert not set(S.planned_seeds(cal, next(iter(cal["cells"])))) & {
                    s for c in cells for s in S.planned_seeds(spec, c)}, name
        for group in spec.get("groups", {}).values():
            assert set(group) <= set(cells)
    for cal in cals.values():
        for rule in cal["analysis"]["select"].values():
            for c in rule["candidates"].values():
                members = ([c] if isinstance(c, str) else [c["cell"], c["base"]] if "cell" in c
                           else [*([c["on"]] if isinstance(c["on"], str) else c["on"]),
                                 *c["off"]])
                assert set(members) <= set(cal["cells"])
    S.validate(S.jobs_of(S.load_study("bandit"), tmp_path), tmp_path)


BLOCK = '''import sys
class Absent:  # the quick start's install: no study extra
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in ("scipy", "matplotlib"):
            raise ModuleNotFoundError(f"No module named {top!r}", name=top)
sys.meta_path.insert(0, Absent())
'''


def test_without_the_study_extra_the_runner_works_and_the_analysis_says_what_to_install(tmp_path):
    """scipy and matplotlib hidden (a sitecustomize): study.py --status and --dry-run of the
    committed study A work; analysis.py ends in one line naming the extra to install, exit 2."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    for flag in ("--status", "--dry-run"):
        r = subprocess.run(module("study", "A", flag), env=env, capture_output=True, text=True,
                           timeout=300, cwd=ROOT)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        done = r"^A: \d+/\d+ runs done|^\d+ of \d+ runs pending$"
        assert re.search(done, r.stdout, re.M), r.stdout
    r = subprocess.run(module("study.analysis", "--all", "--check"), env=env,
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr == ("small_scale.study.analysis: matplotlib is not installed: pip install -e "
                        "'.[study]' (the study extra: scipy, matplotlib)\n"), r.stderr


@pytest.mark.slow
def test_a_run_outliving_a_killed_runner_keeps_its_claim_and_resumes(tmp_path):
    """SIGKILL to the runner mid-run: its job (a fork of the runner's worker) runs on to its end
    and holds the job's lock meanwhile (another runner leaves it alone); the next invocation
    records it (through --resume), with the outcomes of an uninterrupted run."""
    p, deadline = runner_at_its_first_checkpoint(tmp_path)
    folder = tmp_path / "runs" / "kill" / "a" / "s0"
    p.kill()
    p.communicate(timeout=60)
    with open(tmp_path / "runs" / "kill" / "a" / "s0.lock", "a") as f:
        with pytest.raises(BlockingIOError):    # the orphaned run holds the job's claim
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        while time.time() < deadline:           # ... until it has ended
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.2)
        fcntl.flock(f, fcntl.LOCK_UN)
    assert (folder / "summary.json").exists()
    assert S.read_rows(tmp_path / "results" / "kill.jsonl") == []
    r = run(tmp_path, study="kill")
    assert r.returncode == 0, r.stderr
    (row,) = S.read_rows(tmp_path / "results" / "kill.jsonl")
    (ref,) = S.read_rows(tmp_path / "results" / "plain.jsonl")
    assert row["resumed_from_step"] == 300
    assert row["outcomes"] == ref["outcomes"]
    assert row["summary"]["policy"] == ref["summary"]["policy"]
