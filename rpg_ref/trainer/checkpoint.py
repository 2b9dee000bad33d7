"""Atomic checkpoints: everything a killed run needs to continue exactly where it was.

OUT/checkpoints/step_XXXXXX/ holds model.safetensors, ref.safetensors (--ref init), optimizer.pt,
rng.pt (python, numpy, torch, CUDA and the prompt generator's states), sampler_lag.pt
(--sampler-lag: rpg_ref.trainer.sampler_lag) and state.json (the step and the config). A
checkpoint is written into a temporary folder and renamed into place; only then is
OUT/checkpoints/LATEST replaced (also by a rename), so a crash at any moment leaves either the old
or the new checkpoint, never a half-written one. The latest ``keep`` checkpoints are kept
(--keep-checkpoints; 0 keeps all). A run resumed from it is bitwise identical on CPU
to one that was never interrupted (tests/test_train.py).
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from rpg_ref.strict_json import dumps, loads


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half-written)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def rng_state() -> dict:
    py = random.getstate()
    st = {"python": [*py[1], py[0], py[2]],
          "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
          "numpy_pos": np.random.get_state()[2],
          "torch": torch.get_rng_state()}
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


def checkpoint_state(policy, ref, opt, gen: torch.Generator) -> dict:
    """{file name: content} of a checkpoint taken now: the policy and pi_ref (modules, for
    save_model), the optimizer state and the RNG states. Under torchrun every rank calls it (it
    gathers the shards: a collective, so the loop calls it before the section that writes); rank 0
    gets the full state, the others {}."""
    from rpg_ref.trainer import distributed as D

    rng = {**rng_state(), "prompt_gen": gen.get_state()}
    full = D.full_states(policy, ref, opt, rng)  # torchrun: gathered by every rank; else None
    if full is not None:
        return full
    files = {"model.safetensors": policy, "ref.safetensors": ref,
             "optimizer.pt": opt.state_dict(), "rng.pt": rng}
    return {name: content for name, content in files.items() if content is not None}


def save_checkpoint(out: Path, step: int, state: dict, cfg, keep: int = 1) -> None:
    """Write ``state`` (checkpoint_state) as checkpoints/step_XXXXXX into a temp dir, rename it into
    place, point LATEST at it, then delete all but the latest ``keep`` checkpoints (0: keep all).
    Only rank 0 writes; no collective."""
    from safetensors.torch import save_model

    from rpg_ref.trainer import distributed as D

    if not D.is_main():
        return
    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, content in state.items():
        (save_model if name.endswith(".safetensors") else torch.save)(content, str(tmp / name))
    (tmp / "state.json").write_text(dumps({"step": step, "config": dataclasses.asdict(cfg),
                                                "world_size": D.world()}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    atomic_write(root / "LATEST", final.name)
    older = sorted(p for p in root.glob("step_*") if p.name < final.name)
    # from before a resume: discarded
    stale = [p for p in root.glob("step_*") if p.name > final.name]
    for old in stale + (older[: max(0, len(older) - (keep - 1))] if keep else []):
        shutil.rmtree(old, ignore_errors=True)


def latest_step(out: Path) -> int:
    """The step of run folder ``out``'s latest checkpoint (0: none yet)."""
    latest = out / "checkpoints" / "LATEST"
    if not latest.exists():
        return 0
    return loads((latest.parent / latest.read_text().strip() / "state.json").read_text())["step"]


def latest_checkpoint(out: Path) -> Path:
    """The folder of run folder ``out``'s latest checkpoint (where LATEST points)."""
    root = out / "checkpoints"
    return root / (root / "LATEST").read_text().strip()


def load_checkpoint(out: Path, policy, ref, opt, gen: torch.Generator) -> int:
    """Restore the latest checkpoint of run folder ``out``; returns its step (0: none yet)."""
    from safetensors.torch import load_model

    root = out / "checkpoints"
    if not (root / "LATEST").exists():
        return 0
    ck = root / (root / "LATEST").read_text().strip()
    from rpg_ref.trainer import distributed as D

    if D.active():  # a sharded run: every rank loads its shards (rpg_ref.trainer.distributed)
        st = D.load_full_states(ck, policy, ref, opt)
        set_rng_state(st)
        gen.set_state(st["prompt_gen"])
        return loads((ck / "state.json").read_text())["step"]
    dev = str(next(policy.parameters()).device)
    load_model(policy, str(ck / "model.safetensors"), device=dev)
    if ref is not None:
        load_model(ref, str(ck / "ref.safetensors"), device=dev)
    opt.load_state_dict(torch.load(ck / "optimizer.pt", weights_only=True))
    st = torch.load(ck / "rng.pt", weights_only=True)
    set_rng_state(st)
    gen.set_state(st["prompt_gen"])
    return loads((ck / "state.json").read_text())["step"]
