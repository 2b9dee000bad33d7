"""GPU benchmark of `rpg-train --task math`: Qwen3-0.6B / 1.7B / 4B with the HF engine.

    # quick: the three models, writes small_scale/results/gpu.json
    python -m small_scale.bench.gpu
    python -m small_scale.bench.gpu --mode full           # 2,048-token responses, one more step
    python -m small_scale.bench.gpu --models qwen3-4b --max-new-tokens 8192 --mode full
    python -m small_scale.bench.gpu --device cpu          # no GPU: the whole pipeline, tiny model

Needs a CUDA GPU for what it is for (without one it stops with one line, exit code 2). With
--device cpu it runs the same pipeline on the CPU (default model qwen3-tiny, the smoke settings,
writes runs/gpu_bench_cpu.json): a check that the benchmark works, whose numbers say nothing about
a GPU. Each model is built from its shared config (shared/data/models/<name>/config.json) with
random weights and the real Qwen3 tokenizer, and trained for --steps training steps of the math
task (deepmath_int problems, the paper's prompt, rpg-reinforce-urkl with RPG-Style Clip) in a fresh
child process, with fp32 master weights and bf16 autocast, micro-batches by a token budget
(gradient checkpointing for 4B only: CHECKPOINTING below), the LM head in chunks, and the HF engine
(a bf16 copy of the weights, a static KV cache, a CUDA-graph decode step, as many sequences per
call as memory holds). Random weights almost never emit EOS, so every response runs to
--max-new-tokens. Checkpoints, the HF export and evaluation are switched off (they are not what is
measured, and a 4B checkpoint with its AdamW state is 48 GB of disk).

Modes (explicit flags override them):
    quick  2 steps (1 measured) of 4 prompts x 8 responses, 512 new tokens, 2 optimizer steps:
           the issue's generation setting (0.6B, batch 32 x 512); meant to finish the three models
           within 5 minutes on one H100 (an estimate: not yet timed on a GPU)
    full   3 steps (2 measured) of 4 x 8 at 2,048 new tokens
    smoke  2 steps of 2 x 2 at 16 new tokens, one optimizer step (the --device cpu default)

Per model, from the trainer's metrics.jsonl, the first step dropped as warm-up (CUDA kernels,
allocator) and the median of the rest reported:
    step_time_s           time_step (rollout + scoring + log-probs + update)
    gen_tokens_per_s      generated tokens / rollout seconds
    train_tokens_per_s    response tokens through the optimizer loop / update seconds
    peak_mem_gib          max over steps of torch.cuda.max_memory_allocated (reset every step);
                          on a CPU the process's peak RSS
    mfu_step, mfu_generation, mfu_training   model-FLOPs utilization against the GPU's dense
                          bf16 peak (--peak-tflops, or looked up from the device name; on a CPU
                          only with --peak-tflops, else null):

        FLOPs(step) = 6 N T_train + 2 N T_logprob + 2 N T_gen
        MFU = FLOPs / (seconds * peak)

    N = parameters of the model (tied embeddings counted once: the lm_head matmul costs 2 N_embed
    per token, the embedding lookup nothing); T_train = response tokens processed by the
    optimizer (forward + backward: 6 N per token), T_logprob = response tokens of the batch in
    the no-grad pi_old log-prob pass (2 N), T_gen = generated tokens (2 N). Prompt tokens,
    attention's sequence-length term and the gradient-checkpointing recompute are not counted,
    so these are lower bounds of the hardware utilization (the usual MFU convention).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from small_scale.bench.common import (
    DEVICES,
    SHARED_MODELS,
    TINY,
    device_name,
    math_hf_args,
    missing_device,
    model_config,
)
from small_scale.study.train_flags import flags

REPO = Path(__file__).resolve().parents[2]
MODES = {
    "quick": {"steps": 2, "prompts": 4, "group": 8, "updates": 2, "max_new_tokens": 512},
    "full": {"steps": 3, "prompts": 4, "group": 8, "updates": 2, "max_new_tokens": 2048},
    "smoke": {"steps": 2, "prompts": 2, "group": 2, "updates": 1, "max_new_tokens": 16},
}
DEFAULTS = {"cuda": {"models": list(SHARED_MODELS), "mode": "quick",
                     "out": REPO / "small_scale" / "results" / "gpu.json"},
            "cpu": {"models": [TINY], "mode": "smoke",
                    "out": Path("runs") / "gpu_bench_cpu.json"}}
# tokens per forward/backward and activation checkpointing, sized for 80 GB (estimates, to tune on a
# GPU). 0.6B / 1.7B: weights, gradients and AdamW take 10 / 27 GB, and all activations of 16K / 8K
# tokens (~1.3 / 2.5 MB per token) fit without recomputation. 4B: fp32 weights 16 GB + gradients
# 16 GB + AdamW 32 GB leave room only with checkpointed layers: per token the layer inputs
# (36 x 2560 x 2 B) and one layer's recompute (~76 KB), plus one LM-head chunk (~3 GB).
# Generation sizes its batch from free memory (--hf-chunk auto).
MICRO_BATCH_TOKENS = {"qwen3-0.6b": 16384, "qwen3-1.7b": 8192, "qwen3-4b": 4096, TINY: 4096}
CHECKPOINTING = {"qwen3-0.6b": False, "qwen3-1.7b": False, "qwen3-4b": True, TINY: False}
MODELS = list(MICRO_BATCH_TOKENS)
# dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from the vendors' data sheets
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H200": 989.4,
                    "GH200": 989.4, "A100": 312.0, "L40S": 362.05}


# ---------------------------------------------------------------------------- pure arithmetic
def peak_bf16_tflops(device_name: str) -> float:
    """Dense bf16 peak of a GPU from its torch.cuda device name (most specific match first)."""
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_BF16_TFLOPS[key]
    raise ValueError(f"no known bf16 peak for GPU {device_name!r}: pass --peak-tflops")


def step_flops(
    n_params: int, train_tokens: float, logprob_tokens: float, gen_tokens: float
) -> dict:
    """Model FLOPs of one step by phase (module docstring): 6N per trained token, 2N per
    log-prob-pass token and per generated token."""
    for name, v in (("n_params", n_params), ("train_tokens", train_tokens),
                    ("logprob_tokens", logprob_tokens), ("gen_tokens", gen_tokens)):
        if not v >= 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    out = {"training": 6.0 * n_params * train_tokens, "logprob": 2.0 * n_params * logprob_tokens,
           "generation": 2.0 * n_params * gen_tokens}
    out["step"] = out["training"] + out["logprob"] + out["generation"]
    return out


def mfu(flops: float, seconds: float, peak_tflops: float | None) -> float | None:
    """Achieved FLOP/s over the peak: flops / (seconds * peak_tflops * 1e12); None without a
    peak."""
    if peak_tflops is None:
        return None
    if not (seconds > 0 and peak_tflops > 0):
        raise ValueError(f"need seconds > 0 and peak_tflops > 0, got {seconds}, {peak_tflops}")
    return flops / (seconds * peak_tflops * 1e12)


def summarize(rows: list[dict], n_params: int, batch: int, peak_tflops: float | None,
              warmup: int = 1) -> dict:
    """Benchmark numbers from metrics.jsonl rows: medians over the steps after `warmup` (MFU
    None without a peak)."""
    rows = rows[warmup:]
    if not rows:
        raise ValueError(f"need more than {warmup} step(s) to report anything")
    per_step = []
    for r in rows:
        gen_tok = r["gen_tokens_per_s"] * r["time_rollout"]
        train_tok = r["train_tokens_per_s"] * r["time_update"]
        lp_tok = r["response_len"] * batch
        f = step_flops(n_params, train_tok, lp_tok, gen_tok)
        per_step.append({
            "step_time_s": r["time_step"],
            "gen_tokens_per_s": r["gen_tokens_per_s"],
            "train_tokens_per_s": r["train_tokens_per_s"],
            "mfu_step": mfu(f["step"], r["time_step"], peak_tflops),
            "mfu_generation": mfu(f["generation"], r["time_rollout"], peak_tflops),
            "mfu_training": mfu(f["training"], r["time_update"], peak_tflops),
            "response_len": r["response_len"],
            "time_rollout_s": r["time_rollout"], "time_logprob_s": r["time_logprob"],
            "time_update_s": r["time_update"],
        })
    out = {k: None if per_step[0][k] is None else statistics.median(s[k] for s in per_step)
           for k in per_step[0]}
    out["peak_mem_gib"] = max(r["peak_mem_mb"] for r in rows) / 1024
    out["steps_measured"] = len(rows)
    return out


# ---------------------------------------------------------------------------- running
def train_argv(name: str, args, out: Path, config: Path) -> list:
    """rpg-train's flags for one model (``config``: its config.json)."""
    return flags(math_hf_args(
        device=args.device, out=out, model=config, steps=args.steps, prompts=args.prompts,
        group=args.group, updates=args.updates, max_new_tokens=args.max_new_tokens,
        micro_batch_tokens=MICRO_BATCH_TOKENS[name], checkpointing=CHECKPOINTING[name], lr=1e-6))


def resolve_mode(args) -> None:
    """Fill what the command line left out: models, mode and output from the device's defaults
    (DEFAULTS), then the settings from the --mode preset."""
    for k, v in DEFAULTS[args.device].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for k, v in MODES[args.mode].items():
        if getattr(args, k) is None:
            setattr(args, k, v)


def run_one(name: str, args, result_file: Path) -> None:
    """Child process: train one model (checkpoints off) and write its numbers to result_file."""
    from rpg_ref.cli import parse_config
    from rpg_ref.trainer import train

    # benchmark: no 16-48 GB checkpoint gathers and writes
    train.checkpoint_state = lambda *a, **k: {}  # nothing saved: not measured
    train.save_checkpoint = lambda *a, **k: None
    with tempfile.TemporaryDirectory(prefix=f"gpu-bench-{name}-") as tmp:
        cfg = parse_config(train_argv(name, args, Path(tmp) / "run", model_config(name, Path(tmp))))
        s = train.train(cfg)
        rows = [
            json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
        ]
    res = summarize(rows, s["model_params"], args.prompts * args.group, args.peak_tflops)
    res.update(params=s["model_params"], raw_steps=rows, device=device_name(args.device))
    result_file.write_text(json.dumps(res))


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=DEVICES, default="cuda",
                    help="cuda (what it measures) or cpu (the same pipeline: a check that it runs)")
    ap.add_argument("--models", nargs="+", choices=MODELS,
                    help=f"default: {' '.join(SHARED_MODELS)} on cuda, {TINY} on cpu")
    ap.add_argument(
        "--mode",
        choices=list(MODES),
        help="preset of the settings below (default: "
        "quick on cuda, smoke on cpu): " + "; ".join(f"{k}: {v}" for k, v in MODES.items()),
    )
    ap.add_argument("--steps", type=int, help="training steps per model (the first is warm-up)")
    ap.add_argument("--prompts", type=int, help="prompts per step")
    ap.add_argument("--group", type=int, help="responses per prompt")
    ap.add_argument("--updates", type=int, help="optimizer steps per training step")
    ap.add_argument(
        "--max-new-tokens", type=int, help="response length (random weights: always reached)"
    )
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="the device's dense bf16 peak in TFLOP/s (0 = look it up from the GPU's "
                         "name; on a CPU, 0 reports no MFU)")
    ap.add_argument("--out", help="results file (default: small_scale/results/gpu.json on cuda, "
                                  "runs/gpu_bench_cpu.json on cpu)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: child process
    ap.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    resolve_mode(args)

    import torch

    if (problem := missing_device(args.device)) is not None:
        print(f"gpu_bench: {problem}", file=sys.stderr)
        return 2
    if args.steps < 2 or args.prompts < 1 or args.group < 2 or args.updates < 1:
        print("gpu_bench: need --steps >= 2 (one warm-up), --prompts >= 1, --group >= 2, "
              "--updates >= 1", file=sys.stderr)
        return 2
    if (args.prompts * args.group) % args.updates:
        print(f"gpu_bench: {args.prompts} x {args.group} responses do not split into "
              f"{args.updates} optimizer steps", file=sys.stderr)
        return 2
    if args.peak_tflops < 0:
        print(f"gpu_bench: --peak-tflops must be > 0 (or 0: look it up), got {args.peak_tflops}",
              file=sys.stderr)
        return 2
    if not args.peak_tflops and args.device == "cpu":
        args.peak_tflops = None
    elif not args.peak_tflops:
        try:
            args.peak_tflops = peak_bf16_tflops(torch.cuda.get_device_name(0))
        except ValueError as e:
            print(f"gpu_bench: {e}", file=sys.stderr)
            return 2
    if args.one:
        run_one(args.one, args, Path(args.result_file))
        return 0

    results = {}
    for name in args.models:  # a fresh process per model: clean CUDA memory and peak counters
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [
                sys.executable,
                "-m",
                __spec__.name,
                *(argv if argv is not None else sys.argv[1:]),
                "--one",
                name,
                "--result-file",
                f.name,
                "--peak-tflops",
                str(args.peak_tflops or 0),
            ]
            t0 = time.time()
            rc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONHASHSEED": "0"},
                                check=False).returncode
            if rc != 0:
                results[name] = {"error": f"child exited with {rc}"}
                continue
            results[name] = {**json.loads(Path(f.name).read_text()), "wall_s": time.time() - t0}
        r = results[name]
        util = "n/a (no --peak-tflops)" if r["mfu_step"] is None else f"{100 * r['mfu_step']:.1f}%"
        print(f"{name}: {r['params'] / 1e9:.2f}B  step {r['step_time_s']:.1f}s  gen "
              f"{r['gen_tokens_per_s']:.0f} tok/s  train {r['train_tokens_per_s']:.0f} tok/s  MFU "
              f"{util}  peak {r['peak_mem_gib']:.1f} GiB", flush=True)
    import transformers

    payload = {
        "command": "python -m small_scale.bench.gpu "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "train_argv_example": train_argv(args.models[0], args, Path("OUT"), Path("CONFIG.json")),
        "device": device_name(args.device),
        "peak_bf16_tflops": args.peak_tflops,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "flops_formula": "FLOPs(step) = 6 N T_train + 2 N T_logprob + 2 N T_gen; MFU = FLOPs / "
        "(seconds * peak); prompt tokens, attention and recompute not counted",
        "mode": args.mode,
        "settings": {
            k: getattr(args, k) for k in ("steps", "prompts", "group", "updates", "max_new_tokens")
        },
        "micro_batch_tokens": {m: MICRO_BATCH_TOKENS[m] for m in args.models},
        "gradient_checkpointing": {m: CHECKPOINTING[m] for m in args.models},
        "models": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=1))
    print(f"wrote {args.out}")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
