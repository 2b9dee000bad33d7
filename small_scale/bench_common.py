"""What the trainer-vs-TRL benchmarks share (small_scale/bench_trainer.py on CPU,
small_scale/bench_gpu_vs_trl.py on a GPU): process memory, TRL's step timer, fresh worker
processes and the ratio table."""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
import time
from pathlib import Path


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """Peak RSS of this process: VmHWM (ru_maxrss would include a forking parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (this benchmark needs Linux)")


def rollout_cycles(stamps: list[float], per_rollout: int) -> list[float]:
    """Seconds per rollout batch from TRL's timestamps (train begin, then every optimizer step's
    end): generation happens on the first of ``per_rollout`` consecutive optimizer steps, so a
    training step comparable to rpg-train's is the sum of each complete group of them."""
    if per_rollout < 1:
        raise ValueError(f"per_rollout must be >= 1, got {per_rollout}")
    iv = [b - a for a, b in itertools.pairwise(stamps)]  # per optimizer step
    return [sum(iv[i : i + per_rollout]) for i in range(0, len(iv) - per_rollout + 1, per_rollout)]


def step_timer(stamps: list):
    """A transformers TrainerCallback appending time.perf_counter() at train begin and at the end
    of every optimizer step (imported lazily: transformers is the benchmark's, not the CLI's)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

    return StepTimer()


def run_worker(script: str, argv: list, env: dict, label: str) -> float:
    """Run ``script argv`` in a fresh Python process (clean memory counters); its wall seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, script, *argv], check=True, env=env)
    seconds = time.perf_counter() - t0
    print(f"[{label}] finished in {seconds:.1f} s", flush=True)
    return seconds


def ratio_rows(ours: dict, trl: dict, metrics: list[tuple[str, str, str]]) -> list[str]:
    """Markdown rows "| name | ours | TRL | ours/TRL |" for (label, key, format) triples; a list
    value is reported as its median."""
    def value(r, k):
        v = r[k]
        return statistics.median(v) if isinstance(v, list) else v

    out = ["| metric | rpg-train | TRL GRPOTrainer (beta>0) | ratio rpg-train/TRL |", "|---|---|---|---|"]
    for label, key, fmt in metrics:
        a, b = value(ours, key), value(trl, key)
        out.append(f"| {label} | {a:{fmt}} | {b:{fmt}} | {a / b:.2f} |")
    return out
