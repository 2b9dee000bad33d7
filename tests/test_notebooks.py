"""The five walkthrough notebooks run top to bottom and are stored without outputs.

Executed with nbclient on a kernel that runs *this* interpreter (a kernelspec written to a temp
folder), so the test works in a fresh venv whatever `python` is on PATH. RPG_NOTEBOOK_CI=1
shortens the training runs of notebook 5.
"""

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the [notebooks] extra")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need the [notebooks] extra")
pytest.importorskip("ipykernel", reason="notebook tests need the [notebooks] extra")

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
NAMES = ["01_k3_is_unnormalized_kl", "02_grpo_kl_and_its_correction",
         "03_eight_surrogates_gradient_equivalence", "04_rpg_style_clip", "05_bandit_to_transformer"]
KERNEL = "rpg-ref-test-python"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A kernelspec for sys.executable in a temp JUPYTER_PATH entry."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rpg-ref test kernel", "language": "python"}))
    return root


def test_notebooks_stored_without_outputs_and_match_generator():
    """Every notebook is in git without outputs or execution counts, and equals what
    notebooks/make_notebooks.py writes (one source for the cells)."""
    sys.path.insert(0, str(NB_DIR))
    try:
        import make_notebooks
    finally:
        sys.path.pop(0)
    assert sorted(make_notebooks.NOTEBOOKS) == sorted(f"{n}.ipynb" for n in NAMES)
    assert make_notebooks.main(["--check"]) == 0
    for name in NAMES:
        nb = nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code, name
        for c in code:
            assert c.outputs == [] and c.execution_count is None, f"{name}: a cell has stored output"
        text = "\n".join(c.source for c in code)
        assert "import" in text and ("rpg_ref" in text or "paper_figs" in text or "derivations" in text)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, kernel_env, monkeypatch, tmp_path):
    """The notebook executes without error (every cell; cells assert their own claims)."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_env))
    monkeypatch.setenv("RPG_NOTEBOOK_CI", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=180,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
