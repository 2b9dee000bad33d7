"""Benchmark: rpg-train (rpg-reinforce-urkl) vs TRL's GRPOTrainer (beta > 0) on the seq task.

Not a test: it prints a table of ratios measured in one run on this machine. Both trainers get
the same warm-started tiny Qwen3 (saved once with save_pretrained), the same batch (16 prompts x
8 responses), response length (5 tokens), mini-batch (32 responses per optimizer step, so 4
optimizer steps per rollout batch), learning rate, temperature 1, fp32 on CPU, 1 torch thread,
and a KL term with beta = 1e-3. TRL with beta > 0 loads a second copy of the model as its
reference; rpg-train's iterative reference keeps one model (pi_old lives in stored log-probs).

A "training step" is one rollout batch and its 4 optimizer steps (rollout + scoring + log-probs +
update). For rpg-train that is its logged ``time_step``; for TRL, 4 consecutive ``on_step_end``
intervals (one ``steps_per_generation`` cycle: generation happens on the first of them). The first
step of each is warm-up and is dropped, as is rpg-train's last step (it also runs the final eval).
Each trainer runs in its own fresh process; peak RSS is that process's VmHWM, and "RSS after
imports" is the RSS after importing torch/transformers (and TRL), before any model is built.

    python -m small_scale.bench.trainer_overhead [--steps 10] [--out runs/bench_trainer]
    python -m small_scale.bench.trainer_overhead --hidden 512 --layers 4   # a larger model

Needs the bench extra (``pip install 'rpg-ref[bench]'``: trl, psutil).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from small_scale.bench.common import (
    peak_rss_mb,
    ratio_rows,
    rollout_cycles,
    rss_mb,
    run_worker,
    step_timer,
)
from small_scale.study.train_flags import flags

COMMON = {
    "prompts": 16,
    "group": 8,
    "max_new_tokens": 5,
    "mini": 32,
    "lr": 3e-4,
    "beta": 1e-3,
    "seed": 0,
}
MODEL = {}  # seq task model options (--hidden/--layers), the same for both trainers


def model_args() -> dict:
    """The seq task's model options given on the command line, as rpg-train settings."""
    return {f"seq_{k}": v for k, v in MODEL.items()}


def prepare(out: Path) -> Path:
    """Save the seq task's warm-started policy and a matching word-level tokenizer for TRL."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rpg_ref.cli import parse_config
    from rpg_ref.tasks.seq import SeqTask

    model_dir = out / "model"
    if (model_dir / "config.json").exists():
        return model_dir
    cfg = parse_config(flags({"task": "seq", "out": out / "unused", "cache_dir": out / "cache",
                              **model_args()}))
    torch.manual_seed(cfg.seed)
    task = SeqTask(cfg, torch.device("cpu"))
    policy = task.build_policy()
    policy.save_pretrained(model_dir)
    vocab = {str(d): d for d in range(10)}
    vocab.update(
        {
            "+": task.PLUS,
            "=": task.EQ,
            "<bos>": task.BOS,
            "<eos>": task.EOS,
            "<pad>": task.PAD,
            "<unk>": 15,
        }
    )
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.save_pretrained(model_dir)
    return model_dir


def run_ours(out: Path, steps: int) -> dict:
    rss0 = rss_mb()
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401  (same library baseline as TRL's)

    from rpg_ref.cli import parse_config
    from rpg_ref.trainer.train import train

    rss_imports = rss_mb()
    c = COMMON
    argv = flags({"task": "seq", "algo": "rpg-reinforce-urkl", "steps": steps, "out": out / "ours",
                  "cache_dir": out / "cache", "prompts_per_step": c["prompts"],
                  "group_size": c["group"], "max_new_tokens": c["max_new_tokens"],
                  "mini_batch_size": c["mini"], "lr": c["lr"], "beta": c["beta"],
                  "seed": c["seed"], "eval_every": 0, "save_every": 1000000, "threads": 1,
                  "progress": False, "seq_eval_size": 16, **model_args()})
    train(parse_config(argv))
    rows = [json.loads(x) for x in (out / "ours" / "metrics.jsonl").read_text().splitlines()]
    times = [r["time_step"] for r in rows[1:-1]]
    return {
        "step_s": times,
        "peak_rss_mb": peak_rss_mb(),
        "rss_start_mb": rss_imports,
        "rss_python_mb": rss0,
        "reward": [r["reward"] for r in rows],
    }


def run_trl(out: Path, steps: int, model_dir: Path) -> dict:
    rss0 = rss_mb()
    import torch
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rss_imports = rss_mb()
    torch.set_num_threads(1)
    c = COMMON
    EOS = 13  # SeqTask.EOS
    g = torch.Generator().manual_seed(c["seed"] + 2)
    ab = torch.randint(0, 100, (c["prompts"] * (steps + 2), 2), generator=g).tolist()
    data = [
        {
            "prompt": "<bos> " + " ".join(f"{a:02d}") + " + " + " ".join(f"{b:02d}") + " =",
            "answer": [int(x) for x in reversed(str(a + b))],
        }
        for a, b in ab
    ]

    def reward(prompts, completions, completion_ids, answer, **_):
        # the seq task's verifier: exact reversed digits of a+b followed by EOS
        return [float(list(ids) == ans + [EOS]) for ids, ans in zip(completion_ids, answer)]

    stamps = []
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=10**6,
        max_steps=4 * steps,
        learning_rate=c["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=c["seed"],
        per_device_train_batch_size=c["mini"],
        gradient_accumulation_steps=1,
        steps_per_generation=c["prompts"] * c["group"] // c["mini"],
        num_generations=c["group"],
        max_completion_length=c["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=c["beta"],
        epsilon=0.2,
        epsilon_high=0.28,
        num_iterations=1,
        loss_type="grpo",
        dataloader_num_workers=0,
        bf16=False,
        disable_dropout=True,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(data),
        callbacks=[step_timer(stamps)],
    )
    assert trainer.ref_model is not None, "TRL with beta > 0 should hold a reference model"
    trainer.train()
    cycles = rollout_cycles(stamps, args.steps_per_generation)  # per rollout batch
    return {
        "step_s": cycles[1:],
        "peak_rss_mb": peak_rss_mb(),
        "rss_start_mb": rss_imports,
        "rss_python_mb": rss0,
        "trl_version": trl.__version__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="rollout batches per trainer")
    ap.add_argument("--out", default="runs/bench_trainer")
    ap.add_argument(
        "--hidden", type=int, default=None, help="seq model width (default: the task's, 128)"
    )
    ap.add_argument(
        "--layers", type=int, default=None, help="seq model layers (default: the task's, 2)"
    )
    ap.add_argument("--_worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    MODEL.update({k: v for k, v in (("hidden", a.hidden), ("layers", a.layers)) if v is not None})
    out = Path(a.out) / (f"h{a.hidden}-l{a.layers}" if MODEL else "default")
    if a._worker:
        res = (
            run_ours(out, a.steps) if a._worker == "ours" else run_trl(out, a.steps, out / "model")
        )
        (out / f"{a._worker}.json").write_text(json.dumps(res))
        return
    out.mkdir(parents=True, exist_ok=True)
    import shutil

    for d in ("ours", "trl"):
        shutil.rmtree(out / d, ignore_errors=True)
    prepare(out)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for w in ("ours", "trl"):
        argv = [*flags({"steps": a.steps, "out": a.out, **MODEL}), "--_worker", w]
        run_worker(__spec__.name, argv, env, w)
    ours, trl_ = (json.loads((out / f"{w}.json").read_text()) for w in ("ours", "trl"))
    med = lambda r: statistics.median(r["step_s"])
    from safetensors.torch import load_file

    n_params = sum(t.numel() for t in load_file(str(out / "model" / "model.safetensors")).values())
    print(
        f"\nseq task, Qwen3 with {n_params / 1e6:.2f}M parameters, {COMMON['prompts']} prompts x "
        f"{COMMON['group']} responses, "
        f"{COMMON['max_new_tokens']} new tokens, 4 optimizer steps per rollout batch, "
        f"beta={COMMON['beta']}, "
        f"CPU fp32, 1 thread; TRL {trl_['trl_version']}; medians over {len(ours['step_s'])} "
        "(ours) / "
        f"{len(trl_['step_s'])} (TRL) steps\n"
    )
    for r in ratio_rows(ours, trl_, [("seconds per training step (median)", "step_s", ".3f"),
                                     ("peak RSS (MiB)", "peak_rss_mb", ".0f"),
                                     ("RSS after imports (MiB)", "rss_start_mb", ".0f")]):
        print(r)
    po, pt = ours["peak_rss_mb"] - ours["rss_start_mb"], trl_["peak_rss_mb"] - trl_["rss_start_mb"]
    print(f"| peak RSS above imports (MiB) | {po:.0f} | {pt:.0f} | {po / pt:.2f} |")
    print(f"\nspeed-up (TRL time / ours): {med(trl_) / med(ours):.2f}x")


if __name__ == "__main__":
    main()
