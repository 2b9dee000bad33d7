"""Which rank failed: every rank of a torchrun job writes a heartbeat (time, PID, host) into
torchrun's store, so that the rank that notices a failure can say which rank died or hangs, and a
rank that ends on a signal says so first (it is not a rank that died). One process: nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import torch.distributed as dist

from rpg_ref.trainer.collectives import active, rank, world

BEAT_S = 1.0  # a rank writes "time pid host" under rpg/beat/<rank> this often (a daemon thread)


def _store():
    return dist.distributed_c10d._get_default_store()


def start_heartbeat() -> None:
    """Every BEAT_S seconds, from a daemon thread: a stopped (SIGSTOP) or dead rank stops beating,
    so the rank that notices a failure can name it (``silent_peers``)."""
    store, key = _store(), f"rpg/beat/{rank()}"
    ident = f"{os.getpid()} {socket.gethostname()}"

    def beat():
        while True:
            try:
                store.set(key, f"{time.time():.3f} {ident}")
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return
            time.sleep(BEAT_S)

    threading.Thread(target=beat, name="rpg-heartbeat", daemon=True).start()


def mark_stopping() -> None:
    """A rank that ends on a signal says so first: it is not a rank that died."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):  # best effort, on the way out
            _store().set(f"rpg/stopping/{rank()}", "1")


def peers_stopping() -> bool:
    """Another rank ended on a signal (``mark_stopping``): a collective failing now is no fault."""
    if not active():
        return False
    try:
        store = _store()
        return any(store.check([f"rpg/stopping/{r}"]) for r in range(world()) if r != rank())
    except Exception:  # noqa: BLE001 - a report on the way out must not raise
        return False


def _gone(pid: str) -> bool:
    """The process has exited (no /proc entry, or a zombie its parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


def silent_peers(wait_s: float = 0.0, quiet_s: float = 3 * BEAT_S) -> list[str]:
    """'rank 1 (PID 42 on host) has exited' for another rank whose process is gone (same host)
    without saying it was stopping, 'rank 1 (PID 42 on host) gave no sign of life for 21 s' for
    one whose heartbeat is older than ``quiet_s``; [] when none is, or nothing can be read.
    ``wait_s``: look again until one is found or that time has passed (a rank that just died may
    not have exited yet, and its heartbeat goes quiet only after ``quiet_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = _silent_peers(quiet_s)
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def _silent_peers(quiet_s: float) -> list[str]:
    if not active():
        return []
    try:
        store, out = _store(), []
        for r in range(world()):
            if r == rank() or not store.check([f"rpg/beat/{r}"]):
                continue
            t, pid, host = store.get(f"rpg/beat/{r}").decode().split()
            who = f"rank {r} (PID {pid} on {host})"
            if store.check([f"rpg/stopping/{r}"]):
                continue
            if host == socket.gethostname() and _gone(pid):
                out.append(f"{who} has exited")
            elif time.time() - float(t) > quiet_s:
                out.append(f"{who} gave no sign of life for {time.time() - float(t):.0f} s")
        return out
    except Exception:  # noqa: BLE001 - a report on the way out must not raise
        return []


def peer_failure(e: BaseException) -> bool:
    """An error of the process group (another rank died, or a collective timed out)."""
    return active() and (isinstance(e, dist.DistError)
                         or (isinstance(e, RuntimeError) and "gloo" in str(e)))
