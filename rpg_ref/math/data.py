"""Math problem sets: rows {id, problem, answer} from JSONL, parquet, or a Hugging Face dataset id.

    load_problems("aime24")                      -> <data dir>/eval/aime24.jsonl
    load_problems("path/to/file.jsonl")          -> that file (".parquet" needs pyarrow)
    load_problems("hf:HuggingFaceH4/MATH-500", split="test")   (needs `datasets`; network)
    load_problems("arith:add-2d:heldout")        -> made here (rpg_ref.math.arithmetic)
    # renamed/nested fields:
    load_problems("x.parquet", fields={"answer": "reward_model.ground_truth"})

Every row must have a non-empty string `problem` and an `answer` that is a non-empty string or
a finite int/float (AMC23 keeps float answers such as 27.0; see shared/data/SOURCES.md);
`id` is optional (default "<set>-<row index>") and must be unique. Bad rows raise ValueError
naming the file, the line (1-based for JSONL, row index for others) and the field; nothing is
skipped silently. `drop_empty_answers=True` is the one explicit exception, for MATH train's
two rows with an empty answer.

Data dir: $RPG_DATA_DIR if set; else, in a clone of the repository, <clone>/../shared/data (the
layout of this project); else (an installed package) $XDG_DATA_HOME/rpg-ref/data, by default
~/.local/share/rpg-ref/data.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from rpg_ref.math import arithmetic

EVAL_SETS = ("aime24", "aime25", "amc23", "math500")
TRAIN_SETS = ("gsm8k_train", "math_train", "deepmath_int")


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str | int | float
    source: str  # the set name or file it came from


def data_dir() -> Path:
    """$RPG_DATA_DIR, else <clone>/../shared/data in a clone, else the user's data folder (module
    docstring). Not checked for existence here."""
    env = os.environ.get("RPG_DATA_DIR")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[2]            # a clone's root holds pyproject.toml
    if (root / "pyproject.toml").is_file():
        return root.parent / "shared" / "data"
    user = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(user) / "rpg-ref" / "data"


def resolve(spec: str) -> Path:
    """A set name (aime24, math_train, ...) or a path -> an existing file path."""
    if spec in EVAL_SETS or spec in TRAIN_SETS:
        sub = "eval" if spec in EVAL_SETS else "train"
        path = data_dir() / sub / f"{spec}.jsonl"
        if not path.is_file():
            raise ValueError(
                f"data set {spec!r} not found at {path} (set RPG_DATA_DIR to the folder "
                f"holding eval/ and train/)"
            )
        return path
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"data file {spec!r} does not exist (known set names: "
                         f"{', '.join(EVAL_SETS + TRAIN_SETS)}; Hugging Face ids start with 'hf:')")
    return path


def _row_to_problem(row, where: str, index: int, set_name: str, fields: dict,
                    drop_empty_answers: bool) -> Problem | None:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    pkey, akey, ikey = (
        fields.get("problem", "problem"),
        fields.get("answer", "answer"),
        fields.get("id", "id"),
    )
    problem, answer = _field(row, pkey, where), _field(row, akey, where)
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(f"{where}: field {pkey!r} must be a non-empty string, got {problem!r:.60}")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise ValueError(
            f"{where}: field {akey!r} must be a string or a number, got {answer!r:.60}"
        )
    if isinstance(answer, float) and not math.isfinite(answer):
        raise ValueError(f"{where}: field {akey!r} is not finite: {answer!r}")
    if isinstance(answer, str) and not answer.strip():
        if drop_empty_answers:
            return None
        raise ValueError(
            f"{where}: field {akey!r} is empty (pass drop_empty_answers=True to drop such rows)"
        )
    pid = _field(row, ikey, where) if _has(row, ikey) else f"{set_name}-{index}"
    if not isinstance(pid, (str, int)) or isinstance(pid, bool):
        raise ValueError(f"{where}: field {ikey!r} must be a string or an int, got {pid!r}")
    return Problem(str(pid), problem, answer, set_name)


def _has(row: dict, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(row, dict) or part not in row:
            return False
        row = row[part]
    return True


def _field(row: dict, key: str, where: str):
    """row[key]; a dotted key ("reward_model.ground_truth") walks nested objects."""
    if not _has(row, key):
        raise ValueError(f"{where}: missing field {key!r} (fields present: {sorted(row)})")
    for part in key.split("."):
        row = row[part]
    return row


def _read_rows(path: Path):
    """(where, row) pairs from a .jsonl/.json-lines or .parquet file."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line.rstrip("\r\n"))  # columns of this line alone
                except json.JSONDecodeError as e:
                    # json's msg ends "... at" where its own text goes on with the position
                    what = e.msg.removesuffix(" at").removesuffix(" starting")
                    raise ValueError(f"{path}:{lineno}: invalid JSON at column {e.colno} ({what})"
                                     ) from None
                yield f"{path}:{lineno}", row
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(
                f"{path}: reading parquet needs pyarrow (pip install pyarrow)"
            ) from None
        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path} row {i}", row
    else:
        raise ValueError(f"{path}: unsupported file type {suffix!r} (use .jsonl or .parquet)")


def load_problems(spec: str, *, split: str = "train", fields: dict | None = None,
                  drop_empty_answers: bool = False, limit: int | None = None) -> list[Problem]:
    """Load a problem set; see the module docstring. `limit` keeps the first `limit` rows."""
    fields = dict(fields or {})
    unknown = set(fields) - {"problem", "answer", "id"}
    if unknown:
        raise ValueError(f"fields may only rename 'problem', 'answer', 'id'; got {sorted(unknown)}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    if spec.startswith(arithmetic.PREFIX):
        rows = arithmetic.rows(spec)
        set_name = "-".join(arithmetic.parse(spec))
    elif spec.startswith("hf:"):
        name = spec[3:]
        rows = ((f"{name}[{split}] row {i}", r) for i, r in enumerate(_hf_rows(name, split)))
        set_name = name.rsplit("/", 1)[-1]
    else:
        path = resolve(spec)
        rows = _read_rows(path)
        set_name = path.stem
    out, seen = [], {}
    for index, (where, row) in enumerate(rows):
        p = _row_to_problem(row, where, index, set_name, fields, drop_empty_answers)
        if p is None:
            continue
        if p.id in seen:
            raise ValueError(f"{where}: duplicate id {p.id!r} (first at {seen[p.id]})")
        seen[p.id] = where
        out.append(p)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"{spec}: no problems found")
    return out


def _hf_rows(name: str, split: str):
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"loading the Hugging Face dataset {name!r} needs the `datasets` package "
            f"(pip install datasets), or download it to a .jsonl/.parquet file"
        ) from None
    return datasets.load_dataset(name, split=split)
