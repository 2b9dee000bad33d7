"""The paper's hyperparameters and the full-scale math presets built from them.

PAPER_HPARAMS records what the paper states (app:detailed_exp_setup_choices, sec:experiments) and,
marked "released code", what its released scripts use (shared/REFERENCE_NOTES.md section 2).
MATH_PRESETS hold rpg_ref.train Config fields (only values that differ from the Config defaults);
MATH_TASK_OPTIONS the math task's options (rpg_ref.math_task.MathTask.Options) for each preset.
trainer_presets() merges the two into rpg_ref.train's PRESETS format ("math_<option>" keys), which
the trainer adds to its own presets: these values live only here.

One GPU instead of 8: the rollout batch stays 512 prompts x 16 responses; each optimizer step uses
512 responses (the paper's per-GPU mini-batch of 32 prompts x 16 responses), so a rollout batch gives
16 optimizer steps as in the paper, and each optimizer step accumulates gradients over micro-batches.
"""
from __future__ import annotations

PAPER_HPARAMS = {
    "model": "Qwen3-4B",
    "train_data": "DAPO-Math-17k (13.9k English samples)",
    "eval": "Mean@32 on AIME24, AIME25, AMC23",
    "optimizer": "AdamW",
    "lr": 1e-6,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "steps": 400,
    "warmup_steps": 10,                   # then constant
    "prompts_per_step": 512,              # "global training batch size"
    "group_size": 16,                     # responses per prompt
    "temperature": 1.0,
    "mini_batch_prompts_per_gpu": 32,
    "gpus": "8x H100",
    "beta": 1e-4,
    "clip_rpg": (0.2, 0.28),              # RPG, RPG-REINFORCE and DAPO
    "clip_grpo": (0.1, 0.1),              # appendix; sec:experiments says (0.2, 0.2) for GRPO
    "clip_grpo_main_text": (0.2, 0.2),
    "response_lengths": (2048, 4096, 8192),  # the 2K / 4K / 8K runs
    "max_len_note": "appendix: max training and rollout length 4,096 tokens for the 2K context "
                    "length and 8,192 for 4K, with dynamic batching",
    "dynamic_sampling": True,             # DAPO group filtering (sec:experiments)
    "overlong_punishment": True,          # DAPO reward shaping (sec:experiments)
    "rpg_style_clip": True,               # for the REINFORCE-style losses at scale
    "framework": "verl + vLLM",
    # released code (REFERENCE_NOTES section 2), not stated in the paper's text:
    "dual_clip_c_released_code": 10.0,
    "overlong_buffer_released_code": 512,
    "reward_released_code": "+1 / -1 on the last 'Answer:' line",
    "lr_reinforce_scripts_released_code": 5e-7,
}

_PAPER_TRAIN = dict(
    task="math", engine="vllm", algo="rpg-reinforce-urkl", adv="auto", ref="iterative",
    beta=PAPER_HPARAMS["beta"], clip=[*PAPER_HPARAMS["clip_rpg"], PAPER_HPARAMS["dual_clip_c_released_code"]],
    prompts_per_step=PAPER_HPARAMS["prompts_per_step"], group_size=PAPER_HPARAMS["group_size"],
    temperature=PAPER_HPARAMS["temperature"], top_p=1.0,
    dynamic_sampling=True, overlong_buffer=PAPER_HPARAMS["overlong_buffer_released_code"], overlong_penalty=1.0,
    mini_batch_size=PAPER_HPARAMS["mini_batch_prompts_per_gpu"] * PAPER_HPARAMS["group_size"],  # 512
    micro_batch_size=1,                  # gradient accumulation: 512 sequences per optimizer step, one at a
                                         # time (the memory budget in docs/ assumes a micro-batch of 1)
    lr=PAPER_HPARAMS["lr"], weight_decay=PAPER_HPARAMS["weight_decay"], grad_clip=PAPER_HPARAMS["grad_clip"],
    warmup_steps=PAPER_HPARAMS["warmup_steps"], lr_decay="constant", steps=PAPER_HPARAMS["steps"],
    eval_every=10, save_every=10,
)

MATH_PRESETS: dict[str, dict] = {
    "qwen3-4b-h100": dict(_PAPER_TRAIN, max_new_tokens=2048),
    "qwen3-4b-h100-4k": dict(_PAPER_TRAIN, max_new_tokens=4096),
    "qwen3-4b-h100-8k": dict(_PAPER_TRAIN, max_new_tokens=8192),
    # the same recipe on a smaller model (fits easily; a quick end-to-end check of a setup)
    # micro-batch 4: the trainer materializes fp32 logits [micro, 2K, 151936] (~5 GB per copy)
    "qwen3-0.6b-h100": dict(_PAPER_TRAIN, max_new_tokens=2048, micro_batch_size=4),
}

# `rpg-train --task math` (no --preset): the paper's recipe on the HF engine (the math task's default
# engine, runs anywhere; add --engine vllm on a GPU with vLLM installed)
MATH_PRESETS["math"] = {k: v for k, v in MATH_PRESETS["qwen3-4b-h100"].items() if k != "engine"}

_PAPER_TASK = {"train_data": "deepmath_int", "eval_data": ["aime24", "aime25", "amc23"], "eval_n": 32,
               "eval_k": [32], "prompt": "answer", "enable_thinking": False, "scoring": "pm1",
               # docs/memory_budget_qwen3_4b_h100.md: fp32 master weights, bf16 compute, checkpointing
               "dtype": "bf16-autocast", "gradient_checkpointing": True}
MATH_TASK_OPTIONS: dict[str, dict] = {
    "qwen3-4b-h100": {"model": "Qwen/Qwen3-4B", **_PAPER_TASK},
    "qwen3-0.6b-h100": {"model": "Qwen/Qwen3-0.6B", **_PAPER_TASK},
}
MATH_TASK_OPTIONS["qwen3-4b-h100-4k"] = MATH_TASK_OPTIONS["qwen3-4b-h100"]
MATH_TASK_OPTIONS["qwen3-4b-h100-8k"] = MATH_TASK_OPTIONS["qwen3-4b-h100"]
MATH_TASK_OPTIONS["math"] = MATH_TASK_OPTIONS["qwen3-4b-h100"]

# The vLLM engine's settings for these presets are its Options defaults (rpg_ref/engines/vllm_engine.py:
# gpu_memory_utilization 0.4, the memory budget's "trainer state kept on the GPU" column; sleep level 1).


def trainer_presets() -> dict[str, dict]:
    """MATH_PRESETS with MATH_TASK_OPTIONS merged in as "math_<option>" keys: rpg_ref.train's PRESETS
    format (the trainer adds these to its own presets; the values live only here)."""
    return {name: {**p, **{f"math_{k}": v for k, v in MATH_TASK_OPTIONS[name].items()}}
            for name, p in MATH_PRESETS.items()}
