"""rpg-train's command line from a dict: the one rule by which the study runner (study files),
run_experiments.py (experiment configs) and the benchmarks write their runs' flags.

    flags({"task": "seq", "eval_every": 10, "clip": [0.2, 0.28, 3.0], "progress": False})
    -> ["--task", "seq", "--eval-every", "10", "--clip", "0.2", "0.28", "3.0", "--no-progress"]

A key is a flag ("_" -> "-"); a list is several values; true / false is --x / --no-x; any other
value is one value, as str() writes it.
"""

from __future__ import annotations


def flags(args: dict) -> list[str]:
    out = []
    for k, v in args.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + k.replace("_", "-"))
        elif isinstance(v, list):
            out += [flag] + [str(x) for x in v]
        else:
            out += [flag, str(v)]
    return out
