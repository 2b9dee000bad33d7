"""rpg_ref/trainer/interrupts.py: SIGINT and SIGTERM wait for the end of a critical section, are
raised right after it, and interrupt at once outside it; the previous handlers are put back."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from rpg_ref.trainer.errors import Interrupted
from rpg_ref.trainer.interrupts import signals_deferred


def _raise_sigint(signum, frame):
    raise KeyboardInterrupt


def _raise_sigterm(signum, frame):
    raise Interrupted(signum)


@pytest.fixture
def handlers():
    """rpg-train's handlers (Ctrl-C's KeyboardInterrupt, SIGTERM's Interrupted), as new function
    objects (so that putting back exactly these is checkable); the originals afterwards."""
    mine = {signal.SIGINT: _raise_sigint, signal.SIGTERM: _raise_sigterm}
    before = {s: signal.signal(s, h) for s, h in mine.items()}
    yield mine
    for s, h in before.items():
        signal.signal(s, h)


def _installed() -> dict:
    return {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}


def _kill_then(sig, done: list, what: str) -> None:
    os.kill(os.getpid(), sig)  # delivered before kill returns (a signal to oneself)
    done.append(what)


def _section(body, *args) -> None:
    with signals_deferred():
        body(*args)


@pytest.mark.parametrize("sig,raised", [(signal.SIGINT, KeyboardInterrupt),
                                        (signal.SIGTERM, Interrupted)], ids=["SIGINT", "SIGTERM"])
def test_signal_inside_the_section_is_raised_when_it_ends(handlers, sig, raised):
    """A signal sent inside the section lets the section run to its end, is raised right after it
    as the handler's own exception (SIGTERM's Interrupted keeps its signum), and the previous
    handlers are the installed ones again (the very objects)."""
    done = []
    with pytest.raises(raised) as e:
        _section(_kill_then, sig, done, "rest of the section")
    assert done == ["rest of the section"]
    assert type(e.value) is raised and getattr(e.value, "signum", sig) == sig
    assert _installed() == handlers


def test_signal_outside_the_section_interrupts_at_once(handlers):
    """Before and after a section (which leaves the handlers exactly as they were), SIGTERM raises
    at once: the statement after the kill never runs."""
    done = []
    with pytest.raises(Interrupted):
        _kill_then(signal.SIGTERM, done, "before")
    _section(done.append, "section")
    assert _installed() == handlers
    with pytest.raises(Interrupted):
        _kill_then(signal.SIGTERM, done, "after")
    assert done == ["section"]


def test_section_that_raises_puts_the_handlers_back(handlers):
    """A section ended by its own exception propagates it unchanged and leaves the previous
    handlers installed."""
    inside = []

    def fail():
        inside.append(_installed())
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _section(fail)
    assert inside and inside[0] != handlers  # deferring inside
    assert _installed() == handlers


def test_ignored_signal_stays_ignored(handlers):
    """A signal whose previous disposition is SIG_IGN is ignored after the section too (the
    section ends normally) and SIG_IGN is put back."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_outside_the_main_thread_the_section_changes_nothing(handlers):
    """Only the main thread may set handlers: in another thread the section runs its body and
    touches no handler."""
    seen, errors = [], []

    def body():
        try:
            with signals_deferred():
                seen.append(_installed())
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert not errors and seen == [handlers] and _installed() == handlers
