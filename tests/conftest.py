"""Shared pytest fixtures."""

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
