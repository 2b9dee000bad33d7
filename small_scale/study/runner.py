"""Run a pre-registered study: every (cell, seed) of small_scale/studies/<study>.json as one
rpg-train command, resumable, in parallel, one results row per finished run.

    python -m small_scale.study calibration --dry-run     # what would run, in order
    python -m small_scale.study calibration --workers 2   # run (or continue) it
    python -m small_scale.study calibration --status      # done/total per cell, CPU time left
    python -m small_scale.study.analysis calibration      # verdicts, tables, figures

A study file holds rpg-train flags (``common``, and per cell ``args``; JSON keys are flags:
"eval_every": 5 is ``--eval-every 5``, a list is several values, true/false is --x/--no-x),
``seeds`` (seed indices 0..N-1, per cell overridable), ``seed_flags`` (the flags that take the
seed index), the ``outcomes`` recorded per run, the ``series`` kept for figures, and the
pre-registered ``analysis`` (read by small_scale/study/analysis.py). A value {"calibrated": NAME,
"times": F} is the calibration study's choice NAME (analysis.calibrated_values) times F.

Pairing: seed index s of every cell runs with every flag of ``seed_flags`` set to s (the seq
studies: --seed s --init-seed s, so the same warm start and the same RL seed), so cells are
compared seed by seed. Jobs run seed-major across the reference and primary cells first (a
partial study is balanced), then seed-major across the secondary cells.
A seed the study's pre-registered ``exclude`` rule has dropped (its reference-cell run is
done) is not run in the other cells: its results would enter no test.

Each run is the command a user types: ``python -m rpg_ref.cli FLAGS --seed s ... --out
RUNS/<study>/<cell>/s<seed> --cache-dir RUNS/cache --threads 1 --no-progress`` (the runner's
interpreter; the runner sets those flags, a study may not), run as rpg-train's main in a fork of
a persistent worker process that imported torch and transformers once (worker.py: the same
outputs bit for bit, seconds less per run; a run's cpu_s is its own, without those imports), its
output in RUNS/<study>/<cell>/s<seed>.log. A run folder that already holds a run
continues with ``--resume`` (a killed run loses at most the steps since its last checkpoint).
A lock file beside each run folder (fcntl, released when its holder dies) keeps several runner
processes from running one (cell, seed) twice. A finished run appends one JSON line to
small_scale/results/<study>.jsonl (flushed and fsynced under a lock; a torn last line, left by a
kill mid-write, is left out and reported on the next read and cut off, with a word, before the
next write): cell, seed, the exact argv, the outcomes (from the run's full metrics.jsonl), the
series, the summary, commit (and whether the tree was dirty), torch / transformers versions, CPU
model, wall and CPU seconds. Every row read is checked against the study file first (a NaN, a
missing outcome, an unplanned cell or seed, a duplicate: one line naming file:line, exit 2;
paper_figs/study_rows.py holds the rule), and so is every row before it is written.

A row counts only as a run of today's study file: its ``study_sha256`` is the file's (or a version
the file lists in ``earlier_versions`` with the reason its rows still count) and its argv is what
the file gives its cell and seed (files.check_provenance). A study file changed after rows landed
is refused, here (--dry-run, --status, a run) and by the analysis, until its rows are rerun or
the change is declared as a new study. The runner starts no run while the study file, or the
comparison rules naming the study (study/testbeds.json), are untracked or hold changes that are
not committed: the rules are fixed before the first row (--allow-uncommitted: a trial, or a study
folder outside git, as the tests' are).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fcntl
import functools
import io
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from rpg_ref import strict_json
from small_scale.study.files import (
    COMMAND,
    RESULTS,
    ROOT,
    RUNNER_FLAGS,
    STUDIES,
    TESTBEDS,
    StudyError,
    calibrated_values,
    check_provenance,
    check_row,
    excluded_seeds,
    load_study,
    needs_calibration,
    planned_argv,
    planned_seeds,
    read_rows,
    results_path,
    rules_of,
    uncommitted,
)
from small_scale.study.worker import Worker

RUNS = ROOT / "runs" / "study"


# ----------------------------------------------------------------------------------------------
# the jobs
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Job:
    cell: str
    seed: int
    argv: list  # without the interpreter: what follows `python -m rpg_ref.cli`
    folder: Path


def run_folder(runs: Path, study: str, cell: str, seed: int) -> Path:
    return Path(runs) / study / cell / f"s{seed}"


def jobs_of(spec: dict, runs=RUNS, calibrated: dict | None = None,
            cells: list | None = None) -> list[Job]:
    """Every (cell, seed) in run order: seed-major over the reference and primary cells (a
    partial study is balanced and has its warm-start measures), then seed-major over the
    secondary cells."""
    names = list(spec["cells"]) if cells is None else cells
    bad = [c for c in names if c not in spec["cells"]]
    if bad:
        raise StudyError(f"study {spec['name']}: no cells {bad}; cells: {list(spec['cells'])}")
    out = []
    for roles in (("reference", "primary"), ("secondary",)):
        group = [c for c in names if spec["cells"][c]["role"] in roles]
        seeds = sorted({s for c in group for s in planned_seeds(spec, c)})
        for s in seeds:
            for c in group:
                if s not in planned_seeds(spec, c):
                    continue
                folder = run_folder(runs, spec["name"], c, s)
                argv = [*planned_argv(spec, c, s, calibrated), "--out", rel(folder),
                        "--cache-dir", rel(Path(runs) / "cache"), *RUNNER_FLAGS]
                out.append(Job(c, s, argv, folder))
    return out


def rel(p: Path) -> str:
    """A path relative to the repository when it is inside it (the rows are committed)."""
    p = Path(p).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def validate(jobs: list[Job], runs: Path) -> None:
    """rpg-train's own parser on every job's flags (an --out that does not exist), before any
    run starts: a bad flag is one line naming the cell."""
    from rpg_ref.cli import parse_config
    seen = set()
    for j in jobs:
        if j.cell in seen:   # seeds change no flag's validity; one parse per cell
            continue
        seen.add(j.cell)
        probe = list(j.argv)
        probe[probe.index("--out") + 1] = str(Path(runs) / ".validate-only" / j.cell)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parse_config(probe)
        except (ValueError, SystemExit) as e:
            msg = (err.getvalue().strip().splitlines() or [str(e)])[-1] if isinstance(
                e, SystemExit) else str(e).splitlines()[0]
            raise StudyError(f"cell {j.cell!r}: rpg-train refuses its flags: {msg}") from None


# ----------------------------------------------------------------------------------------------
# the results file
# ----------------------------------------------------------------------------------------------

def done_keys(rows: list[dict]) -> set:
    return {(r["cell"], r["seed"]) for r in rows}


def skipped_keys(spec: dict, jobs: list[Job], rows: list[dict]) -> set:
    """(cell, seed) of the jobs not worth running: seeds the pre-registered ``exclude`` rule has
    already dropped (their reference run is in ``rows``), in every cell but the reference one.
    Their results would enter no table or test; the rule itself is analysis.excluded_seeds."""
    rule = spec.get("analysis", {}).get("exclude")
    if not rule:
        return set()
    dropped = set(excluded_seeds(rows, rule))
    return {(j.cell, j.seed) for j in jobs
            if j.seed in dropped and j.cell != rule["reference_cell"]}


def append_row(path: Path, row: dict) -> None:
    """One complete line, under an exclusive lock on the file; a torn tail (a kill mid-write) is
    cut off first, and said; flushed and fsynced before the lock is released."""
    line = (strict_json.dumps(row, separators=(",", ":")) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(0)
                data = f.read()
                if not data.endswith(b"\n"):
                    keep, lines = data.rfind(b"\n") + 1, data.count(b"\n")
                    f.truncate(keep)
                    print(f"small_scale.study: {rel(path)}:{lines + 1}: cut off a torn last "
                          f"line ({size - keep} bytes, a write stopped by a kill); a run "
                          f"without its row is run again", file=sys.stderr, flush=True)
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------
# one run
# ----------------------------------------------------------------------------------------------

def outcomes(metrics: list[dict], rules: dict) -> dict:
    """{name: value} of each pre-registered outcome, from a run's full metrics rows: the values
    of ``key`` at the steps that logged it, reduced by last (mean of the last k), mean, first,
    max, min, or drop (the first value minus the smallest: how far the run fell below where its
    first evaluation stood, >= 0). None when the run never logged the key."""
    out = {}
    for name, rule in rules.items():
        vals = [r[rule["key"]] for r in metrics if r.get(rule["key"]) is not None]
        if not vals:
            out[name] = None
            continue
        red = rule["reduce"]
        if red == "last":
            k = rule.get("k", 1)
            out[name] = sum(vals[-k:]) / len(vals[-k:])
        elif red == "mean":
            out[name] = sum(vals) / len(vals)
        else:
            out[name] = {"first": vals[0], "max": max(vals), "min": min(vals),
                         "drop": vals[0] - min(vals)}[red]
    return out


def _round(v):
    return float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v


def series(metrics: list[dict], keys: list, every: int) -> list[dict]:
    """The rows kept for figures: every ``every``-th step, the last step and every evaluation
    step; ``keys`` only (and the eval_* keys), floats to 6 significant digits."""
    last = metrics[-1]["step"] if metrics else 0
    out = []
    for r in metrics:
        ev = any(k.startswith("eval_") for k in r)
        if r["step"] % every == 0 or r["step"] == last or ev:
            out.append({k: _round(v) for k, v in r.items()
                        if k == "step" or k in keys or k.startswith("eval_")})
    return out


def environment() -> dict:
    """The commit and whether tracked files outside small_scale/results differ from it (the
    results files grow during a study; the code must not), versions and CPU."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
    head = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                f":!{RESULTS.relative_to(ROOT)}").stdout.strip()
    return {"commit": head.stdout.strip() if head.returncode == 0 else None,
            "dirty": bool(dirty), **_versions()}


_VERSIONS = {}


def _versions() -> dict:
    """torch / transformers / python versions and the CPU model, once per process."""
    if not _VERSIONS:
        from importlib.metadata import PackageNotFoundError, version

        def ver(pkg):
            try:
                return version(pkg)
            except PackageNotFoundError:
                return None
        cpu = platform.processor() or platform.machine()
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        _VERSIONS.update(torch=ver("torch"), transformers=ver("transformers"),
                         python=platform.python_version(), cpu=cpu, cpu_count=os.cpu_count())
    return _VERSIONS


class Stopping(Exception):
    """The runner was asked to stop (SIGINT/SIGTERM): the run was left resumable."""


def run_job(job: Job, spec: dict, worker: Worker, claim_fd: int, on_pid) -> dict:
    """Train (or resume) one job in a fork of ``worker`` (rpg-train's main, as ``python -m
    rpg_ref.cli`` runs it; ``on_pid(pid)`` once it runs); returns its results row. Raises Stopping
    when the run was interrupted, RuntimeError when it failed."""
    cfg_file = job.folder / "config.json"
    resumed_from = 0
    if cfg_file.is_file():
        from rpg_ref.trainer.checkpoint import latest_step
        check_same_run(job)
        resumed_from = latest_step(job.folder)
        argv = ["--resume", rel(job.folder), "--no-progress"]
    else:
        argv = job.argv
    env = environment()   # the code the run imports: the tree as it is when the run starts
    log = job.folder.parent / f"s{job.seed}.log"
    with open(log, "ab") as out:   # the command the job is the same as
        out.write(f"$ {shlex.join([sys.executable, '-m', 'rpg_ref.cli', *argv])}\n".encode())
    t0 = time.perf_counter()
    code, cpu = worker.run(argv, log, claim_fd, on_pid)
    wall = time.perf_counter() - t0
    if code in (130, 143, -2, -15):
        raise Stopping(f"{job.cell} s{job.seed}: interrupted; it resumes on the next invocation")
    if code != 0:
        tail = log.read_text().splitlines()[-5:]
        raise RuntimeError(f"{job.cell} s{job.seed}: rpg-train exited {code}: " + " | ".join(tail))
    metrics = [strict_json.loads(x) for x in
               (job.folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    summary = strict_json.loads((job.folder / "summary.json").read_text())
    summary = {k: v for k, v in summary.items() if k not in ("config", "final")}
    return {
        "study": spec["name"], "cell": job.cell, "seed": job.seed,
        "argv": [*COMMAND, *job.argv],
        "resumed_from_step": resumed_from,
        "outcomes": outcomes(metrics, spec["outcomes"]),
        "series": series(metrics, spec["series"].get("keys", []), spec["series"].get("every", 1)),
        "summary": summary,
        "study_sha256": spec["sha256"],
        **env,
        "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def check_same_run(job: Job) -> None:
    """A run folder continued by --resume must hold this job's configuration."""
    from rpg_ref.cli import parse_config
    stored = strict_json.loads((job.folder / "config.json").read_text())
    probe = list(job.argv)
    probe[probe.index("--out") + 1] = str(job.folder.parent / ".validate-only")
    want = dataclasses.asdict(parse_config(probe))
    diff = sorted(k for k, v in want.items()
                  if k not in ("out", "resume", "progress", "tensorboard") and stored.get(k) != v)
    if diff:
        raise StudyError(f"{job.folder} holds a run with other values of {diff} than the study "
                         f"file's; delete the folder to rerun it")


@contextlib.contextmanager
def claimed(job: Job):
    """An exclusive lock on RUNS/<study>/<cell>/s<seed>.lock: its file descriptor, or None if
    another process holds it. The OS releases it when every holder (the runner, the rpg-train it
    started) has died, so a killed runner leaves no stale claim."""
    job.folder.parent.mkdir(parents=True, exist_ok=True)
    with open(job.folder.parent / f"s{job.seed}.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield f.fileno()   # closing the file (and the run's copy of it) releases the lock


# ----------------------------------------------------------------------------------------------
# the study
# ----------------------------------------------------------------------------------------------

def status_lines(spec: dict, jobs: list[Job], rows: list[dict]) -> list[str]:
    """Done/total per cell and the CPU time left, from the rows' measured cost (a cell without
    rows: its est_cpu_s from the study file, else the mean over the study's rows)."""
    done = done_keys(rows)
    cpu = {}
    for r in rows:
        if r["resumed_from_step"] == 0:   # a resumed run's cost misses its first attempt
            cpu.setdefault(r["cell"], []).append(r["cpu_s"])
    every = [x for v in cpu.values() for x in v]
    lines, left, unknown = [], 0.0, 0
    for c in dict.fromkeys(j.cell for j in jobs):
        mine = [j for j in jobs if j.cell == c]
        n_done = sum((c, j.seed) in done for j in mine)
        est = (sum(cpu[c]) / len(cpu[c]) if c in cpu else spec["cells"][c].get("est_cpu_s")
               or (sum(every) / len(every) if every else None))
        todo = len(mine) - n_done
        if est is None:
            unknown += todo
        else:
            left += todo * est
        est_txt = "?" if est is None else f"{est:.0f}"
        lines.append(f"{c:28s} {spec['cells'][c]['role']:9s} {n_done:3d}/{len(mine):<3d} "
                     f"cpu s/run {est_txt:>5s}")
    total = sum((j.cell, j.seed) in done for j in jobs)
    lines.append(f"{spec['name']}: {total}/{len(jobs)} runs done; about {left / 3600:.2f} CPU-h "
                 f"left" + (f" (+ {unknown} runs of unknown cost)" if unknown else ""))
    return lines


def run_study(spec: dict, jobs: list[Job], results: Path, workers: int,
              max_runs: int | None = None) -> int:
    """Run every pending job with ``workers`` threads, each driving one persistent worker process
    (small_scale/study/worker.py) that runs its jobs one at a time."""
    # signalled: reentrant, since a second signal can run on_signal inside the first one
    lock, signalled = threading.Lock(), threading.RLock()
    queue, running = list(jobs), set()   # running: the pids of the jobs now running
    state = {"stop": None, "ran": 0, "failed": None}

    def forward(pid: int, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)   # rpg-train saves and stops at the end of its step

    def on_signal(signum, frame):
        with signalled:
            state["stop"] = signal.Signals(signum).name
            for pid in list(running):
                forward(pid, signum)

    def on_pid(mine: list, pid: int) -> None:  # a job started: a signal that came first too
        mine.append(pid)
        with signalled:
            running.add(pid)
            if state["stop"]:
                forward(pid, getattr(signal, state["stop"]))

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def worker():
        proc = None
        try:
            while True:
                with lock:
                    if state["stop"] or state["failed"] or not queue or (
                            max_runs is not None and state["ran"] >= max_runs):
                        return
                    job = queue.pop(0)
                proc = proc or Worker()   # imports once: seconds, before the first job only
                if state["stop"]:         # asked to stop while the worker was starting
                    return
                with claimed(job) as fd:
                    # another runner may have appended since we looked (a torn line: said once)
                    rows = read_rows(results, spec, report_torn=False)
                    if fd is None or (job.cell, job.seed) in done_keys(rows) | skipped_keys(
                            spec, [job], rows):
                        continue  # held or finished by another runner, or excluded since
                    with lock:
                        state["ran"] += 1
                        n = state["ran"]
                    mine = []
                    try:
                        row = run_job(job, spec, proc, fd, functools.partial(on_pid, mine))
                        check_row(row, spec)
                    except Stopping as e:
                        print(f"stopped: {e}", flush=True)
                        return
                    finally:
                        with signalled:
                            running.difference_update(mine)
                    append_row(results, row)
                    print(f"[{n}] {job.cell} s{job.seed}: {row['outcomes']} "
                          f"({row['wall_s']:.0f} s wall, {row['cpu_s']:.0f} s CPU)", flush=True)
        except (RuntimeError, StudyError) as e:   # WorkerDied is a RuntimeError
            state["failed"] = str(e)
        finally:
            if proc is not None:
                proc.close()

    try:
        with ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(worker) for _ in range(workers)]
            while wait(futures, timeout=0.5).not_done:   # the main thread takes the signals
                pass
            for f in futures:
                f.result()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if state["failed"]:
        print(f"small_scale.study: {state['failed']}", file=sys.stderr)
        return 1
    if state["stop"]:
        print(f"small_scale.study: stopped by {state['stop']}; run the same command to continue",
              file=sys.stderr)
        return 128 + getattr(signal, state["stop"])
    return 0


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m small_scale.study",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("study", help="a study file's name: small_scale/studies/<study>.json")
    ap.add_argument("--workers", type=int, default=1, help="runs at a time (each one thread)")
    ap.add_argument("--nice", type=int, default=10, help="niceness added to the runner and its "
                    "runs (0: none)")
    ap.add_argument("--cells", nargs="+", metavar="CELL", help="only these cells")
    ap.add_argument("--max-runs", type=int, default=None, help="stop after starting this many")
    ap.add_argument("--dry-run", action="store_true", help="list the pending runs, run nothing")
    ap.add_argument("--status", action="store_true", help="progress and CPU time left")
    ap.add_argument("--studies", default=str(STUDIES), help=argparse.SUPPRESS)
    ap.add_argument("--results", default=str(RESULTS), help="folder of <study>.jsonl")
    ap.add_argument("--runs", default=str(RUNS), help="run folders (git-ignored)")
    ap.add_argument("--allow-uncommitted", action="store_true",
                    help="run a study whose study file or comparison rules are not committed "
                    "(a trial, or a study folder outside a git repository)")
    a = ap.parse_args(argv)
    if a.workers < 1 or (a.max_runs is not None and a.max_runs < 1) or a.nice < 0:
        print("small_scale.study: --workers and --max-runs must be >= 1, --nice >= 0",
              file=sys.stderr)
        return 2
    try:
        spec = load_study(a.study, a.studies)
        path = results_path(a.study, a.results)
        rows = read_rows(path, spec)
        calibrated = None
        if a.status:   # cells and seeds only: no flag is resolved or checked
            check_provenance(path, spec, rows)
            cells = a.cells or list(spec["cells"])
            if set(cells) - set(spec["cells"]):
                raise StudyError(f"no cells {sorted(set(cells) - set(spec['cells']))}; cells: "
                                 f"{list(spec['cells'])}")
            jobs = [Job(c, s, [], run_folder(a.runs, a.study, c, s)) for c in cells
                    for s in planned_seeds(spec, c)]
        else:
            if needs_calibration(spec):
                calibrated = calibrated_values(a.results, a.studies, spec["calibration"])
            jobs = jobs_of(spec, a.runs, calibrated, a.cells)
            check_provenance(path, spec, rows, calibrated)
            validate(jobs, Path(a.runs))
            if not (a.dry_run or a.allow_uncommitted):
                problem = uncommitted(rules_of(spec, TESTBEDS))
                if problem:
                    raise StudyError(f"{problem}: commit the study file and the comparison rules "
                                     f"that name it before its first run (git add, git commit), "
                                     f"so that they are fixed before any row lands")
    except StudyError as e:
        print(f"small_scale.study: {e}", file=sys.stderr)
        return 2
    skip = skipped_keys(spec, jobs, rows)
    if skip:
        print(f"not run: {len(skip)} jobs of the seeds the warm-start rule excludes "
              f"{sorted({s for _, s in skip})}")
    jobs = [j for j in jobs if (j.cell, j.seed) not in skip]
    if a.status:
        print("\n".join(status_lines(spec, jobs, rows)))
        return 0
    done = done_keys(rows)
    pending = [j for j in jobs if (j.cell, j.seed) not in done]
    if calibrated:
        print(f"calibrated values: {calibrated}")
    if a.dry_run:
        for j in pending:
            how = f"--resume {rel(j.folder)}" if (j.folder / "config.json").is_file() else ""
            print(f"{j.cell} s{j.seed}: python -m rpg_ref.cli {how or shlex.join(j.argv)}")
        print(f"{len(pending)} of {len(jobs)} runs pending")
        return 0
    if a.nice:
        os.nice(a.nice)   # the runs inherit it
    print(f"{spec['name']}: {len(jobs)} runs, {len(pending)} pending, {a.workers} worker(s); "
          f"results: {rel(path)}", flush=True)
    return run_study(spec, pending, path, a.workers, a.max_runs)


if __name__ == "__main__":
    sys.exit(main())
