"""Strict JSON for everything a run writes (config.json, metrics.jsonl, summary.json, state.json).

Python's json writes float infinities and NaN as the bare words Infinity / NaN, which strict JSON
parsers (JavaScript, jq, most other languages) reject. Here a non-finite float is written as one of
the strings "inf", "-inf", "nan" (what Python's float() reads), and ``loads`` turns exactly these
three strings back into floats. So a string value that is literally "inf", "-inf" or "nan" reads
back as a float: no field of a run's files holds such a string.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def encode(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by "inf", "-inf" or "nan" (nested dicts,
    lists)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    return obj


def decode(obj: Any) -> Any:
    """The inverse of ``encode``: the strings "inf", "-inf", "nan" become floats again."""
    if isinstance(obj, str):
        return NON_FINITE.get(obj, obj)
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def dumps(obj: Any, **kw) -> str:
    """json.dumps that never writes Infinity or NaN (allow_nan=False would catch a miss)."""
    return json.dumps(encode(obj), allow_nan=False, **kw)


def loads(text: str) -> Any:
    return decode(json.loads(text))


def step_rows(path: Path) -> list[tuple[int, dict, str]]:
    """(line number, row, line) of every complete row of a JSONL file of steps (metrics.jsonl): a
    last line cut short by a kill (no newline) is left out. ValueError "path:line: ..." for a line
    that is not a JSON object with an integer "step"."""
    text = path.read_text() if path.exists() else ""
    out = []
    for i, line in enumerate(text[: text.rfind("\n") + 1].splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = loads(line)
            if not isinstance(row, dict) or type(row.get("step")) is not int:
                raise ValueError("not a JSON object with an integer 'step'")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"{path}:{i}: not a metrics row ({e}); fix or remove that line"
                             ) from None
        out.append((i, row, line))
    return out
