"""The answer checker's time limit under parallel load (issue: a correct answer scored wrong on a
busy machine because a replacement worker's start-up was charged to it).

Runs the hang tests of test_math_reward.py with pytest-xdist (`-n 8`, three copies of each) while
busy-loop processes keep every CPU core loaded, in a subprocess, and requires all of them to pass.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rpg_ref.math import reward as mr

ROOT = Path(__file__).resolve().parent.parent
COPIES = 3


@pytest.mark.slow
def test_the_hang_test_passes_under_parallel_load():
    pytest.importorskip("xdist", reason="pytest-xdist is in the dev extra: pip install -e '.[dev]'")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(os.cpu_count() or 2)]
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-n", "8", "-q", "-p", "no:cacheprovider",
             "--noconftest", "tests/test_math_reward.py", "-k", "hanging or slow_worker"],
            check=False, cwd=ROOT, env=dict(os.environ, RPG_HANG_TEST_REPEATS=str(COPIES)),
            capture_output=True, text=True, timeout=900)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    report = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    expected = COPIES * (1 + mr.math_verify_available()) + 1  # hang copies per backend + slow start
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed and int(passed.group(1)) == expected, report
