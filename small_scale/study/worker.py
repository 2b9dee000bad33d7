"""Persistent worker processes for the study runner: torch, transformers and rpg-train are imported
once per worker, and each job is a fork of that worker that runs rpg-train's main.

A fresh ``python -m rpg_ref.cli`` spends seconds importing torch and transformers before its
first step; a worker pays that once. Each job still gets a process of its own (a fork of the
worker, which has imported but never run anything): its own pid, signals, exit code, CPU time and
open files, exactly as the fresh process it replaces, so a run's outputs are the same bit for bit
(tests/test_study_worker.py), and SIGINT / SIGTERM, resume and the per-job lock work as they
do for a process started from scratch.

    worker = Worker()                                   # starts and preloads (seconds)
    status, cpu_s = worker.run(argv, log, claim_fd, on_pid)
    worker.close()

The runner and its worker talk over a Unix SEQPACKET socket pair, one JSON message each way per
step: runner -> worker {"argv", "log"} with the job's lock file descriptor attached (the fork
inherits it, so a run outliving a killed runner keeps its claim); worker -> runner {"ready"} once,
then per job {"pid"} when the fork starts and {"status", "cpu_s"} when it ends (os.wait4: the
job's own user + system time). A worker exits when the runner closes its end.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what a study job imports before its first step (rpg-train, the seq task's Qwen3); optional ones
# (transformers: the llm extra) are left to the job when absent
PRELOAD = ("rpg_ref.cli", "rpg_ref.trainer.train", "rpg_ref.tasks.seq", "safetensors.torch")
PRELOAD_OPTIONAL = ("transformers", "transformers.models.qwen3.modeling_qwen3")
MSG = 1 << 16


def _send(sock: socket.socket, msg: dict, fds: tuple = ()) -> None:
    data = json.dumps(msg).encode()
    socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)


# ----------------------------------------------------------------------------------------------
# the runner's side
# ----------------------------------------------------------------------------------------------

class WorkerDied(RuntimeError):
    """The worker process ended or failed to start (its message says why)."""


class Worker:
    """One persistent worker process (started and preloaded here; seconds)."""

    def __init__(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __spec__.name, str(theirs.fileno())], cwd=ROOT,
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)  # our signal handler forwards
        theirs.close()
        self.sock = mine
        got = self._recv()
        if "ready" not in got:
            self.close()
            raise WorkerDied(f"the study worker did not start: {got.get('error')}")

    def _recv(self) -> dict:
        data = self.sock.recv(MSG)
        if not data:
            raise WorkerDied(f"the study worker (PID {self.proc.pid}) ended unexpectedly")
        return json.loads(data)

    def run(self, argv: list, log: Path, claim_fd: int, on_pid) -> tuple[int, float]:
        """rpg-train's main(argv) in a fork of the worker, its output appended to ``log``;
        ``on_pid(pid)`` once the fork runs. Returns (exit code as subprocess gives it: negative
        for a signal, CPU seconds of the job)."""
        _send(self.sock, {"argv": argv, "log": str(log)}, (claim_fd,))
        on_pid(self._recv()["pid"])
        end = self._recv()
        return os.waitstatus_to_exitcode(end["status"]), end["cpu_s"]

    def close(self) -> None:
        self.sock.close()   # the worker reads the end of its socket and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=60)


# ----------------------------------------------------------------------------------------------
# the worker's side
# ----------------------------------------------------------------------------------------------

def job(argv: list, log: str) -> int:
    """In the fork: what ``python -m rpg_ref.cli ARGV > log 2>&1`` does after its imports."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from rpg_ref import cli
    sys.argv = [cli.__file__, *argv]
    try:
        return cli.main(argv)
    except SystemExit:
        raise
    except KeyboardInterrupt:   # as the interpreter reports one reaching the top
        traceback.print_exc()
        return 130
    except BaseException:  # noqa: BLE001 -- as the interpreter does: a traceback, exit code 1
        traceback.print_exc()
        return 1


def serve(sock: socket.socket) -> None:
    try:
        for name in PRELOAD:
            importlib.import_module(name)
        for name in PRELOAD_OPTIONAL:
            with contextlib.suppress(ModuleNotFoundError):
                importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 -- said to the runner in one line
        _send(sock, {"error": f"{type(e).__name__}: {e}"})
        return
    _send(sock, {"ready": True})
    while True:
        data, fds, _, _ = socket.recv_fds(sock, MSG, 1)
        if not data:
            return
        msg = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:   # the job: leaves through the interpreter's own exit (atexit, threads)
            sock.close()
            sys.exit(job(msg["argv"], msg["log"]))
        _send(sock, {"pid": pid})
        _, status, ru = os.wait4(pid, 0)
        for fd in fds:
            os.close(fd)    # the job's claim: released once the job has ended
        _send(sock, {"status": status, "cpu_s": ru.ru_utime + ru.ru_stime})


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
