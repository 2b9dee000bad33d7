"""Critical sections that SIGINT and SIGTERM wait for.

The end of a training step writes its metrics row and, on a checkpoint step, its checkpoint; a
signal between the two would leave a row whose checkpoint is missing. Inside ``signals_deferred()``
the two signals are only recorded. When the section ends the previous handlers are back (exactly the
objects that were installed) and the recorded signals are raised again in order of arrival, so they
reach them as if they had just arrived: Ctrl-C's KeyboardInterrupt, rpg-train's Interrupted for
SIGTERM (rpg_ref/cli.py), the default action, or nothing for an ignored one. Outside a section
nothing changes. A section that raises ends with its own exception (the run is ending either way).
SIGKILL cannot wait: a resumed run drops metrics rows newer than its checkpoint
(rpg_ref/trainer/metrics.py).

Only the main thread may set handlers: elsewhere the section is a no-op. Under torchrun every rank
gets the signal and defers it in its own process. A section must hold no collective: a rank
interrupted just before it would leave the others waiting inside it. The loop gathers a checkpoint's
state first (rpg_ref.trainer.checkpoint.checkpoint_state) and only writes files inside.
"""

from __future__ import annotations

import contextlib
import signal
import threading

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
