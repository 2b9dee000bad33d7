"""How a run ends on a signal: the critical sections that SIGINT and SIGTERM wait for, and the
one line a run stopped by a signal, or by another rank's failure, prints.

The end of a training step writes its metrics row and, on a checkpoint step, its checkpoint; a
signal between the two would leave a row whose checkpoint is missing. Inside ``signals_deferred()``
the two signals are only recorded. When the section ends the previous handlers are back (exactly the
objects that were installed) and the recorded signals are raised again in order of arrival, so they
reach them as if they had just arrived: Ctrl-C's KeyboardInterrupt, ``Interrupted`` for SIGTERM
(rpg-train's handler: ``raise_interrupted``), the default action, or nothing for an ignored one.
Outside a section nothing changes. A section that raises ends with its own exception (the run is
ending either way). SIGKILL cannot wait: a resumed run drops metrics rows newer than its checkpoint
(rpg_ref/trainer/metrics.py).

Only the main thread may set handlers: elsewhere the section is a no-op. Under torchrun every rank
gets the signal and defers it in its own process. A section must hold no collective: a rank
interrupted just before it would leave the others waiting inside it. The loop gathers a checkpoint's
state first (rpg_ref.trainer.checkpoint.checkpoint_state) and only writes files inside.

rpg-train (rpg_ref/cli.py) ends a run stopped by a signal with ``interrupted_message`` (the step
reached, what is saved, the --resume command), and a rank stopped by another rank's failure with
``peer_line`` (which rank, when the heartbeats tell).
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import threading
from pathlib import Path

from rpg_ref.trainer.checkpoint import latest_step
from rpg_ref.trainer.collectives import rank
from rpg_ref.trainer.distributed.liveness import silent_peers
from rpg_ref.trainer.errors import Interrupted

DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_deferred(signums=DEFERRED):
    """``with signals_deferred(): ...``: SIGINT and SIGTERM wait until the block has ended."""
    previous = {s: signal.getsignal(s) for s in signums}
    # None: a handler not set from Python, which could not be put back
    if threading.current_thread() is not threading.main_thread() or None in previous.values():
        yield
        return
    pending = []
    try:
        for s in signums:
            signal.signal(s, lambda signum, frame: pending.append(signum))
        yield
    finally:
        _restore(previous)
    for s in dict.fromkeys(pending):  # in order of arrival, each once
        signal.raise_signal(s)  # its handler runs before this returns


def _restore(previous: dict) -> None:
    """Put every previous handler back, even when one raises on the way (signal.signal first runs
    the handlers of signals that just arrived): the first such exception is raised once all are."""
    error = None
    for s, handler in previous.items():
        while signal.getsignal(s) != handler:
            try:
                signal.signal(s, handler)
            except BaseException as e:  # noqa: BLE001 - re-raised below, once every handler is back
                error = error or e
    if error is not None:
        raise error


def raise_interrupted(signum, frame):
    raise Interrupted(signum)


def interrupted_message(cfg, signum: int) -> str:
    """One line: the signal, the step reached, what is saved, and the command that continues
    (``cfg``: the run's Config, None when this process holds no run folder)."""
    name = signal.Signals(signum).name
    out = Path(cfg.out) if cfg is not None and cfg.out else None
    if out is None or not (out / "config.json").is_file():
        return f"rpg-train: interrupted ({name}) before the run started; nothing was written"
    metrics = out / "metrics.jsonl"
    done = metrics.read_text().count("\n") if metrics.is_file() else 0  # complete rows: steps done
    saved = latest_step(out)
    kept = (f"checkpoint of step {saved} in {out / 'checkpoints'}" if saved
            else "no checkpoint yet (the run restarts from step 1; the same command works too)")
    return (f"rpg-train: interrupted ({name}) after step {done} of {cfg.steps}; saved: {kept}; "
            f"continue with: rpg-train --resume {shlex.quote(str(out))}")


def peer_line(what: str, wait_s: float = 4.0) -> str:
    """This rank stopped because another failed: which one, when the heartbeats tell."""
    who = silent_peers(wait_s)
    where = (f"{'; '.join(who)}: look there first (torchrun's report names the first rank to exit)"
             if who else "torchrun's report names the rank that failed first")
    return f"rank {rank()} stopped: another rank died or stopped responding ({what}); {where}"
