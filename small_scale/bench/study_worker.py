"""Benchmark: one study job in a fresh ``python -m rpg_ref.cli`` process (one process per job,
its imports included) against the same job in a fork of a persistent worker
(small_scale/study/worker.py: torch and transformers imported once), in one run on this machine.

    python -m small_scale.bench.study_worker                 # study A's urkl-clip-u1, seed 1
    python -m small_scale.bench.study_worker --repeats 5 --cell dapo-u16 --seed 3

The job is the committed study A's (its flags, the calibrated lr: a 40-step seq run with 1,024
held-out problems every 5 steps, one thread), its warm start cached by a first run, as a study's
runs find it after their seed's first. Fresh and worker runs alternate (``--repeats`` each); each
writes its own run folder, and every worker run's metrics (the machine's measurements aside) and
final weights are checked equal, bit for bit, to the fresh run's. Printed: median wall and CPU
seconds per job each way (CPU: the job's own user + system time, os.wait4), the saving per job,
and the worker's start (paid once per worker, i.e. once per --workers slot of a study).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from small_scale.study.files import ROOT, calibrated_values, load_study
from small_scale.study.runner import jobs_of
from small_scale.study.worker import Worker


def outputs(run: Path) -> tuple[list, str]:
    """(metrics rows without seconds, throughput and peak memory, sha256 of the final weights)."""
    rows = [{k: v for k, v in json.loads(x).items()
             if not (k.startswith("time_") or k.endswith("_per_s") or k == "peak_mem_mb")}
            for x in (run / "metrics.jsonl").read_text().splitlines()]
    last = (run / "checkpoints" / "LATEST").read_text().strip()
    return rows, hashlib.sha256((run / "checkpoints" / last / "model.safetensors").read_bytes()
                                ).hexdigest()


def with_out(argv: list, out: Path, cache: Path) -> list:
    argv = list(argv)
    argv[argv.index("--out") + 1] = str(out)
    argv[argv.index("--cache-dir") + 1] = str(cache)
    return argv


def fresh(argv: list, log: Path) -> tuple[float, float]:
    """Wall and CPU seconds of ``python -m rpg_ref.cli argv`` (its own rusage)."""
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        p = subprocess.Popen([sys.executable, "-m", "rpg_ref.cli", *argv], cwd=ROOT, stdout=out,
                             stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench_study_worker: the fresh run failed; see {log}")
    return time.perf_counter() - t0, ru.ru_utime + ru.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", default="urkl-clip-u1", help="a cell of study A")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="runs each way")
    ap.add_argument("--out", default="runs/bench_study_worker")
    a = ap.parse_args()
    if a.repeats < 1:
        print("bench_study_worker: --repeats must be >= 1", file=sys.stderr)
        return 2
    spec = load_study("A")
    job = next((j for j in jobs_of(spec, calibrated=calibrated_values(), cells=[a.cell])
                if j.seed == a.seed), None)
    if job is None:
        print(f"bench_study_worker: study A plans no seed {a.seed} in cell {a.cell}",
              file=sys.stderr)
        return 2
    out = Path(a.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cache = out / "cache"
    fresh(with_out(job.argv, out / "warm", cache), out / "warm.log")   # fills the cache
    t0 = time.perf_counter()
    worker = Worker()
    start = time.perf_counter() - t0
    got = {"fresh": [], "worker": []}
    try:
        with open(out / "claim.lock", "a") as claim:
            for i in range(a.repeats):
                f = out / f"fresh{i}"
                got["fresh"].append(fresh(with_out(job.argv, f, cache), out / f"fresh{i}.log"))
                w = out / f"worker{i}"
                t0 = time.perf_counter()
                code, cpu = worker.run(with_out(job.argv, w, cache), out / f"worker{i}.log",
                                       claim.fileno(), lambda pid: None)
                got["worker"].append((time.perf_counter() - t0, cpu))
                if code != 0:
                    raise SystemExit(f"bench_study_worker: the worker's run failed ({code})")
                if outputs(w) != outputs(f):
                    raise SystemExit(f"bench_study_worker: {w} differs from {f}")
    finally:
        worker.close()
    med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in got.items()}
    print(f"study A, cell {a.cell}, seed {a.seed} ({len(outputs(out / 'fresh0')[0])} steps), "
          f"median of {a.repeats} each way; every worker run bitwise equal to the fresh one")
    print("| per job | fresh process | persistent worker | saved | worker / fresh |")
    print("|---|---|---|---|---|")
    for i, what in enumerate(("wall s", "CPU s")):
        f, w = med["fresh"][i], med["worker"][i]
        print(f"| {what} | {f:.2f} | {w:.2f} | {f - w:.2f} | {w / f:.2f} |")
    print(f"worker start (imports, once per worker): {start:.2f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
