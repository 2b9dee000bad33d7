"""Shared pytest fixtures and the line that says up front which tests will skip here (the
repository's root, and so small_scale's modules, is on the import path: pyproject.toml's pytest
pythonpath)."""

import signal
import sys
from collections import Counter

import pytest
import torch


@pytest.fixture
def float64_default():
    """Make float64 the default dtype for one test and restore the previous default afterwards
    (a module-level torch.set_default_dtype would leak into every later test in the process)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture(autouse=True)
def _fresh_working_directory(tmp_path_factory, monkeypatch):
    """Every test runs in an empty working directory of its own: what a user's run left in the
    checkout (runs/, caches) cannot change a test's outcome, and no test writes into the checkout
    through a relative default path such as runs/<task>-<algo>-s<seed>."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    """An xdist worker whose end of session (pytest's last garbage collections: seconds on a loaded
    machine) outlasts 5 s is sent SIGINT by its own gateway (execnet's
    WorkerGateway._terminate_execution). The KeyboardInterrupt lands in whatever runs then, such
    as hypothesis's gc callback, and prints a traceback under the results. The results are in by
    now: a worker ignores SIGINT from here on (tests/test_conftest.py checks it)."""
    if hasattr(session.config, "workerinput"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


# ---------------------------------------------------------------------------------------------
# one line, before the first test: how many tests will skip here, and why
# ---------------------------------------------------------------------------------------------

_skipped_files: list[tuple[str, str]] = []  # (file, reason): modules skipped while collected


def pytest_collectreport(report):
    if report.skipped and report.nodeid.endswith(".py"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _skipped_files.append((report.nodeid, reason.removeprefix("Skipped: ")))


def _skip_reason(item) -> str | None:
    """The reason an item will be skipped by its skip / skipif markers (None: it will run)."""
    for mark in item.iter_markers("skip"):
        return mark.kwargs.get("reason", mark.args[0] if mark.args else "unconditional skip")
    for mark in item.iter_markers("skipif"):
        condition = mark.args[0] if mark.args else mark.kwargs.get("condition")
        if isinstance(condition, bool) and condition:
            return mark.kwargs.get("reason", "skipif")
    return None


def _why(reason: str) -> str:
    """A skip reason, shortened to what a user can act on (one entry per cause)."""
    if "RPG_DATA_DIR" in reason:
        return "no shared data: put shared/ beside the clone or set RPG_DATA_DIR"
    if "RPG_PAPER_TEX" in reason:
        return "no paper .tex: set RPG_PAPER_TEX"
    if "CUDA" in reason and "CPU-only" not in reason and "without CUDA" not in reason:
        return "no GPU"
    return reason.split(":")[0].split(" (")[0]


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: the tests that will run
def pytest_collection_modifyitems(session, config, items):
    """Print the skip forecast once (the only process, or xdist's first worker, whose stderr is the
    terminal's): the tests/needs.py markers and any other skip marker, by reason, and the test
    files skipped whole (an optional package that is absent). The counts are pytest's own: a file
    skipped whole is one skipped test in its summary (tests/test_conftest.py compares)."""
    # xdist's own record of the worker, not PYTEST_XDIST_WORKER: that variable is inherited by a
    # pytest started inside a test that runs under -n, which is then a process of its own
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker not in (None, "gw0") or config.option.collectonly:
        return
    reasons = Counter()
    for item in items:
        reason = _skip_reason(item)
        if reason is not None:
            reasons[_why(reason)] += 1
    parts = [f"{n} ({reason})" for reason, n in reasons.most_common()]
    if _skipped_files:
        why = Counter(_why(r) for _, r in _skipped_files)
        parts.append(f"{len(_skipped_files)} whole test file(s) ({'; '.join(why)})")
    total = len(items) + len(_skipped_files)
    if not parts:
        line = f"rpg-ref: none of the {total} tests will skip here"
    else:
        n = sum(reasons.values()) + len(_skipped_files)
        line = (f"rpg-ref: {n} of {total} tests will skip here: {', '.join(parts)} (see "
                f"tests/needs.py; -ra lists each)")
    print(line, file=sys.__stderr__, flush=True)
