"""Rollout correction measured end to end: rpg-train with a sampler mu that is not pi_old.

    python -m small_scale.probes.correction_end_to_end [--exp bandit seq]
        [--out runs/rollout_correction]

bandit: the 5-armed bandit preset with --ref init (optimum: argmax E[R] - beta URKL(pi, pi_ref)),
    sampled by ``TemperedEngine``: the bandit's sampler at 4x the trainer's temperature, reporting
    its own log-probs, so mu is a flattened pi_old (max |log pi_old/mu| ~2.7). Printed: the total
    variation to the optimum and the last step's rc_* statistics, for no correction, tis without a
    cap, and tis / mis with cap 1.5 (the caps' bias, docs/rollout_correction.md).
seq: the default run (seq preset, 80 steps) sampling from a bf16 copy of the fp32 policy
    (--hf-gen-dtype bfloat16): the mismatch a bf16 sampler brings, with and without correction.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rpg_ref import cli
from rpg_ref.engines.sample import SampleEngine
from rpg_ref.registry import ENGINES
from rpg_ref.trainer import train

TEMPER = 4.0


class TemperedEngine(SampleEngine):
    """The bandit's sampler at TEMPER x the trainer's temperature: mu != pi_old, its own log-probs
    reported (sample_next reports the log-prob at the temperature it samples with)."""

    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        return super().generate(prompts, n, TEMPER * temperature, top_p, max_new_tokens)


ENGINES.setdefault("tempered", TemperedEngine)

BANDIT = {
    "none": [],
    "tis, no cap": ["--rollout-correction", "tis", "--rollout-correction-cap", "inf"],
    "tis, C = 1.5": ["--rollout-correction", "tis", "--rollout-correction-cap", "1.5"],
    "mis, C = 1.5": ["--rollout-correction", "mis", "--rollout-correction-cap", "1.5"],
}
SEQ = {"none": [], "tis token": ["--rollout-correction", "tis"],
       "tis sequence": ["--rollout-correction", "tis", "--rollout-correction-level", "sequence"],
       "mis token": ["--rollout-correction", "mis"]}
RC_KEYS = ("rc_weight_mean", "rc_capped_frac", "rc_log_ratio_max", "rc_ess")


def run(argv: list) -> tuple[dict, list]:
    cfg = cli.parse_config(argv + ["--no-progress"])
    summary = train.train(cfg)
    rows = [json.loads(line) for line in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def bandit(out: Path) -> None:
    print(
        f"| bandit, sampler at {TEMPER:g}x temperature | TV to optimum | "
        + " | ".join(RC_KEYS)
        + " |"
    )
    print("|---" * (2 + len(RC_KEYS)) + "|")
    for name, flags in BANDIT.items():
        s, rows = run(
            [
                "--preset",
                "bandit",
                "--ref",
                "init",
                "--engine",
                "tempered",
                "--out",
                str(out / "bandit" / name.replace(" ", "").replace(",", "-")),
                *flags,
            ]
        )
        last = rows[-1]
        print(
            f"| {name} | {s['tv_distance']:.4f} | "
            + " | ".join(fmt(last.get(k)) for k in RC_KEYS)
            + " |"
        )


def seq(out: Path) -> None:
    keys = ("logprob_diff_max", *RC_KEYS)
    print("| seq, bf16 sampler | sampled accuracy step 1 -> 80 | greedy held-out | "
          + " | ".join(f"{k} mean [min, max] over steps" for k in keys) + " |")
    print("|---" * (3 + len(keys)) + "|")
    for name, flags in SEQ.items():
        s, rows = run(
            [
                "--hf-gen-dtype",
                "bfloat16",
                "--out",
                str(out / "seq" / name.replace(" ", "-")),
                *flags,
            ]
        )
        cells = []
        for k in keys:
            v = [r[k] for r in rows if k in r]
            cells.append(f"{statistics.mean(v):.4g} [{min(v):.3g}, {max(v):.3g}]" if v else "-")
        print(f"| {name} | {rows[0]['accuracy']:.2f} -> {rows[-1]['accuracy']:.2f} | "
              f"{s['eval']['eval_greedy_accuracy']:.2f} | " + " | ".join(cells) + " |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exp", nargs="+", choices=("bandit", "seq"), default=["bandit", "seq"])
    ap.add_argument("--out", default="runs/rollout_correction")
    args = ap.parse_args(argv)
    for exp in args.exp:
        {"bandit": bandit, "seq": seq}[exp](Path(args.out))


if __name__ == "__main__":
    main()
