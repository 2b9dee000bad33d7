"""The checks of a Config against what it cannot see in itself: the run folder (a new run never
writes into another run; --resume continues the stored config with the few flags a resume may
change), the job (torchrun's number of ranks) and the machine (its devices, tensorboard).

rpg_ref/trainer/config.py checks a Config's own values where it is built; these read the disk and
the environment, so they run where a run starts (rpg-train's parse_config, and ``join`` for a
torchrun job), each a one-line ValueError naming the fix, before anything is written.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path

import torch

from rpg_ref.strict_json import loads
from rpg_ref.trainer.checkpoint import latest_state, latest_step
from rpg_ref.trainer.collectives import world
from rpg_ref.trainer.config import DEFAULTS, Config


def mistyped(stored: dict, path: Path) -> str | None:
    """One line naming ``path`` and the first field of a stored config (config.json) whose value
    is not of its Config type; None when every value is."""
    for name, hint in typing.get_type_hints(Config).items():
        if name not in stored:
            continue
        v = stored[name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        args = typing.get_args(hint) if union else (hint,)
        if v is None and type(None) in args:
            continue
        kinds = [typing.get_origin(a) or a for a in args if a is not type(None)]  # list[x]: list
        ok = any(
            (k is float and isinstance(v, (int, float)) and not isinstance(v, bool))
            or (k is int and isinstance(v, int) and not isinstance(v, bool))
            or (k in (str, bool, dict) and isinstance(v, k))
            or (k in (list, tuple) and isinstance(v, list))
            for k in kinds
        )
        if not ok:
            want = " or ".join(getattr(k, "__name__", str(k)) for k in kinds)
            return (f"{path}: {name} is {v!r}, not a {want}; correct the file (it is what "
                    f"--resume continues)")
    return None


def check_out(cfg: Config) -> None:
    """OUT is a folder we can create or reuse, and a new run never writes into another run."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"bad configuration: --out {out} exists and is not a folder; choose another --out")
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not os.access(ancestor, os.W_OK):
        raise ValueError(
            f"bad configuration: --out {out}: cannot write in {ancestor}; choose another --out")
    if not cfg.resume and (out / "config.json").exists():
        stored = {**DEFAULTS, **loads((out / "config.json").read_text())}
        diff = sorted(k for k, v in dataclasses.asdict(cfg).items()
                      if stored.get(k) != v and k not in ("progress", "tensorboard", "resume"))
        if not diff and latest_step(out) == 0:
            return  # the same run, stopped before its first checkpoint: it starts again from step 1
        what = f"a different config (fields {diff})" if diff else "the same config"
        raise ValueError(f"bad configuration: output folder {out} already holds a run with {what}; "
                         f"pass --resume {out} to continue it, or choose another --out")


# what --resume OUT may change; every other flag must equal the stored run's
RESUME_CHANGEABLE = ("steps", "progress", "tensorboard", "eval_every", "save_every",
                     "keep_checkpoints", "dist_timeout")


def resume_config(given: dict) -> Config:
    """The stored config of run folder ``given["resume"]`` with the flags ``given`` that may change,
    continued there (wherever the run was first written: a moved folder, or a relative --out
    resumed from another working directory, stays where it is)."""
    out = Path(given["resume"])
    if "out" in given:
        raise ValueError(f"--resume {out} continues the run in {out}: drop --out")
    path = out / "config.json"
    if not path.is_file():
        if out.is_dir():  # the folder of a run killed while it set up (its lock file, say)
            raise ValueError(f"--resume {out}: the run there never started ({path} was never "
                             f"written: it was stopped while setting up); the command that "
                             f"started it starts it again")
        raise ValueError(f"--resume {out}: no run there ({path} not found)")
    try:
        stored = loads(path.read_text())
        cfg = Config(**stored)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--resume {out}: {path} is not an rpg-train config ({e})") from e
    if wrong := mistyped(stored, path):
        raise ValueError(f"--resume {out}: {wrong}")
    flat = {**stored, **{f"{cfg.task}_{k}": v for k, v in cfg.task_options.items()},
            **{f"{cfg.engine}_{k}": v for k, v in cfg.engine_options.items()}}
    differ = {k: (flat.get(k), v) for k, v in given.items()
              if k not in (*RESUME_CHANGEABLE, "resume") and flat.get(k) != v}
    if differ:
        raise ValueError(f"--resume {out}: flags differ from the stored run's config: {differ}; "
                         f"only {sorted(RESUME_CHANGEABLE)} may change on resume")
    cfg = dataclasses.replace(cfg, **{k: v for k, v in given.items() if k in RESUME_CHANGEABLE},
                              resume=str(out), out=str(out))
    reached = latest_step(out)
    if cfg.steps < reached:
        raise ValueError(f"--resume {out}: --steps {cfg.steps} is below the step the run has "
                         f"reached ({reached}); pass --steps >= {reached}")
    return cfg


def check_job(cfg, n_ranks: int | None = None) -> None:
    """What a run of ``n_ranks`` processes needs (ValueError naming the fix, before any work)."""
    W = n_ranks or world()
    if cfg.resume:
        stored = checkpoint_world_size(Path(cfg.resume))
        if stored not in (None, W):
            how = (
                "one process (no torchrun)"
                if stored == 1
                else f"torchrun --nproc_per_node {stored}"
            )
            raise ValueError(
                f"--resume {cfg.resume}: its checkpoint was written by {stored} rank(s), "
                f"this run has {W}; a run resumes only on the same number: use {how} "
                f"(its model.safetensors is the full policy, loadable anywhere)"
            )
    if W == 1:
        return
    N, M = cfg.prompts_per_step * cfg.group_size, cfg.mini_batch_size
    if N % W or M % W:
        raise ValueError(
            f"bad configuration: {W} ranks need the batch ({cfg.prompts_per_step} prompts "
            f"x {cfg.group_size} = {N} responses) and --mini-batch-size ({M}) divisible "
            f"by {W}; change them or --nproc_per_node"
        )
    if cfg.micro_batch_size and (M // W) % cfg.micro_batch_size:
        raise ValueError(
            f"bad configuration: --micro-batch-size {cfg.micro_batch_size} counts responses "
            f"per rank and must divide each rank's mini-batch ({M} / {W} ranks = {M // W})"
        )
    if not cfg.dist_timeout > 0:
        raise ValueError(
            f"bad configuration: --dist-timeout must be > 0 seconds, got {cfg.dist_timeout}"
        )


def checkpoint_world_size(out: Path) -> int | None:
    """The world size of run folder ``out``'s latest checkpoint (None: no checkpoint yet)."""
    state = latest_state(out)
    return None if state is None else state.get("world_size", 1)


def check_machine(cfg: Config) -> None:
    """What the Config cannot know: that this machine has --device and the tensorboard package."""
    device = torch.device("cpu" if cfg.device == "auto" else cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        why = "no GPU is visible" if torch.version.cuda else "this torch is a CPU-only build"
        raise ValueError(f"bad configuration: --device {cfg.device}: CUDA is not available here "
                         f"({why}); use --device cpu (or auto)")
    if device.type == "cuda" and (device.index or 0) >= (n := torch.cuda.device_count()):
        raise ValueError(f"bad configuration: --device {cfg.device}: this machine has {n} GPU(s) "
                         f"(cuda:0..cuda:{n - 1})")
    if cfg.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as e:
            raise ValueError(f"bad configuration: --tensorboard needs the tensorboard package "
                             f"({e}); pip install tensorboard") from None
