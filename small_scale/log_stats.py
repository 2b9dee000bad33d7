"""Per-run numbers quoted in small_scale/RESULTS.md's readings, computed from the committed logs.

    python -m small_scale.log_stats [--logs small_scale/logs]

For every run of the seq and ablation experiments, per seed: entropy (mean of the first 5 and of
the last 5 logged steps), run-mean KL(pi_theta || pi_old) per step (kl_old), run-mean clipped
fractions at the low and high bound, response length (mean of the last 10 steps); and, pooled over
seeds, the change in held-out greedy accuracy between consecutive evaluations (mean, max).
"""

from __future__ import annotations

import argparse
import itertools
import statistics as st
from pathlib import Path

from paper_figs.training import load_experiment

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", default=str(HERE / "logs"))
    root = Path(ap.parse_args().logs)
    for exp in ("seq", "ablation"):
        print(f"== {exp}")
        runs = load_experiment(exp, root)["runs"]
        for run in sorted(runs):
            cols = {
                k: []
                for k in (
                    "ent_first5",
                    "ent_last5",
                    "kl_old",
                    "clip_low",
                    "clip_high",
                    "len_last10",
                )
            }
            ev_steps = []
            for rec in runs[run]:
                m = rec["metrics"]
                cols["ent_first5"].append(st.mean(r["entropy"] for r in m[:5]))
                cols["ent_last5"].append(st.mean(r["entropy"] for r in m[-5:]))
                cols["kl_old"].append(st.mean(r["kl_old"] for r in m))
                cols["clip_low"].append(st.mean(r["clip_frac_low"] for r in m))
                cols["clip_high"].append(st.mean(r["clip_frac_high"] for r in m))
                cols["len_last10"].append(st.mean(r["response_len"] for r in m[-10:]))
                ev = [r["eval_greedy_accuracy"] for r in m if "eval_greedy_accuracy" in r]
                ev_steps += [abs(b - a) for a, b in itertools.pairwise(ev)]
            per_seed = " | ".join(
                f"{k} " + "/".join(f"{v:.3f}" for v in vs) for k, vs in cols.items()
            )
            print(
                f"{run:20s} {per_seed} | eval change mean {st.mean(ev_steps):.3f} max "
                f"{max(ev_steps):.3f}"
            )


if __name__ == "__main__":
    main()
