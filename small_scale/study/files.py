"""A study's files and the pre-registered rules the runner itself applies: the study file
(small_scale/studies/<study>.json, checked), its results rows (small_scale/results/<study>.jsonl,
checked against it: paper_figs/study_rows.py), which seeds the warm-start rule excludes, and the
values the calibration study chose. The runner and the statistics (analysis.py) both read these;
nothing here needs scipy or matplotlib.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from pathlib import Path

import numpy as np

from paper_figs.study_rows import read_study_rows, row_problem, shown
from small_scale.study.train_flags import flags

HERE = Path(__file__).resolve().parent.parent   # small_scale/
ROOT = HERE.parent
STUDIES = HERE / "studies"
RESULTS = HERE / "results"
TESTBEDS = HERE / "study" / "testbeds.json"   # the claims compared across testbeds
SPEC_KEYS = {"description", "claims", "budget", "common", "seeds", "first_seed", "calibration",
             "seed_flags", "cells",
             "outcomes", "series", "analysis", "groups", "earlier_versions"}
CELL_KEYS = {"label", "role", "seeds", "args", "est_cpu_s"}
ROLES = ("primary", "secondary", "reference")
RESERVED = {"seed", "init_seed", "out", "resume", "cache_dir", "threads", "progress"}
REDUCERS = ("last", "mean", "first", "max", "min", "drop")


class StudyError(ValueError):
    """A bad study file, flag or results file: one line for the user, exit code 2."""


# ----------------------------------------------------------------------------------------------
# the study file
# ----------------------------------------------------------------------------------------------

def study_path(name: str, studies=STUDIES) -> Path:
    path = Path(studies) / f"{name}.json"
    if not path.is_file():
        have = sorted(p.stem for p in Path(studies).glob("*.json"))
        raise StudyError(f"no study {name!r} ({path} not found); studies: {', '.join(have)}")
    return path


def load_study(name: str, studies=STUDIES) -> dict:
    """The study file, checked: known keys, cells with flags the runner does not set, outcomes
    with a known reducer. Each cell gets its "seeds" (count) and "role" filled in."""
    path = study_path(name, studies)
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise StudyError(f"{path}: not JSON ({e})") from None
    bad = set(spec) - SPEC_KEYS
    missing = {"common", "seeds", "cells", "outcomes"} - set(spec)
    if bad or missing:
        raise StudyError(f"{path}: unknown keys {sorted(bad)}, missing keys {sorted(missing)}")
    spec.setdefault("seed_flags", ["seed"])
    spec.setdefault("series", {"keys": [], "every": 1})
    spec.setdefault("first_seed", 0)
    spec.setdefault("calibration", "calibration")
    if type(spec["first_seed"]) is not int or spec["first_seed"] < 0:
        raise StudyError(f"{path}: first_seed must be an integer >= 0")
    if not spec["cells"]:
        raise StudyError(f"{path}: no cells")
    for where, args in [("common", spec["common"])] + [
            (f"cell {c!r}", cell.get("args", {})) for c, cell in spec["cells"].items()]:
        if RESERVED & set(args):
            raise StudyError(f"{path}: {where} sets {sorted(RESERVED & set(args))}: the runner "
                             f"sets those (seeds through seed_flags)")
    for c, cell in spec["cells"].items():
        if set(cell) - CELL_KEYS:
            raise StudyError(f"{path}: cell {c!r} has unknown keys {sorted(set(cell) - CELL_KEYS)}")
        cell.setdefault("role", "primary")
        cell.setdefault("seeds", spec["seeds"])
        if cell["role"] not in ROLES:
            raise StudyError(f"{path}: cell {c!r}: role must be one of {ROLES}")
        if not (isinstance(cell["seeds"], int) and cell["seeds"] >= 1):
            raise StudyError(f"{path}: cell {c!r}: seeds must be an integer >= 1")
    for o, rule in spec["outcomes"].items():
        if rule.get("reduce") not in REDUCERS or "key" not in rule:
            raise StudyError(f"{path}: outcome {o!r} needs a key and a reduce in {REDUCERS}")
    if set(spec["seed_flags"]) - {"seed", "init_seed"}:
        raise StudyError(f"{path}: seed_flags may hold 'seed' and 'init_seed' only")
    versions = spec.setdefault("earlier_versions", {})
    if not isinstance(versions, dict) or not all(
            isinstance(v, str) and v.strip() for v in versions.values()):
        raise StudyError(f"{path}: earlier_versions maps a version's sha256 to the reason its "
                         f"rows still count (a sentence)")
    spec["name"] = name
    spec["path"] = str(path)
    spec["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return spec


# ----------------------------------------------------------------------------------------------
# the results file
# ----------------------------------------------------------------------------------------------

def planned_seeds(spec: dict, cell: str) -> range:
    """The seeds a cell runs: its ``seeds`` count from the study's ``first_seed`` (default 0; a
    calibration on other seeds than the study it calibrates chooses nothing from that study's
    own draws)."""
    first = spec.get("first_seed", 0)
    return range(first, first + spec["cells"][cell].get("seeds", spec.get("seeds", 0)))


def results_path(study: str, results=RESULTS) -> Path:
    return Path(results) / f"{study}.jsonl"


def read_rows(path: Path, spec: dict | None = None, report_torn: bool = True) -> list[dict]:
    """The rows of a results file ([] when there is none), checked against the study file
    ``spec`` (paper_figs/study_rows.py says what a row must hold); a StudyError naming file:line
    and the field for a bad one. A torn last line is left out, and said on stderr (report_torn)."""
    try:
        return read_study_rows(path, spec, **({} if report_torn else {"on_torn": None}))
    except ValueError as e:
        raise StudyError(str(e)) from None


def check_row(row: dict, spec: dict) -> None:
    """A row the runner is about to append meets what every reader asks of it (the same rule);
    else a StudyError: a run whose outcomes are not data is not written as data."""
    problem = row_problem(row, spec, {}, 0)
    if problem:
        raise StudyError(f"{row['cell']} s{row['seed']}: its results row would not be data: "
                         f"{problem}")


def values(rows: list[dict], outcome: str) -> dict:
    """{cell: {seed: outcome value}} (runs whose outcome is None are left out)."""
    out = {}
    for r in rows:
        v = r["outcomes"].get(outcome)
        if v is not None:
            out.setdefault(r["cell"], {})[r["seed"]] = float(v)
    return out


# ----------------------------------------------------------------------------------------------
# the pre-registered rules the runner applies
# ----------------------------------------------------------------------------------------------

def excluded_seeds(rows: list[dict], rule: dict | None) -> list:
    """The seeds the study's pre-registered ``exclude`` rule drops from every table and test:
    those whose reference-cell outcome (the warm start, measured before any RL step, so no cell
    can influence it) is below ``below``."""
    if not rule:
        return []
    ref = values(rows, rule["outcome"]).get(rule["reference_cell"], {})
    return sorted(s for s, v in ref.items() if v < rule["below"])


def select(spec: dict, rows: list[dict]) -> dict:
    """Each pre-registered choice of the calibration study (its analysis.select):

    "lr": cost(lr) = 1 - sum of off-policy outcomes / sum of the paired on-policy outcomes (over
      methods and seeds); floored = fraction of off-policy runs whose outcome is below ``floor``.
      Eligible: cost within ``range`` and floored <= ``max_floored``; the choice is the eligible
      candidate whose cost is nearest ``target`` (the smaller value on a tie). None eligible: the
      candidate nearest ``target`` among those with floored <= max_floored, marked
      "outside the range"; none of those: no choice (the grid must be extended).
    "share" (beta): share = value * mean over seeds of (kl * length / reward) at the end of
      training, the regularizer's part of the objective; the choice is the candidate whose share
      is nearest ``target`` within ``range`` (the same fallback).
    "gain-and-job" (several names at once, "token_cost,beta": a candidate's key holds their
      values in that order): gain = mean over seeds of the candidate cell's outcome minus the
      ``reference_cell``'s (what RL adds to the warm start), job = mean over seeds of the cell's
      outcome minus its ``base`` cell's (beta 0: what the KL term changes); score =
      min(gain - ``min_gain``, job). The choice is the candidate with the largest score ("inside
      the range" when it is > 0: both criteria met), the smaller key on a tie.
    "clip-binds" (several names at once, as gain-and-job): RL still improves on-policy and the
      clip binds off-policy; the first eligible candidate in the file's order (clip_binds).
    Complete: every cell of the study has all its planned seeds but those of the study's
    ``exclude`` rule, which do not count in any score (the runner does not run them)."""
    done = {(r["cell"], r["seed"]) for r in rows}
    dropped = excluded_seeds(rows, spec["analysis"].get("exclude"))
    complete = all((c, s) in done for c in spec["cells"]
                   for s in planned_seeds(spec, c) if s not in dropped)
    rows = [r for r in rows if r["seed"] not in dropped]
    out = {}
    for name, rule in spec["analysis"]["select"].items():
        if rule["rule"] in ("gain-and-job", "clip-binds"):
            pick = gain_and_job if rule["rule"] == "gain-and-job" else clip_binds
            out[name] = {**pick(rule, rows), "complete": complete}
            continue
        cands = {}
        for value, cells in rule["candidates"].items():
            if rule["rule"] == "offpolicy-cost":
                on, off = values(rows, rule["outcome"]), values(rows, rule["outcome"])
                pairs = [(on[a][s], off[b][s]) for a, b in zip(cells["on"], cells["off"])
                         for s in sorted(set(on.get(a, {})) & set(off.get(b, {})))]
                if not pairs:
                    continue
                son, soff = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
                cost = 1 - soff / son if son > 0 else math.nan
                floored = np.mean([p[1] < rule["floor"] for p in pairs])
                cands[value] = {"score": cost, "floored": float(floored), "n": len(pairs)}
            elif rule["rule"] == "kl-share":
                got = [r for r in rows if r["cell"] == cells]
                sh = [float(value) * r["outcomes"][rule["kl"]] * r["outcomes"][rule["length"]]
                      / r["outcomes"][rule["reward"]] for r in got
                      if r["outcomes"][rule["reward"]]]
                if sh:
                    cands[value] = {"score": float(np.mean(sh)), "floored": 0.0, "n": len(sh)}
            else:
                raise ValueError(f"unknown selection rule {rule['rule']!r}")
        lo, hi = rule["range"]
        ok = {v: c for v, c in cands.items() if c["floored"] <= rule.get("max_floored", 1.0)}
        inside = {v: c for v, c in ok.items() if lo <= c["score"] <= hi}
        pool = inside or ok
        choice = min(pool, key=lambda v: (abs(pool[v]["score"] - rule["target"]), float(v)),
                     default=None)
        out[name] = {"candidates": cands, "complete": complete,
                     "choice": float(choice) if choice is not None else None,
                     "inside_range": bool(inside)}
    return out


def gain_and_job(rule: dict, rows: list[dict]) -> dict:
    """The "gain-and-job" choice (select's docstring): {candidates, choice, inside_range}."""
    vals = values(rows, rule["outcome"])
    ref = vals.get(rule["reference_cell"], {})
    cands = {}
    for key, c in rule["candidates"].items():
        mine, base = vals.get(c["cell"], {}), vals.get(c["base"], {})
        seeds = sorted(set(mine) & set(ref) & set(base))
        if not seeds:
            continue
        gain = float(np.mean([mine[s] - ref[s] for s in seeds]))
        job = float(np.mean([mine[s] - base[s] for s in seeds]))
        cands[key] = {"score": min(gain - rule["min_gain"], job), "gain": gain, "job": job,
                      "floored": 0.0, "n": len(seeds)}
    choice = max(cands, key=lambda k: (cands[k]["score"], [-float(x) for x in k.split(",")]),
                 default=None)
    return {"candidates": cands,
            "choice": None if choice is None else tuple(float(x) for x in choice.split(",")),
            "inside_range": choice is not None and cands[choice]["score"] > 0}


def clip_binds(rule: dict, rows: list[dict]) -> dict:
    """The "clip-binds" choice (select's docstring): a candidate setting has an on-policy cell
    ``on`` and off-policy cells ``off``; gain = mean over seeds of ``on``'s outcome minus the
    ``reference_cell``'s (what RL adds on-policy), bind = the smallest, over the ``off`` cells, of
    the mean over seeds of the share of units the clip bound on (the sum of the ``bind``
    outcomes: its low, high and dual branches). Eligible: gain >= ``min_gain`` and bind >=
    ``min_bind``; score = min(gain - min_gain, bind - min_bind). The choice is the first eligible
    candidate in the order the study file lists them (its pre-registered preference); with none
    eligible, none ("outside the range": the grid must be extended)."""
    vals = values(rows, rule["outcome"])
    ref = vals.get(rule["reference_cell"], {})
    bind_vals = [values(rows, o) for o in rule["bind"]]
    cands = {}
    for key, c in rule["candidates"].items():
        on = vals.get(c["on"], {})
        seeds = sorted(set(on) & set(ref))
        per_cell = []
        for cell in c["off"]:
            got = [sum(v.get(cell, {}).get(s, math.nan) for v in bind_vals)
                   for s in sorted(set(bind_vals[0].get(cell, {})))]
            per_cell.append(float(np.mean(got)) if got else math.nan)
        if not seeds or any(math.isnan(b) for b in per_cell):
            continue
        gain = float(np.mean([on[s] - ref[s] for s in seeds]))
        bind = min(per_cell)
        cands[key] = {"score": min(gain - rule["min_gain"], bind - rule["min_bind"]),
                      "gain": gain, "bind": bind, "floored": 0.0, "n": len(seeds)}
    eligible = [k for k in rule["candidates"] if k in cands and cands[k]["score"] >= 0]
    choice = eligible[0] if eligible else None
    return {"candidates": cands,
            "choice": None if choice is None else tuple(float(x) for x in choice.split(",")),
            "inside_range": choice is not None}


def calibrated_values(results=RESULTS, studies=STUDIES, study: str = "calibration") -> dict:
    """{name: value} the calibration study ``study`` chose (the runner substitutes them into the
    studies whose "calibration" names it); a StudyError while it is incomplete or chose
    nothing."""
    spec = load_study(study, studies)
    rows = read_rows(results_path(study, results), spec, report_torn=False)
    got = {}
    for name, s in select(spec, rows).items():
        if not s["complete"]:
            raise StudyError(f"the calibration study {study} is not complete ({len(rows)} runs); "
                             f"finish it first: python -m small_scale.study {study}")
        if s["choice"] is None:
            raise StudyError(f"the calibration chose no {name}: no candidate met its rule; "
                             f"extend the grid in small_scale/studies/{study}.json")
        names, choice = name.split(","), s["choice"]
        got.update(zip(names, choice if isinstance(choice, tuple) else (choice,)))
    return got


# ----------------------------------------------------------------------------------------------
# the rows' provenance: run under this study file, with its arguments
# ----------------------------------------------------------------------------------------------

COMMAND = ["python", "-m", "rpg_ref.cli"]   # how a row's argv starts
PLACES = ("--out", "--cache-dir")           # where a run writes (--runs): not what it runs
RUNNER_FLAGS = ["--threads", "1", "--no-progress"]   # what the runner adds to every run


def resolve_calibrated(args: dict, values: dict | None) -> dict:
    """Replace each {"calibrated": NAME, "times": F} by values[NAME] * F (a flag's value, or one
    item of a list value such as --clip's)."""
    def one(k, v):
        if not isinstance(v, dict):
            return v
        if set(v) - {"calibrated", "times"} or "calibrated" not in v:
            raise StudyError(f"--{k.replace('_', '-')}: a dict value must be "
                             f'{{"calibrated": NAME, "times": F}}, got {v}')
        if values is None or v["calibrated"] not in values:
            raise StudyError(f"--{k.replace('_', '-')} needs the calibration's "
                             f"{v['calibrated']!r}, which is not chosen yet")
        return float(f"{values[v['calibrated']] * v.get('times', 1.0):.6g}")

    return {k: [one(k, x) for x in v] if isinstance(v, list) else one(k, v)
            for k, v in args.items()}


def needs_calibration(spec: dict) -> bool:
    every = [spec["common"]] + [c.get("args", {}) for c in spec["cells"].values()]
    return any(isinstance(x, dict) for a in every for v in a.values()
               for x in (v if isinstance(v, list) else [v]))


def planned_argv(spec: dict, cell: str, seed: int, calibrated: dict | None) -> list[str]:
    """rpg-train's flags for (cell, seed) as the study file says: its common and cell arguments
    (calibrated values substituted), then each seed flag set to the seed. The runner adds --out,
    --cache-dir and RUNNER_FLAGS."""
    args = resolve_calibrated({**spec["common"], **spec["cells"][cell].get("args", {})},
                              calibrated)
    argv = flags(args)
    for f in spec["seed_flags"]:
        argv += ["--" + f.replace("_", "-"), str(seed)]
    return argv


def without_places(argv: list) -> list:
    """``argv`` without the folders a run writes to (PLACES and their values)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in PLACES:
            skip = True
        else:
            out.append(a)
    return out


def flag_values(argv: list) -> dict:
    """{flag: its values as one string} of an rpg-train command line."""
    out, flag = {}, None
    for a in argv:
        if a.startswith("--"):
            flag = a
            out[flag] = ""
        elif flag is not None:
            out[flag] = (out[flag] + " " + a).strip()
    return out


def argv_difference(got: list, want: list) -> str:
    """The first flags in which a row's command differs from the study file's, in words."""
    g, w = flag_values(got), flag_values(want)
    said = []
    for f in dict.fromkeys([*w, *g]):
        if g.get(f) == w.get(f):
            continue
        ran = "without it" if f not in g else f"{f} {g[f]}".strip()
        says = "no such flag" if f not in w else f"{f} {w[f]}".strip()
        said.append(f"ran {ran} where the study file says {says}")
    return "; ".join(said[:3]) if said else "the flags' order differs"


def version_difference(path: Path, sha: str) -> str | None:
    """The keys in which the committed version of the study file ``path`` whose sha256 is ``sha``
    differs from the file as it is now (None when git holds no such version)."""
    git = lambda *a: subprocess.run(["git", "-C", str(path.parent), *a], capture_output=True)
    log = git("log", "--format=%H", "-n", "200", "--", path.name)
    for commit in log.stdout.decode().split() if log.returncode == 0 else []:
        old = git("show", f"{commit}:./{path.name}")
        if old.returncode == 0 and hashlib.sha256(old.stdout).hexdigest() == sha:
            try:
                keys = changed_keys(json.loads(old.stdout), json.loads(path.read_text()))
            except json.JSONDecodeError:
                return None
            return ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
    return None


def changed_keys(old, new, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two JSON values."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [prefix or "(the whole file)"]
    out = []
    for k in dict.fromkeys([*old, *new]):
        where = f"{prefix}.{k}" if prefix else k
        if k not in old or k not in new:
            out.append(where)
        else:
            out += changed_keys(old[k], new[k], where)
    return out


def check_provenance(path: Path, spec: dict, rows: list[dict],
                     calibrated: dict | None = None) -> None:
    """Each row was run under this study file: its ``study_sha256`` is the file's (or a version
    the file lists in ``earlier_versions``, each with the reason its rows still count), and its
    argv is what the file says for its cell and seed (``calibrated``: the calibration's values,
    for a study that reads them). Else a StudyError naming file:line, what differs and the fix:
    rerun the rows, or declare the changed file a new study."""
    if not rows:
        return
    study_file = shown(Path(spec["path"]))
    fix = (f"rerun its rows (remove them from {shown(path)}, then python -m small_scale.study "
           f"{spec['name']}) or declare the change as a new study file")
    known = {spec["sha256"], *spec.get("earlier_versions", {})}
    if needs_calibration(spec) and calibrated is None:
        calibrated = calibrated_values(Path(path).parent, Path(spec["path"]).parent,
                                       spec["calibration"])
    for i, row in enumerate(rows, 1):
        where = f"{shown(path)}:{i}: {row['cell']} s{row['seed']}"
        if row["study_sha256"] not in known:
            what = version_difference(Path(spec["path"]), row["study_sha256"])
            raise StudyError(
                f"{where} was run under another version of {study_file} (sha256 "
                f"{row['study_sha256'][:12]}, the file's is now {spec['sha256'][:12]}"
                + (f"; changed since: {what}" if what else "") + f"); {fix}")
        want = COMMAND + planned_argv(spec, row["cell"], row["seed"], calibrated) + RUNNER_FLAGS
        got = without_places(row["argv"])
        if got != want:
            raise StudyError(f"{where} was run with other arguments than {study_file} gives "
                             f"it: {argv_difference(got, want)}; {fix}")


# ----------------------------------------------------------------------------------------------
# the rules are committed before the first row
# ----------------------------------------------------------------------------------------------

def rules_of(spec: dict, testbeds: Path = TESTBEDS) -> list[Path]:
    """The files whose rules decide what a study's rows say: its study file, and the comparison
    rules (testbeds.json) when an entry there names the study."""
    out = [Path(spec["path"])]
    if Path(testbeds).is_file() and names_study(json.loads(Path(testbeds).read_text()),
                                                spec["name"]):
        out.append(Path(testbeds))
    return out


def names_study(value, study: str) -> bool:
    """Whether a JSON value holds {"study": ``study``} anywhere."""
    if isinstance(value, dict):
        return value.get("study") == study or any(names_study(v, study) for v in value.values())
    return isinstance(value, list) and any(names_study(v, study) for v in value)


def uncommitted(paths: list[Path]) -> str | None:
    """Why one of ``paths`` is not the committed record ("FILE is untracked", "... has changes
    that are not committed", "... is not in a git repository"); None when each is committed as
    it is."""
    for p in map(Path, paths):
        git = lambda *a, p=p: subprocess.run(["git", "-C", str(p.resolve().parent), *a],
                                             capture_output=True)
        if git("rev-parse", "--git-dir").returncode != 0:
            return f"{shown(p)} is not in a git repository"
        if git("ls-files", "--error-unmatch", "--", p.name).returncode != 0:
            return f"{shown(p)} is untracked"
        if git("diff", "--quiet", "HEAD", "--", p.name).returncode != 0:
            return f"{shown(p)} has changes that are not committed"
    return None
