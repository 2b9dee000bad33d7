"""rpg-train's named presets, and the paper's hyperparameters they come from: data only.

A preset holds the values that differ from ``Config``'s defaults (rpg_ref/trainer/config.py),
keyed like flags: a field's name, or "<task>_<option>" / "<engine>_<option>" for an option of a
task or an engine. ``config.from_preset`` applies one; explicit flags override it.
"""

from __future__ import annotations

from typing import Any

# What the paper states (app:detailed_exp_setup_choices, sec:experiments) and, marked "released
# code", what its released training scripts use (docs/paper_code.md).
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
    # released code, not stated in the paper's text:
    "dual_clip_c_released_code": 10.0,
    "overlong_buffer_released_code": 512,
    "reward_released_code": "+1 / -1 on the last 'Answer:' line",
    "lr_reinforce_scripts_released_code": 5e-7,
}

# The paper's recipe on one GPU: the rollout batch stays 512 prompts x 16 responses; each optimizer
# step uses 512 responses (the paper's per-GPU mini-batch of 32 prompts x 16), so a rollout batch
# gives 16 optimizer steps as on 8 GPUs, each accumulating gradients over micro-batches.
_P = PAPER_HPARAMS
PAPER_RECIPE = dict(
    task="math",
    engine="vllm",
    algo="rpg-reinforce-urkl",
    adv="auto",
    ref="iterative",
    beta=_P["beta"],
    clip=[*_P["clip_rpg"], _P["dual_clip_c_released_code"]],
    prompts_per_step=_P["prompts_per_step"],
    group_size=_P["group_size"],
    temperature=_P["temperature"],
    top_p=1.0,
    dynamic_sampling=True,
    overlong_buffer=_P["overlong_buffer_released_code"],
    overlong_penalty=1.0,
    mini_batch_size=_P["mini_batch_prompts_per_gpu"] * _P["group_size"],  # 512
    # 512 sequences per optimizer step, one at a time (the memory budget's assumption)
    micro_batch_size=1,
    lr=_P["lr"],
    weight_decay=_P["weight_decay"],
    grad_clip=_P["grad_clip"],
    warmup_steps=_P["warmup_steps"],
    lr_decay="constant",
    steps=_P["steps"],
    eval_every=10,
    save_every=10,
    # the math task's options: fp32 master weights, bf16 compute, checkpointing
    # (docs/memory_budget_*)
    math_model="Qwen/Qwen3-4B",
    math_train_data="deepmath_int",
    math_eval_data=["aime24", "aime25", "amc23"],
    math_eval_n=32,
    math_eval_k=[32],
    math_prompt="answer",
    math_enable_thinking=False,
    math_scoring="pm1",
    math_dtype="bf16-autocast",
    math_gradient_checkpointing=True,
)

PRESETS: dict[str, dict[str, Any]] = {
    # K-armed bandit: large groups make the group-mean baseline's (1 - 1/G) shrink negligible, a
    # cosine-decayed learning rate lets Adam settle on the KL-regularized optimum.
    "bandit": {
        "task": "bandit",
        "steps": 300,
        "beta": 0.5,
        "prompts_per_step": 1,
        "group_size": 512,
        "max_new_tokens": 1,
        "mini_batch_size": 128,
        "lr": 0.05,
        "grad_clip": 0.0,
        "lr_decay": "cosine",
        "save_every": 50,
        "threads": 1,
    },
    # digit addition with a tiny Qwen3 (warm-started by a short supervised phase, cached), with
    # RPG-Style Clip at the paper's (eps_low, eps_high) = (0.2, 0.28) and dual-clip c = 3.
    "seq": {
        "task": "seq",
        "steps": 80,
        "max_new_tokens": 5,
        "lr": 3e-4,
        "clip": [0.2, 0.28, 3.0],
        "eval_every": 20,
        "save_every": 20,
        "threads": 1,
    },
    # addition with a written scratchpad (rpg_ref/tasks/carry.py, docs/carry_task.md)
    # the setting the carry calibration chose (small_scale/RESULTS.md): a frozen reference (the
    # warm start) at beta 0.1, the task's token cost 0.02, one update of the 128 responses per batch
    "carry": {
        "task": "carry",
        "steps": 40,
        "max_new_tokens": 40,
        "lr": 3e-4,
        "ref": "init",
        "beta": 0.1,
        "mini_batch_size": 128,
        "updates_per_step": 1,
        "clip": [0.2, 0.28, 3.0],
        "eval_every": 10,
        "save_every": 20,
        "threads": 1,
    },
    # the paper's run: Qwen3-4B at 2K / 4K / 8K responses with a colocated vLLM
    "qwen3-4b-h100": dict(PAPER_RECIPE, max_new_tokens=2048),
    "qwen3-4b-h100-4k": dict(PAPER_RECIPE, max_new_tokens=4096),
    "qwen3-4b-h100-8k": dict(PAPER_RECIPE, max_new_tokens=8192),
    # the same recipe on a smaller model, micro-batches of 4 responses (chosen when the trainer
    # still materialized full fp32 logits; with the chunked LM head a token budget may do better:
    # untuned)
    "qwen3-0.6b-h100": dict(
        PAPER_RECIPE, max_new_tokens=2048, micro_batch_size=4, math_model="Qwen/Qwen3-0.6B"
    ),
}
# `rpg-train --task math` (no --preset): the paper's recipe on the math task's default engine (hf)
PRESETS["math"] = {k: v for k, v in PRESETS["qwen3-4b-h100"].items() if k != "engine"}
# the math pipeline on a CPU in about a minute: a tiny random Qwen3 (the real tokenizer and chat
# template), real training problems, the paper's loss and clip, DAPO's overlong penalty over the
# last 8 of 32 tokens, then Mean@k / Pass@k on 8 AMC23 problems. It checks the pipeline, not the
# learning: random text never ends nor holds an answer, so every reward is -1 - 1 (wrong, overlong).
PRESETS["math-cpu"] = dict(
    PRESETS["math"], device="cpu", threads=1, steps=4, prompts_per_step=4, group_size=4,
    max_new_tokens=32, dynamic_sampling=False, overlong_buffer=8, mini_batch_size=8,
    micro_batch_size=0, lr=1e-4, warmup_steps=0, eval_every=0, save_every=2,
    math_model="tiny-qwen3", math_train_limit=256, math_eval_data=["amc23"], math_eval_limit=8,
    math_eval_n=2, math_eval_k=[1, 2], math_dtype="float32", math_gradient_checkpointing=False)
# a real pretrained model on a CPU: SmolLM2-135M-Instruct (the smollm2 extra, docs/smollm2.md)
# learns two-digit sums. It writes "a + b = c" however it is asked and is scored on c (the number
# after the last "="), so a gain cannot come from a format it learns; held-out pairs of numbers are
# never trained on (rpg_ref.math.arithmetic), evaluated greedily with the cap-hit share and the
# strict (bare number) score beside. The base model is the KL reference. Cheap where a 135M model
# costs on a CPU: 24-token responses, the last 10 of 30 layers trained (the tied 49k-token
# embedding frozen), one update per batch, the LM head applied to response tokens only.
PRESETS["smollm2-cpu"] = dict(
    PRESETS["math"], device="cpu", threads=2, steps=60, prompts_per_step=8, group_size=8,
    max_new_tokens=24, dynamic_sampling=False, overlong_buffer=0, mini_batch_size=64,
    micro_batch_size=0, updates_per_step=1, lr=1e-5, warmup_steps=0, eval_every=10,
    save_every=20, ref="init", beta=0.01, math_model="smollm2-135m-instruct",
    math_train_data="arith:add-2d:train", math_eval_data=["arith:add-2d:heldout"], math_eval_n=1,
    math_eval_k=[1], math_eval_temperature=0.0, math_prompt="number", math_scoring="binary",
    math_dtype="float32", math_gradient_checkpointing=False, math_train_layers=10)
DEFAULT_PRESET = "seq"
