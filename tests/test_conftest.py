"""tests/conftest.py's session hooks, each in a pytest run of its own on a few made-up test files:
the first line, "rpg-ref: N of M tests will skip here", counts what pytest's summary then reports
(skip markers, and each test file skipped whole as the one skipped test pytest counts for it; under
xdist too, printed once); an xdist worker whose end of session is slow ends without a
KeyboardInterrupt traceback."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="pytest-xdist is in the dev extra: pip install -e '.[dev]'")

WHOLE_FILE = """
import pytest
pytest.importorskip("rpg_ref_absent_package", reason="an absent optional package")

def test_never_runs():
    pass
"""
MARKED = """
import pytest

@pytest.mark.skipif(True, reason="shared data absent: x not found; set RPG_DATA_DIR")
def test_needs_data():
    pass

@pytest.mark.skip(reason="no GPU: CUDA is not available")
def test_needs_gpu():
    pass

@pytest.mark.parametrize("i", range(3))
def test_runs(i):
    pass
"""


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest on `folder`, started as from an xdist worker other than the first (as the README's
    `-n auto` does for most tests): the worker's PYTEST_XDIST_* variables are inherited, and the
    run must still behave as the process of its own that it is."""
    env = dict(os.environ, PYTEST_XDIST_WORKER="gw1", PYTEST_XDIST_WORKER_COUNT="2",
               PYTHONPATH=os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
                           str(folder)], cwd=folder, capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_the_forecast_counts_what_the_summary_reports(tmp_path, workers):
    """2 marked tests and 1 file skipped whole of 6: the forecast says 3 of 6, the summary 3
    skipped and 3 passed."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_whole_file.py").write_text(WHOLE_FILE)
    (tmp_path / "test_marked.py").write_text(MARKED)
    run = _pytest(tmp_path, *workers)
    forecasts = re.findall(r"rpg-ref: (\d+) of (\d+) tests will skip here", run.stderr)
    summary = re.search(r"(\d+) passed, (\d+) skipped", run.stdout)
    assert run.returncode == 0 and summary, run.stdout + run.stderr
    passed, skipped = int(summary.group(1)), int(summary.group(2))
    assert forecasts == [(str(skipped), str(passed + skipped))], run.stderr
    assert (passed, skipped) == (3, 3)


HYPOTHESIS_TEST = """
from hypothesis import given, strategies as st

@given(st.integers())
def test_any_integer(x):
    assert x == x
"""
# an end of session that outlasts execnet's 5 s (pytest's last garbage collections, on a loaded
# machine, over torch's heap): collections for 8 s, while hypothesis's gc callback is installed
SLOW_END = """
import gc, time

def pytest_unconfigure(config):
    if hasattr(config, "workerinput"):
        end = time.time() + 8
        while time.time() < end:
            gc.collect()
"""


def test_a_slow_worker_end_prints_no_keyboard_interrupt(tmp_path):
    """execnet sends a worker that is still busy 5 s after the session's end SIGINT; that worker
    ignores it (else the KeyboardInterrupt is raised in hypothesis's gc callback and printed as a
    PytestUnraisableExceptionWarning with its traceback)."""
    pytest.importorskip("hypothesis")
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_hypothesis.py").write_text(HYPOTHESIS_TEST)
    (tmp_path / "slow_end.py").write_text(SLOW_END)
    run = _pytest(tmp_path, "-n", "1", "-p", "slow_end")
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "1 passed" in out, out
    assert "KeyboardInterrupt" not in out and "Unraisable" not in out, out
