"""rpg-train's configuration: the ``Config`` dataclass, the named presets, and validation.

Each field's ``help`` is its --help text (rpg_ref/cli.py builds the parser from this dataclass).
A preset holds only the values that differ from the dataclass defaults; options of a task or an
engine are written "<task>_<option>". A loss's own options (beta, clip, level, agg) are resolved
and checked once by rpg_ref.core.losses.run_options (``loss_options``: the frozen value the loop
passes to every loss call); ``validate`` states every other rule once.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import rpg_ref.core.losses as L
import rpg_ref.trainer.rollout_correction as RC
from rpg_ref.core.advantages import ADVANTAGES, GROUP_ESTIMATORS
from rpg_ref.registry import ENGINES, TASKS, resolve
from rpg_ref.strict_json import loads
from rpg_ref.trainer.checkpoint import latest_step


def _f(default, help: str, **kw):
    """A dataclass field whose ``help`` is its --help text (the single source of truth)."""
    if isinstance(default, (list, dict)):  # mutable: a fresh copy each
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class Config:
    # --- run ---
    preset: str = _f(
        "seq",
        "named preset of hyperparameters (see PRESETS); explicit flags "
        "override it. Default: the preset named like --task if there is one, else 'seq'",
    )
    task: str = _f("seq", "task: one of rpg_ref.registry.TASKS (bandit, seq, math)")
    out: str | None = _f(None, "output folder (default runs/<task>-<algo>-s<seed>)")
    resume: str | None = _f(
        None, "continue the run stored in this output folder (its config is reused)"
    )
    seed: int = _f(0, "random seed (python, numpy, torch): prompts, sampling, shuffling")
    init_seed: int | None = _f(
        None,
        "seed of the initialization: the model's random init and the task's warm start (the seq "
        "task's supervised phase and its cache key, the bandit's initial logits); default "
        "--seed. Runs with one --init-seed and different --seed share their initial weights",
    )
    steps: int = _f(60, "training steps; one step = one rollout batch and its inner optimizer loop")
    device: str = _f("auto", "cpu, cuda, cuda:N or auto (cuda when available)")
    threads: int = _f(0, "torch CPU threads (0 = torch's default; 1 is fastest for tiny models)")
    dist_timeout: float = _f(
        1800.0,
        "under torchrun: seconds a rank waits in a collective before the "
        "run stops with an error (a hung rank; a dead one stops it at once)",
    )
    cache_dir: str = _f(
        "runs/cache", "cache for task artifacts (e.g. the seq task's warm-started weights)"
    )
    # --- algorithm ---
    algo: str = _f("rpg-reinforce-urkl", "loss: a name in rpg_ref.core.losses.LOSSES")
    beta: float = _f(1e-3, "KL coefficient (for reinforce++ it enters the reward; dapo has no KL "
                     "and uses 0 unless --beta is given)")
    adv: str = _f(
        "auto",
        "advantage estimator in rpg_ref.core.advantages.ADVANTAGES; auto = the loss's default",
    )
    clip: list | None = _f(None, "clipping eps_low eps_high [c]: PPO / RPG-Style dual clip (c > 1, "  # noqa: RUF009
                           "'inf' = no dual bound). Default: the loss's own (none for rpg losses)",
                           nargs="+")
    no_clip: bool = _f(False, "no clipping (rpg losses only; PPO-type baselines always clip)")
    level: str = _f("token", f"importance-ratio level: one of {L.LEVELS}")
    agg: str = _f("token-mean", f"loss aggregation: one of {L.AGGREGATIONS}")
    ref: str = _f("iterative", "pi_ref: 'iterative' (pi_ref = pi_old, one model) or 'init' (frozen "
                  "initial policy, a second model)")
    # --- rollout ---
    engine: str = _f("auto", "sampler: one of rpg_ref.registry.ENGINES; auto = the task's default")
    prompts_per_step: int = _f(16, "prompts per rollout batch")
    group_size: int = _f(8, "responses per prompt (G)")
    temperature: float = _f(
        1.0, "sampling temperature (log-probs are computed at the same temperature)"
    )
    top_p: float = _f(1.0, "nucleus sampling threshold in (0, 1]")
    max_new_tokens: int = _f(8, "maximum response length in tokens")
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: drop groups whose rewards are all "
                                "equal and sample more prompts to refill the batch")
    dynamic_sampling_rounds: int = _f(
        8,
        "cap on generation rounds per step for dynamic sampling; "
        "when hit, the batch is completed with dropped groups (dyn_filled=0)",
    )
    overlong_buffer: int = _f(0, "DAPO soft overlong punishment: penalty rises linearly from 0 to "
                              "-overlong_penalty over the last this-many tokens before "
                              "max_new_tokens (0 = off)")
    overlong_penalty: float = _f(1.0, "size of the overlong penalty at max_new_tokens")
    sampler_lag: int = _f(
        0,
        "K: step t samples with the policy of K updates before (the weights after t-1-K "
        "updates, the initial ones for the first K steps) and keeps the sampler's log-probs, as "
        "an asynchronous trainer does; pi_old stays the policy at the start of step t, so "
        "--rollout-correction tis|mis corrects the staleness (docs/trainer.md). 0: on-policy",
    )
    rollout_correction: str = _f(
        "none",
        "weight each sample's loss by pi_old / pi_sampler from the "
        "engine's log-probs: 'none', 'tis' (truncated at the cap) or 'mis' "
        "(masked to 0 above the cap); docs/rollout_correction.md",
    )
    rollout_correction_level: str = _f(
        "token",
        "importance weight per 'token' (biased, low variance) "
        "or per 'sequence' (exact without a cap)",
    )
    rollout_correction_cap: float = _f(
        2.0, "cap C >= 1 on the weight pi_old / pi_sampler (inf = no cap)"
    )
    # --- update ---
    mini_batch_size: int = _f(32, "responses per optimizer step")
    micro_batch_size: int = _f(
        0, "responses per forward/backward (gradient accumulation); 0 = mini-batch"
    )
    micro_batch_tokens: int = _f(0, "at most this many tokens per forward/backward (rows x longest "
                                 "prompt+response; sequences sorted by length first; 0 = no limit)")
    logprob_chunk: int = _f(0, "response tokens per LM-head call in log-prob passes (0 = auto: "
                            "512 MiB of fp32 logits, 883 tokens for Qwen3's vocabulary)")
    updates_per_step: int | None = _f(None, "K: max optimizer steps per rollout batch (default one "
                                      "pass: batch / mini_batch_size)")
    kappa: float = _f(
        math.inf,
        "stop the inner loop when the running token-level KL(pi_theta||pi_old) "
        "estimate exceeds this (inf = never)",
    )
    lr: float = _f(1e-3, "AdamW learning rate")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_betas: list = _f([0.9, 0.999], "AdamW betas", nargs=2)  # noqa: RUF009
    grad_clip: float = _f(1.0, "max gradient norm (0 = no clipping; the norm is logged either way)")
    warmup_steps: int = _f(0, "linear learning-rate warm-up, in training steps")
    lr_decay: str = _f("constant", "after warm-up: 'constant' or 'cosine' (to 0 at the last step)")
    # --- logging / checkpoints ---
    eval_every: int = _f(0, "evaluate every this many steps (0 = only at the end)")
    save_every: int = _f(10, "checkpoint every this many steps (and at the end)")
    keep_checkpoints: int = _f(1, "checkpoints kept on disk: the latest N (0 = all)")
    progress: bool = _f(True, "progress bar (tqdm when installed)")
    tensorboard: bool = _f(False, "also log to TensorBoard (needs the tensorboard package)")
    # --- filled from the task's / engine's Options (--<task>-<option>, --<engine>-<option>) ---
    task_options: dict = _f({}, "task-specific options (set with --<task>-<option>)", cli=False)  # noqa: RUF009
    engine_options: dict = _f(  # noqa: RUF009
        {}, "engine-specific options (set with --<engine>-<option>)", cli=False)


# =============================================================================================
# presets
# =============================================================================================

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
DEFAULT_PRESET = "seq"


def preset_for(task: str | None, preset: str | None) -> str:
    """The preset a run uses: the one named, else the one named like the task, else the default."""
    name = preset or (task if task in PRESETS else DEFAULT_PRESET)
    if name not in PRESETS:
        raise ValueError(f"bad configuration: unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return name


# =============================================================================================
# resolution: what the loop hands to the loss and the advantage estimator
# =============================================================================================


def loss_options(cfg: Config) -> L.LossOptions:
    """The loss's options, resolved once: beta split between the loss and the reward, the clip
    bounds (the loss's default without --clip), level and aggregation."""
    return L.run_options(cfg.algo, beta=cfg.beta, clip=cfg.clip, level=cfg.level, agg=cfg.agg,
                         no_clip=cfg.no_clip)


def resolved_adv(cfg: Config) -> str:
    return L.SPECS[cfg.algo].advantage if cfg.adv == "auto" else cfg.adv


def fill_options(cfg: Config, flags: dict, owners: dict) -> None:
    """Resolve engine 'auto' and fill cfg.task_options / cfg.engine_options from the task's and the
    engine's Options defaults, the preset's entries and ``flags`` ({"<name>_<option>": value});
    ``owners`` maps each such key to "task:<name>" or "engine:<name>"."""
    task_cls = resolve(TASKS, cfg.task, "task")
    cfg.engine = task_cls.default_engine if cfg.engine == "auto" else cfg.engine
    engine_cls = resolve(ENGINES, cfg.engine, "engine")
    for dest in flags:
        if owners[dest] not in (f"task:{cfg.task}", f"engine:{cfg.engine}"):
            raise ValueError(f"bad configuration: --{dest.replace('_', '-')} is an option of "
                             f"{owners[dest]}, but this run uses task {cfg.task!r} and engine "
                             f"{cfg.engine!r}")
    for key, cls, name in (
        ("task_options", task_cls, cfg.task),
        ("engine_options", engine_cls, cfg.engine),
    ):
        mine = {
            d[len(name) + 1 :]: v
            for d, v in flags.items()
            if owners[d] in (f"task:{name}", f"engine:{name}")
        }
        base = dataclasses.asdict(cls.Options()) if hasattr(cls, "Options") else {}
        unknown = set(getattr(cfg, key)) - set(base)
        if unknown:
            raise ValueError(f"bad configuration: unknown {key} for {name}: {sorted(unknown)}; "
                             f"valid: {sorted(base)}")
        setattr(cfg, key, {**base, **getattr(cfg, key), **mine})
        if hasattr(cls, "Options"):
            # an Options class may check its values (__post_init__)
            cls.Options(**getattr(cfg, key))


# =============================================================================================
# validation: every rule once
# =============================================================================================


def validate(cfg: Config) -> None:
    """Refuse a bad configuration with one clear message (ValueError), before any work is done."""

    def bad(msg):
        raise ValueError(f"bad configuration: {msg}")

    try:  # the loss's own rules: name, beta, clip, level, agg
        loss_options(cfg)
    except ValueError as e:
        bad(f"--algo {cfg.algo}: {e}")
    resolve(TASKS, cfg.task, "task")
    if cfg.engine != "auto":
        resolve(ENGINES, cfg.engine, "engine")
    spec, adv = L.SPECS[cfg.algo], resolved_adv(cfg)
    if adv not in ADVANTAGES:
        bad(f"unknown advantage estimator --adv {cfg.adv!r}; valid: auto, {', '.join(ADVANTAGES)}")
    if adv.startswith("reinforce++") != spec.kl_in_reward:
        bad(
            f"--adv {adv} does not fit --algo {cfg.algo} (reinforce++ losses need reinforce++ "
            "advantages)"
        )
    if cfg.group_size < 1 or cfg.prompts_per_step < 1:
        bad(
            f"--group-size ({cfg.group_size}) and --prompts-per-step ({cfg.prompts_per_step}) "
            "must be >= 1"
        )
    if cfg.group_size == 1 and adv in GROUP_ESTIMATORS:
        bad(f"--group-size 1 with the group baseline {adv!r}: every advantage would be 0; use "
            f"--group-size >= 2 or --adv batch-mean")
    if cfg.updates_per_step is not None and cfg.updates_per_step < 1:
        bad(f"K = --updates-per-step must be >= 1, got {cfg.updates_per_step}")
    if not cfg.kappa > 0:
        bad(f"--kappa must be > 0 (inf disables the KL early stop), got {cfg.kappa}")
    n = cfg.prompts_per_step * cfg.group_size
    if cfg.mini_batch_size < 1 or n % cfg.mini_batch_size:
        bad(f"the batch ({cfg.prompts_per_step} prompts x {cfg.group_size} = {n} responses) is not "
            f"divisible into mini-batches of --mini-batch-size {cfg.mini_batch_size}")
    if cfg.micro_batch_size < 0 or (
        cfg.micro_batch_size and cfg.mini_batch_size % cfg.micro_batch_size
    ):
        bad(f"--mini-batch-size {cfg.mini_batch_size} is not divisible into micro-batches of "
            f"--micro-batch-size {cfg.micro_batch_size}")
    if cfg.micro_batch_tokens < 0 or cfg.logprob_chunk < 0:
        bad(
            f"--micro-batch-tokens ({cfg.micro_batch_tokens}) and --logprob-chunk "
            f"({cfg.logprob_chunk}) "
            f"must be >= 0 (0 = no limit / auto)"
        )
    if not cfg.temperature > 0:
        bad(f"--temperature must be > 0, got {cfg.temperature}")
    if not 0 < cfg.top_p <= 1:
        bad(f"--top-p must be in (0, 1], got {cfg.top_p}")
    if cfg.threads < 0:
        bad(f"--threads must be >= 0, got {cfg.threads}")
    if cfg.keep_checkpoints < 0 or cfg.save_every < 1:
        bad(f"need --keep-checkpoints >= 0 and --save-every >= 1; got {cfg.keep_checkpoints}, "
            f"{cfg.save_every}")
    check_device(cfg.device)
    if cfg.steps < 1:
        bad(f"--steps must be >= 1, got {cfg.steps}")
    if cfg.max_new_tokens < 1:
        bad(f"--max-new-tokens must be >= 1, got {cfg.max_new_tokens}")
    if not cfg.lr > 0 or cfg.weight_decay < 0 or cfg.grad_clip < 0:
        bad(
            f"need --lr > 0, --weight-decay >= 0, --grad-clip >= 0; got {cfg.lr}, "
            f"{cfg.weight_decay}, "
            f"{cfg.grad_clip}"
        )
    if cfg.ref not in ("iterative", "init"):
        bad(f"--ref must be 'iterative' or 'init', got {cfg.ref!r}")
    if cfg.lr_decay not in ("constant", "cosine"):
        bad(f"--lr-decay must be 'constant' or 'cosine', got {cfg.lr_decay!r}")
    if cfg.overlong_buffer < 0 or cfg.overlong_buffer > cfg.max_new_tokens:
        bad(f"--overlong-buffer must be in [0, --max-new-tokens {cfg.max_new_tokens}], got "
            f"{cfg.overlong_buffer}")
    if cfg.dynamic_sampling and cfg.dynamic_sampling_rounds < 1:
        bad(f"--dynamic-sampling-rounds must be >= 1, got {cfg.dynamic_sampling_rounds}")
    if cfg.dynamic_sampling and cfg.group_size < 2:
        bad("--dynamic-sampling needs --group-size >= 2 (a group of one always has equal rewards)")
    if type(cfg.sampler_lag) is not int or cfg.sampler_lag < 0:
        bad(f"--sampler-lag must be an integer >= 0 (0: sample with the current policy), got "
            f"{cfg.sampler_lag!r}")
    if cfg.init_seed is not None and type(cfg.init_seed) is not int:
        bad(f"--init-seed must be an integer (or left out: --seed), got {cfg.init_seed!r}")
    check_rollout_correction(cfg)
    if cfg.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as e:
            bad(f"--tensorboard needs the tensorboard package ({e}); pip install tensorboard")
    check_output_folder(cfg)


def check_rollout_correction(cfg: Config) -> None:
    """--rollout-correction needs the sampler's log-probs of the distribution it samples from."""
    mode, level, cap = (
        cfg.rollout_correction,
        cfg.rollout_correction_level,
        cfg.rollout_correction_cap,
    )
    try:
        RC.check_options(mode, level, cap)
    except ValueError as e:
        raise ValueError(f"bad configuration: --rollout-correction: {e}") from None
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    if mode == "none":
        given = [
            f"--{k.replace('_', '-')}"
            for k in ("rollout_correction_level", "rollout_correction_cap")
            if getattr(cfg, k) != defaults[k]
        ]
        if given:
            raise ValueError(
                f"bad configuration: {' and '.join(given)} given without --rollout-correction "
                f"tis|mis; add one, or drop them"
            )
        return
    if level == "token" and cfg.level == "sequence":
        raise ValueError("bad configuration: --rollout-correction-level token weights tokens, but "
                         "--level sequence makes a whole response one unit of the loss; use "
                         "--rollout-correction-level sequence")
    if cfg.top_p < 1:
        raise ValueError(
            f"bad configuration: --rollout-correction {mode} with --top-p {cfg.top_p}: the "
            f"sampler never draws tokens outside the nucleus, so pi_old / pi_sampler cannot "
            f"restore them; use --top-p 1"
        )
    task_cls = resolve(TASKS, cfg.task, "task")
    engine = task_cls.default_engine if cfg.engine == "auto" else cfg.engine
    missing = getattr(
        resolve(ENGINES, engine, "engine"),
        "sampler_logprobs_missing",
        lambda cfg: "it does not declare sampler_logprobs_missing (rpg_ref.interfaces.Engine)",
    )
    why = missing(cfg)
    if why is not None:
        raise ValueError(f"bad configuration: --rollout-correction {mode} needs the sampler's own "
                         f"log-probs, which engine {engine!r} does not report here ({why}); use "
                         f"--rollout-correction none or another --engine")


def check_device(name: str) -> None:
    """--device must name a device this machine has (checked before anything is built)."""
    if name == "auto":
        return
    try:
        dev = torch.device(name)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"bad configuration: --device {name!r} is not cpu, cuda, cuda:N or auto")
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "no GPU is visible" if torch.version.cuda else "this torch is a CPU-only build"
        raise ValueError(f"bad configuration: --device {name}: CUDA is not available here ({why}); "
                         f"use --device cpu (or auto)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"bad configuration: --device {name}: this machine has "
            f"{torch.cuda.device_count()} GPU(s) (cuda:0..cuda:{torch.cuda.device_count() - 1})"
        )


def check_output_folder(cfg: Config) -> None:
    """OUT must be a folder we can create or reuse; a new run never writes into another run."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"bad configuration: --out {out} exists and is not a folder; choose another --out"
        )
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not os.access(ancestor, os.W_OK):
        raise ValueError(
            f"bad configuration: --out {out}: cannot write in {ancestor}; choose another --out"
        )
    if not cfg.resume and (out / "config.json").exists():
        stored = loads((out / "config.json").read_text())
        diff = sorted(k for k, v in dataclasses.asdict(cfg).items()
                      if stored.get(k) != v and k not in ("progress", "tensorboard", "resume"))
        if not diff and latest_step(out) == 0:
            return  # the same run, stopped before its first checkpoint: it starts again from step 1
        what = f"a different config (fields {diff})" if diff else "the same config"
        raise ValueError(f"bad configuration: output folder {out} already holds a run with {what}; "
                         f"pass --resume {out} to continue it, or choose another --out")
