"""Arithmetic problems made here, with exact answers, split so that no held-out problem's numbers
appear in training.

    load_problems("arith:add-2d:train")     a + b, a and b two-digit: the training problems
    load_problems("arith:add-2d:heldout")   the held-out problems (HELDOUT of them)

Every unordered pair {a, b} of a kind is one problem; a fixed permutation (seed SPLIT_SEED, not a
run's seed) puts HELDOUT pairs in the held-out split and the rest in training, so a held-out pair
is never trained on in either order. Each problem is written with the larger number first
("What is 47 + 28?"); the gold answer is the exact integer.
"""

from __future__ import annotations

import random

PREFIX = "arith:"
# kind -> (operator, lowest operand, highest operand)
KINDS = {"add-2d": ("+", 10, 99), "add-3d": ("+", 100, 999)}
SPLITS = ("train", "heldout")
HELDOUT = 200
SPLIT_SEED = 20_261_128


def _pairs(kind: str) -> list[tuple[int, int]]:
    _, lo, hi = KINDS[kind]
    pairs = [(a, b) for a in range(lo, hi + 1) for b in range(lo, a + 1)]  # a >= b: unordered
    random.Random(SPLIT_SEED).shuffle(pairs)
    return pairs


def parse(spec: str) -> tuple[str, str]:
    """'arith:KIND:SPLIT' -> (kind, split), or one line naming what is wrong."""
    parts = spec[len(PREFIX):].split(":")
    if len(parts) != 2 or parts[0] not in KINDS or parts[1] not in SPLITS:
        raise ValueError(f"{spec!r}: an arithmetic set is arith:KIND:SPLIT with KIND one of "
                         f"{sorted(KINDS)} and SPLIT one of {SPLITS}")
    return parts[0], parts[1]


def rows(spec: str):
    """(where, row) for each problem of an 'arith:KIND:SPLIT' set, as load_problems reads them."""
    kind, split = parse(spec)
    op = KINDS[kind][0]
    pairs = _pairs(kind)
    chosen = pairs[:HELDOUT] if split == "heldout" else pairs[HELDOUT:]
    for i, (a, b) in enumerate(chosen):
        row = {"id": f"{kind}-{split}-{a}{op}{b}", "problem": f"What is {a} {op} {b}?",
               "answer": str(a + b)}
        yield f"{spec} row {i}", row
