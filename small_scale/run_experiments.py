"""Run a small_scale experiment: every (run, seed) of small_scale/configs/<exp>.json through
rpg_ref.trainer.train, then keep commit-size logs that paper_figs reads. The legacy runner of
small_scale/logs/; small_scale/study/runner.py runs the same experiments as study files
(small_scale/studies/{bandit,seq,ablation}.json), which paper_figs reads once these logs are gone.

    python -m small_scale.run_experiments --exp bandit            # ~3 min on 2 CPU cores
    python -m small_scale.run_experiments --exp seq               # every method, 3 seeds
    python -m small_scale.run_experiments --exp ablation          # sec:ablation
    python -m small_scale.run_experiments --exp all --workers 2
    rpg-figs                                                       # figures + tables from the logs

A config (the one source of truth for an experiment) holds ``common`` trainer flags, ``runs``
(name -> label and extra flags; flags are rpg-train's, written as JSON keys: "eval_every": 10 is
``--eval-every 10``), ``seeds``, ``groups`` (figure subsets), ``log_keys`` and ``log_every``. Every
(run, seed) is parsed by rpg_ref.cli.parse_config before anything trains, so a bad config fails
at once. Full outputs (checkpoints included) go to --runs-dir; one file per experiment,
small_scale/logs/<exp>.jsonl (layout: paper_figs/training.py), keeps the experiment's config, the
command, and per run and seed: the trainer's config.json and summary.json, and its metrics.jsonl
rows (log_keys only, every log_every steps and every evaluation step, floats to 6 significant
digits). The file is rewritten (atomically) after every finished (run, seed), so a killed
invocation keeps what finished; finished (run, seed) pairs are skipped unless --force.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from paper_figs.training import read_experiment_log
from rpg_ref import strict_json
from small_scale.study.train_flags import flags  # the one dict -> rpg-train flags rule

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = HERE / "configs"
EXPERIMENTS = ("bandit", "seq", "ablation")
SPEC_KEYS = {"description", "paper", "seeds", "common", "runs", "groups", "log_keys", "log_every"}


def load_spec(exp: str) -> dict:
    path = CONFIGS / f"{exp}.json"
    if not path.exists():
        raise ValueError(f"no config {path}; experiments: {', '.join(EXPERIMENTS)}")
    spec = json.loads(path.read_text())
    unknown = set(spec) - SPEC_KEYS
    missing = {"seeds", "common", "runs", "log_keys"} - set(spec)
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    if not spec["runs"]:
        raise ValueError(f"{path}: no runs")
    for g, members in spec.get("groups", {}).items():
        bad = [m for m in members if m not in spec["runs"]]
        if bad:
            raise ValueError(f"{path}: group {g!r} names unknown runs {bad}")
    for name, run in spec["runs"].items():
        if set(run) - {"label", "args"}:
            raise ValueError(
                f"{path}: run {name!r} has unknown keys {sorted(set(run) - {'label', 'args'})}"
            )
        reserved = {"seed", "out", "resume"} & set(run.get("args", {})) | {
            "seed",
            "out",
            "resume",
        } & set(spec["common"])
        if reserved:
            raise ValueError(f"{path}: run {name!r}: {sorted(reserved)} are set by the runner")
    return spec


def argv_for(spec: dict, run: str, seed: int, runs_dir: Path) -> list[str]:
    args = {**spec["common"], **spec["runs"][run].get("args", {})}
    return flags(args) + ["--seed", str(seed), "--out", str(runs_dir / run / f"seed{seed}"),
                          "--cache-dir", str(runs_dir.parent / "cache"), "--no-progress"]


def _round(v):
    if isinstance(v, float):
        return float(f"{v:.6g}")
    return v


def trim_metrics(src: Path, keys: list, every: int) -> list[dict]:
    rows = [strict_json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    last = rows[-1]["step"]
    return [{k: _round(r[k]) for k in keys if k in r} for r in rows
            if r["step"] % every == 0 or r["step"] == last or any(k.startswith("eval_") for k in r)]


def read_log(path: Path) -> dict:
    """An experiment's log file as {"experiment", "invocation", "runs": {run: {seed: {...}}}}
    (empty when there is none yet)."""
    if not path.exists():
        return {"experiment": None, "invocation": None, "runs": {}}
    return read_experiment_log(path)


def write_log(path: Path, log: dict) -> None:
    """The layout of paper_figs/training.py, runs in the experiment's order, seeds increasing;
    written to a temporary file and renamed, so a reader never sees half a file."""
    recs = [{"experiment": log["experiment"]}]
    if log["invocation"]:
        recs.append({"invocation": log["invocation"]})
    order = list(log["experiment"]["runs"]) + sorted(
        set(log["runs"]) - set(log["experiment"]["runs"])
    )
    for run in order:
        for seed, r in sorted(log["runs"].get(run, {}).items()):
            recs.append({"run": run, "seed": seed, "config": r["config"]})
            recs.append({"run": run, "seed": seed, "summary": r["summary"]})
            recs += [{"run": run, "seed": seed, "metrics": m} for m in r["metrics"]]
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text("".join(strict_json.dumps(x, separators=(",", ":")) + "\n" for x in recs))
    os.replace(tmp, path)


def portable(config: dict) -> dict:
    """The run's config with its folders relative to the repository (the logs are committed:
    they must not carry the paths of the machine that produced them)."""
    out = dict(config)
    for key in ("out", "cache_dir", "resume"):
        if out.get(key) and Path(out[key]).is_absolute():
            p = Path(out[key])
            out[key] = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name
    return out


def run_one(job: tuple) -> tuple:
    """Train one (run, seed) in this process. Returns (exp, run, seed, seconds, its logs)."""
    exp, run, seed, argv, keys, every = job
    from rpg_ref.cli import parse_config
    from rpg_ref.trainer.train import train
    t0 = time.perf_counter()
    out = Path(argv[argv.index("--out") + 1])
    if out.exists():
        shutil.rmtree(out)                           # --force or a half-finished run: start clean
    cfg = parse_config(argv)
    train(cfg)
    wall = time.perf_counter() - t0
    out = Path(cfg.out)
    summary = strict_json.loads((out / "summary.json").read_text())
    summary["runner_wall_time_s"] = wall
    summary["config"] = portable(summary["config"])
    logs = {"config": portable(strict_json.loads((out / "config.json").read_text())),
            "summary": summary,
            "metrics": trim_metrics(out / "metrics.jsonl", keys, every)}
    return exp, run, seed, wall, logs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument("--exp", required=True, choices=EXPERIMENTS + ("all",))
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default: the config's)")
    ap.add_argument("--workers", type=int, default=1, help="parallel training processes")
    ap.add_argument("--only", nargs="+", metavar="RUN", help="only these runs of the config")
    ap.add_argument(
        "--force", action="store_true", help="rerun (run, seed) pairs that already have logs"
    )
    ap.add_argument("--logs", default=str(HERE / "logs"), help="where the commit-size logs go "
                    "(one <exp>.jsonl per experiment)")
    ap.add_argument(
        "--runs-dir", default=str(ROOT / "runs" / "small_scale"), help="full trainer outputs"
    )
    a = ap.parse_args(argv)
    if a.seeds is not None and a.seeds < 1:
        ap.error(f"--seeds must be >= 1, got {a.seeds}")
    if a.workers < 1:
        ap.error(f"--workers must be >= 1, got {a.workers}")

    from rpg_ref.cli import parse_config
    exps = EXPERIMENTS if a.exp == "all" else (a.exp,)
    jobs, specs, logs, pairs = [], {}, {}, 0
    for exp in exps:                                  # validate everything before training anything
        spec = specs[exp] = load_spec(exp)
        logs[exp] = read_log(Path(a.logs) / f"{exp}.jsonl")
        runs = a.only or list(spec["runs"])
        bad = [r for r in runs if r not in spec["runs"]]
        if bad:
            ap.error(f"{exp}: unknown runs {bad}; runs: {list(spec['runs'])}")
        for run in runs:
            for seed in range(a.seeds or spec["seeds"]):
                av = argv_for(spec, run, seed, Path(a.runs_dir) / exp)
                probe = argv_for(spec, run, seed, Path(a.runs_dir) / ".validate-only" / exp)
                try:
                    parse_config(probe)  # same flags, an --out that does not exist
                except (ValueError, SystemExit) as e:
                    raise SystemExit(
                        f"{exp}/{run} seed {seed}: bad trainer flags {av}: {e}"
                    ) from None
                pairs += 1
                done = (logs[exp]["runs"].get(run, {}).get(seed) or {}).get("summary") is not None
                if a.force or not done:
                    jobs.append((exp, run, seed, av, spec["log_keys"], spec.get("log_every", 1)))

    Path(a.logs).mkdir(parents=True, exist_ok=True)
    for exp, spec in specs.items():
        logs[exp]["experiment"] = spec
        write_log(Path(a.logs) / f"{exp}.jsonl", logs[exp])

    print(f"{pairs} (run, seed) pairs, {len(jobs)} to train, {a.workers} worker(s)", flush=True)
    t0 = time.perf_counter()
    walls = []
    if a.workers == 1:
        results = map(run_one, jobs)
    else:
        import multiprocessing as mp
        pool = ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn"))
        results = pool.map(run_one, jobs)
    for i, (exp, run, seed, wall, run_logs) in enumerate(results, 1):
        logs[exp]["runs"].setdefault(run, {})[seed] = run_logs
        write_log(Path(a.logs) / f"{exp}.jsonl", logs[exp])
        walls.append(wall)
        print(
            f"[{i}/{len(jobs)}] {run} seed {seed}: {wall:.1f}s (elapsed "
            f"{time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    total = time.perf_counter() - t0

    info = {
        "command": "python -m small_scale.run_experiments "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "wall_time_s": round(total, 1),
        "runs_trained": len(jobs),
        "sum_run_wall_time_s": round(sum(walls), 1),
        "workers": a.workers,
        "machine": f"{platform.machine()} {platform.processor() or ''} "
        f"{os.cpu_count()} CPU cores, {platform.system()}",
        "python": platform.python_version(),
    }
    for exp in specs:
        logs[exp]["invocation"] = info
        write_log(Path(a.logs) / f"{exp}.jsonl", logs[exp])
    print(f"done in {total:.0f}s; logs in {a.logs}; now: rpg-figs (or python -m paper_figs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
