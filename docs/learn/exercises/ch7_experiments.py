"""Chapter 7 solutions: reading study C's committed rows."""

import json
import math
from pathlib import Path

from scipy import stats

ROWS = Path(__file__).resolve().parents[3] / "small_scale" / "results" / "C.jsonl"
EXCLUDED_SEEDS = {17}          # study C's pre-registered warm-start rule (RESULTS.md)


def cell_outcome(cell, outcome="heldout", rows=ROWS):
    """{seed: outcome} of one cell of study C, the excluded seeds left out."""
    out = {}
    for line in Path(rows).read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["cell"] == cell and r["seed"] not in EXCLUDED_SEEDS:
            out[r["seed"]] = r["outcomes"][outcome]
    return out


def paired_difference(cell_a, cell_b, outcome="heldout"):
    """Exercise 7.1: mean of a - b over the seeds both cells ran, with its 95 % paired t interval:
    (mean, low, high, n)."""
    a, b = cell_outcome(cell_a, outcome), cell_outcome(cell_b, outcome)
    d = [a[s] - b[s] for s in sorted(a.keys() & b.keys())]
    n, mean = len(d), sum(d) / len(d)
    half = stats.t.ppf(0.975, n - 1) * stats.tstd(d) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def clip_share(cell):
    """Exercise 7.2: the mean over seeds of the share of tokens on a clipped segment (low + high +
    dual), each run's mean over its steps."""
    parts = [cell_outcome(cell, k) for k in ("clip_low_mean", "clip_high_mean", "clip_dual_mean")]
    seeds = parts[0].keys()
    return sum(sum(p[s] or 0.0 for p in parts) for s in seeds) / len(seeds)
