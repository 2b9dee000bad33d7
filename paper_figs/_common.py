"""Shared plumbing for paper_figs: the Agg backend, saving PNG + PDF, the paper's colours.

Every figure module exposes a pure ``*_data()`` (numbers only, no matplotlib) and a
``plot_*(data, out_dir)`` that draws those numbers and returns the files it wrote; with
``out_dir=None`` (the notebooks) it shows the figure inline instead and writes nothing.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are files, never windows
import matplotlib.pyplot as plt

# The paper's line styles: solid blue where the loss has a gradient, dotted magenta where not.
GRAD_COLOR = "tab:blue"
FLAT_COLOR = "m"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "paper_figs" / "out"
# Inline figures are embedded in the committed notebooks: a moderate resolution keeps them small.
NOTEBOOK_DPI = 80


def show(fig, dpi: int = NOTEBOOK_DPI) -> None:
    """Display ``fig`` as an embedded PNG (a notebook output) and close it.

    Rendered here rather than by the kernel's inline backend, so that the output does not depend
    on the kernel's matplotlib settings. The committed notebooks embed these PNGs, so they are
    stored with a 256-colour palette (a line plot has few colours; about 4x smaller) and without
    the "Software" field (a rebuild with other library versions changes only changed pixels).
    """
    from IPython.display import Image, display  # only notebooks get here: IPython is their extra
    from PIL import Image as PILImage  # Pillow: a dependency of matplotlib

    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    png = io.BytesIO()
    PILImage.open(rgba).convert("RGB").quantize(256).save(png, format="PNG", optimize=True)
    display(Image(data=png.getvalue()))


def save(fig, out_dir, name: str) -> list[Path] | None:
    """Write ``name``.png and ``name``.pdf into out_dir; close the figure; return both paths.
    ``out_dir=None``: show the figure inline instead (a notebook) and write nothing; returns None,
    so that a notebook cell ending in a ``plot_*`` call prints no ``Out[]`` value."""
    if out_dir is None:
        show(fig)
        return None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    # A fixed creation date keeps the PDF bytes reproducible from run to run.
    fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None})
    plt.close(fig)
    return paths


def runs_of(mask):
    """Split a boolean array into maximal runs: [(start, stop, value)], stop exclusive."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or bool(mask[i]) != bool(mask[start]):
            runs.append((start, i, bool(mask[start])))
            start = i
    return runs


def draw_masked(ax, x, y, has_grad, label_grad="gradient $\\neq 0$", label_flat="gradient $= 0$",
                color=None, lw=2.0, labels=True):
    """Draw y(x) solid where ``has_grad`` and dotted where not: the line style is the data."""
    seen = set()
    for a, b, g in runs_of(has_grad):
        sl = slice(a, b + 1 if b < len(x) else b)   # share the boundary point: no visual gap
        style = {"color": color or (GRAD_COLOR if g else FLAT_COLOR), "lw": lw,
                     "linestyle": "-" if g else (0, (1, 1.2))}
        lab = (label_grad if g else label_flat) if labels and g not in seen else None
        seen.add(g)
        ax.plot(x[sl], y[sl], label=lab, **style)
