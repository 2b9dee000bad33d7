"""A task's warm-started weights, computed once per key and cached in --cache-dir.

Runs that start together with the same warm start (a study's workers, each on another cell of the
same seed) compute it once: the first takes an exclusive lock (a file in the cache's ``.locks``
folder) and trains, the others wait on the lock, then load what it wrote. The file is written
under another name and renamed, so a reader never sees half of it, and a run killed while
training leaves no file (the lock dies with its process).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from torch import nn


def cached_warm_start(model: nn.Module, cache_dir: str, prefix: str, key: str,
                      warm_start: Callable[[nn.Module], None]) -> nn.Module:
    """``model`` with the weights ``warm_start(model)`` gives it, from
    ``cache_dir/<prefix>-<sha256(key)[:16]>.safetensors`` when a run has already trained them."""
    from safetensors.torch import load_model, save_model

    path = Path(cache_dir) / f"{prefix}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.safetensors"
    device = str(next(model.parameters()).device)
    if path.exists():
        load_model(model, str(path), device=device)
        return model
    (path.parent / ".locks").mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".locks" / f"{path.stem}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        if path.exists():  # another run trained it while this one waited
            load_model(model, str(path), device=device)
            return model
        warm_start(model)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        save_model(model, str(tmp))
        os.replace(tmp, path)
    return model
