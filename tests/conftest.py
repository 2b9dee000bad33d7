"""Shared pytest fixtures, and small_scale/ on the import path: the tests import the benchmarks'
shared module, small_scale/bench_common.py (its tiny Qwen3 is the tests' model too)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "small_scale"))


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
