"""small_scale/study/worker.py: a study job run in a fork of a persistent worker gives the same
run, bit for bit, as the fresh ``python -m rpg_ref.cli`` process it replaces: the same metrics
rows (the machine's measurements aside: seconds, throughput, peak memory) and the same final
model.safetensors. The worker's second job is
compared, so that nothing of its first one can leak into it."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the seq task's Qwen3 (the llm extra)")

from small_scale.study.worker import Worker

ROOT = Path(__file__).resolve().parent.parent


def seq_job(out: Path, seed: int) -> list:
    """A short seq run: a 30-step warm start (its own cache), 6 RL steps, two evaluations."""
    return ["--preset", "seq", "--seq-warm-steps", "30", "--steps", "6", "--eval-every", "3",
            "--save-every", "3", "--seq-eval-size", "64", "--seed", str(seed), "--out", str(out),
            "--cache-dir", str(out.parent / f"cache-{out.name}"), "--threads", "1",
            "--no-progress"]


def measured(key: str) -> bool:
    """The keys that measure the machine, not the run: seconds, throughput, peak memory."""
    return key.startswith("time_") or key.endswith("_per_s") or key == "peak_mem_mb"


def outputs(run: Path) -> tuple[list, str]:
    """(metrics rows without the machine's measurements, sha256 of the last checkpoint's
    weights)."""
    rows = [{k: v for k, v in json.loads(x).items() if not measured(k)}
            for x in (run / "metrics.jsonl").read_text().splitlines()]
    last = (run / "checkpoints" / "LATEST").read_text().strip()
    weights = run / "checkpoints" / last / "model.safetensors"
    return rows, hashlib.sha256(weights.read_bytes()).hexdigest()


def test_a_job_in_a_worker_equals_a_fresh_process(tmp_path):
    fresh = tmp_path / "fresh"
    r = subprocess.run([sys.executable, "-m", "rpg_ref.cli", *seq_job(fresh, 1)], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    worker, pids = Worker(), []
    try:
        for name, seed in (("first", 0), ("second", 1)):
            log = tmp_path / f"{name}.log"
            with open(tmp_path / f"{name}.lock", "a") as claim:
                code, cpu = worker.run(seq_job(tmp_path / name, seed), log, claim.fileno(),
                                       pids.append)
            assert code == 0 and cpu > 0, log.read_text()[-2000:]
            assert "done: " in log.read_text()     # the job's output went to its log
    finally:
        worker.close()
    assert len(set(pids)) == 2 and worker.proc.pid not in pids   # a process per job
    rows, digest = outputs(fresh)
    got_rows, got_digest = outputs(tmp_path / "second")
    assert len(rows) == 6 and sum("eval_greedy_accuracy" in x for x in rows) == 2
    assert {"loss", "grad_norm", "entropy", "kl_old", "reward"} <= set(rows[0])
    assert got_rows == rows
    assert got_digest == digest
    assert outputs(tmp_path / "first")[1] != digest          # another seed: another run


def test_a_failing_job_reports_its_exit_code_and_the_worker_goes_on(tmp_path):
    """A job whose flags rpg-train refuses ends with exit code 2 and its one line in the log, as
    the fresh process would; the worker runs the next job."""
    worker = Worker()
    try:
        with open(tmp_path / "x.lock", "a") as claim:
            code, _ = worker.run(["--no-such-flag", "1"], tmp_path / "bad.log", claim.fileno(),
                                 lambda pid: None)
            assert code == 2
            code, _ = worker.run(["--preset", "bandit", "--steps", "2", "--out",
                                  str(tmp_path / "b"), "--no-progress"], tmp_path / "ok.log",
                                 claim.fileno(), lambda pid: None)
    finally:
        worker.close()
    assert code == 0 and "no-such-flag" in (tmp_path / "bad.log").read_text()
