"""Benchmark on one GPU: rpg-train (math task, HF engine) vs TRL's GRPOTrainer, the same settings.

    python -m small_scale.bench.gpu_vs_trl                # Qwen3-0.6B, 4 prompts x 8, 256 tokens
    python -m small_scale.bench.gpu_vs_trl --model qwen3-1.7b --max-new-tokens 1024 --steps 4
    python -m small_scale.bench.gpu_vs_trl --device cpu   # no GPU: the pipeline, tiny model

Not a test: it prints a table of ratios measured in one run. Needs a CUDA GPU and the bench extra
(``pip install 'rpg-ref[bench]'``: trl, psutil); without them it stops with one line (exit 2).
With --device cpu it runs the same comparison on the CPU (default: qwen3-tiny, 2 prompts x 2,
16 new tokens, 3 steps), peak memory being each process's peak RSS: a check that both sides of
the benchmark run, whose ratios say nothing about a GPU.

Both trainers get:
  - one model, built once from shared/data/models/<name>/config.json (or qwen3-tiny:
    small_scale/bench_common.model_config) with random weights (seed 0)
    and saved in fp32 with save_pretrained, with the shared Qwen3 tokenizer;
  - the same problems: the first prompts x (steps + 1) deepmath_int problems, through the chat
    template with the paper's "Answer:" instruction (rpg-train reads them as its training set;
    TRL gets the templated text), and the same answer checker as reward (rpg_ref.math.reward);
  - the same batch (--prompts x --group responses per rollout), response length
    (--max-new-tokens; random weights never emit EOS, so every response has that length),
    --updates optimizer steps per rollout batch, lr 1e-6, temperature 1, top-p 1;
  - fp32 master weights with bf16 autocast (TRL: bf16=True) and gradient checkpointing;
  - a KL term: TRL with beta = --beta > 0, which loads a second copy of the model as its reference;
    rpg-train's rpg-reinforce-urkl with the iterative reference (pi_ref = pi_old, one model).
Each trainer runs in its own fresh process. A training step is one rollout batch and its optimizer
steps: rpg-train's logged time_step; for TRL, --updates consecutive optimizer steps (generation
happens in the first). The first step of each is warm-up (compilation, allocator) and dropped; the
median of the rest is reported. Peak memory is torch.cuda.max_memory_allocated of the process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from small_scale.bench.common import (
    DEVICES,
    SHARED_MODELS,
    TINY,
    device_name,
    math_hf_args,
    missing_device,
    model_config,
    peak_memory_gib,
    ratio_rows,
    rollout_cycles,
    run_worker,
    step_timer,
)
from small_scale.study.train_flags import flags

REPO = Path(__file__).resolve().parents[2]
# what the command line leaves out, by device
DEFAULTS = {"cuda": {"model": "qwen3-0.6b", "prompts": 4, "group": 8, "updates": 2,
                     "max_new_tokens": 256, "steps": 4},
            "cpu": {"model": TINY, "prompts": 2, "group": 2, "updates": 1, "max_new_tokens": 16,
                    "steps": 3}}


def settings(a) -> dict:
    d = DEFAULTS[a.device]
    given = {k: getattr(a, k) for k in d}
    return {"device": a.device, **{k: d[k] if v is None else v for k, v in given.items()},
            "beta": a.beta, "lr": 1e-6, "seed": 0}


def check(s: dict) -> str | None:
    """What is wrong with the settings, in one line, or None."""
    if s["steps"] < 2:
        return "need --steps >= 2 (the first is warm-up)"
    if s["prompts"] < 1 or s["group"] < 2 or s["updates"] < 1 or s["max_new_tokens"] < 1:
        return "need --prompts >= 1, --group >= 2, --updates >= 1, --max-new-tokens >= 1"
    if (s["prompts"] * s["group"]) % s["updates"]:
        return (f"{s['prompts']} x {s['group']} responses do not split into {s['updates']} "
                "optimizer steps")
    if not s["beta"] > 0:
        return "TRL is compared with its reference model: need --beta > 0"
    return None


# --------------------------------------------------------------------------- the two configurations
def ours_argv(s: dict, out: Path, model_dir: Path, problems: Path) -> list:
    """rpg-train's flags for the comparison (a valid configuration: tests/test_gpu_bench.py)."""
    return flags({
        **math_hf_args(device=s["device"], out=out, model=model_dir, steps=s["steps"],
                       prompts=s["prompts"], group=s["group"], updates=s["updates"],
                       max_new_tokens=s["max_new_tokens"], micro_batch_tokens=16384,
                       checkpointing=True, lr=s["lr"]),
        "algo": "rpg-reinforce-urkl", "ref": "iterative", "beta": s["beta"],
        "math_tokenizer": model_dir, "math_train_data": problems, "temperature": 1.0,
        "top_p": 1.0, "weight_decay": 0.0, "grad_clip": 1.0, "seed": s["seed"]})


def trl_config(s: dict, out: Path) -> dict:
    """TRL GRPOConfig keywords for the same run (TRL 1.x names)."""
    batch = s["prompts"] * s["group"]
    return dict(output_dir=str(out), report_to=[], save_strategy="no", logging_steps=10**6,
                max_steps=s["updates"] * s["steps"], learning_rate=s["lr"],
                lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                seed=s["seed"], per_device_train_batch_size=batch // s["updates"],
                gradient_accumulation_steps=1, steps_per_generation=s["updates"],
                num_generations=s["group"], max_completion_length=s["max_new_tokens"],
                temperature=1.0, top_p=1.0, top_k=0, beta=s["beta"], epsilon=0.2, epsilon_high=0.28,
                num_iterations=1, loss_type="grpo", bf16=True, gradient_checkpointing=True,
                model_init_kwargs={"dtype": "float32"}, disable_dropout=True, disable_tqdm=True,
                dataloader_num_workers=0, use_cpu=s["device"] == "cpu")


def compare(ours: dict, trl: dict) -> dict:
    """The headline ratios: speed-up (TRL's median step time / ours) and memory (ours / TRL's)."""
    t_ours, t_trl = statistics.median(ours["step_s"]), statistics.median(trl["step_s"])
    return {
        "speedup_vs_trl": t_trl / t_ours,
        "peak_memory_ratio": ours["peak_gib"] / trl["peak_gib"],
        "step_s_ours": t_ours,
        "step_s_trl": t_trl,
    }


# ---------------------------------------------------------------------------- the workers
def prepare(s: dict, out: Path) -> tuple[Path, Path]:
    """Save the random model + tokenizer once, and the problems both trainers use."""
    import torch
    from transformers import AutoTokenizer

    from rpg_ref.math.data import data_dir, load_problems
    from rpg_ref.models.load import load_hf_model

    model_dir, problems = out / "model", out / "problems.jsonl"
    if not (model_dir / "config.json").exists():
        torch.manual_seed(s["seed"])
        load_hf_model(str(model_config(s["model"], out))).save_pretrained(model_dir)
        AutoTokenizer.from_pretrained(str(data_dir() / "tokenizer" / "qwen3")).save_pretrained(
            model_dir
        )
    rows = load_problems("deepmath_int", limit=s["prompts"] * (s["steps"] + 1))
    problems.write_text(
        "".join(
            json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer}) + "\n" for p in rows
        )
    )
    return model_dir, problems


def run_ours(s: dict, out: Path, model_dir: Path, problems: Path) -> dict:
    from rpg_ref.cli import parse_config
    from rpg_ref.trainer import train

    train.checkpoint_state = lambda *a, **k: {}  # nothing saved: not measured
    train.save_checkpoint = lambda *a, **k: None  # not measured
    train.train(parse_config(ours_argv(s, out / "ours", model_dir, problems)))
    rows = [json.loads(x) for x in (out / "ours" / "metrics.jsonl").read_text().splitlines()]
    return {"step_s": [r["time_step"] for r in rows[1:]],
            "gen_tokens_per_s": [r["gen_tokens_per_s"] for r in rows[1:]],
            "peak_gib": peak_memory_gib(s["device"])}


def run_trl(s: dict, out: Path, model_dir: Path, problems: Path) -> dict:
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rpg_ref.math.data import load_problems
    from rpg_ref.math.reward import MathReward, chat_prompt

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    data = [{"prompt": chat_prompt(tok, p.problem), "answer": p.answer}
            for p in load_problems(str(problems))]
    scorer = MathReward(style="answer", scoring="pm1")

    def reward(prompts, completions, answer, **_):
        return scorer(list(completions), list(answer))[0]

    stamps = []
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=reward,
        args=GRPOConfig(**trl_config(s, out / "trl")),
        train_dataset=Dataset.from_list(data),
        processing_class=tok,
        callbacks=[step_timer(stamps)],
    )
    if trainer.ref_model is None:
        raise RuntimeError("TRL with beta > 0 should hold a reference model")
    trainer.train()
    scorer.close()
    cycles = rollout_cycles(stamps, s["updates"])
    return {"step_s": cycles[1:], "peak_gib": peak_memory_gib(s["device"]),
            "trl_version": trl.__version__}


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--device",
        choices=DEVICES,
        default="cuda",
        help="cuda (what it measures) or cpu (the same comparison: a check that it runs)",
    )
    ap.add_argument(
        "--model",
        choices=[*SHARED_MODELS, TINY],
        help="a folder of shared/data/models, or "
        f"{TINY}; the defaults of this and the next five: "
        + "; ".join(f"{dev}: {d}" for dev, d in DEFAULTS.items()),
    )
    ap.add_argument("--prompts", type=int)
    ap.add_argument("--group", type=int)
    ap.add_argument("--updates", type=int, help="optimizer steps per rollout batch")
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--steps", type=int, help="rollout batches per trainer (first = warm-up)")
    ap.add_argument("--beta", type=float, default=1e-4)
    ap.add_argument("--out", default="runs/bench_gpu_vs_trl")
    ap.add_argument("--_worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    s = settings(a)
    problem = check(s)
    if problem is None:
        import importlib.util

        problem = missing_device(a.device)
        if problem is None and importlib.util.find_spec("trl") is None:
            problem = "TRL is not installed: pip install 'rpg-ref[bench]'"
    if problem:
        print(f"bench_gpu_vs_trl: {problem}", file=sys.stderr)
        return 2
    out = Path(a.out) / f"{s['model']}-{a.device}"
    if a._worker:
        model_dir, problems = out / "model", out / "problems.jsonl"
        run = run_ours if a._worker == "ours" else run_trl
        (out / f"{a._worker}.json").write_text(json.dumps(run(s, out, model_dir, problems)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    prepare(s, out)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    passed = argv if argv is not None else sys.argv[1:]
    for w in ("ours", "trl"):
        run_worker(__spec__.name, [*passed, "--_worker", w], env, w)
    ours, trl_ = (json.loads((out / f"{w}.json").read_text()) for w in ("ours", "trl"))
    r = compare(ours, trl_)
    device = device_name(a.device)
    print(f"\n{s['model']} (random weights), {s['prompts']} prompts x {s['group']} responses, "
          f"{s['max_new_tokens']} new tokens, {s['updates']} optimizer steps per rollout, bf16 "
          f"autocast, checkpointing; {device}; TRL {trl_['trl_version']}; medians over "
          f"{len(ours['step_s'])} / {len(trl_['step_s'])} steps\n")
    memory = "peak GPU memory (GiB)" if a.device == "cuda" else "peak RSS (GiB)"
    for row in ratio_rows(ours, trl_, [("seconds per training step (median)", "step_s", ".2f"),
                                       (memory, "peak_gib", ".2f")]):
        print(row)
    print(f"\nspeed-up (TRL step time / ours): {r['speedup_vs_trl']:.2f}x; peak memory ours/TRL: "
          f"{r['peak_memory_ratio']:.2f}")
    (out / "result.json").write_text(
        json.dumps(
            {
                "command": "python -m small_scale.bench.gpu_vs_trl " + " ".join(passed),
                "settings": s,
                "device": device,
                **r,
                "ours": ours,
                "trl": trl_,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
