"""The rows of a study's results file, small_scale/results/<study>.jsonl, checked before any reader
(small_scale/study/runner.py, small_scale/study/analysis.py, the figures) takes one as data. No
matplotlib here: the study runner reads rows without it.

One finished run a line, written by small_scale/study/runner.py. What a row must hold, given its
study file (``spec``):
- a JSON object with ``cell`` (a string) and ``seed`` (an integer), a cell of the study file and a
  seed it plans (0 .. the cell's ``seeds`` - 1), and no (cell, seed) twice in the file;
- ``outcomes``: every outcome the study file names, each a finite number or null. Null means the
  run never logged the outcome's key (``rc_ess`` in a run without rollout correction); NaN or an
  infinity is never an outcome of a finished run;
- the outcomes the analysis decides with -- ``analysis.outcome``, and the ``outcome`` of
  ``analysis.exclude`` and of ``analysis.collapse`` -- are never null: a row without them is a run
  that cannot enter the tables;
- ``cpu_s`` and ``wall_s`` finite numbers >= 0, ``resumed_from_step`` an integer >= 0;
- what the figures and the provenance check read: ``series`` (a list of objects, each with its
  ``step``), ``summary`` (an object), ``argv`` (the run's command, a list of strings) and
  ``study_sha256`` (the study file's hash when the run was made).
Any other line is refused with ``ValueError("file:line: what is wrong")``; a last line without
its newline is a write cut short by a kill (or one in progress): it is left out and reported to
``on_torn`` (the runner cuts it off before its next write; a run without its row is run again).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rpg_ref import strict_json


def _stderr(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr, flush=True)


def key_outcomes(spec: dict) -> set:
    """The outcomes the analysis decides with: never null in a row."""
    an = spec.get("analysis", {})
    return {o for o in (an.get("outcome"), an.get("exclude", {}).get("outcome"),
                        an.get("collapse", {}).get("outcome")) if o}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def row_problem(row, spec: dict | None, seen: dict, line: int) -> str | None:
    """What is wrong with one row (None: nothing); ``seen`` maps (cell, seed) to its line."""
    if not isinstance(row, dict):
        return "not a JSON object"
    cell, seed = row.get("cell"), row.get("seed")
    if not isinstance(cell, str) or type(seed) is not int:
        return f"cell must be a string and seed an integer, got cell {cell!r}, seed {seed!r}"
    if (cell, seed) in seen:
        return f"cell {cell!r} seed {seed} again (first at line {seen[cell, seed]})"
    if spec is None:
        return None
    if cell not in spec["cells"]:
        return f"cell {cell!r} is not a cell of study {spec.get('name', '?')}"
    first = spec.get("first_seed", 0)
    planned = spec["cells"][cell].get("seeds", spec["seeds"])
    if not first <= seed < first + planned:
        return f"seed {seed} of cell {cell!r} is not planned (the study file plans seeds " \
               f"{first}-{first + planned - 1})"
    outcomes = row.get("outcomes")
    if not isinstance(outcomes, dict):
        return "no outcomes object"
    for name in spec["outcomes"]:
        if name not in outcomes:
            return f"outcome {name!r} is missing"
    for name, v in outcomes.items():
        if v is None:
            if name in key_outcomes(spec):
                return f"outcome {name!r} is null, and the analysis decides with it"
        elif not _number(v) or not math.isfinite(v):
            return f"outcome {name!r} is {v!r}, not a finite number or null"
    for name in ("cpu_s", "wall_s", "resumed_from_step"):
        v = row.get(name)
        if not _number(v) or not math.isfinite(v) or v < 0 or (
                name == "resumed_from_step" and type(v) is not int):
            return f"{name} is {v!r}, not a " + (
                "whole number >= 0" if name == "resumed_from_step" else "finite number >= 0")
    return record_problem(row)


def record_problem(row: dict) -> str | None:
    """What the row lacks of the record the figures and the provenance check read."""
    series = row.get("series")
    if not isinstance(series, list):
        return "series is missing or not a list (the run's metrics rows the figures read)"
    if not all(isinstance(s, dict) and type(s.get("step")) is int for s in series):
        return "a series row is not an object with an integer step"
    if not isinstance(row.get("summary"), dict):
        return "summary is missing or not an object"
    argv = row.get("argv")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return "argv is missing or not a list of strings (the run's command)"
    if not isinstance(row.get("study_sha256"), str):
        return "study_sha256 is missing (the study file's hash the run was made under)"
    return None


def shown(path: Path) -> Path:
    """``path`` as a message names it: relative to the working directory when inside it."""
    path = Path(path).absolute()
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


def read_study_rows(path: Path, spec: dict | None = None, on_torn=_stderr) -> list[dict]:
    """The checked rows of a results file ([] when there is none); ``spec``: its study file (the
    plan the rows are checked against; None: JSON objects with a cell and a seed, none twice).
    ValueError "path:line: ..." for the first bad line; a torn last line goes to
    ``on_torn(message)`` (None: not reported)."""
    if not Path(path).exists():
        return []
    path = shown(path)
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    rows, seen = [], {}
    for i, line in enumerate(complete.splitlines(), 1):
        try:
            row = strict_json.loads(line)
            if isinstance(row, dict) and isinstance(row.get("argv"), list):
                # a command line's words are strings: strict_json reads the word "inf" (--clip's
                # "no dual bound") back as a float, so it is written back as the word
                row["argv"] = [strict_json.encode(a) if isinstance(a, float) else a
                               for a in row["argv"]]
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not a JSON object ({e}); the file is corrupt: "
                             f"restore it from git") from None
        problem = row_problem(row, spec, seen, i)
        if problem:
            raise ValueError(f"{path}:{i}: {problem}; fix or remove that line (a removed row's "
                             f"run is done again by python -m small_scale.study)")
        seen[row["cell"], row["seed"]] = i
        rows.append(row)
    if text[len(complete):].strip() and on_torn is not None:
        on_torn(f"{path}:{complete.count(chr(10)) + 1}: the last line is cut short (a write "
                f"stopped by a kill, or one in progress): left out; the runner cuts it off before "
                f"its next row (a run without its row is run again)")
    return rows
