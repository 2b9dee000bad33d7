"""What a study's rows say beyond its pre-registered contrasts, read the same way for every study
that declares ``readings`` below: each method against its own warm start, stability as the drop
from the first evaluation to the lowest, how often the clip bound in every cell, and the KL
term's share of the objective at both levels. These readings were not pre-registered: each
interval is a plain 95 % paired t interval (scipy.stats.t) with no multiplicity correction, and
they qualify the pre-registered verdicts rather than add verdicts of their own.

    python -m small_scale.study.readings C         # the block, on stdout
    python -m small_scale.study.readings --write   # into small_scale/RESULTS.md (between markers)
    python -m small_scale.study.readings --check   # exit 1 when RESULTS.md's blocks are stale

Definitions (per run, from its row's outcomes):
- end point: ``heldout`` (Mean@4 over the last evaluations, the study's primary outcome);
- drop: ``heldout_first - heldout_min``, how far a run fell below its first evaluation (step 10),
  >= 0; ``heldout_min`` alone mixes where a run starts with how far it falls;
- clip share: ``clip_low_mean + clip_high_mean + clip_dual_mean``, the share of units (tokens, or
  responses at sequence level) on a clipped segment, averaged over the run's updates;
- beta KL share, sequence level: beta KL_seq / (|R| + beta KL_seq), KL_seq = the token-mean k3
  estimate of KL to the reference times the mean response length, R the training reward (both over
  the last steps: kl_ref_last, len_last, reward_last); token level: the same with the token-mean
  KL itself.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

try:
    from scipy import stats
except ModuleNotFoundError as e:
    print(f"readings: {e.name} is not installed: pip install -e '.[study]' (the study extra: "
          f"scipy, matplotlib)", file=sys.stderr)
    raise SystemExit(2) from None

import small_scale.study.files as S

RESULTS_MD = S.HERE / "RESULTS.md"

# Each study read here: its warm-start cell, the method cells at each number of updates per batch,
# the pairs whose stability is compared, the cell whose KL share is stated.
READINGS = {
    "C": {
        "warm": "warm-start",
        "methods": {
            "RPG-REINFORCE-URKL + RPG-Style Clip": {"1": "urkl-u1", "4": "urkl-u4",
                                                    "16": "urkl-u16"},
            "DAPO": {"1": "dapo-u1", "4": "dapo-u4", "16": "dapo-u16"},
            "GRPO": {"1": "grpo-u1", "4": "grpo-u4", "16": "grpo-u16"},
        },
        "stability": [("urkl-iter-b3.0x-u4", "urkl-frozen-b3.0x-u4"), ("urkl-u16", "urkl-u1")],
        "kl_share": "urkl-u1",
    },
}


def by_seed(rows: list[dict], cell: str, value) -> dict:
    """{seed: value(outcomes)} of a cell's runs."""
    return {r["seed"]: value(r["outcomes"]) for r in rows if r["cell"] == cell}


def paired(a: dict, b: dict) -> dict:
    """Mean of a - b over the seeds both have, its 95 % t interval, n and how many are < 0."""
    seeds = sorted(set(a) & set(b))
    d = np.array([a[s] - b[s] for s in seeds], dtype=float)
    n = len(d)
    m = float(d.mean()) if n else math.nan
    half = (float(stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)) if n > 1
            else math.nan)
    return {"n": n, "mean": m, "lo": m - half, "hi": m + half, "below": int((d < 0).sum())}


def _ci(r: dict) -> str:
    return f"{r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"


def heldout(o):
    return o["heldout"]


def first(o):
    return o["heldout_first"]


def lowest(o):
    return o["heldout_min"]


def drop(o):
    return o["heldout_first"] - o["heldout_min"]


def clip_share(o):
    return o["clip_low_mean"] + o["clip_high_mean"] + o["clip_dual_mean"]


def kl_shares(o: dict, beta: float) -> tuple[float, float]:
    """(sequence level, token level) share of beta KL in |R| + beta KL (the module docstring)."""
    seq = beta * o["kl_ref_last"] * o["len_last"]
    tok = beta * o["kl_ref_last"]
    r = abs(o["reward_last"])
    return seq / (r + seq) if r + seq else 0.0, tok / (r + tok) if r + tok else 0.0


def kept_rows(spec: dict, rows: list[dict]) -> list[dict]:
    """The rows the study's tables use: the seeds its warm-start rule excludes are left out."""
    dropped = set(S.excluded_seeds(rows, spec.get("analysis", {}).get("exclude")))
    return [r for r in rows if r["seed"] not in dropped]


def read(name: str, results=S.RESULTS, studies=S.STUDIES) -> dict:
    """Every reading of study ``name`` as numbers (the block is written from these)."""
    spec, plan = S.load_study(name, studies), READINGS[name]
    rows = kept_rows(spec, S.read_rows(S.results_path(name, results), spec))
    warm = by_seed(rows, plan["warm"], heldout)
    label = {c: spec["cells"][c].get("label", c) for c in spec["cells"]}
    vs_warm = {m: {u: paired(by_seed(rows, c, heldout), warm) for u, c in cells.items()}
               for m, cells in plan["methods"].items()}
    stability = []
    for a, b in plan["stability"]:
        stability.append({"a": a, "b": b, "label_a": label[a], "label_b": label[b], **{
            what: paired(by_seed(rows, a, f), by_seed(rows, b, f))
            for what, f in (("first", first), ("lowest", lowest), ("drop", drop),
                            ("end", heldout))}})
    clip = []
    for c in spec["cells"]:
        v = list(by_seed(rows, c, clip_share).values())
        if v:
            clip.append({"cell": c, "label": label[c], "n": len(v), "mean": float(np.mean(v)),
                         "min": float(min(v)), "max": float(max(v))})
    beta = float(spec["common"]["beta"]) if not isinstance(spec["common"].get("beta"), dict) \
        else None
    share_rows = [r for r in rows if r["cell"] == plan["kl_share"]]
    if beta is None:   # a calibrated beta: the value the row's run used
        beta = float(share_rows[0]["argv"][share_rows[0]["argv"].index("--beta") + 1])
    shares = np.array([kl_shares(r["outcomes"], beta) for r in share_rows])
    return {"study": name, "n_rows": len(rows), "vs_warm": vs_warm, "stability": stability,
            "clip": clip, "kl_share": {"cell": plan["kl_share"], "beta": beta,
                                       "n": len(shares), "seq": float(shares[:, 0].mean()),
                                       "token": float(shares[:, 1].mean())}}


def block(r: dict) -> str:
    """The markdown block of one study's readings."""
    L = [f"Read from study {r['study']}'s rows ({r['n_rows']} runs, the excluded seeds out), "
         f"beyond its pre-registered contrasts: each a paired 95 % t interval, not corrected for "
         f"multiplicity (small_scale/study/readings.py).", "",
         "Each method's end point minus its own warm start (held-out Mean@4; seeds below their "
         "warm start / seeds):", "",
         "| method | 1 update | 4 updates | 16 updates |", "|---|---|---|---|"]
    for m, by_u in r["vs_warm"].items():
        L.append(f"| {m} | " + " | ".join(
            f"{_ci(by_u[u])}, {by_u[u]['below']} / {by_u[u]['n']} below" if u in by_u else "-"
            for u in ("1", "4", "16")) + " |")
    L += ["", "Stability: a minus b at the first evaluation (step 10), at the lowest, and the drop "
          "from the first to the lowest (first - lowest: larger is less stable):", "",
          "| a | b | first | lowest | drop | end |", "|---|---|---|---|---|---|"]
    for s in r["stability"]:
        L.append(f"| {s['label_a']} | {s['label_b']} | {_ci(s['first'])} | {_ci(s['lowest'])} | "
                 f"{_ci(s['drop'])} | {_ci(s['end'])} |")
    L += ["", "How often the clip bound (share of units on a clipped segment, mean over the run's "
          "updates; mean over seeds, and the range):", "", "| cell | clip share | range |",
          "|---|---|---|"]
    for c in r["clip"]:
        L.append(f"| {c['label']} | {100 * c['mean']:.2f} % | {100 * c['min']:.2f}-"
                 f"{100 * c['max']:.2f} % |")
    k = r["kl_share"]
    L += ["", f"beta KL's share of the objective, {k['cell']} (beta {k['beta']:g}, {k['n']} "
          f"runs, the last steps): {100 * k['seq']:.1f} % with the sequence-level KL (token-mean "
          f"k3 x response length), {100 * k['token']:.2f} % with the token-mean KL."]
    return "\n".join(L) + "\n"


# The power of a study stated before its first run, from the paired standard deviations of the
# analogous contrasts of a study already run: {study: (the analogue study, its exclusion-kept
# seed count expected, [(what, a, b, outcome)])}.
POWER = {
    "D": ("C", 21, [
        ("two methods with a KL term, 16 updates", "urkl-u16", "grpo-u16", "heldout"),
        ("a method that collapses against one that does not, 16 updates", "urkl-u16",
         "dapo-u16", "heldout"),
        ("16 updates against 1, the same method", "urkl-u16", "urkl-u1", "heldout"),
        ("coupled against decoupled, a stale sampler", "urkl-lag4-coupled", "urkl-lag4-tis",
         "heldout"),
        ("iterative against frozen reference: the drop", "urkl-iter-b3.0x-u4",
         "urkl-frozen-b3.0x-u4", "drop"),
    ]),
}


def power(name: str, results=S.RESULTS, studies=S.STUDIES) -> str:
    """The minimum detectable effects of study ``name``'s families (Holm's first step, alpha / m;
    power 0.8; analysis.mde) at the paired standard deviations of its analogues (POWER)."""
    from small_scale.study.analysis import mde
    spec = S.load_study(name, studies)
    analogue, n, pairs = POWER[name]
    aspec = S.load_study(analogue, studies)
    rows = kept_rows(aspec, S.read_rows(S.results_path(analogue, results), aspec))
    alpha = spec["analysis"]["alpha"]
    m = {f: len(spec["analysis"].get(f, [])) for f in ("primary", "secondary")}
    L = [f"Power of study {name}, stated before its first run: the paired standard deviation of "
         f"each analogous contrast of study {analogue} (its rows), and the difference a paired t "
         f"test on {n} seeds detects with power 0.8 at Holm's first step (alpha / m; primary m = "
         f"{m['primary']}, secondary m = {m['secondary']}):", "",
         f"| analogue in {analogue} | paired sd | MDE, primary | MDE, secondary |",
         "|---|---|---|---|"]
    for what, a, b, outcome in pairs:
        f = drop if outcome == "drop" else (lambda o, k=outcome: o[k])
        x, y = by_seed(rows, a, f), by_seed(rows, b, f)
        d = np.array([x[s] - y[s] for s in sorted(set(x) & set(y))])
        sd = float(d.std(ddof=1))
        L.append(f"| {what} ({a} - {b}, {outcome}) | {sd:.3f} | "
                 f"{mde(sd, n, alpha / m['primary']):.3f} | "
                 f"{mde(sd, n, alpha / m['secondary']):.3f} |")
    return "\n".join(L) + "\n"


def markers(name: str, what: str = "readings") -> tuple[str, str]:
    return (f"<!-- generated: python -m small_scale.study.readings --write ({name} {what}) -->",
            f"<!-- end generated ({name} {what}) -->")


def blocks(results=S.RESULTS, studies=S.STUDIES) -> list[tuple[str, str, str]]:
    """(begin marker, end marker, body) of every block this module writes."""
    out = [(*markers(n), block(read(n, results, studies))) for n in READINGS]
    return out + [(*markers(n, "power"), power(n, results, studies)) for n in POWER]


def write(check: bool, results=S.RESULTS, studies=S.STUDIES, md: Path = RESULTS_MD) -> int:
    text = md.read_text()
    new = text
    for b, e, body in blocks(results, studies):
        if b not in new or e not in new:
            print(f"readings: {md.name} has no markers {b} ... {e}: add them where the block "
                  f"belongs", file=sys.stderr)
            return 2
        i, j = new.index(b) + len(b), new.index(e)
        new = new[:i] + "\n" + body + new[j:]
    if check:
        if new != text:
            print(f"readings: {md} is stale: run python -m small_scale.study.readings --write",
                  file=sys.stderr)
            return 1
        return 0
    md.write_text(new)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", nargs="?", help=f"one of {sorted(READINGS)}")
    p.add_argument("--write", action="store_true", help="write the blocks into RESULTS.md")
    p.add_argument("--check", action="store_true", help="exit 1 when RESULTS.md is stale")
    a = p.parse_args(argv)
    try:
        if a.write or a.check:
            return write(a.check)
        if a.study not in READINGS:
            print(f"readings: give a study ({', '.join(sorted(READINGS))}) or --write/--check",
                  file=sys.stderr)
            return 2
        print(block(read(a.study)), end="")
        return 0
    except S.StudyError as e:
        print(f"readings: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
