"""Joining a torchrun job and leaving it: the ranks' agreement on a refusal, the process group,
this process's device, the set-up's long wait, and how a rank ends
(rpg_ref/trainer/distributed/__init__.py).

A user's mistake (bad flags or data, a folder in use) is found by one rank or by all, at moments
seconds apart on a loaded machine. A rank that exits alone leaves the others waiting for it until
torchrun's agent stops them (SIGTERM, SIGKILL after 30 s) and prints a traceback of its own; so
every check that can refuse a run is made inside ``agree``: the ranks wait for each other's verdict
in torchrun's store (no process group needed), and if any refused, every rank raises the first
refusal at once and exits with code 2.

One process (no torchrun, or WORLD_SIZE=1): ``agree(fn)`` is fn(), ``join`` checks the
configuration and returns rank 0 of 1 on the run's device; nothing else happens.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from rpg_ref.trainer.collectives import active, rank, world
from rpg_ref.trainer.config_checks import check_job
from rpg_ref.trainer.distributed.liveness import start_heartbeat

STARTUP_TIMEOUT_S = 600.0  # the least a rank waits for the others while they set up
# torch's way to shorten a group's timeout once set up (torchtitan does the same); without it the
# group keeps --dist-timeout from the start
_set_pg_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
_collective_timeout_s: float | None = None   # --dist-timeout: set by join, applied by all_set_up
_agreements = 0  # the agreements this process has reached (every rank reaches the same ones)
_store = []  # torchrun's store, once connected


def _job_store():
    """torchrun's store (its agent's), reachable before the process group exists; None without
    torchrun's agent (one process, or ranks started by hand: no agreement, each rank refuses on its
    own)."""
    if world() == 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if not _store:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timedelta(seconds=STARTUP_TIMEOUT_S))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        _store.append(dist.PrefixStore(f"rpg/agree/{attempt}", store))
    return _store[0]


def agree(fn):
    """fn(), run by every rank; a ValueError (a user's mistake) in any rank's is every rank's: each
    waits until all have run fn (polling, so a signal still ends it), then raises the first
    refusal (the lowest rank's: its own exception there, a ValueError with its message
    elsewhere). One process, or no torchrun agent: fn()."""
    global _agreements
    store = _job_store()
    if store is None:
        return fn()
    n, _agreements = _agreements, _agreements + 1
    mine = result = None
    try:
        result = fn()
    except ValueError as e:
        mine = e
    store.set(f"{n}/{rank()}", "" if mine is None else f"refused:{mine}")
    keys = [f"{n}/{r}" for r in range(world())]
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not store.check(keys):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the ranks did not all finish setting up within "
                               f"{STARTUP_TIMEOUT_S:.0f} s")
        time.sleep(0.01)
    verdicts = [store.get(k).decode() for k in keys]
    first = next((r for r, v in enumerate(verdicts) if v), None)
    if first is None:
        return result
    if first == rank():
        raise mine
    raise ValueError(verdicts[first].removeprefix("refused:"))


class Rank(NamedTuple):
    """This process in the job (one process: rank 0 of 1)."""

    device: torch.device  # cuda:LOCAL_RANK under torchrun on CUDA
    index: int
    world: int

    @property
    def main(self) -> bool:
        """Rank 0: it writes the run folder and runs the evaluation."""
        return self.index == 0

    @property
    def seed_offset(self) -> int:
        """Added to the sampling seed: rank 0 keeps the single-process stream, the others their
        own."""
        return 1_000_003 * self.index


def join(cfg) -> Rank:
    """Check what a job of this many ranks needs (check_job), then join torchrun's process group
    (gloo on CPU, NCCL on CUDA) unless this process has joined it already; returns this process's
    Rank. One process: nothing is joined, and the Rank is (the run's device, 0, 1)."""
    global _collective_timeout_s
    agree(lambda: check_job(cfg))
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if cfg.device == "auto" else cfg.device)
    if world() == 1:
        return Rank(device, 0, 1)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():  # on CUDA the small CPU tensors of our reductions go through gloo
        wait = max(cfg.dist_timeout, STARTUP_TIMEOUT_S) if _set_pg_timeout else cfg.dist_timeout
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=wait))
        _collective_timeout_s = cfg.dist_timeout
        start_heartbeat()
    return Rank(device, rank(), world())


def all_set_up() -> None:
    """Returns once every rank has built and checked its inputs (so rank 0 writes nothing before
    every rank could refuse); from here a rank waits --dist-timeout in a collective, not the
    set-up's STARTUP_TIMEOUT_S. One process: nothing."""
    if not active():
        return
    dist.barrier()
    if _set_pg_timeout and _collective_timeout_s is not None:
        _set_pg_timeout(timedelta(seconds=_collective_timeout_s))


def tell_torchrun(line: str) -> None:
    """Under torchrun: ``line`` is why this rank ends, in the error file torchrun's agent reads, so
    that its report ("Root Cause ... traceback :") names the project's line, not "To enable
    traceback see ...". Elsewhere: nothing."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or world() == 1:
        return
    stamp = str(int(time.time()))
    data = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": stamp}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the report then says less; the line itself is printed anyway


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int):
    """End the process with ``code`` once its work is done. A torchrun rank flushes its output and
    leaves by os._exit, skipping the interpreter's final teardown: there, after
    destroy_process_group, torch 2.13's gloo backend now and then aborts the process ("terminate
    called without an active exception", no Python frame), turning a finished run into a failed
    torchrun job. One process: sys.exit."""
    if world() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
