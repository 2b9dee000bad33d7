"""rpg-train: one readable file that trains a policy with every loss of the RPG paper.

Read it top to bottom; the sections follow the data:

    1. config      one dataclass (its field help is the --help text) + named presets
    2. tasks       where prompts, rewards and evaluation come from (bandit, seq; math plugs in)
    3. engines     who samples responses (HF ``generate``, a plain sampler; vLLM plugs in)
    4. rollout     sample a batch with pi_old, score it, DAPO dynamic sampling
    5. logprobs    behaviour / reference log-probs recomputed in one forward pass
    6. update      up to K optimizer steps on mini-batches, early stop at KL(pi_theta||pi_old) > kappa
    7. log/ckpt    metrics.jsonl, summary.json, atomic checkpoints, resume
    8. main        the loop

The loop is the paper's *iterative reference* scheme (sec:experiments, REFERENCE_NOTES §2):

    for step in 1..steps:
        batch  = sample(pi_old = current policy)             # engine.generate
        R      = reward(batch) (+ DAPO overlong penalty)      # task.reward
        old_lp = log pi_old(batch)   (stored once: these numbers are the ONLY copy of pi_old)
        A      = advantage(R)                                 # rpg_ref.advantages
        for k in 1..K (mini-batches, reshuffled every pass):
            loss, stats = LOSSES[algo](log pi_theta, old_lp, A, mask, beta, ref_logp, clip)
            if running mean of stats["kl_old"] > kappa: stop   # KL(pi_theta || pi_old) trust region
            optimizer step
        pi_old <- pi_theta                                   # nothing to copy: next step re-samples

With ``--ref iterative`` (default) pi_ref = pi_old, so ``ref_logp=None`` and one model lives in
memory. ``--ref init`` keeps a frozen copy of the initial policy as pi_ref (GRPO's setting): a
second model, whose log-probs are computed once per step next to pi_old's.

Losses and advantages are imported from rpg_ref.losses / rpg_ref.advantages, never re-implemented.

Metrics (one JSON object per step in OUT/metrics.jsonl):

    key                    meaning
    step                   training step = one rollout batch and its inner optimizer loop (1-based)
    reward                 mean reward of the batch (incl. overlong penalty), pi_old samples
    accuracy               fraction of responses the task's verifier marks correct
    entropy                token-mean entropy of pi_old (temperature-scaled) on the response tokens
    response_len           mean response length in tokens (EOS included)
    kl_old                 mean over mini-batches of stats["kl_old"], token-level KL(pi_theta||pi_old)
    kl_old_last            the running estimate (window = one pass) when the inner loop ended
    kl_ref                 token-mean k3 estimate of KL(pi_old || pi_ref) at rollout (0: iterative ref)
    kl_loss                mean over mini-batches of stats["kl"], the loss's own divergence estimate
    clip_frac_low/high/dual mean fractions of units clipped by the low / high / dual bound
    ratio_mean             mean importance ratio w over the mini-batches
    loss                   mean loss value over the mini-batches that were stepped
    grad_norm              mean gradient norm before clipping
    updates                optimizer steps taken this step (<= K); early_stop 1 if kappa stopped it
    lr                     learning rate used this step
    logprob_diff_max       max |sampler log-prob - recomputed log-prob| (engines that report them)
    dyn_rounds, dyn_kept   DAPO dynamic sampling: generation rounds, groups with non-constant rewards
    dyn_filled             1 if the batch was filled with informative groups, 0 if the cap was hit
    gen_tokens_per_s       generated tokens / rollout seconds
    train_tokens_per_s     response tokens processed by the optimizer loop / update seconds
    time_rollout, time_scoring, time_logprob, time_update, time_step   seconds per phase
    peak_mem_mb            peak RSS of the process (CPU) or max CUDA memory allocated (GPU), MiB
    eval_*                 task evaluation (every --eval-every steps and at the end)

Outputs: OUT/config.json, OUT/metrics.jsonl, OUT/summary.json, OUT/checkpoints/step_XXXXXX/
(model.safetensors, ref.safetensors with --ref init, optimizer.pt, rng.pt, state.json) and
OUT/checkpoints/LATEST. ``rpg-train --resume OUT`` continues a run; a run killed at any moment and
resumed ends with the same metrics and weights as an uninterrupted one (bitwise on CPU).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import hashlib
import importlib
import json
import math
import os
import random
import resource
import shutil
import sys
import time
import typing
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from rpg_ref.advantages import ADVANTAGES, GROUP_ESTIMATORS, compute_advantages
from rpg_ref.kl import k3
from rpg_ref.losses import AGGREGATIONS, LEVELS, LOSSES, SPECS
from rpg_ref.presets import trainer_presets

# =============================================================================================
# 1. config
# =============================================================================================


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
        "named preset of hyperparameters (see PRESETS); explicit flags override it. "
        "Default: the preset named like --task if there is one, else 'seq'",
    )
    task: str = _f("seq", "task: one of TASKS (bandit, seq, math: see rpg_ref/math_task.py)")
    out: str | None = _f(None, "output folder (default runs/<task>-<algo>-s<seed>)")
    resume: str | None = _f(
        None, "continue the run stored in this output folder (its config is reused)"
    )
    seed: int = _f(0, "random seed (python, numpy, torch)")
    steps: int = _f(60, "training steps; one step = one rollout batch and its inner optimizer loop")
    device: str = _f("auto", "cpu, cuda, cuda:N or auto (cuda when available)")
    threads: int = _f(0, "torch CPU threads (0 = torch's default; 1 is fastest for tiny models)")
    cache_dir: str = _f(
        "runs/cache", "cache for task artifacts (e.g. the seq task's warm-started weights)"
    )
    # --- algorithm ---
    algo: str = _f("rpg-reinforce-urkl", "loss: a name in rpg_ref.losses.LOSSES")
    beta: float = _f(
        1e-3,
        "KL coefficient (for reinforce++ it enters the reward; dapo has no KL and "
        "uses 0 unless --beta is given)",
    )
    adv: str = _f(
        "auto", "advantage estimator in rpg_ref.advantages.ADVANTAGES; auto = the loss's default"
    )
    clip: list | None = _f(  # noqa: RUF009 (_f returns a field)
        None,
        "clipping eps_low eps_high [c]: PPO / RPG-Style dual clip (c > 1, "
        "'inf' = no dual bound). Default: the loss's own (none for rpg losses)",
        nargs="+",
    )
    no_clip: bool = _f(False, "no clipping (rpg losses only; PPO-type baselines always clip)")
    level: str = _f("token", f"importance-ratio level: one of {LEVELS}")
    agg: str = _f("token-mean", f"loss aggregation: one of {AGGREGATIONS}")
    ref: str = _f(
        "iterative",
        "pi_ref: 'iterative' (pi_ref = pi_old, one model) or 'init' (frozen "
        "initial policy, a second model)",
    )
    # --- rollout ---
    engine: str = _f("auto", "sampler: one of ENGINES; auto = the task's default")
    prompts_per_step: int = _f(16, "prompts per rollout batch")
    group_size: int = _f(8, "responses per prompt (G)")
    temperature: float = _f(
        1.0, "sampling temperature (log-probs are computed at the same temperature)"
    )
    top_p: float = _f(1.0, "nucleus sampling threshold in (0, 1]")
    max_new_tokens: int = _f(8, "maximum response length in tokens")
    dynamic_sampling: bool = _f(
        False,
        "DAPO dynamic sampling: drop groups whose rewards are all equal "
        "and sample more prompts to refill the batch",
    )
    dynamic_sampling_rounds: int = _f(
        8,
        "cap on generation rounds per step for dynamic sampling; when "
        "hit, the batch is completed with dropped groups (dyn_filled=0)",
    )
    overlong_buffer: int = _f(
        0,
        "DAPO soft overlong punishment: penalty rises linearly from 0 to "
        "-overlong_penalty over the last this-many tokens before max_new_tokens "
        "(0 = off)",
    )
    overlong_penalty: float = _f(1.0, "size of the overlong penalty at max_new_tokens")
    # --- update ---
    mini_batch_size: int = _f(32, "responses per optimizer step")
    micro_batch_size: int = _f(
        0, "responses per forward/backward (gradient accumulation); 0 = mini-batch"
    )
    updates_per_step: int | None = _f(
        None, "K: max optimizer steps per rollout batch (default one pass: batch / mini_batch_size)"
    )
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
    progress: bool = _f(True, "progress bar (tqdm when installed)")
    tensorboard: bool = _f(False, "also log to TensorBoard (needs the tensorboard package)")
    # --- filled by parse_config from the task's / engine's Options (flags --<task>-<field>) ---
    task_options: dict = _f({}, "task-specific options (set with --<task>-<option>)", cli=False)  # noqa: RUF009
    engine_options: dict = _f(  # noqa: RUF009 (_f returns a field)
        {}, "engine-specific options (set with --<engine>-<option>)", cli=False
    )


# Named presets: only the values that differ from the dataclass defaults. Options of a task or an
# engine are written "<task>_<option>". Explicit flags override a preset.
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
}
# the math presets (rpg-train --task math, --preset qwen3-4b-h100[-4k|-8k], qwen3-0.6b-h100): their
# values live in rpg_ref/presets.py, the paper's hyperparameters recorded next to them
PRESETS.update(trainer_presets())
DEFAULT_PRESET = "seq"


def _hints() -> dict:
    return typing.get_type_hints(Config)


def _cli_type(tp) -> tuple[Any, bool]:
    """(element type, is_optional) for a field annotation."""
    args = typing.get_args(tp)
    optional = type(None) in args
    if optional:
        tp = next(a for a in args if a is not type(None))
    return tp, optional


def _option_flag_fields() -> list[tuple[str, str, dataclasses.Field, str, Any]]:
    """(dest, flag, field, owner, type) for every registered task's and engine's Options field."""
    out = []
    for kind, registry in (("task", TASKS), ("engine", ENGINES)):
        for name in registry:
            cls = _resolve(registry, name, kind, quiet=True)
            if cls is None or not hasattr(cls, "Options"):
                continue
            hints = typing.get_type_hints(cls.Options)
            for f in dataclasses.fields(cls.Options):
                dest = f"{name}_{f.name}"
                tp, _ = _cli_type(hints[f.name])
                out.append((dest, "--" + dest.replace("_", "-"), f, f"{kind}:{name}", tp))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rpg-train",
        description="Train with the RPG paper's losses (see rpg_ref/train.py).",
        argument_default=argparse.SUPPRESS,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    hints = _hints()
    for f in dataclasses.fields(Config):
        if not f.metadata.get("cli", True):
            continue
        tp, _ = _cli_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = "--" + f.name.replace("_", "-")
        helptext = f"{f.metadata['help']} (default: {default})"
        if tp is bool and f.name.startswith("no_"):
            p.add_argument(flag, action="store_true", help=helptext)
        elif tp is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, help=helptext)
        elif tp in (list, tuple) or "nargs" in f.metadata:
            p.add_argument(flag, nargs=f.metadata.get("nargs", "+"), type=str, help=helptext)
        else:
            p.add_argument(flag, type=tp, help=helptext)
    group = p.add_argument_group("task and engine options")
    for dest, flag, f, owner, tp in _option_flag_fields():
        helptext = f"[{owner}] {f.metadata.get('help', '')} (default: {f.default if f.default is not dataclasses.MISSING else f.default_factory()})"
        if tp is bool:
            group.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, help=helptext
            )
        elif tp in (list, tuple) or typing.get_origin(tp) in (list, tuple):
            elem = (typing.get_args(tp) or (str,))[0]  # list[float] -> float
            group.add_argument(flag, dest=dest, nargs="+", type=elem, help=helptext)
        else:
            group.add_argument(flag, dest=dest, type=tp, help=helptext)
    return p


def _parse_clip(values) -> list | None:
    if values is None:
        return None
    if len(values) not in (2, 3):
        raise ValueError(f"--clip takes eps_low eps_high [c], got {values}")
    try:
        clip = [float(v) for v in values[:2]] + ([float(values[2])] if len(values) == 3 else [])
    except ValueError as e:
        raise ValueError(
            f"--clip values must be numbers ('inf' allowed for c), got {values}"
        ) from e
    return clip


def _fix_types(d: dict) -> dict:
    d = dict(d)
    if "clip" in d:
        d["clip"] = _parse_clip(d["clip"])
    if "adam_betas" in d:
        d["adam_betas"] = [float(v) for v in d["adam_betas"]]
    return d


def parse_config(argv: list | None = None) -> Config:
    """argv -> validated Config. Raises ValueError with a clear message on bad configuration."""
    explicit = vars(build_parser().parse_args(argv))
    option_dests = {dest: owner for dest, _, _, owner, _ in _option_flag_fields()}
    if "resume" in explicit:
        return _resume_config(explicit)
    task = explicit.get("task")
    preset_name = explicit.get("preset") or (task if task in PRESETS else DEFAULT_PRESET)
    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; valid: {', '.join(PRESETS)}")
    values = {**copy.deepcopy(PRESETS[preset_name]), **_fix_types(explicit), "preset": preset_name}
    if explicit.get("no_clip") and "clip" not in explicit:
        values["clip"] = None  # --no-clip beats a preset's clip
    opts = {k: values.pop(k) for k in list(values) if k in option_dests}
    cfg = Config(**values)
    # beta for a loss without any KL term (dapo) is 0 unless the user asked otherwise (then refused).
    spec = SPECS.get(cfg.algo)
    if (
        spec is not None
        and not spec.has_kl
        and "beta" not in explicit
    ):
        cfg.beta = 0.0
    if cfg.out is None:
        cfg.out = f"runs/{cfg.task}-{cfg.algo}-s{cfg.seed}"
    _fill_options(cfg, opts, option_dests)
    validate(cfg)
    return cfg


def _fill_options(cfg: Config, opts: dict, owners: dict) -> None:
    task_cls = _resolve(TASKS, cfg.task, "task")
    engine = task_cls.default_engine if cfg.engine == "auto" else cfg.engine
    engine_cls = _resolve(ENGINES, engine, "engine")
    cfg.engine = engine
    for dest in opts:
        if owners[dest] not in (f"task:{cfg.task}", f"engine:{engine}"):
            raise ValueError(
                f"--{dest.replace('_', '-')} is an option of {owners[dest]}, but this run "
                f"uses task {cfg.task!r} and engine {engine!r}"
            )
    for key, cls, name in (
        ("task_options", task_cls, cfg.task),
        ("engine_options", engine_cls, engine),
    ):
        mine = {d[len(name) + 1 :]: v for d, v in opts.items() if d.startswith(name + "_")}
        base = dataclasses.asdict(cls.Options()) if hasattr(cls, "Options") else {}
        unknown = set(getattr(cfg, key)) - set(base)
        if unknown:
            raise ValueError(f"unknown {key} for {name}: {sorted(unknown)}; valid: {sorted(base)}")
        setattr(cfg, key, {**base, **getattr(cfg, key), **mine})


def _resume_config(explicit: dict) -> Config:
    out = Path(explicit["resume"])
    path = out / "config.json"
    if not path.exists():
        raise ValueError(f"--resume {out}: no run there ({path} not found)")
    stored = json.loads(path.read_text())
    cfg = Config(**stored)
    changeable = {"steps", "progress", "tensorboard", "resume", "eval_every", "save_every"}
    given = _fix_types({k: v for k, v in explicit.items() if k not in changeable})
    differ = {k: (stored.get(k), v) for k, v in given.items() if stored.get(k, None) != v}
    if differ:
        raise ValueError(
            f"--resume {out}: flags differ from the stored run's config: {differ}; only "
            f"{sorted(changeable - {'resume'})} may change on resume"
        )
    for k in changeable - {"resume"}:
        if k in explicit:
            setattr(cfg, k, explicit[k])
    cfg.resume = str(out)
    validate(cfg)
    return cfg


def resolved_clip(cfg: Config) -> tuple | None:
    """The clip tuple handed to the loss (None = the loss's own default / no clipping)."""
    if cfg.no_clip or cfg.clip is None:
        return None
    c = cfg.clip[2] if len(cfg.clip) == 3 else None
    return (cfg.clip[0], cfg.clip[1], c)


def resolved_adv(cfg: Config) -> str:
    return SPECS[cfg.algo].advantage if cfg.adv == "auto" else cfg.adv


def validate(cfg: Config) -> None:
    """Refuse a bad configuration with a clear message, before any work is done."""

    def bad(msg):
        raise ValueError(f"bad configuration: {msg}")

    if cfg.algo not in LOSSES:
        bad(f"unknown algorithm --algo {cfg.algo!r}; valid: {', '.join(LOSSES)}")
    _resolve(TASKS, cfg.task, "task")
    _resolve(ENGINES, cfg.engine, "engine") if cfg.engine != "auto" else None
    spec = SPECS[cfg.algo]
    adv = resolved_adv(cfg)
    if adv not in ADVANTAGES:
        bad(f"unknown advantage estimator --adv {cfg.adv!r}; valid: auto, {', '.join(ADVANTAGES)}")
    if adv.startswith("reinforce++") != spec.kl_in_reward:
        bad(
            f"--adv {adv} does not fit --algo {cfg.algo} (reinforce++ losses need reinforce++ advantages)"
        )
    if cfg.group_size < 1 or cfg.prompts_per_step < 1:
        bad(
            f"group_size ({cfg.group_size}) and prompts_per_step ({cfg.prompts_per_step}) must be >= 1"
        )
    if cfg.group_size == 1 and adv in GROUP_ESTIMATORS:
        bad(
            f"--group-size 1 with the group baseline {adv!r}: every advantage would be 0; use "
            f"--group-size >= 2 or --adv batch-mean"
        )
    if cfg.no_clip and cfg.clip is not None:
        bad("--clip and --no-clip together")
    if cfg.no_clip and spec.default_clip is not None:
        bad(
            f"--no-clip: {cfg.algo} is a PPO-type loss that always clips; pass a wide --clip instead"
        )
    if cfg.clip is not None:
        eps_low, eps_high = cfg.clip[0], cfg.clip[1]
        if not (eps_low > 0 and eps_high > 0):
            bad(f"clip eps must be > 0, got eps_low={eps_low}, eps_high={eps_high}")
        if eps_low >= 1:
            bad(
                f"clip eps_low must be < 1 (the lower bound 1 - eps_low must be positive), got {eps_low}"
            )
        if len(cfg.clip) == 3 and not cfg.clip[2] > 1:
            bad(f"dual-clip c must be > 1, got {cfg.clip[2]}")
    if cfg.updates_per_step is not None and cfg.updates_per_step < 1:
        bad(f"K = --updates-per-step must be >= 1, got {cfg.updates_per_step}")
    if not cfg.kappa > 0:
        bad(f"kappa must be > 0 (inf disables the KL early stop), got {cfg.kappa}")
    n = cfg.prompts_per_step * cfg.group_size
    if cfg.mini_batch_size < 1 or n % cfg.mini_batch_size:
        bad(
            f"the batch ({cfg.prompts_per_step} prompts x {cfg.group_size} = {n} responses) is not "
            f"divisible into mini-batches of {cfg.mini_batch_size}"
        )
    if cfg.micro_batch_size < 0 or (
        cfg.micro_batch_size and cfg.mini_batch_size % cfg.micro_batch_size
    ):
        bad(
            f"mini_batch_size {cfg.mini_batch_size} is not divisible into micro-batches of "
            f"{cfg.micro_batch_size}"
        )
    if not (math.isfinite(cfg.beta) and cfg.beta >= 0):
        bad(f"beta must be a finite number >= 0, got {cfg.beta}")
    if not cfg.temperature > 0:
        bad(f"temperature must be > 0, got {cfg.temperature}")
    if not 0 < cfg.top_p <= 1:
        bad(f"top_p must be in (0, 1], got {cfg.top_p}")
    if cfg.threads < 0:
        bad(f"threads must be >= 0, got {cfg.threads}")
    if cfg.steps < 1 or cfg.max_new_tokens < 1:
        bad(f"steps ({cfg.steps}) and max_new_tokens ({cfg.max_new_tokens}) must be >= 1")
    if not cfg.lr > 0 or cfg.weight_decay < 0 or cfg.grad_clip < 0:
        bad(
            f"need lr > 0, weight_decay >= 0, grad_clip >= 0; got {cfg.lr}, {cfg.weight_decay}, {cfg.grad_clip}"
        )
    if cfg.ref not in ("iterative", "init"):
        bad(f"--ref must be 'iterative' or 'init', got {cfg.ref!r}")
    if cfg.level not in LEVELS or cfg.agg not in AGGREGATIONS:
        bad(
            f"--level must be in {LEVELS} and --agg in {AGGREGATIONS}; got {cfg.level!r}, {cfg.agg!r}"
        )
    if cfg.level == "sequence" and spec.kl_in_reward:
        bad(f"{cfg.algo} has token-level advantages and cannot run at --level sequence")
    if cfg.lr_decay not in ("constant", "cosine"):
        bad(f"--lr-decay must be 'constant' or 'cosine', got {cfg.lr_decay!r}")
    if cfg.overlong_buffer < 0 or cfg.overlong_buffer > cfg.max_new_tokens:
        bad(
            f"overlong_buffer must be in [0, max_new_tokens={cfg.max_new_tokens}], got {cfg.overlong_buffer}"
        )
    if cfg.dynamic_sampling and cfg.dynamic_sampling_rounds < 1:
        bad(f"dynamic_sampling_rounds must be >= 1, got {cfg.dynamic_sampling_rounds}")
    if cfg.dynamic_sampling and cfg.group_size < 2:
        bad("--dynamic-sampling needs --group-size >= 2 (a group of one always has equal rewards)")
    if cfg.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as e:
            bad(f"--tensorboard needs the tensorboard package ({e}); pip install tensorboard")
    # the loss's own checks (e.g. dapo/reinforce++ refuse beta > 0) on a one-token probe
    z = torch.zeros(1, 1)
    try:
        LOSSES[cfg.algo](
            z,
            z,
            torch.zeros(1),
            torch.ones(1, 1),
            beta=_loss_beta(cfg),
            clip=resolved_clip(cfg),
            level=cfg.level,
            agg=cfg.agg,
        )
    except ValueError as e:
        bad(f"--algo {cfg.algo}: {e}")
    if not cfg.resume and cfg.out and (Path(cfg.out) / "config.json").exists():
        stored = json.loads((Path(cfg.out) / "config.json").read_text())
        diff = sorted(
            k
            for k, v in dataclasses.asdict(cfg).items()
            if stored.get(k) != v and k not in ("progress", "tensorboard", "resume")
        )
        what = f"a different config (fields {diff})" if diff else "the same config"
        bad(
            f"output folder {cfg.out} already holds a run with {what}; pass --resume {cfg.out} to "
            f"continue it, or choose another --out"
        )


def _loss_beta(cfg: Config) -> float:
    """beta handed to the loss: reinforce++ puts the KL in the advantage, so its loss gets 0."""
    return 0.0 if SPECS[cfg.algo].kl_in_reward else cfg.beta


# =============================================================================================
# 2. tasks
# =============================================================================================


@dataclass
class Prompt:
    ids: list  # prompt token ids
    answer: Any  # whatever the task's verifier needs


class Task(Protocol):
    """What the loop needs from a task. Register a class in TASKS (or as a lazy "module:Class")."""

    name: str
    default_engine: str
    eos_id: int | None  # None: responses always run to max_new_tokens (bandit)
    pad_id: int

    def __init__(self, cfg: Config, device: torch.device): ...
    def build_policy(self) -> nn.Module:
        """The trainable policy: module(input_ids, attention_mask, position_ids, logits_to_keep).logits."""

    def sample_prompts(self, n: int, gen: torch.Generator) -> list[Prompt]: ...
    def reward(self, prompts: list[Prompt], responses: list[list[int]]) -> tuple[Tensor, Tensor]:
        """(rewards [N] float, correct [N] bool) for responses (token ids, EOS included)."""

    def evaluate(self, policy: nn.Module, engine: Engine) -> dict: ...
    def summary(self, policy: nn.Module, cfg: Config) -> dict:
        """Task-specific entries merged into summary.json."""


class TabularPolicy(nn.Module):
    """A softmax over K arms that ignores its input: logits [K], same distribution at every position."""

    def __init__(self, logits: Tensor):
        super().__init__()
        self.logits = nn.Parameter(logits.clone())  # [K]

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, **_):
        B, L = input_ids.shape
        keep = L if not logits_to_keep else logits_to_keep
        return SimpleNamespace(logits=self.logits.expand(B, keep, -1))  # [B, keep, K]


def kl_regularized_optimum(
    ref: np.ndarray, rewards: np.ndarray, beta: float, divergence: str
) -> np.ndarray:
    """argmax_p  sum_i p_i R_i - beta D(p, ref) over the simplex, in float64.

    rkl / urkl (D = KL(p||ref); UKL = KL for normalized p): p* ∝ ref exp(R / beta).
    fkl / ufkl (D = KL(ref||p)):  stationarity R_i + beta ref_i / p_i = lam gives
        p_i = beta ref_i / (lam - R_i),  lam > max R,  with lam the root of sum_i p_i = 1
    (sum is decreasing in lam: bisection, then Newton polish). beta = 0: the best arm(s).
    """
    ref, R = np.asarray(ref, np.float64), np.asarray(rewards, np.float64)
    if beta == 0:
        p = (R == R.max()).astype(np.float64)
        return p / p.sum()
    if divergence in ("rkl", "urkl"):
        z = np.log(ref) + R / beta
        p = np.exp(z - z.max())
        return p / p.sum()
    if divergence in ("fkl", "ufkl"):
        g = lambda lam: float(np.sum(beta * ref / (lam - R)) - 1.0)
        # p_best <= 1 gives lam >= max R + beta ref_best (there g >= 0); at lam = max R + beta
        # every p_i <= ref_i, so g <= 0: the root is bracketed.
        lo, hi = R.max() + beta * ref[R == R.max()].sum(), R.max() + beta
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if g(mid) > 0 else (lo, mid)
        lam = 0.5 * (lo + hi)
        for _ in range(5):  # Newton polish
            lam -= g(lam) / float(-np.sum(beta * ref / (lam - R) ** 2))
        p = beta * ref / (lam - R)
        return p / p.sum()
    raise ValueError(f"no optimum for divergence {divergence!r}")


class BanditTask:
    """K-armed bandit: a sample x is one arm (one token, level='token' with T = 1), R(x) = rewards[x].

    With --ref init the KL-regularized optimum of J = E_p[R] - beta D(p, pi_ref) is known
    (kl_regularized_optimum) and summary.json reports its total-variation distance to the policy.
    With the iterative reference the regularizer only bounds each step: the policy tends to the
    best arm (the reported optimum is then that one-hot vector).
    """

    name = "bandit"
    default_engine = "sample"
    eos_id = None
    pad_id = 0

    @dataclass
    class Options:
        rewards: list[float] = field(
            default_factory=lambda: [1.0, 0.8, 0.5, 0.2, 0.0],
            metadata={"help": "reward of each arm (K = number of values)"},
        )
        init_scale: float = field(
            default=1.0,
            metadata={"help": "initial logits ~ N(0, init_scale^2) (0 = uniform policy)"},
        )

    def __init__(self, cfg: Config, device: torch.device):
        self.opt = self.Options(**cfg.task_options)
        if len(self.opt.rewards) < 2:
            raise ValueError(f"bandit needs >= 2 arms, got rewards {self.opt.rewards}")
        if cfg.max_new_tokens != 1:
            raise ValueError(
                f"bandit responses are one arm: --max-new-tokens must be 1, got {cfg.max_new_tokens}"
            )
        self.R = torch.tensor(self.opt.rewards, dtype=torch.float32, device=device)  # [K]

    def build_policy(self) -> nn.Module:
        self.init_logits = (
            torch.randn(len(self.opt.rewards)) * self.opt.init_scale
        )  # [K] = pi_ref's
        return TabularPolicy(self.init_logits)

    def sample_prompts(self, n, gen):
        return [Prompt(ids=[0], answer=None) for _ in range(n)]

    def reward(self, prompts, responses):
        arms = torch.tensor([r[0] for r in responses], device=self.R.device)  # [N]
        r = self.R[arms]
        return r, r == self.R.max()

    def evaluate(self, policy, engine):
        p = torch.softmax(policy.logits.detach().double(), -1)
        return {"expected_reward": float(p @ self.R.double()), "p_best": float(p[self.R.argmax()])}

    def summary(self, policy, cfg):
        p = torch.softmax(policy.logits.detach().double(), -1).cpu().numpy()
        ref = torch.softmax(self.init_logits.double(), -1).numpy()
        R = np.asarray(self.opt.rewards, np.float64)
        spec = SPECS[cfg.algo]
        if cfg.ref == "iterative":
            optimum, note = (
                kl_regularized_optimum(ref, R, 0.0, "rkl"),
                "iterative reference: best arm",
            )
        elif spec.family in ("rpg", "rpg-reinforce"):
            optimum = kl_regularized_optimum(ref, R, cfg.beta, spec.divergence)
            note = f"argmax E[R] - beta {spec.divergence}(p, ref)"
        else:
            optimum, note = (
                None,
                f"{cfg.algo}: no closed-form fixed point (advantage scaling / estimator bias)",
            )
        tv = None if optimum is None else float(0.5 * np.abs(p - optimum).sum())
        return {
            "policy": p.tolist(),
            "ref_policy": ref.tolist(),
            "rewards": R.tolist(),
            "beta": cfg.beta,
            "algo": cfg.algo,
            "optimum": None if optimum is None else optimum.tolist(),
            "optimum_note": note,
            "tv_distance": tv,
        }


class SeqTask:
    """Digit addition "a+b=" -> digits of a+b then EOS, with a tiny random-init Qwen3.

    Tokens: 0-9 digits, 10 '+', 11 '=', 12 BOS, 13 EOS, 14 PAD. The answer is written least
    significant digit first (the order in which a carry is computed), no leading zeros.
    Reward 1 for an exact answer followed by EOS, else 0 (accuracy = reward before penalties).
    The policy is first warm-started by a short supervised phase on (prompt, answer) pairs so that
    it solves some problems; RL then raises the accuracy. The warm-started weights are cached in
    --cache-dir, keyed by the model config, the warm-start options and the seed.
    """

    name = "seq"
    default_engine = "hf"
    PLUS, EQ, BOS, EOS, PAD, VOCAB = 10, 11, 12, 13, 14, 16
    eos_id, pad_id = EOS, PAD

    @dataclass
    class Options:
        digits: int = field(default=2, metadata={"help": "digits per operand"})
        hidden: int = field(default=128, metadata={"help": "model width"})
        layers: int = field(default=2, metadata={"help": "transformer layers"})
        heads: int = field(default=4, metadata={"help": "attention heads"})
        warm_steps: int = field(
            default=250, metadata={"help": "supervised warm-start steps (0 = none)"}
        )
        warm_lr: float = field(default=3e-3, metadata={"help": "warm-start learning rate"})
        warm_batch: int = field(default=64, metadata={"help": "warm-start batch size"})
        eval_size: int = field(
            default=256, metadata={"help": "held-out problems for greedy evaluation"}
        )

    def __init__(self, cfg: Config, device: torch.device):
        self.opt = self.Options(**cfg.task_options)
        self.cfg, self.device = cfg, device
        if self.opt.digits < 1:
            raise ValueError(f"seq digits must be >= 1, got {self.opt.digits}")
        need = self.opt.digits + 2
        if cfg.max_new_tokens < need:
            raise ValueError(
                f"seq with {self.opt.digits}-digit operands needs --max-new-tokens >= {need}"
            )
        self.eval_prompts = self.sample_prompts(
            self.opt.eval_size, torch.Generator().manual_seed(12345)
        )

    def _answer(self, s: int) -> list:
        return [int(c) for c in reversed(str(s))]

    def sample_prompts(self, n, gen):
        d = self.opt.digits
        ab = torch.randint(0, 10**d, (n, 2), generator=gen).tolist()
        out = []
        for a, b in ab:
            ids = (
                [self.BOS]
                + [int(c) for c in f"{a:0{d}d}"]
                + [self.PLUS]
                + [int(c) for c in f"{b:0{d}d}"]
                + [self.EQ]
            )
            out.append(Prompt(ids=ids, answer=self._answer(a + b)))
        return out

    def reward(self, prompts, responses):
        ok = torch.tensor([r == p.answer + [self.EOS] for p, r in zip(prompts, responses)])
        return ok.float().to(self.device), ok.to(self.device)

    def model_config(self):
        from transformers import Qwen3Config

        o = self.opt
        return Qwen3Config(
            vocab_size=self.VOCAB,
            hidden_size=o.hidden,
            intermediate_size=2 * o.hidden,
            num_hidden_layers=o.layers,
            num_attention_heads=o.heads,
            num_key_value_heads=max(1, o.heads // 2),
            head_dim=o.hidden // o.heads,
            max_position_embeddings=64,
            tie_word_embeddings=True,
            bos_token_id=self.BOS,
            eos_token_id=self.EOS,
            pad_token_id=self.PAD,
            attn_implementation="sdpa",
        )

    def build_policy(self) -> nn.Module:
        from safetensors.torch import load_model, save_model
        from transformers import Qwen3ForCausalLM

        mcfg = self.model_config()
        model = Qwen3ForCausalLM(mcfg).to(self.device)
        if self.opt.warm_steps == 0:
            return model
        warm = {k: v for k, v in dataclasses.asdict(self.opt).items() if k != "eval_size"}
        key = json.dumps([mcfg.to_dict(), warm, self.cfg.seed], sort_keys=True, default=str)
        path = (
            Path(self.cfg.cache_dir)
            / f"seq-warm-{hashlib.sha256(key.encode()).hexdigest()[:16]}.safetensors"
        )
        if path.exists():
            load_model(model, str(path), device=str(self.device))
            return model
        self._warm_start(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        save_model(model, str(tmp))
        os.replace(tmp, path)
        return model

    def _warm_start(self, model: nn.Module) -> None:
        """Supervised phase: cross-entropy on the answer tokens of random problems (own generator)."""
        gen = torch.Generator().manual_seed(self.cfg.seed + 7)
        opt = torch.optim.AdamW(model.parameters(), lr=self.opt.warm_lr)
        for _ in range(self.opt.warm_steps):
            ps = self.sample_prompts(self.opt.warm_batch, gen)
            seqs = [p.ids + p.answer + [self.EOS] for p in ps]
            L = max(map(len, seqs))
            ids = torch.full((len(seqs), L), self.PAD)  # [B, L] right-padded
            labels = torch.full((len(seqs), L), -100)  # [B, L] loss on answers only
            for i, (p, s) in enumerate(zip(ps, seqs)):
                ids[i, : len(s)] = torch.tensor(s)
                labels[i, len(p.ids) : len(s)] = torch.tensor(s[len(p.ids) :])
            ids, labels = ids.to(self.device), labels.to(self.device)
            loss = model(input_ids=ids, attention_mask=(ids != self.PAD).long(), labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()

    def evaluate(self, policy, engine):
        gen = engine.generate(
            [p.ids for p in self.eval_prompts], 1, 0.0, 1.0, self.cfg.max_new_tokens
        )
        _, correct = self.reward(self.eval_prompts, gen.responses)
        return {"greedy_accuracy": float(correct.float().mean())}

    def summary(self, policy, cfg):
        return {}


# name -> class, or "module:Class" imported on first use (the next tasks plug in without edits here)
TASKS: dict[str, Any] = {"bandit": BanditTask, "seq": SeqTask, "math": "rpg_ref.math_task:MathTask"}


def _resolve(registry: dict, name: str, kind: str, quiet: bool = False):
    if name not in registry:
        if quiet:
            return None
        raise ValueError(
            f"bad configuration: unknown {kind} {name!r}; valid: {', '.join(registry)}"
        )
    obj = registry[name]
    if isinstance(obj, str):
        mod, _, cls = obj.partition(":")
        try:
            obj = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError) as e:
            if quiet:
                return None
            raise ValueError(
                f"bad configuration: {kind} {name!r} lives in {obj}, which cannot be "
                f"imported here: {e}"
            ) from e
        registry[name] = obj
    return obj


# =============================================================================================
# 3. engines
# =============================================================================================


@dataclass
class Generation:
    responses: list  # N lists of token ids (EOS included when emitted)
    logprobs: list | None = (
        None  # the sampler's own log-probs of those tokens, when it reports them
    )


class Engine(Protocol):
    """Who samples. ``generate`` returns n consecutive responses per prompt (the group layout).

    temperature 0 means greedy. ``sync_weights(policy)`` is called after every policy update
    (a no-op for engines that share the policy module); ``sleep``/``wake`` free and restore the
    engine's memory around the update (no-ops for HF; vLLM's sleep mode).
    """

    def __init__(self, policy: nn.Module, task: Task, cfg: Config): ...
    def generate(
        self, prompts: list, n: int, temperature: float, top_p: float, max_new_tokens: int
    ) -> Generation: ...
    def sync_weights(self, policy: nn.Module) -> None: ...
    def sleep(self) -> None: ...
    def wake(self) -> None: ...


def _left_pad(prompts: list, pad_id: int, device) -> tuple[Tensor, Tensor]:
    P = max(map(len, prompts))
    ids = torch.tensor(
        [[pad_id] * (P - len(p)) + list(p) for p in prompts], dtype=torch.long
    )  # [B, P]
    am = torch.tensor(
        [[0] * (P - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long
    )  # [B, P]
    return ids.to(device), am.to(device)


def _cut(row: list, eos_id: int | None) -> list:
    """Response tokens up to and including the first EOS."""
    if eos_id is not None and eos_id in row:
        return row[: row.index(eos_id) + 1]
    return row


class _RecordLogprobs:
    """Logits processor that keeps the sampler's log-prob of each sampled token.

    Custom processors run before HF's temperature/top-p warpers, so ``scores`` are the model's
    raw logits; at call t it reads the token sampled at call t-1 from input_ids. Memory: one [B, V].
    """

    def __init__(self, temperature: float):
        self.t, self.prev, self.out = temperature, None, []

    def __call__(self, input_ids, scores):
        if self.prev is not None:
            self.out.append(self.prev.gather(-1, input_ids[:, -1:]))  # [B, 1]
        self.prev = torch.log_softmax(scores.float() / self.t, -1)  # [B, V]
        return scores

    def finish(self, last_tokens: Tensor) -> Tensor:
        self.out.append(self.prev.gather(-1, last_tokens[:, None]))
        return torch.cat(self.out, 1)  # [B, T]


class _InProcessEngine:
    """An engine that samples with the policy module itself: there are no weights to sync and no
    separate memory to release, so the Engine hooks do nothing."""

    def sync_weights(self, policy):
        pass

    def sleep(self):
        pass

    def wake(self):
        pass


class HFEngine(_InProcessEngine):
    """transformers ``generate`` on the policy module itself (colocated: nothing to sync)."""

    @dataclass
    class Options:
        chunk: int = field(
            default=0, metadata={"help": "generate at most this many sequences at once (0 = all)"}
        )
        sampler_logprobs: bool = field(
            default=True,
            metadata={"help": "record the sampler's log-probs to compare with the recomputed ones"},
        )

    def __init__(self, policy, task, cfg):
        self.policy, self.task = policy, task
        self.opt = self.Options(**cfg.engine_options)

    @torch.no_grad()
    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        from transformers import GenerationConfig, LogitsProcessorList

        flat = [p for p in prompts for _ in range(n)]
        chunk = self.opt.chunk or len(flat)
        responses, logprobs = [], [] if (temperature > 0 and self.opt.sampler_logprobs) else None
        was_training = self.policy.training
        self.policy.eval()
        for s in range(0, len(flat), chunk):
            ids, am = _left_pad(flat[s : s + chunk], self.task.pad_id, self.policy.device)
            if temperature > 0:
                gc_ = GenerationConfig(
                    do_sample=True,
                    temperature=temperature,
                    top_p=top_p,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=self.task.eos_id,
                    pad_token_id=self.task.pad_id,
                )
            else:
                gc_ = GenerationConfig(
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=self.task.eos_id,
                    pad_token_id=self.task.pad_id,
                )
            rec = _RecordLogprobs(temperature) if logprobs is not None else None
            seq = self.policy.generate(
                input_ids=ids,
                attention_mask=am,
                generation_config=gc_,
                logits_processor=LogitsProcessorList([rec] if rec else []),
            )
            new = seq[:, ids.shape[1] :]  # [b, T_gen]
            lp = rec.finish(new[:, -1]).tolist() if rec else None
            for i, row in enumerate(new.tolist()):
                r = _cut(row, self.task.eos_id)
                responses.append(r)
                if lp is not None:
                    logprobs.append(lp[i][: len(r)])
        self.policy.train(was_training)
        return Generation(responses, logprobs)


class SampleEngine(_InProcessEngine):
    """A plain autoregressive sampler on any policy module (no KV cache; used for the bandit)."""

    def __init__(self, policy, task, cfg):
        self.policy, self.task = policy, task

    @torch.no_grad()
    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        flat = [p for p in prompts for _ in range(n)]
        dev = next(self.policy.parameters()).device
        ids, am = _left_pad(flat, self.task.pad_id, dev)  # [N, P]
        done = torch.zeros(len(flat), dtype=torch.bool, device=dev)
        toks, lps = [], []
        for _ in range(max_new_tokens):
            pos = (am.cumsum(-1) - 1).clamp(min=0)
            logits = (
                self.policy(input_ids=ids, attention_mask=am, position_ids=pos, logits_to_keep=1)
                .logits[:, -1]
                .float()
            )  # [N, V]
            if temperature == 0:
                tok = logits.argmax(-1)
                lp = torch.zeros_like(tok, dtype=torch.float)
            else:
                logp = torch.log_softmax(logits / temperature, -1)  # [N, V]
                probs = logp.exp()
                if top_p < 1:
                    sp, si = probs.sort(-1, descending=True)
                    keep = (sp.cumsum(-1) - sp) < top_p  # always keeps the top token
                    probs = torch.zeros_like(probs).scatter(-1, si, sp * keep)
                tok = torch.multinomial(probs, 1)[:, 0]  # [N]
                lp = logp.gather(-1, tok[:, None])[:, 0]
            if self.task.eos_id is not None:
                tok = torch.where(done, torch.full_like(tok, self.task.pad_id), tok)
            toks.append(tok)
            lps.append(lp)
            ids = torch.cat([ids, tok[:, None]], 1)
            am = torch.cat([am, (~done).long()[:, None]], 1)
            if self.task.eos_id is not None:
                done |= tok == self.task.eos_id
                if bool(done.all()):
                    break
        T = torch.stack(toks, 1).tolist()  # [N, T]
        L = torch.stack(lps, 1).tolist()
        responses = [_cut(r, self.task.eos_id) for r in T]
        logprobs = None if temperature == 0 else [lp[: len(r)] for lp, r in zip(L, responses)]
        return Generation(responses, logprobs)


ENGINES: dict[str, Any] = {
    "hf": HFEngine,
    "sample": SampleEngine,
    "vllm": "rpg_ref.engines.vllm_engine:VLLMEngine",
}


# =============================================================================================
# 4. rollout: sample, score, DAPO dynamic sampling
# =============================================================================================


@dataclass
class Batch:
    """A scored rollout batch; tensors have N = prompts * group_size rows, groups consecutive."""

    input_ids: Tensor  # [N, P+T] left-padded prompt, right-padded response
    attention_mask: Tensor  # [N, P+T]
    position_ids: Tensor  # [N, P+T]
    mask: Tensor  # [N, T] float, 1 on response tokens
    rewards: Tensor  # [N]
    correct: Tensor  # [N] bool
    sampler_logp: Tensor | None = None  # [N, T] the engine's own log-probs, when reported
    old_logp: Tensor | None = None  # [N, T] log pi_old: the only copy of pi_old
    ref_logp: Tensor | None = None  # [N, T] log pi_ref (--ref init only)
    adv: Tensor | None = None  # [N] or [N, T]

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.mask.shape[1]

    def __len__(self):
        return self.input_ids.shape[0]

    def index(self, idx) -> Batch:
        """Rows ``idx`` (an index tensor or a slice) of every tensor field."""
        return Batch(
            **{
                f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[idx])
                for f in dataclasses.fields(self)
            }
        )


def collate(prompts: list, responses: list, pad_id: int, device, sampler_lp: list | None) -> dict:
    """Token lists -> padded tensors: prompts left-padded to P, responses right-padded to T."""
    ids_p, am_p = _left_pad(prompts, pad_id, device)  # [N, P]
    T = max(1, max(map(len, responses)))
    ids_r = torch.tensor(
        [list(r) + [pad_id] * (T - len(r)) for r in responses], dtype=torch.long
    )  # [N, T]
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (T - len(r)) for r in responses])  # [N, T]
    slp = (
        None
        if sampler_lp is None
        else torch.tensor([list(x) + [0.0] * (T - len(x)) for x in sampler_lp])
    )  # [N, T]
    ids = torch.cat([ids_p, ids_r.to(device)], 1)  # [N, P+T]
    am = torch.cat([am_p, mask.long().to(device)], 1)  # [N, P+T]
    pos = (am.cumsum(-1) - 1).clamp(min=0)  # [N, P+T] as HF generate
    return dict(  # keyword names = Batch fields
        input_ids=ids,
        attention_mask=am,
        position_ids=pos,
        mask=mask.to(device),
        sampler_logp=None if slp is None else slp.to(device),
    )


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float) -> Tensor:
    """DAPO soft overlong punishment: 0 up to max_len - buffer, then linear down to -penalty at max_len
    (penalty times rpg_ref.math_reward.overlong_penalty, the one implementation; buffer 0 = off)."""
    if buffer == 0:
        return torch.zeros_like(lengths, dtype=torch.float)
    from rpg_ref.math_reward import overlong_penalty as r_length  # lazy: that module imports sympy

    r = [penalty * r_length(n, max_len, buffer) for n in lengths.tolist()]
    return torch.tensor(r, dtype=torch.float, device=lengths.device)  # [N]


def rollout(task, engine, cfg: Config, gen: torch.Generator, device) -> tuple[Batch, dict]:
    """Sample prompts_per_step groups with pi_old and score them (DAPO dynamic sampling optional)."""
    kept, dropped, rounds, t_gen, t_score, n_tok = [], [], 0, 0.0, 0.0, 0
    while (
        len(kept) < cfg.prompts_per_step
        and (rounds == 0 or cfg.dynamic_sampling)
        and rounds < (cfg.dynamic_sampling_rounds if cfg.dynamic_sampling else 1)
    ):
        prompts = task.sample_prompts(cfg.prompts_per_step - len(kept), gen)
        t0 = time.perf_counter()
        g = engine.generate(
            [p.ids for p in prompts], cfg.group_size, cfg.temperature, cfg.top_p, cfg.max_new_tokens
        )
        t1 = time.perf_counter()
        flat = [p for p in prompts for _ in range(cfg.group_size)]
        r, correct = task.reward(flat, g.responses)
        lengths = torch.tensor([len(x) for x in g.responses], device=r.device)
        r = r + overlong_penalty(
            lengths, cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty
        )
        t_gen, t_score, rounds, n_tok = (
            t_gen + t1 - t0,
            t_score + time.perf_counter() - t1,
            rounds + 1,
            n_tok + int(lengths.sum()),
        )
        G = cfg.group_size
        for i, p in enumerate(prompts):
            sl = slice(i * G, (i + 1) * G)
            item = (
                p,
                g.responses[sl],
                None if g.logprobs is None else g.logprobs[sl],
                r[sl],
                correct[sl],
            )
            informative = bool((r[sl] != r[sl][0]).any())
            (kept if informative or not cfg.dynamic_sampling else dropped).append(item)
    filled = len(kept) >= cfg.prompts_per_step
    groups = (kept + dropped[::-1])[: cfg.prompts_per_step]  # cap hit: complete with dropped
    prompts = [g[0].ids for g in groups for _ in range(cfg.group_size)]
    responses = [x for g in groups for x in g[1]]
    slp = None if any(g[2] is None for g in groups) else [x for g in groups for x in g[2]]
    batch = Batch(
        **collate(prompts, responses, task.pad_id, device, slp),
        rewards=torch.cat([g[3] for g in groups]).float().to(device),
        correct=torch.cat([g[4] for g in groups]).to(device),
    )
    info = {"time_rollout": t_gen, "time_scoring": t_score, "gen_tokens": n_tok}
    if cfg.dynamic_sampling:
        info.update(
            dyn_rounds=rounds, dyn_kept=min(len(kept), cfg.prompts_per_step), dyn_filled=int(filled)
        )
    return batch, info


# =============================================================================================
# 5. log-probs: one forward pass per (micro-)batch
# =============================================================================================


def token_logprobs(model: nn.Module, b: Batch, temperature: float, entropy: bool = False):
    """log model(y_t | prefix) of the response tokens at the sampling temperature: [B, T] (+ entropy)."""
    T = b.mask.shape[1]
    out = model(
        input_ids=b.input_ids,
        attention_mask=b.attention_mask,
        position_ids=b.position_ids,
        logits_to_keep=T + 1,
    )
    logits = out.logits[:, :-1].float() / temperature  # [B, T, V] predicts y_1..y_T
    tok = b.input_ids[:, -T:]  # [B, T]
    lse = torch.logsumexp(logits, -1)  # [B, T]
    logp = logits.gather(-1, tok[..., None])[..., 0] - lse  # [B, T]
    if not entropy:
        return logp
    p = torch.softmax(logits, -1)
    ent = lse - (p * logits).sum(-1)  # [B, T] H = lse - E_p[logit]
    return logp, ent


@torch.no_grad()
def batch_logprobs(model: nn.Module, b: Batch, cfg: Config, entropy: bool) -> tuple:
    """Behaviour (or reference) log-probs of the whole batch, in chunks of a mini-batch."""
    chunk = cfg.micro_batch_size or cfg.mini_batch_size
    outs = [
        token_logprobs(model, b.index(slice(s, s + chunk)), cfg.temperature, entropy)
        for s in range(0, len(b), chunk)
    ]
    if entropy:
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])
    return torch.cat(outs), None


# =============================================================================================
# 6. update: up to K optimizer steps, KL(pi_theta || pi_old) early stop
# =============================================================================================

STAT_KEYS = ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "ratio_mean", "kl", "kl_old")


def update(policy: nn.Module, opt: torch.optim.Optimizer, b: Batch, cfg: Config) -> dict:
    """The inner loop on one rollout batch (Algorithm alg:offpolicy_rpg_rf_ppo_dualclip_v1's
    "for k = 1..K" with mini-batches), stopped early when the running mean of stats["kl_old"]
    over the last pass's worth of mini-batches exceeds kappa (that step is not applied)."""
    loss_fn, N, M = LOSSES[cfg.algo], len(b), cfg.mini_batch_size
    mu = cfg.micro_batch_size or M
    per_pass = N // M
    K = cfg.updates_per_step or per_pass
    window = deque(maxlen=per_pass)
    acc = {k: [] for k in STAT_KEYS + ("loss", "grad_norm")}
    n_upd, early, train_tokens = 0, False, 0
    params = [p for p in policy.parameters() if p.requires_grad]
    while n_upd < K and not early:
        perm = torch.randperm(N).to(b.mask.device)
        for j in range(per_pass):
            if n_upd >= K:
                break
            mb = b.index(perm[j * M : (j + 1) * M])
            opt.zero_grad(set_to_none=True)
            mb_tokens = float(mb.mask.sum())
            mstats = {k: 0.0 for k in STAT_KEYS + ("loss",)}
            for s in range(0, M, mu):
                ub = mb.index(slice(s, s + mu))
                logp = token_logprobs(policy, ub, cfg.temperature)  # [mu, T] differentiable
                loss, stats = loss_fn(
                    logp,
                    ub.old_logp,
                    ub.adv,
                    ub.mask,
                    beta=_loss_beta(cfg),
                    ref_logp=ub.ref_logp,
                    clip=resolved_clip(cfg),
                    level=cfg.level,
                    agg=cfg.agg,
                )
                # the mini-batch loss = micro-batch losses weighted by their share of it
                # (tokens for token-mean, sequences for the seq-mean aggregations)
                w = float(ub.mask.sum()) / mb_tokens if cfg.agg == "token-mean" else len(ub) / M
                (loss * w).backward()
                mstats["loss"] += float(loss.detach()) * w
                for k in STAT_KEYS:
                    mstats[k] += float(stats[k]) * w
            window.append(mstats["kl_old"])
            if sum(window) / len(window) > cfg.kappa:
                early = True
                opt.zero_grad(set_to_none=True)
                break
            gn = torch.nn.utils.clip_grad_norm_(
                params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf
            )
            opt.step()
            n_upd += 1
            train_tokens += int(mb.mask.sum())
            for k, v in mstats.items():
                acc[k].append(v)
            acc["grad_norm"].append(float(gn))
    opt.zero_grad(set_to_none=True)  # free the gradients before the next rollout (16 GB at 4B)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    out = {k: mean(v) for k, v in acc.items()}
    out["kl_loss"] = out.pop("kl")
    out.update(
        kl_old_last=sum(window) / len(window),
        updates=n_upd,
        early_stop=int(early),
        train_tokens=train_tokens,
    )
    return out


def lr_at(step: int, cfg: Config) -> float:
    """Learning rate for training step ``step`` (1-based): linear warm-up, then constant or cosine."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.lr_decay == "cosine":
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * t))
    return cfg.lr


# =============================================================================================
# 7. logging and checkpoints
# =============================================================================================


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory in MiB: CUDA max allocated on GPU; on CPU the process's peak RSS (VmHWM).

    VmHWM belongs to this process image; ru_maxrss is not used on Linux because it carries over the
    peak of a parent that forked us (a big parent would inflate it).
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )  # Linux: KiB; elsewhere approx.


def live_parameter_count() -> int:
    """Elements in all nn.Parameter objects alive in this process (counts every model copy)."""
    gc.collect()
    seen, n = set(), 0
    for obj in gc.get_objects():
        if issubclass(type(obj), nn.Parameter) and id(obj) not in seen:
            seen.add(id(obj))
            n += obj.numel()
    return n


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def rng_state() -> dict:
    st = {
        "python": list(random.getstate()[1]) + [random.getstate()[0], random.getstate()[2]],
        "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
        "numpy_pos": np.random.get_state()[2],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    py = st["python"]
    random.setstate((py[-2], tuple(py[:-2]), py[-1]))
    np.random.set_state(("MT19937", st["numpy"].numpy().astype(np.uint32), st["numpy_pos"], 0, 0.0))
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def save_checkpoint(
    out: Path, step: int, policy, ref, opt, gen: torch.Generator, cfg: Config
) -> None:
    """Write checkpoints/step_XXXXXX into a temp dir, rename it into place, then point LATEST at it."""
    from safetensors.torch import save_model

    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(policy, str(tmp / "model.safetensors"))
    if ref is not None:
        save_model(ref, str(tmp / "ref.safetensors"))
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    torch.save({**rng_state(), "prompt_gen": gen.get_state()}, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "config": dataclasses.asdict(cfg)}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _atomic_write(root / "LATEST", final.name)
    for old in root.glob("step_*"):  # keep the latest only
        if old.name != final.name:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(out: Path, policy, ref, opt, gen: torch.Generator) -> int:
    from safetensors.torch import load_model

    root = out / "checkpoints"
    if not (root / "LATEST").exists():
        return 0
    ck = root / (root / "LATEST").read_text().strip()
    dev = str(next(policy.parameters()).device)
    load_model(policy, str(ck / "model.safetensors"), device=dev)
    if ref is not None:
        load_model(ref, str(ck / "ref.safetensors"), device=dev)
    opt.load_state_dict(torch.load(ck / "optimizer.pt", weights_only=True))
    st = torch.load(ck / "rng.pt", weights_only=True)
    set_rng_state(st)
    gen.set_state(st["prompt_gen"])
    return json.loads((ck / "state.json").read_text())["step"]


class MetricsLog:
    """OUT/metrics.jsonl (+ TensorBoard). On resume, rows after the checkpoint's step are dropped."""

    def __init__(self, out: Path, start_step: int, tensorboard: bool):
        self.path = out / "metrics.jsonl"
        if self.path.exists():
            rows = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
            keep = [ln for ln in rows if json.loads(ln)["step"] <= start_step]
            _atomic_write(self.path, "".join(ln + "\n" for ln in keep))
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out / "tb"))

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()  # survives a killed process (the OS holds the data)
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, row["step"])


class _Progress:
    def __init__(self, total: int, initial: int, enabled: bool):
        self.bar = None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=initial, desc="rpg-train", dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, step: int, total: int, row: dict) -> None:
        msg = {k: f"{row[k]:.3g}" for k in ("reward", "accuracy", "kl_old", "entropy") if k in row}
        if self.bar is not None:
            self.bar.set_postfix(msg)
            self.bar.update(1)
        elif self.enabled:
            print(
                f"step {step}/{total} " + " ".join(f"{k}={v}" for k, v in msg.items()), flush=True
            )

    def close(self):
        if self.bar is not None:
            self.bar.close()


# =============================================================================================
# 8. main loop
# =============================================================================================


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(cfg: Config) -> dict:
    """Run (or resume) the training described by ``cfg``; returns the summary dict."""
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    )
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if not cfg.resume:
        _atomic_write(out / "config.json", json.dumps(dataclasses.asdict(cfg), indent=1))

    # --- task, policy (pi_theta; also pi_old through the stored log-probs), optional frozen pi_ref ---
    seed_everything(cfg.seed)
    task = _resolve(TASKS, cfg.task, "task")(cfg, device)
    # build in float32 whatever the caller's torch default dtype is (a float64 default used to make
    # the seq warm start silently fail); mixed precision is the task's own option (e.g. --math-dtype)
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        policy = task.build_policy().to(device)
    finally:
        torch.set_default_dtype(previous_dtype)
    policy.eval()  # no dropout, ever: w = pi_theta / pi_old must be exactly 1 before the first update
    ref = None
    if cfg.ref == "init":
        ref = copy.deepcopy(policy).eval().requires_grad_(False)  # the second model
    engine = _resolve(ENGINES, cfg.engine, "engine")(policy, task, cfg)
    # fused AdamW (one kernel per step, no per-parameter temporaries; ~7x faster steps on CPU) where
    # torch has it for every parameter: floating point on CPU or CUDA
    params = list(policy.parameters())
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    opt = torch.optim.AdamW(
        params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.adam_betas), fused=fused
    )
    seed_everything(cfg.seed + 1)  # same stream cached or not
    gen = torch.Generator().manual_seed(cfg.seed + 2)  # prompt sampling
    start = load_checkpoint(out, policy, ref, opt, gen) if cfg.resume else 0
    log = MetricsLog(out, start, cfg.tensorboard)
    bar = _Progress(cfg.steps, start, cfg.progress)
    model_params = sum(p.numel() for p in policy.parameters())
    live_params, last_eval, t_run = None, {}, time.perf_counter()
    row: dict = {}

    for step in range(start + 1, cfg.steps + 1):
        t_step = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)

        # --- rollout with pi_old (= the current policy) and scoring ---
        engine.wake()
        batch, info = rollout(task, engine, cfg, gen, device)
        engine.sleep()

        # --- log-probs of pi_old (stored once) and pi_ref; advantages ---
        t0 = time.perf_counter()
        batch.old_logp, ent = batch_logprobs(policy, batch, cfg, entropy=True)
        if ref is not None:
            batch.ref_logp, _ = batch_logprobs(ref, batch, cfg, entropy=False)
        m = batch.mask
        batch.adv = compute_advantages(
            resolved_adv(cfg),
            batch.rewards,
            cfg.group_size,
            mask=m,
            old_logp=batch.old_logp,
            ref_logp=batch.ref_logp if batch.ref_logp is not None else batch.old_logp,
            beta=cfg.beta,
        )
        t_lp = time.perf_counter() - t0

        # --- inner loop: up to K optimizer steps; then pi_old <- pi_theta (next rollout) ---
        t0 = time.perf_counter()
        stats = update(policy, opt, batch, cfg)
        t_upd = time.perf_counter() - t0
        engine.sync_weights(policy)

        # --- metrics ---
        n_tok = m.sum()
        row = {
            "step": step,
            "reward": float(batch.rewards.mean()),
            "accuracy": float(batch.correct.float().mean()),
            "entropy": float((ent * m).sum() / n_tok),
            "response_len": float(m.sum(1).mean()),
            **{k: v for k, v in stats.items() if k != "train_tokens"},
            "kl_ref": 0.0
            if ref is None
            else float((k3(batch.ref_logp - batch.old_logp) * m).sum() / n_tok),
            "lr": opt.param_groups[0]["lr"],
        }
        if batch.sampler_logp is not None:
            row["logprob_diff_max"] = float(((batch.sampler_logp - batch.old_logp).abs() * m).max())
        row.update({k: v for k, v in info.items() if k.startswith("dyn_")})
        row.update(
            gen_tokens_per_s=info["gen_tokens"] / max(info["time_rollout"], 1e-9),
            train_tokens_per_s=stats["train_tokens"] / max(t_upd, 1e-9),
            time_rollout=info["time_rollout"],
            time_scoring=info["time_scoring"],
            time_logprob=t_lp,
            time_update=t_upd,
        )
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            last_eval = {f"eval_{k}": v for k, v in task.evaluate(policy, engine).items()}
            row.update(last_eval)
        row["time_step"] = time.perf_counter() - t_step
        row["peak_mem_mb"] = peak_memory_mb(device)
        if live_params is None:
            live_params = live_parameter_count()
        log.write(row)
        bar.update(step, cfg.steps, row)
        if step % cfg.save_every == 0 or step == cfg.steps:
            save_checkpoint(out, step, policy, ref, opt, gen, cfg)
    bar.close()

    if live_params is None:
        live_params = live_parameter_count()
    summary = {
        "config": dataclasses.asdict(cfg),
        "steps_done": cfg.steps,
        "final": row,
        "eval": last_eval,
        "model_params": model_params,
        "live_params": live_params,
        "models_in_memory": live_params / model_params,
        "wall_time_s_this_process": time.perf_counter() - t_run,
        **task.summary(policy, cfg),
    }
    _atomic_write(out / "summary.json", json.dumps(summary, indent=1))
    return summary


def main(argv: list | None = None) -> int:
    try:
        cfg = parse_config(argv)
    except ValueError as e:
        print(f"rpg-train: {e}", file=sys.stderr)
        return 2
    s = train(cfg)
    f = s["final"]
    print(
        f"done: {cfg.out}  reward={f.get('reward', float('nan')):.3f}  accuracy={f.get('accuracy', float('nan')):.3f}"
        + (f"  tv_distance={s['tv_distance']:.4f}" if s.get("tv_distance") is not None else "")
        + "".join(f"  {k}={v:.3f}" for k, v in s["eval"].items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
