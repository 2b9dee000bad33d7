"""The walkthrough notebooks: each committed .ipynb is its jupytext .py source, executed, with
outputs; every .py executes from source without error.

The helpers (kernel for this interpreter, execution, the staleness check) are notebooks/build.py's,
the command that writes the .ipynb files. Executing here sets RPG_NOTEBOOK_CI=1, which shortens
the training runs of notebook 5; the committed notebooks are built without it.
"""

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("jupytext", reason="notebook tests need the [notebooks] extra")
pytest.importorskip("nbclient", reason="notebook tests need the [notebooks] extra")
pytest.importorskip("ipykernel", reason="notebook tests need the [notebooks] extra")
import nbformat  # after the skips, whose message an ImportError would hide
from needs import needs_paper_tex

from derivations.paper_tables import paper_tex_path

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
NAMES = [
    "01_k3_is_unnormalized_kl",
    "02_grpo_kl_and_its_correction",
    "03_eight_surrogates_gradient_equivalence",
    "04_rpg_style_clip",
    "05_bandit_to_transformer",
    "06_audit_your_kl_term",
    "07_off_policy_on_the_bandit",
    "08_reading_a_study",
]
# a cell that draws a figure calls a paper_figs plot_* function or paper_figs.show
DRAWS_FIGURE = re.compile(r"\bplot_\w+\(|\bshow\(")
# paths of a developer's machine that must not be committed in an output
MACHINE_PATH = re.compile(r"/(?:tmp|home|root|Users)/|site-packages")
PAPER_LABEL = re.compile(r"`((?:sec|subsec|app|eq|tab|fig|alg|prop|remark|thm|proof):[\w\-]+)`")


def _load_build():
    spec = importlib.util.spec_from_file_location("rpg_notebooks_build", NB_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()


def _stored(name):
    return nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)


def _has_image(cell) -> bool:
    return any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def _shows_something(cell) -> bool:
    """Prints or displays anything (stderr aside: warnings differ between environments)."""
    return any(o.get("name") != "stderr" for o in cell.get("outputs", []))


def test_every_notebook_is_a_jupytext_pair():
    """notebooks/ holds exactly the eight sources, each next to its .ipynb; no generator is
    left."""
    assert [p.stem for p in build.SOURCES] == NAMES
    for name in NAMES:
        assert (NB_DIR / f"{name}.ipynb").exists(), name
    assert not (NB_DIR / "make_notebooks.py").exists()


@pytest.mark.parametrize("name", NAMES)
def test_stored_notebook_is_its_source_executed(name):
    """The committed .ipynb has exactly the cells of its .py, is paired with it, was executed top
    to bottom in one kernel, has outputs and stores no error (`build.py --check`)."""
    assert build.problems(NB_DIR / f"{name}.py") == []


@pytest.mark.parametrize("name", NAMES)
def test_stored_figures_are_embedded(name):
    """Every code cell that draws a figure stores it as an inline PNG, and no output holds a path
    of the machine that built it."""
    nb = _stored(name)
    drawing = [c for c in nb.cells if c.cell_type == "code" and DRAWS_FIGURE.search(c.source)]
    assert drawing, f"{name} draws no figure"
    for cell in drawing:
        assert _has_image(cell), f"{name}: no figure stored for\n{cell.source}"
    leaked = MACHINE_PATH.findall(build.output_text(nb))
    assert not leaked, f"{name}: outputs contain machine paths {leaked}"


def test_staleness_check_catches_an_edit_and_missing_outputs(tmp_path):
    """build.problems fails a pair whose .py was edited after the build, and one stored without
    outputs (the check the tests above rely on can fail)."""
    name = NAMES[0]
    for ext in (".py", ".ipynb"):
        shutil.copy(NB_DIR / f"{name}{ext}", tmp_path / f"{name}{ext}")
    py, ipynb = tmp_path / f"{name}.py", tmp_path / f"{name}.ipynb"
    assert build.problems(py) == []

    py.write_text(py.read_text().replace("torch.set_default_dtype", "torch.set_default_dtype  ", 1))
    assert any("cells differ" in p for p in build.problems(py))

    shutil.copy(NB_DIR / f"{name}.py", py)
    nb = nbformat.read(ipynb, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, ipynb)
    found = build.problems(py)
    assert any("no outputs" in p for p in found) and any("not executed" in p for p in found)


def test_build_refuses_an_unknown_notebook_before_any_work(capsys):
    """`build.py NAME` with a name that is no notebook: one line naming the valid ones, exit 2."""
    assert build.main(["06_no_such_notebook"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "06_no_such_notebook" in err[0] and NAMES[0] in err[0]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_opens_and_closes_as_a_reader_needs(name):
    """Each notebook starts with what it shows and the paper labels it covers, with the paper's
    printed numbers before its labels and its arXiv id, and ends with a 'What we learned' that
    points at a figure above it, then its exercises (tests/test_notebook_solutions.py runs their
    solutions)."""
    cells = build.read_source(NB_DIR / f"{name}.py").cells
    first, learned, last = cells[0], cells[-2], cells[-1]
    assert first.cell_type == "markdown" and last.cell_type == "markdown"
    assert "**What this shows.**" in first.source and "**Paper labels.**" in first.source
    assert learned.source.startswith("## What we learned") and "figure" in learned.source
    assert last.source.startswith("## Exercises") and "notebooks/solutions.py" in last.source
    assert "arXiv:2505.17508" in "\n".join(c.source for c in cells if c.cell_type == "markdown")


@pytest.mark.parametrize("name", NAMES)
def test_paper_labels_follow_the_papers_numbers(name):
    """Every paper label a notebook's prose names in backticks comes after the number the PDF
    prints for it ("Eq. (3.2) (`eq:k3_func_estimators_main`)"), so a reader can find it; the
    numbers themselves are checked against the paper by tests/test_paper_numbers.py."""
    from derivations import paper_numbers

    table = paper_numbers.load()
    prose = "\n".join(c.source for c in build.read_source(NB_DIR / f"{name}.py").cells
                      if c.cell_type == "markdown")
    bare = [m.group(1) for m in PAPER_LABEL.finditer(prose) if m.group(1) in table
            and not prose[:m.start()].rstrip("(").rstrip().endswith(table[m.group(1)])]
    assert not bare, f"{name}: labels without their printed number: {bare}"


@needs_paper_tex
@pytest.mark.parametrize("name", NAMES)
def test_paper_labels_named_in_a_notebook_exist(name):
    """Every paper label a notebook names (in backticks) is a \\label in the paper's source (the
    only notebook test that needs it: the notebooks themselves run without it)."""
    tex = paper_tex_path()
    labels = set(re.findall(r"\\label\{([^}]*)\}", tex.read_text()))
    cells = build.read_source(NB_DIR / f"{name}.py").cells
    header = PAPER_LABEL.findall(cells[0].source.split("**Paper labels.**", 1)[1].split("\n\n")[0])
    assert header, f"{name}: no labels after **Paper labels.**"
    named = set(
        PAPER_LABEL.findall("\n".join(c.source for c in cells if c.cell_type == "markdown"))
    )
    assert named - labels == set()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_from_source(name):
    """The .py source executes top to bottom without error (cells assert their own claims), and
    the cells that show a figure or print in this run are the ones that do in the stored .ipynb
    (a guard against stored outputs left over from an older source)."""
    with build.kernel_env(ci=True):
        fresh = build.execute(build.read_source(NB_DIR / f"{name}.py"), timeout=300)
    stored = [c for c in _stored(name).cells if c.cell_type == "code"]
    fresh = [c for c in fresh.cells if c.cell_type == "code"]
    assert [_has_image(c) for c in fresh] == [_has_image(c) for c in stored]
    assert [_shows_something(c) for c in fresh] == [_shows_something(c) for c in stored]
