"""The carry task's properties as a testbed, measured: from the task's definition and from the
committed rows of study C (small_scale/results/C.jsonl) and its calibration.

    python -m small_scale.study.carry_properties          # the table (markdown), docs/carry_task.md
    python -m small_scale.study.carry_properties --json   # the same numbers, machine-readable
    python -m small_scale.study.carry_properties --write  # the table into docs/carry_task.md

Each property has the requirement it is held to and what was measured; "holds" is yes or no
(n/a while the rows it needs are missing). The rules, in the order of the table:

1. length: a worked response's mean length over the task's problems (20,000 drawn with a fixed
   generator, exact lengths from the task's own target), and the mean response length of the
   calibrated on-policy cell's runs (len_mean: every step's sampled responses), >= 24 tokens;
2. warm start: the share of seeds whose warm start (reference cell, before any RL step) solves
   >= 0.2 of the held-out problems (the study's exclusion rule), >= 0.95; and the share inside
   [0.2, 0.7] (room to learn);
3. RL improves: the share of seeds on which the calibrated on-policy cell ends >= 0.10 above its
   warm start, >= 0.90;
4. the KL term's job: the pre-registered contrast calibrated beta vs beta 0 (analysis.py) is
   significant after Holm and its |mean| exceeds its minimum detectable effect;
5. the clip binds: in each off-policy cell (4 and 16 updates, a stale sampler coupled to the
   ratio), the mean share of tokens on a clipped segment (low + high + dual) >= 0.05;
6. the KL's share of the objective, beta KL / (|E[R]| + beta KL) with KL the sequence-level
   KL(pi_old || pi_ref) (the token-mean k3 estimate times the mean response length) at the end of
   the calibrated on-policy runs, >= 0.10;
7. cost: each cell's median CPU seconds per run <= 60 (the one run of a seed that also trains its
   warm start, its costliest, shown apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import types

import numpy as np

import small_scale.study.analysis as A
import small_scale.study.files as S

STUDY, ON_POLICY, BETA0, REF = "C", "urkl-u1", "urkl-b0-u1", "warm-start"
KL_JOB = "urkl-u1 - urkl-b0-u1"
OFF_POLICY = ("urkl-u4", "dapo-u4", "grpo-u4", "urkl-u16", "dapo-u16", "grpo-u16",
              "urkl-lag4-coupled", "dapo-lag4-coupled")


def task_lengths(n: int = 20000) -> dict:
    """Worked and direct response lengths over n problems of the carry task's defaults."""
    import torch

    from rpg_ref.tasks.carry import CarryTask
    cfg = types.SimpleNamespace(task_options={}, max_new_tokens=40, seed=0, init_seed=None,
                                cache_dir="unused", progress=False, temperature=1.0)
    task = CarryTask(cfg, torch.device("cpu"))
    problems = task.sample_prompts(n, torch.Generator().manual_seed(1))
    worked = [len(task.target(*p.answer, direct=False)) for p in problems]
    direct = [len(task.target(*p.answer, direct=True)) for p in problems]
    return {"worked_mean": statistics.mean(worked), "worked_sd": statistics.pstdev(worked),
            "worked_min": min(worked), "worked_max": max(worked),
            "direct_mean": statistics.mean(direct)}


def share(xs: list[bool]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def properties(rows: list[dict], spec: dict, beta: float | None, contrast: dict | None,
               lengths: dict, all_rows: list[dict] | None = None) -> list[dict]:
    """The table's rows: {name, requirement, measured (text), holds (True/False/None)}. ``rows``
    are the seeds the exclusion rule keeps; ``all_rows`` (default: ``rows``) every seed, whose
    warm starts the warm-start property counts, the excluded ones included."""
    vals = S.values(rows, "heldout")
    out = []

    def add(name, requirement, measured, holds):
        out.append({"name": name, "requirement": requirement, "measured": measured,
                    "holds": holds})

    on = [r for r in rows if r["cell"] == ON_POLICY]
    run_len = float(np.mean([r["outcomes"]["len_mean"] for r in on])) if on else None
    add("responses are long and vary", ">= 24 tokens on average",
        f"worked responses {lengths['worked_mean']:.1f} tokens ({lengths['worked_min']}-"
        f"{lengths['worked_max']}, sd {lengths['worked_sd']:.1f}); direct "
        f"{lengths['direct_mean']:.1f}; the calibrated runs' responses "
        + ("n/a" if run_len is None else f"{run_len:.1f}"),
        None if run_len is None else bool(lengths["worked_mean"] >= 24 and run_len >= 24))

    warm = vals.get(REF, {})
    every = S.values(rows if all_rows is None else all_rows, "heldout").get(REF, {})
    ok = [v >= 0.2 for v in every.values()]
    room = [0.2 <= v <= 0.7 for v in every.values()]
    add("the warm start succeeds", ">= 95 % of seeds at >= 0.2 held-out (the exclusion rule)",
        "n/a" if not ok else f"{sum(ok)} / {len(ok)} seeds; {sum(room)} / {len(room)} inside "
        f"[0.2, 0.7] (range {min(every.values()):.2f}-{max(every.values()):.2f})",
        None if not ok else bool(share(ok) >= 0.95))

    gains = [vals[ON_POLICY][s] - warm[s] for s in vals.get(ON_POLICY, {}) if s in warm]
    big = [g >= 0.10 for g in gains]
    add("on-policy RL improves", "+0.10 held-out on >= 90 % of seeds",
        "n/a" if not gains else f"{sum(big)} / {len(big)} seeds; mean gain {np.mean(gains):+.3f}"
        f" (min {min(gains):+.3f})", None if not gains else bool(share(big) >= 0.90))

    job = "beta* vs beta 0: significant (Holm), the mean beyond the MDE"
    if contrast is None or contrast.get("n", 0) < 2:
        add("the KL term has a job", job, "n/a", None)
    else:
        c = contrast
        holds = bool(c["p_holm"] < 0.05 and abs(c["mean"]) > c["mde"])
        add("the KL term has a job", job,
            f"{c['mean']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}], Holm p {c['p_holm']:.3g}, "
            f"MDE {c['mde']:.3f}, n {c['n']}", holds)

    clip = {}
    for cell in OFF_POLICY:
        mine = [r for r in rows if r["cell"] == cell]
        if mine:
            clip[cell] = float(np.mean([sum(r["outcomes"][k] or 0.0 for k in (
                "clip_low_mean", "clip_high_mean", "clip_dual_mean")) for r in mine]))
    add("the clip binds off-policy", ">= 5 % of tokens in every off-policy cell",
        "n/a" if not clip else "; ".join(f"{c} {v:.3f}" for c, v in clip.items()),
        None if not clip else bool(all(v >= 0.05 for v in clip.values())))

    shares = []
    for r in on:
        o = r["outcomes"]
        kl = beta * o["kl_ref_last"] * o["len_last"] if beta is not None else None
        if kl is not None:
            shares.append(kl / (abs(o["reward_last"]) + kl) if abs(o["reward_last"]) + kl else 0)
    add("beta KL is part of the objective", ">= 10 % of abs(E[R]) + beta KL",
        "n/a" if not shares else f"{np.mean(shares):.3f} (beta {beta:g}; seeds "
        f"{min(shares):.3f}-{max(shares):.3f})",
        None if not shares else bool(np.mean(shares) >= 0.10))

    # one run per seed trains its warm start (the cache's lock makes the others load it); rows do
    # not say which, and it need not be the first to finish (a run waiting on the lock ends soon
    # after), so it is the seed's costliest run: the warm start alone is about 160 s CPU, a run
    # 30-50 s
    first = {}
    for r in rows:
        if r["seed"] not in first or r["cpu_s"] > first[r["seed"]]["cpu_s"]:
            first[r["seed"]] = r
    later = {}
    for r in rows:
        if first.get(r["seed"]) is not r and r["resumed_from_step"] == 0:
            later.setdefault(r["cell"], []).append(r["cpu_s"])
    med = {c: statistics.median(v) for c, v in later.items()}
    firsts = [r["cpu_s"] for r in first.values()]
    add("a run costs <= 60 s CPU", "each cell's median", "n/a" if not med else
        f"medians {min(med.values()):.0f}-{max(med.values()):.0f} s (slowest: "
        f"{max(med, key=med.get)}); a seed's run that trains its warm start "
        f"{statistics.median(firsts):.0f} s", None if not med else bool(max(med.values()) <= 60))
    return out


def measure(results=S.RESULTS, studies=S.STUDIES) -> list[dict]:
    spec = S.load_study(STUDY, studies)
    rows = S.read_rows(S.results_path(STUDY, results), spec, report_torn=False)
    try:
        beta = S.calibrated_values(results, studies, spec["calibration"])["beta"]
    except S.StudyError:
        beta = None
    dropped = S.excluded_seeds(rows, spec["analysis"].get("exclude"))
    kept = [r for r in rows if r["seed"] not in dropped]
    contrast = None
    if rows:
        res = A.analyse(spec, rows)
        contrast = next((c for c in res["primary"] if c["name"] == KL_JOB), None)
    return properties(kept, spec, beta, contrast, task_lengths(), all_rows=rows)


DOC = S.ROOT / "docs" / "carry_task.md"
DOC_NAME = "docs/carry_task.md"
BEGIN = "<!-- generated: python -m small_scale.study.carry_properties --write -->"
END = "<!-- end generated (carry properties) -->"


def table(props: list[dict]) -> str:
    words = {True: "yes", False: "no", None: "n/a"}
    lines = ["| property | requirement | measured | holds |", "|---|---|---|---|"]
    lines += [f"| {p['name']} | {p['requirement']} | {p['measured']} | {words[p['holds']]} |"
              for p in props]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m small_scale.study.carry_properties",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--write", action="store_true", help=f"write the table into {DOC_NAME}")
    ap.add_argument("--check", action="store_true",
                    help=f"exit 1 when {DOC_NAME}'s table is not what the rows give")
    ap.add_argument("--results", default=str(S.RESULTS))
    ap.add_argument("--studies", default=str(S.STUDIES), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        props = measure(a.results, a.studies)
    except S.StudyError as e:
        print(f"small_scale.study.carry_properties: {e}", file=sys.stderr)
        return 2
    if not (a.write or a.check):
        print(json.dumps(props, indent=1) if a.json else table(props), end="")
        return 0
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        print(f"small_scale.study.carry_properties: {DOC_NAME} has no block to fill ({BEGIN} ... "
              f"{END})", file=sys.stderr)
        return 2
    new = A.between(text, BEGIN, END, table(props))
    if a.check:
        if new != text:
            print(f"small_scale.study.carry_properties: {DOC_NAME}'s table differs from the rows; "
                  "run: python -m small_scale.study.carry_properties --write", file=sys.stderr)
            return 1
        return 0
    if new != text:
        DOC.write_text(new)
        print(f"rewrote the table of {DOC_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
