"""One writer per run folder: an OS lock on OUT/.lock, held for the life of the run.

``claim(out)`` takes an exclusive ``flock`` on OUT/.lock (non-blocking) and writes this process's
PID and host into it. A second rpg-train into the same --out, or a --resume of a run that is still
going, is refused with one line naming the holder's PID, before it writes anything. The kernel
drops the lock when the holder's process ends in any way (kill -9 included), so a stale file never
blocks anyone; children that fork without exec close their copy of the descriptor (a forked
helper outliving a killed run must not keep the folder locked). Under torchrun rank 0 holds it.

When OUT does not exist, ``claim`` creates it to hold the lock; ``release`` removes the lock file,
and the folders ``claim`` created when nothing else was written into them, so a run refused (or
stopped) before it started leaves no trace. Once the lock is held, the temporary files of writers
that died (``.tmp_step_*``, ``.LATEST.tmp<PID>``, ``.<file>.tmp<PID>``) are leftovers and are
removed: no live writer can own them.

The folder's rules for a configuration live here too: ``check_out`` (OUT can be written, and a new
run never writes into another run) and ``resume_config`` (the stored config of ``--resume OUT``,
with the few flags a resume may change).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import shutil
import socket
import time
import types
import typing
from pathlib import Path

from rpg_ref.strict_json import loads
from rpg_ref.trainer.checkpoint import latest_step
from rpg_ref.trainer.config import DEFAULTS, Config

LOCK = ".lock"
_HELD: dict[Path, RunLock] = {}  # resolved OUT -> this process's lock on it


class FolderBusy(ValueError):
    """Another process holds the run folder's lock."""


class RunLock:
    def __init__(self, out: Path, fd: int, created: list[Path]):
        self.out, self.fd, self.created, self.users = out, fd, created, 1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Unlock (the lock file is removed first: a process that opened the old file sees it is
        no longer the folder's lock and opens the new one), and remove the folders ``claim``
        created if the run wrote nothing into them."""
        self.users -= 1
        if self.users > 0 or self.fd < 0:
            return
        _HELD.pop(self.out, None)
        with contextlib.suppress(OSError):
            os.unlink(self.out / LOCK)
        os.close(self.fd)
        self.fd = -1
        for folder in self.created:  # deepest first
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break


def _close_in_child() -> None:
    for lock in _HELD.values():
        if lock.fd >= 0:
            os.close(lock.fd)  # the parent's lock stays: flock belongs to the open file
            lock.fd = -1


os.register_at_fork(after_in_child=_close_in_child)


def holder(out: Path) -> str:
    """'PID 123 on host h' from the lock file (written right after the lock is taken)."""
    for _ in range(20):
        try:
            text = (out / LOCK).read_text().split()
        except OSError:
            text = []
        if len(text) >= 2:
            return f"PID {text[0]} on {text[1]}"
        time.sleep(0.05)  # the holder is between taking the lock and writing its PID
    return "a process that is starting"


def busy_line(out: Path) -> str:
    return (f"run folder {out} is in use by another rpg-train ({holder(out)}); wait for it to "
            f"end or stop it, or choose another --out")


def in_use(out: Path) -> str | None:
    """busy_line(out) when another process holds ``out``'s lock, else None (nothing is created)."""
    if out.resolve() in _HELD:
        return None
    try:
        fd = os.open(out / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError:
        return busy_line(out)
    finally:
        os.close(fd)  # also drops the shared lock


def claim(out: Path | str) -> RunLock:
    """Take run folder ``out``'s lock for this process (re-entrant within a process), creating
    ``out`` if needed; FolderBusy (one line) if another process holds it."""
    out = Path(out)
    key = out.resolve()
    if key in _HELD:
        _HELD[key].users += 1
        return _HELD[key]
    created = []
    folder = out
    while not folder.exists():
        created.append(folder)
        folder = folder.parent
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    tries = 0
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            tries += 1
            if tries < 4:  # ``in_use`` of a refused process holds it for a moment: try again
                time.sleep(0.05)
                continue
            raise FolderBusy(busy_line(out)) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder released and removed this file meanwhile: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    lock = _HELD[key] = RunLock(key, fd, created)
    remove_leftovers(out)
    return lock


def leftovers(out: Path) -> list[Path]:
    """Temporary files and folders of writers that died (meaningful only under the lock)."""
    ck = out / "checkpoints"
    found = list(ck.glob(".tmp_step_*")) + list(ck.glob(".*.tmp[0-9]*"))
    return found + list(out.glob(".*.tmp[0-9]*"))


def remove_leftovers(out: Path) -> None:
    for p in leftovers(out):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


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


def busy(args: list, error: str) -> str | None:
    """The lock holder's line when the folder a refusal names (--resume DIR or --out DIR in
    ``args``) is in use by another process: that is the reason."""
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        folder = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        if flag in ("--resume", "--out") and folder and folder in error:
            return in_use(Path(folder))
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
