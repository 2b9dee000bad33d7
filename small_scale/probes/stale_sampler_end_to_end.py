"""--sampler-lag measured end to end: the bandit's optimum with a stale sampler, and what a lag
costs per step.

    python -m small_scale.probes.stale_sampler_end_to_end [--exp bandit cost]
        [--out runs/sampler_lag]

bandit: --preset bandit --ref init, seeds 0-4, for K = 0, 2, 8 with no correction, tis at level
    sequence (cap 2) and uncapped mis: the total variation to the optimum of E[R] - beta URKL at
    the last step, and the largest |log pi_old / pi_sampler| of the first 30 steps
    (logprob_diff_max; docs/rollout_correction.md, "A stale sampler").
cost: the default seq run for 40 steps at K = 0, 2, 8, interleaved over --repeats rounds so a
    shared machine's load hits every K alike: the median wall time per run and its ratio to K = 0,
    and the mean logprob_diff_max (max |log pi_sampler - log pi_old|, the staleness); then the
    time of one lagged sync_weights (the lag's own work per step) against the median step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from rpg_ref import cli
from rpg_ref.trainer import train

BANDIT = {
    "none": [],
    "tis sequence, C = 2": ["--rollout-correction", "tis",
                            "--rollout-correction-level", "sequence"],
    "mis, no cap": ["--rollout-correction", "mis", "--rollout-correction-cap", "inf"],
}


def run(argv: list) -> tuple[dict, list]:
    cfg = cli.parse_config([*argv, "--no-progress"])
    summary = train.train(cfg)
    rows = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def bandit(out: Path) -> None:
    print("| bandit | TV per seed (seeds 0-4) | max abs log r, steps 1-30 |\n|---|---|---|")
    for lag in (0, 2, 8):
        for name, extra in BANDIT.items():
            if lag == 0 and extra:
                continue
            tvs, logr = [], []
            for seed in range(5):
                o = out / f"bandit-k{lag}-{name.split()[0].strip(',')}-s{seed}"
                s, rows = run(["--preset", "bandit", "--ref", "init", "--seed", str(seed),
                               "--sampler-lag", str(lag), "--out", str(o), *extra])
                tvs.append(f"{s['tv_distance']:.4f}")
                logr.append(max(r["logprob_diff_max"] for r in rows[:30]))
            print(f"| K = {lag}, {name} | {', '.join(tvs)} | {max(logr):.3g} |", flush=True)


def cost(out: Path, repeats: int) -> None:
    lags, wall, diff = (0, 2, 8), {}, {}
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.1f}")
    for r in range(repeats):
        for lag in lags:
            o = out / f"seq-k{lag}-r{r}"
            t0 = time.perf_counter()
            _, rows = run(["--steps", "40", "--sampler-lag", str(lag), "--out", str(o),
                           "--cache-dir", str(out / "cache")])
            wall.setdefault(lag, []).append(time.perf_counter() - t0)
            diff[lag] = statistics.mean(x["logprob_diff_max"] for x in rows)
    base = statistics.median(wall[0])
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")
    print("| K | median wall per 40-step run (s) | ratio to K = 0 | mean logprob_diff_max |")
    print("|---|---|---|---|")
    for lag in lags:
        m = statistics.median(wall[lag])
        print(f"| {lag} | {m:.2f} | {m / base:.3f} | {diff[lag]:.3g} |")
    # the lag's own work per step, apart from the load's noise: one sync_weights (a CPU snapshot of
    # the policy, the oldest one loaded into the sampler), against the runs' median step
    for lag in lags[1:]:
        cfg = cli.parse_config(["--sampler-lag", str(lag), "--out", str(out / f"sync-k{lag}"),
                                "--cache-dir", str(out / "cache"), "--no-progress"])
        prepared = train.prepare(cfg)
        t = []
        for _ in range(200):
            t0 = time.perf_counter()
            prepared.engine.sync_weights(prepared.policy)
            t.append(time.perf_counter() - t0)
        rows = [json.loads(x) for r in range(repeats) for x in
                (out / f"seq-k{lag}-r{r}" / "metrics.jsonl").read_text().splitlines()]
        step = statistics.median(x["time_step"] for x in rows)
        print(f"K = {lag}: sync_weights {statistics.median(t) * 1e3:.3f} ms (median of 200), "
              f"{statistics.median(t) / step:.2%} of the median step ({step * 1e3:.0f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exp", nargs="+", default=["bandit", "cost"], choices=["bandit", "cost"])
    ap.add_argument("--out", default="runs/sampler_lag")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    out = Path(a.out)
    if "cost" in a.exp:  # the warm start first, outside the timed runs
        run(["--steps", "1", "--out", str(out / "warm"), "--cache-dir", str(out / "cache")])
        cost(out, a.repeats)
    if "bandit" in a.exp:
        bandit(out)


if __name__ == "__main__":
    main()
