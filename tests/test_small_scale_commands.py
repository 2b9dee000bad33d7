"""Every small_scale command the repository documents runs: each `python -m small_scale.X` named
in the docs, the READMEs, the notebooks, paper_figs, .ci/run and small_scale's own files answers
--help with exit 0, and every small_scale/ script or module path they name exists."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/*.md", "small_scale/**/*.md", "small_scale/**/*.py",
             "small_scale/**/*.sh", "notebooks/*.py", "notebooks/*.ipynb", "paper_figs/**/*.py",
             "paper_figs/*.md", "derivations/*.md", ".ci/run", "rpg_ref/**/*.py")
MODULE = re.compile(r"python3? -m (small_scale(?:\.\w+)+)")
PATH = re.compile(r"small_scale/[\w/]+\.(?:py|sh)\b")


def documents() -> list[Path]:
    return sorted({p for pattern in DOCUMENTS for p in ROOT.glob(pattern) if p.is_file()})


def named(pattern: re.Pattern) -> dict:
    """{what the pattern names: the first file naming it}."""
    out = {}
    for path in documents():
        for m in pattern.finditer(path.read_text()):
            out.setdefault(m.group(m.lastindex or 0), path.relative_to(ROOT))
    return out


def test_the_documents_name_the_study_runner_and_the_benchmarks():
    """The scan finds what it must (an empty scan would pass the tests below vacuously)."""
    modules = named(MODULE)
    assert {"small_scale.study", "small_scale.study.analysis", "small_scale.study.rerun",
            "small_scale.study.carry_properties", "small_scale.bench.floors"} <= set(modules)


@pytest.mark.parametrize("module", sorted(named(MODULE)))
def test_each_documented_command_answers_help(module):
    r = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "usage:" in r.stdout, (
        f"{module} (named in {named(MODULE)[module]}): exit {r.returncode}\n{r.stderr[-2000:]}")


def test_each_named_small_scale_file_exists():
    missing = {p: str(where) for p, where in named(PATH).items() if not (ROOT / p).is_file()}
    assert not missing, f"named but absent (path: where): {missing}"


def test_small_scale_edits_no_import_path():
    """small_scale's modules import each other as a package: no sys.path edit in them."""
    edits = [str(p.relative_to(ROOT)) for p in (ROOT / "small_scale").rglob("*.py")
             if re.search(r"sys\.path\.(insert|append)|sys\.path\s*[+]?=", p.read_text())]
    assert not edits, edits
