"""Atomic, verified checkpoints: everything a killed run needs to continue exactly where it was.

OUT/checkpoints/step_XXXXXX/ holds model.safetensors, ref.safetensors (--ref init), optimizer.pt,
rng.pt (python, numpy, torch, CUDA and the prompt generator's states), sampler_lag.pt
(--sampler-lag: rpg_ref.trainer.sampler_lag), state.json (the step and the config) and, written
last, manifest.json: every other file's size and sha256 (per 128 MiB
block, so that the blocks of a large checkpoint are hashed in parallel). A checkpoint is
written into a temporary folder and renamed into place; only then is OUT/checkpoints/LATEST
replaced (also by a rename), so a crash at any moment leaves either the old or the new checkpoint,
never a half-written one. The latest ``keep`` checkpoints are kept (--keep-checkpoints; 0 keeps
all). A run resumed from it is bitwise identical on CPU to one that was never interrupted
(tests/test_train.py).

Resume checks the manifest (``pick``): a checkpoint whose files are missing, truncated or differ
in one bit is named in one line and the newest intact one is used instead (ResumeError, one line,
when none is). A full disk ends the write with one line (DiskFull) and leaves no partial folder.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import math
import os
import random
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import safetensors.torch
import torch

from rpg_ref.strict_json import dumps, loads
from rpg_ref.trainer.checkpoint_shards import full_states, load_full_states
from rpg_ref.trainer.collectives import active, is_main, main_decides, world
from rpg_ref.trainer.errors import DiskFull, Diverged, ResumeError, flag_advice
from rpg_ref.trainer.files import atomic_write

MANIFEST = "manifest.json"


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
    rng = {**rng_state(), "prompt_gen": gen.get_state()}
    full = full_states(policy, ref, opt, rng)  # torchrun: gathered by every rank; else None
    if full is not None:
        return full
    files = {"model.safetensors": policy, "ref.safetensors": ref,
             "optimizer.pt": opt.state_dict(), "rng.pt": rng}
    return {name: content for name, content in files.items() if content is not None}


BLOCK = 1 << 27  # files are hashed in blocks of 128 MiB, all blocks in parallel threads


def sha256(path: Path, start: int = 0, length: int | None = None) -> str:
    """sha256 of ``length`` bytes of ``path`` from ``start`` (None: to the end)."""
    h, left = hashlib.sha256(), math.inf if length is None else length
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        buf = bytearray(1 << 22)
        view = memoryview(buf)
        while left > 0 and (n := f.readinto(buf)):
            n = int(min(n, left))
            h.update(view[:n])  # releases the GIL: blocks hash in parallel
            left -= n
    return h.hexdigest()


def block_hashes(paths: list[Path], block: int) -> list[list[str]]:
    """Per file, the sha256 of each ``block`` bytes (one block for an empty file)."""
    jobs = [(i, p, start) for i, p in enumerate(paths)
            for start in range(0, max(p.stat().st_size, 1), block)]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = max(1, min(len(jobs), cpus or 1))
    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(lambda job: sha256(job[1], job[2], block), jobs))
    out = [[] for _ in paths]
    for (i, _, _), h in zip(jobs, done):
        out[i].append(h)
    return out


def write_manifest(ck: Path) -> None:
    """ck/manifest.json: the size and the block sha256s of every other file of folder ``ck``."""
    files = sorted(p for p in ck.iterdir() if p.is_file() and p.name != MANIFEST)
    entries = {p.name: {"bytes": p.stat().st_size, "sha256": h}
               for p, h in zip(files, block_hashes(files, BLOCK))}
    (ck / MANIFEST).write_text(dumps({"block_bytes": BLOCK, "files": entries}, indent=1))


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _stored_bytes(ck: Path) -> int:
    return sum(p.stat().st_size for p in ck.iterdir() if p.is_file())


def _mb(n: float) -> str:
    """Bytes for people: 25.3 KiB, 1.2 GiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


def save_checkpoint(out: Path, step: int, state: dict, cfg, keep: int = 1) -> None:
    """Write ``state`` (checkpoint_state: {file name: content}, every file whatever its name) and
    state.json as checkpoints/step_XXXXXX into a temp dir, its manifest last, rename it into
    place, point LATEST at it, then delete all but the latest ``keep`` checkpoints (0: keep all).
    Only rank 0 writes; no collective. A full disk: DiskFull, the temp dir removed, LATEST and
    the previous checkpoints untouched."""
    if not is_main():
        return
    bad = [name for name, m in state.items() if isinstance(m, torch.nn.Module)
           and not all(bool(torch.isfinite(p).all()) for p in m.parameters())]
    if bad:  # never saved: a resume must start from finite weights
        raise Diverged(f"step {step}: the weights to save in {', '.join(bad)} are not finite: "
                       f"training diverged; {flag_advice(cfg)}")
    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for name, content in state.items():
            save = safetensors.torch.save_model if name.endswith(".safetensors") else torch.save
            save(content, str(tmp / name))
        (tmp / "state.json").write_text(dumps({"step": step, "config": dataclasses.asdict(cfg),
                                               "world_size": world()}))
        write_manifest(tmp)
    except BaseException as e:
        # torch.save reports a full disk as "unexpected pos": judged by the space left as well
        full = isinstance(e, Exception) and (
            getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)
            or shutil.disk_usage(root).free < 2**20)
        shutil.rmtree(tmp, ignore_errors=True)
        if not full:
            raise
        prev, _ = pick(out, full=False)
        need = max(_tensor_bytes(state), _stored_bytes(prev) if prev else 0)
        kept = f"the checkpoint {prev.name} is intact" if prev else "no checkpoint yet"
        raise DiskFull(errno.ENOSPC, f"no space left in {root}: the checkpoint of step {step} "
                       f"needs about {_mb(need)}, {_mb(shutil.disk_usage(root).free)} are free; "
                       f"{kept}; free some space and continue with: rpg-train --resume {out}"
                       ) from None
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    atomic_write(root / "LATEST", final.name)
    older = sorted(p for p in root.glob("step_*") if p.name < final.name)
    # from before a resume: discarded
    stale = [p for p in root.glob("step_*") if p.name > final.name]
    for old in stale + (older[: max(0, len(older) - (keep - 1))] if keep else []):
        shutil.rmtree(old, ignore_errors=True)


# =============================================================================================
# resume: which checkpoint, verified
# =============================================================================================


def _state(ck: Path) -> tuple[dict | None, str | None]:
    """(ck/state.json, None), or (None, what is wrong with it)."""
    try:
        st = loads((ck / "state.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"
    if not isinstance(st, dict) or type(st.get("step")) is not int:
        return None, "no integer 'step'"
    return st, None


def read_state(ck: Path) -> dict:
    """ck/state.json; ResumeError naming the file when it is not what save_checkpoint wrote."""
    st, why = _state(ck)
    if why:
        raise ResumeError(f"{ck / 'state.json'} is not a checkpoint's state ({why})")
    return st


def problem(ck: Path, full: bool = True) -> str | None:
    """What is wrong with checkpoint folder ``ck`` (None: intact). ``full``: every file's sha256
    too, else only the sizes (cheap). A folder without manifest.json (written before checkpoints
    had one) is checked for its files only."""
    path = ck / MANIFEST
    try:
        manifest = loads(path.read_text())
        files, block = manifest["files"], int(manifest["block_bytes"])
        sizes = {k: int(v["bytes"]) for k, v in files.items()}
    except FileNotFoundError:
        files = sizes = None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__}: {e})"
    for name in sizes or ("model.safetensors", "optimizer.pt", "rng.pt", "state.json"):
        if not (ck / name).is_file():
            return f"{name} is missing"
    for name, n in (sizes or {}).items():
        got = (ck / name).stat().st_size
        if got != n:
            return f"{name} has {got} bytes, its manifest says {n} (" + (
                "truncated)" if got < n else "grown)")
    if files is not None and full:
        names = sorted(files)
        for name, h in zip(names, block_hashes([ck / n for n in names], block)):
            if h != files[name]["sha256"]:
                return f"{name} differs from its manifest's sha256 (a changed byte)"
    _, why = _state(ck)
    return None if why is None else f"state.json is unreadable ({why})"


def pick(out: Path, full: bool = True) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume run folder ``out`` from: the one LATEST names, else (damaged,
    LATEST empty or naming a missing folder) the newest intact one; and a line for each one passed
    over. (None, notes): no checkpoint (notes empty: none was ever written)."""
    root = out / "checkpoints"
    notes, first = [], None
    latest = root / "LATEST"
    if latest.exists():
        try:
            name = latest.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            name = ""
            notes.append(f"{latest} is unreadable ({e})")
        if not name:
            notes += [] if notes else [f"{latest} is empty"]
        elif not name.startswith("step_") or not (root / name).is_dir():
            notes.append(f"{latest} names {name!r}, which is not a checkpoint folder there")
        else:
            first = root / name
    found = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
    if first is not None:  # LATEST's, then older ones (newer ones predate a resume: never used)
        found = [first] + [p for p in found if p.name < first.name]
    elif found and not latest.exists():
        notes.append(f"{latest} is missing")
    for ck in found:
        why = problem(ck, full)
        if why is None:
            return ck, notes
        notes.append(f"checkpoint {ck.name} is damaged: {why}")
    return None, notes


def latest_state(out: Path) -> dict | None:
    """state.json of the checkpoint a resume of ``out`` would start from, sizes checked but not
    hashes (cheap); None when there is none."""
    ck, _ = pick(out, full=False)
    return None if ck is None else read_state(ck)


def latest_step(out: Path) -> int:
    """The step of run folder ``out``'s latest usable checkpoint (0: none)."""
    st = latest_state(out)
    return 0 if st is None else st["step"]


def _choose(out: Path) -> tuple[str | None, str | None]:
    """(folder to load, line to print) or (None, error line); (None, None): nothing to load."""
    ck, notes = pick(out, full=True)
    if ck is None:
        if not notes:
            return None, None
        return None, (f"--resume {out}: no intact checkpoint in {out / 'checkpoints'}: "
                      f"{'; '.join(notes)}; start the run again with another --out")
    note = (f"rpg-train: {'; '.join(notes)}; resuming from {ck.name}, the newest intact checkpoint"
            if notes else None)
    return str(ck), note


def _loading(out: Path, path: Path, load):
    """load(path), its failure one line naming the file (a checkpoint without a manifest, or one
    of another model or optimizer: safetensors, pickle and torch each raise their own)."""
    try:
        return load(path)
    except Exception as e:  # noqa: BLE001 - reported in one line
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ResumeError(f"--resume {out}: {path} cannot be loaded ({why})") from None


class Resumed(NamedTuple):
    """The checkpoint a resume continues from."""

    step: int
    folder: Path  # files a feature adds to a checkpoint are read from here: the weights' step


def load_checkpoint(out: Path, policy, ref, opt, gen: torch.Generator) -> Resumed | None:
    """Restore the checkpoint ``pick`` chooses in run folder ``out`` (verified against its
    manifest); None when there is none yet. ResumeError (one line) when none is intact."""
    ck, line = main_decides(lambda: _choose(out))  # rank 0 verifies, every rank loads that one
    if ck is None:
        if line is not None:
            raise ResumeError(line)
        return None
    if line and is_main():
        print(line, file=sys.stderr, flush=True)
    ck = Path(ck)
    step = read_state(ck)["step"]
    if active():  # a sharded run: every rank loads its shards (rpg_ref.trainer.checkpoint_shards)
        st = _loading(out, ck, lambda p: load_full_states(p, policy, ref, opt))
    else:
        dev = str(next(policy.parameters()).device)
        for model, name in ((policy, "model.safetensors"), (ref, "ref.safetensors")):
            if model is not None:
                _loading(out, ck / name,
                         lambda p, m=model: safetensors.torch.load_model(m, str(p), device=dev))
        _loading(out, ck / "optimizer.pt",
                 lambda p: opt.load_state_dict(torch.load(p, weights_only=True)))
        st = _loading(out, ck / "rng.pt", lambda p: torch.load(p, weights_only=True))
    _loading(out, ck / "rng.pt", lambda p: (set_rng_state(st), gen.set_state(st["prompt_gen"])))
    return Resumed(step, ck)
