"""The distributions: the wheel holds every file an installed command reads, and the license; the
sdist holds the package, its data and the license, and no tests (they need a clone). .ci/run
installs the wheel in a fresh venv and runs the commands outside the clone."""
from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("setuptools", reason="building the distributions needs setuptools")

ROOT = Path(__file__).resolve().parent.parent
# what the installed commands read besides code: the file, and who reads it
READ_BY_COMMANDS = {
    "derivations/ERRATA.md": "rpg-verify (names it)",
    "derivations/paper_numbers.txt": "rpg-verify (the paper's numbers without the .tex)",
    "paper_figs/paper_results.json": "rpg-verify, rpg-figs (the paper's results tables)",
    "rpg_ref/math/answer_formats.jsonl": "python -m rpg_ref.math.answer_formats",
}
# (build_meta rewrites sys.argv: read the folder first; its own output goes to stdout too)
BUILD = ("import sys; from setuptools import build_meta as b; out = sys.argv[1]; "
         "names = b.build_wheel(out), b.build_sdist(out); print('built', *names)")


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    run = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    wheel, sdist = run.stdout.splitlines()[-1].split()[1:]
    return out / wheel, out / sdist


def test_wheel_holds_what_the_commands_read_and_the_license(dists):
    names = set(zipfile.ZipFile(dists[0]).namelist())
    missing = [f"{f} ({who})" for f, who in READ_BY_COMMANDS.items() if f not in names]
    assert not missing
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith("tests/")]


def test_sdist_has_the_package_data_and_license_but_no_tests(dists):
    with tarfile.open(dists[1]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "pyproject.toml", "README.md", *READ_BY_COMMANDS} <= names
    assert not [n for n in names if n.startswith("tests/")]
