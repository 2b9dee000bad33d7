"""Execute the walkthrough notebooks from their jupytext sources and store them with outputs.

Each notebook is a pair: ``NN_name.py`` (percent format, the source people edit and review) and
``NN_name.ipynb`` (the same cells with their outputs, what GitHub renders).

    python notebooks/build.py               # execute every .py top to bottom, write its .ipynb
    python notebooks/build.py 04_rpg_style_clip    # only some (names without extension)
    python notebooks/build.py --check       # no execution: exit 1 if an .ipynb is stale

The kernel runs this interpreter with the repository first on its path, so the notebooks show
this checkout's code. Volatile metadata (timings, the Python patch version, random cell ids) is not
stored, so a rebuild changes an .ipynb only where an output changed. tests/test_notebooks.py
imports the helpers below.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbclient
import nbformat

NB_DIR = Path(__file__).resolve().parent
ROOT = NB_DIR.parent
SOURCES = sorted(p for p in NB_DIR.glob("*.py") if re.match(r"\d\d_", p.name))
FORMATS = "ipynb,py:percent"
KERNEL = "rpg-ref-notebooks"
# What Jupyter shows as the kernel of a stored notebook: the reader's own default Python kernel.
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
TIMEOUT_S = 600  # per cell: notebook 5 trains for a few minutes at most


@contextlib.contextmanager
def kernel_env(ci: bool = False):
    """Environment for executing the notebooks: a kernelspec for sys.executable (found first on
    JUPYTER_PATH, whatever `python` is on PATH), the repository on PYTHONPATH, a headless
    matplotlib, and RPG_NOTEBOOK_CI=1 if ``ci`` (shorter runs). Restores os.environ after."""
    saved = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="rpg-nb-kernel-") as tmp:
        spec = Path(tmp) / "kernels" / KERNEL
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "rpg-ref notebooks", "language": "python"}))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [tmp, saved.get("JUPYTER_PATH")]))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), saved.get("PYTHONPATH")])
        )
        os.environ["MPLBACKEND"] = "Agg"
        if ci:
            os.environ["RPG_NOTEBOOK_CI"] = "1"
        else:
            os.environ.pop("RPG_NOTEBOOK_CI", None)
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


def read_source(py: Path) -> nbformat.NotebookNode:
    """The notebook that the percent-format source ``py`` describes (cells only, no outputs)."""
    return jupytext.read(py, fmt="py:percent")


def execute(nb: nbformat.NotebookNode, timeout: int = TIMEOUT_S) -> nbformat.NotebookNode:
    """Run every cell top to bottom (call inside kernel_env); raises on the first failing cell."""
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=timeout, record_timing=False,
                                     resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()
    return nb


def normalize(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Keep only what a reader needs and what stays the same from build to build."""
    nb.metadata = nbformat.from_dict({"jupytext": {"formats": FORMATS}, "kernelspec": KERNELSPEC,
                                      "language_info": {"name": "python"}})
    for i, cell in enumerate(nb.cells):
        cell.id = f"c{i:02d}"
        cell.metadata = nbformat.from_dict({})
    nbformat.validate(nb)
    return nb


def volatile_paths() -> list[str]:
    """Paths of this machine that must not end up in a committed output."""
    paths = {str(ROOT), str(Path.home()), sys.prefix, tempfile.gettempdir()}
    return sorted(p for p in paths if len(p) > 1)


def output_text(nb: nbformat.NotebookNode) -> str:
    """All text of all outputs (stdout, stderr, results, tracebacks), for searching."""
    return json.dumps([c.get("outputs", []) for c in nb.cells if c.cell_type == "code"])


def without_version(text: str) -> str:
    """``text`` less the header line naming jupytext's version (it depends on who saved the file
    last, not on the notebook)."""
    return re.sub(r"(?m)^#\s+jupytext_version: .*\n", "", text)


def problems(py: Path) -> list[str]:
    """Why ``py``'s stored .ipynb is not an executed copy of it; [] when it is."""
    ipynb = py.with_suffix(".ipynb")
    if not ipynb.exists():
        return [f"{ipynb.name} is missing"]
    stored = nbformat.read(ipynb, as_version=4)
    source = read_source(py)
    out = []
    if [(c.cell_type, c.source) for c in stored.cells] != [
        (c.cell_type, c.source) for c in source.cells
    ]:
        out.append(f"{ipynb.name}: cells differ from {py.name}")
    elif without_version(py.read_text()) != without_version(
        jupytext.writes(stored, fmt="py:percent")
    ):
        # JupyterLab's jupytext refuses to open a pair whose .py is older than its .ipynb and is
        # not the text jupytext would write for it
        out.append(f"{py.name}: not the text jupytext writes for {ipynb.name}")
    if stored.metadata.get("jupytext", {}).get("formats") != FORMATS:
        out.append(f"{ipynb.name}: not paired (metadata jupytext.formats != {FORMATS!r})")
    code = [c for c in stored.cells if c.cell_type == "code"]
    if [c.execution_count for c in code] != list(range(1, len(code) + 1)):
        out.append(f"{ipynb.name}: not executed top to bottom in one kernel")
    if not any(c.outputs for c in code):
        out.append(f"{ipynb.name}: has no outputs")
    if any(o.output_type == "error" for c in code for o in c.outputs):
        out.append(f"{ipynb.name}: stores an error")
    return out


def build(py: Path) -> nbformat.NotebookNode:
    """Execute ``py`` (not in CI mode), write its .ipynb, and rewrite ``py`` as the text jupytext
    writes for it (same cells; as `jupytext --sync` would), so that JupyterLab opens the pair
    whatever the files' timestamps. Returns the executed notebook."""
    nb = execute(read_source(py))
    normalize(nb)
    leaked = [p for p in volatile_paths() if p in output_text(nb)]
    if leaked:
        raise RuntimeError(f"{py.name}: outputs contain this machine's paths {leaked}; "
                           "print paths relative to the repository")
    nbformat.write(nb, py.with_suffix(".ipynb"))
    jupytext.write(nb, py, fmt="py:percent")
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "names", nargs="*", help="notebooks to build (default: all), e.g. 01_k3_is_unnormalized_kl"
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="execute nothing; exit 1 if an .ipynb differs from its .py or lacks outputs",
    )
    a = ap.parse_args(argv)
    by_name = {p.stem: p for p in SOURCES}
    unknown = [n for n in a.names if n.removesuffix(".py").removesuffix(".ipynb") not in by_name]
    if unknown:
        print(f"error: unknown notebook(s) {unknown}; choose from {list(by_name)}", file=sys.stderr)
        return 2
    chosen = [by_name[n.removesuffix(".py").removesuffix(".ipynb")] for n in a.names] or SOURCES
    if a.check:
        found = [msg for py in chosen for msg in problems(py)]
        for msg in found:
            print(msg, file=sys.stderr)
        if found:
            print("rebuild with: python notebooks/build.py", file=sys.stderr)
        return 1 if found else 0
    with kernel_env(ci=False):
        for py in chosen:
            print(f"executing {py.relative_to(ROOT)} ...", flush=True)
            t0 = time.perf_counter()
            build(py)
            print(f"wrote {py.with_suffix('.ipynb').relative_to(ROOT)} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
