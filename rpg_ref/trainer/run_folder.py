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

What a configuration may do with a folder (a new run never writes into another run; --resume
continues the stored config) is checked with the configuration, in rpg_ref/trainer/config_checks.py.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
import time
from pathlib import Path

from rpg_ref.trainer.errors import FolderBusy

LOCK = ".lock"
_HELD: dict[Path, RunLock] = {}  # resolved OUT -> this process's lock on it


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


def busy(args: list, error: str) -> str | None:
    """The lock holder's line when the folder a refusal names (--resume DIR or --out DIR in
    ``args``) is in use by another process: that is the reason."""
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        folder = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        if flag in ("--resume", "--out") and folder and folder in error:
            return in_use(Path(folder))
    return None
