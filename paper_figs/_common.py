"""Shared plumbing for paper_figs: the Agg backend, saving PNG + PDF, the paper's colours.

Every figure module exposes a pure ``*_data()`` (numbers only, no matplotlib) and a
``plot_*(data, out_dir)`` that draws those numbers and returns the files it wrote.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are files, never windows
import matplotlib.pyplot as plt

# The paper's line styles: solid blue where the loss has a gradient, dotted magenta where not.
GRAD_COLOR = "tab:blue"
FLAT_COLOR = "m"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "paper_figs" / "out"


def save(fig, out_dir, name: str) -> list[Path]:
    """Write ``name``.png and ``name``.pdf into out_dir; close the figure; return both paths."""
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
