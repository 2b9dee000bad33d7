"""What the benchmarks share (trainer_overhead.py on CPU, gpu.py and gpu_vs_trl.py on a GPU, or on
a CPU at smoke settings): the benchmark models, the device's name, the math runs' rpg-train
settings, process memory, TRL's step timer, fresh worker processes and the ratio table."""

from __future__ import annotations

import itertools
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

TINY = "qwen3-tiny"
SHARED_MODELS = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b")
DEVICES = ("cuda", "cpu")


def model_config(name: str, folder: Path) -> Path:
    """config.json of a benchmark model: one of shared/data/models (SHARED_MODELS), or TINY
    (rpg_ref.math.tiny_model) written into ``folder``: the model a CPU runs the GPU benchmarks'
    whole
    pipeline with in seconds."""
    from rpg_ref.math.data import data_dir
    from rpg_ref.math.tiny_model import tiny_qwen3_config

    if name in SHARED_MODELS:
        return data_dir() / "models" / name / "config.json"
    if name != TINY:
        raise ValueError(f"unknown benchmark model {name!r}: one of {(*SHARED_MODELS, TINY)}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{TINY}.json"
    path.write_text(json.dumps(tiny_qwen3_config()))
    return path


def math_hf_args(*, device: str, out: Path, model: Path, steps: int, prompts: int, group: int,
                 updates: int, max_new_tokens: int, micro_batch_tokens: int,
                 checkpointing: bool, lr: float) -> dict:
    """rpg-train's settings of the GPU benchmarks' math runs (gpu.py, gpu_vs_trl.py;
    a dict for train_flags.flags): the HF engine with --hf-chunk auto, bf16 autocast,
    micro-batches by a token budget, ``updates`` optimizer steps per batch, every response to
    max_new_tokens (no overlong penalty, no dynamic sampling), no evaluation or export. A caller
    adds its own (algorithm, data, optimizer)."""
    return {"task": "math", "engine": "hf", "device": device, "out": out, "math_model": model,
            "math_dtype": "bf16-autocast", "math_gradient_checkpointing": checkpointing,
            "math_eval_n": 0, "math_export": False, "steps": steps, "prompts_per_step": prompts,
            "group_size": group, "mini_batch_size": prompts * group // updates,
            "micro_batch_size": 0, "micro_batch_tokens": micro_batch_tokens, "hf_chunk": "auto",
            "max_new_tokens": max_new_tokens, "overlong_buffer": 0, "dynamic_sampling": False,
            "lr": lr, "progress": False}


def missing_device(device: str) -> str | None:
    """Why ``device`` cannot run a benchmark (one line), or None."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return ("no CUDA GPU is available (torch.cuda.is_available() is False): run on a GPU, or "
                "pass --device cpu to run the same pipeline on this CPU (see --help)")
    return None


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's (with torch's thread count)."""
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    cpu = platform.processor() or platform.machine()
    for line in (
        Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    ):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"CPU: {cpu}, {torch.get_num_threads()} torch threads"


def peak_memory_gib(device: str) -> float:
    """The process's peak memory: max CUDA memory allocated, or peak RSS on a CPU."""
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return peak_rss_mb() / 1024


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


def run_worker(module: str, argv: list, env: dict, label: str) -> float:
    """Run ``python -m module argv`` from the repository's root in a fresh Python process (clean
    memory counters); its wall seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", module, *argv], check=True, env=env,
                   cwd=Path(__file__).resolve().parents[2])
    seconds = time.perf_counter() - t0
    print(f"[{label}] finished in {seconds:.1f} s", flush=True)
    return seconds


def ratio_rows(ours: dict, trl: dict, metrics: list[tuple[str, str, str]]) -> list[str]:
    """Markdown rows "| name | ours | TRL | ours/TRL |" for (label, key, format) triples; a list
    value is reported as its median."""
    def value(r, k):
        v = r[k]
        return statistics.median(v) if isinstance(v, list) else v

    out = [
        "| metric | rpg-train | TRL GRPOTrainer (beta>0) | ratio rpg-train/TRL |",
        "|---|---|---|---|",
    ]
    for label, key, fmt in metrics:
        a, b = value(ours, key), value(trl, key)
        out.append(f"| {label} | {a:{fmt}} | {b:{fmt}} | {a / b:.2f} |")
    return out
