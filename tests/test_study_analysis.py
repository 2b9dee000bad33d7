"""small_scale/study/analysis.py: the statistics against hand-worked values and closed forms, a
planted effect found, the false-positive rate under a null, and RESULTS.md's generated blocks."""

import math

import numpy as np
import pytest

pytest.importorskip("scipy", reason="the study analysis needs scipy (pip install -e '.[study]')")

from study_runs import as_run  # tests/ is on sys.path under pytest

import small_scale.study.analysis as A
import small_scale.study.files as S
from small_scale.study.runner import append_row


def test_holm_hand_worked():
    """p = (0.01, 0.04, 0.03, 0.005), m = 4: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 =
    0.02, 0.03, 0.06, 0.04, made non-decreasing: 0.02, 0.03, 0.06, 0.06; back in input order."""
    assert A.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    assert A.holm([0.5, 0.9]) == [1.0, 1.0]          # capped at 1
    assert A.holm([0.02]) == [0.02]                  # a family of one is not adjusted


def test_holm_matches_statsmodels():
    sm = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.uniform(0, 0.2, size=rng.integers(1, 9)).tolist()
        want = sm.multipletests(p, alpha=0.05, method="holm")[1]
        np.testing.assert_allclose(A.holm(p), want, rtol=0, atol=1e-12)


def test_one_sample_closed_forms_df2():
    """d = (0.1, 0.2, 0.3): mean 0.2, sd 0.1, t = 0.2 / (0.1 / sqrt 3) = 2 sqrt 3. For 2 degrees
    of freedom the t distribution has closed forms: F(t) = 1/2 + t / (2 sqrt(2 + t^2)), so the
    two-sided p = 1 - t / sqrt(2 + t^2), and the q-quantile is (2q - 1) / sqrt(2 q (1 - q))."""
    r = A.one_sample(np.array([0.1, 0.2, 0.3]))
    t = 2 * math.sqrt(3)
    q = 0.975
    half = (2 * q - 1) / math.sqrt(2 * q * (1 - q)) * 0.1 / math.sqrt(3)
    assert r["n"] == 3 and abs(r["mean"] - 0.2) < 1e-12 and abs(r["sd"] - 0.1) < 1e-12
    assert abs(r["p"] - (1 - t / math.sqrt(2 + t * t))) < 1e-10
    assert abs(r["lo"] - (0.2 - half)) < 1e-10 and abs(r["hi"] - (0.2 + half)) < 1e-10
    # Wilcoxon signed-rank, 3 positive differences: exact two-sided p = 2 / 2^3
    assert abs(r["p_wilcoxon"] - 0.25) < 1e-12
    const = A.one_sample(np.array([0.25, 0.25, 0.25]))        # no spread: a sure difference
    assert const["p"] == 0.0 and const["lo"] == const["hi"] == 0.25
    assert math.isnan(A.one_sample(np.array([0.3]))["p"])     # one seed: nothing to test


def test_mde_normal_limit_and_monte_carlo_power():
    """MDE: for many seeds it tends to (z_{1-a/2} + z_{0.8}) sd / sqrt(n); at n = 20 a Monte Carlo
    of the paired t test at a true difference of exactly the MDE rejects in 80 % of 4000 trials
    (binomial sd 0.0063; the tolerance 0.03 is 4.7 sd: false failure < 1e-5, fixed seed)."""
    from scipy import stats
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert abs(A.mde(1.0, 2000, 0.05) / (z / math.sqrt(2000)) - 1) < 2e-3
    n, sd, alpha = 20, 0.07, 0.05
    m = A.mde(sd, n, alpha)
    rng = np.random.default_rng(1)
    d = rng.normal(m, sd, size=(4000, n))
    p = stats.ttest_1samp(d, 0.0, axis=1).pvalue
    assert abs((p < alpha).mean() - 0.8) < 0.03
    assert math.isnan(A.mde(0.0, 20, 0.05)) and math.isnan(A.mde(0.1, 1, 0.05))



def test_mde_at_holm_levels_where_the_lower_tail_is_far():
    """The MDE at Holm-adjusted levels for 2-40 paired seeds: the power equation's lower tail
    P(T < -t_crit) lies far out for these noncentralities (scipy's nct.cdf gives NaN there, e.g.
    17 seeds at 0.05/4); every MDE is finite, and at each the paired t test's power is 0.8 by
    the noncentral t distribution (upper tail only: the lower one is below 1e-6 here)."""
    from scipy import stats
    for alpha in (0.05, 0.025, 0.05 / 3, 0.0125, 0.01):
        prev = math.inf
        for n in range(2, 41):
            m = A.mde(1.0, n, alpha)
            assert math.isfinite(m) and m < prev, (n, alpha, m)
            prev = m
            tc = stats.t.ppf(1 - alpha / 2, n - 1)
            upper = stats.nct.sf(tc, n - 1, m * math.sqrt(n))
            assert abs(upper - 0.8) < 1e-6, (n, alpha, upper)

def test_verdict_wording():
    v = A.verdict
    assert v(0.1, 0.05, 0.15, 0.01, 0.05, "greater") == A.SUPPORTED
    assert v(-0.1, -0.15, -0.05, 0.01, 0.05, "greater") == A.CONTRADICTED
    assert v(-0.1, -0.15, -0.05, 0.01, 0.05, "less") == A.SUPPORTED
    assert v(-0.1, -0.15, -0.05, 0.01, 0.05, "two-sided") == A.SUPPORTED
    assert v(0.02, -0.03, 0.07, 0.4, 0.05, "greater") == "no difference larger than 0.070"
    assert v(-0.02, -0.09, 0.05, 0.4, 0.05, "two-sided") == "no difference larger than 0.090"
    # significant before Holm, not after: no claim
    assert v(0.05, 0.01, 0.09, 0.06, 0.05, "greater") == "no difference larger than 0.090"
    with pytest.raises(ValueError, match="sides"):
        v(0.1, 0.0, 0.2, 0.01, 0.05, "bigger")


def test_mcnemar_exact_hand_worked():
    """a collapses on 6 seeds where b does not, never the other way: exact p = 2 * 2^-6."""
    a = {s: s < 6 for s in range(20)}
    b = dict.fromkeys(range(20), False)
    r = A.mcnemar_exact(a, b)
    assert (r["a_only"], r["b_only"], r["n"]) == (6, 0, 20)
    assert abs(r["p"] - 2 * 0.5**6) < 1e-15 and abs(r["mean"] - 0.3) < 1e-15
    both = dict.fromkeys(range(20), True)
    assert A.mcnemar_exact(both, both)["p"] == 1.0     # no discordant seed
    lo, hi = A.rate_ci(0, 20)
    assert lo == 0.0 and abs(hi - (1 - 0.025 ** (1 / 20))) < 1e-10   # Clopper-Pearson at k = 0


# ----------------------------------------------------------------------------------------------
# synthetic studies
# ----------------------------------------------------------------------------------------------

def synthetic_rows(effects: dict, n: int, rng, seed_sd=0.15, noise_sd=0.05, base=0.5) -> list:
    """One row per (cell, seed): outcome = base + seed effect (shared by the cells: the warm start)
    + the cell's planted effect + independent noise."""
    seed_eff = rng.normal(0, seed_sd, n)
    rows = []
    for cell, eff in effects.items():
        for s in range(n):
            v = base + seed_eff[s] + eff + rng.normal(0, noise_sd)
            rows.append({"cell": cell, "seed": s, "outcomes": {"acc": float(v)},
                         "cpu_s": 1.0, "wall_s": 1.0, "resumed_from_step": 0})
    return rows


SPEC = {"name": "synthetic", "cells": {c: {"label": c.upper(), "seeds": 20, "role": "primary"}
                                       for c in ("on-a", "on-b", "off-a", "off-b")},
        "analysis": {"alpha": 0.05, "outcome": "acc", "primary": [
            {"name": "off", "a": "off-a", "b": "off-b", "sides": "greater"},
            {"name": "interaction", "interaction": [["off-a", "off-b"], ["on-a", "on-b"]],
             "sides": "greater"}]}}


def test_planted_effect_is_found_and_a_reversed_one_contradicts():
    """A planted off-policy gap of 0.1 (noise sd 0.05 per run, seed sd 0.15 shared by the cells,
    20 seeds: t about 6) is supported, as is its interaction with the level; planted the other
    way it is contradicted. The interaction's per-seed differences are the exact difference of
    differences."""
    rng = np.random.default_rng(3)
    rows = synthetic_rows({"on-a": 0.0, "on-b": 0.0, "off-a": -0.1, "off-b": -0.2}, 20, rng)
    a = A.analyse(SPEC, rows)
    off, inter = a["primary"]
    assert off["verdict"] == A.SUPPORTED and inter["verdict"] == A.SUPPORTED
    assert off["lo"] < 0.1 < off["hi"] and inter["lo"] < 0.1 < inter["hi"]
    v = S.values(rows, "acc")
    _, d = A.paired_differences(v, A.weights(SPEC["analysis"]["primary"][1]))
    want = [(v["off-a"][s] - v["off-b"][s]) - (v["on-a"][s] - v["on-b"][s]) for s in range(20)]
    np.testing.assert_allclose(d, want, rtol=0, atol=1e-12)
    rows = synthetic_rows({"on-a": 0.0, "on-b": 0.0, "off-a": -0.2, "off-b": -0.1}, 20, rng)
    assert A.analyse(SPEC, rows)["primary"][0]["verdict"] == A.CONTRADICTED


def test_no_verdict_until_every_contrast_of_the_family_has_its_seeds():
    """A planted effect clear at 20 seeds: with one cell at 5 of its 20 seeds, the contrast on it
    reads "pending (5 of 20 seeds)" and the finished contrast of the same Holm family reads
    "pending (its family's other contrasts are landing)" (its Holm p depends on the other's);
    with every seed in, both get their verdicts and are final."""
    rng = np.random.default_rng(3)
    rows = synthetic_rows({"on-a": 0.0, "on-b": 0.0, "off-a": -0.1, "off-b": -0.2}, 20, rng)
    part = [r for r in rows if r["cell"] != "on-b" or r["seed"] < 5]
    off, inter = A.analyse(SPEC, part)["primary"]
    assert (off["n"], inter["n"]) == (20, 5)
    assert inter["verdict"] == "pending (5 of 20 seeds)" and not inter["final"]
    assert off["verdict"] == "pending (its family's other contrasts are landing)"
    assert not off["final"]
    off, inter = A.analyse(SPEC, rows)["primary"]
    assert off["verdict"] == inter["verdict"] == A.SUPPORTED and off["final"] and inter["final"]


def test_null_flags_no_more_often_than_alpha():
    """No planted effect: over 1500 synthetic studies of 20 seeds, the family of two primary
    contrasts (Holm; the verdict's path, without the Wilcoxon p and the MDE it does not use)
    rejects anything in at most alpha of them. The family-wise rate is <= 0.05;
    the bound 0.05 + 3.2 binomial sd (0.0056) = 0.068 fails falsely with probability < 1e-3
    (fixed seed)."""
    rng = np.random.default_rng(7)
    reps, hits = 1500, 0
    for _ in range(reps):
        rows = synthetic_rows(dict.fromkeys(SPEC["cells"], 0.0), 20, rng)
        fam = A.contrast_family(rows, SPEC["analysis"]["primary"], "acc", 0.05, detail=False)
        hits += any(r["p_holm"] < 0.05 for r in fam)
    sd = math.sqrt(0.05 * 0.95 / reps)
    assert hits / reps <= 0.05 + 3.2 * sd, hits


def test_collapse_rule_and_rates():
    """Collapsed: outcome below half the seed's warm-start (reference cell) outcome, or below the
    floor."""
    rows = [{"cell": "warm", "seed": s, "outcomes": {"acc": 0.6}} for s in range(4)]
    rows += [{"cell": "x", "seed": s, "outcomes": {"acc": v}}
             for s, v in enumerate([0.29, 0.31, 0.5, 0.0])]
    rows += [{"cell": "y", "seed": s, "outcomes": {"acc": 0.5}} for s in range(4)]
    rule = {"outcome": "acc", "below": 0.5, "reference_cell": "warm", "floor": 0.01}
    assert A.collapsed(rows, rule) == {"x": {0: True, 1: False, 2: False, 3: True},
                                       "y": dict.fromkeys(range(4), False)}
    fam = A.collapse_family(rows, rule, [{"name": "x-y", "a": "x", "b": "y", "sides": "less"}],
                            0.05)
    assert fam["rates"]["x"]["k"] == 2 and fam["contrasts"][0]["a_only"] == 2
    assert fam["contrasts"][0]["verdict"].startswith("no difference detected")


def test_excluded_seeds_leave_every_table():
    """Seeds whose warm start (reference cell) is below the rule's bound are dropped from every
    cell before any test; the report names them."""
    rng = np.random.default_rng(11)
    rows = synthetic_rows({"on-a": 0.0, "on-b": 0.0, "off-a": -0.1, "off-b": -0.2}, 20, rng)
    rows += [{"cell": "warm", "seed": s, "outcomes": {"acc": 0.05 if s in (3, 7) else 0.8},
              "cpu_s": 1.0, "wall_s": 1.0} for s in range(20)]
    spec = {**SPEC, "cells": {**SPEC["cells"], "warm": {"label": "W", "seeds": 20}},
            "analysis": {**SPEC["analysis"], "exclude": {"outcome": "acc", "below": 0.2,
                                                         "reference_cell": "warm"}}}
    a = A.analyse(spec, rows)
    assert a["excluded"] == [3, 7] and a["cells"]["off-a"]["n"] == 18
    assert a["primary"][0]["n"] == 18 and 3 not in a["primary"][0]["seeds"]
    assert "excluded by the pre-registered warm-start rule: [3, 7]" in A.report(a)


# ----------------------------------------------------------------------------------------------
# the calibration's choices
# ----------------------------------------------------------------------------------------------

CAL = {"name": "calibration", "cells": {f"{k}-{v}": {"seeds": 4} for k in ("on", "off")
                                        for v in ("0.0001", "0.0002", "0.0004")},
       "analysis": {"select": {"lr": {
    "rule": "offpolicy-cost", "outcome": "acc", "range": [0.2, 0.6], "target": 0.4,
    "floor": 0.05, "max_floored": 0.25,
    "candidates": {v: {"on": [f"on-{v}"], "off": [f"off-{v}"]}
                   for v in ("0.0001", "0.0002", "0.0004")}}}}}


# what a row must carry beside its outcomes (paper_figs/study_rows.py), where no test reads it
NO_RECORD = {"series": [], "summary": {}, "argv": ["python"], "study_sha256": ""}


def cal_rows(cost: dict, floored: dict) -> list:
    rows = []
    for v, c in cost.items():
        for s in range(4):
            off = 0.0 if s < floored.get(v, 0) else 0.5 * (1 - c)
            for cell, acc in ((f"on-{v}", 0.5), (f"off-{v}", off)):
                rows.append({"cell": cell, "seed": s, "outcomes": {"acc": acc}, "cpu_s": 1.0,
                             "wall_s": 1.0, "resumed_from_step": 0, **NO_RECORD})
    return rows


def test_lr_selection_rule():
    """cost = 1 - sum(off) / sum(on): the eligible candidate nearest 0.4 wins; one whose seeds
    floor too often is not eligible; none inside the range: the nearest, marked outside."""
    pick = lambda rows: S.select(CAL, rows)["lr"]
    s = pick(cal_rows({"0.0001": 0.1, "0.0002": 0.3, "0.0004": 0.55}, {}))
    assert s["choice"] == 0.0002 and s["inside_range"] and s["complete"]
    assert abs(s["candidates"]["0.0004"]["score"] - 0.55) < 1e-12
    # 0.0002 floors 2 of 4 seeds (> 0.25): 0.0004 (cost 0.55) is the eligible one
    rows = cal_rows({"0.0001": 0.1, "0.0002": 0.4, "0.0004": 0.55}, {"0.0002": 2})
    assert pick(rows)["choice"] == 0.0004
    s = pick(cal_rows({"0.0001": 0.05, "0.0002": 0.1, "0.0004": 0.9}, {}))
    assert s["choice"] == 0.0002 and not s["inside_range"]
    s = pick(cal_rows({"0.0001": 0.1, "0.0002": 0.3}, {}))
    assert not s["complete"]


def test_calibrated_values_refuse_an_incomplete_calibration(tmp_path):
    import json
    studies, results = tmp_path / "studies", tmp_path / "results"
    studies.mkdir()
    spec = {"common": {}, "seeds": 4, "outcomes": {"acc": {"key": "a", "reduce": "last"}},
            "cells": CAL["cells"], "analysis": CAL["analysis"]}
    (studies / "calibration.json").write_text(json.dumps(spec))
    with pytest.raises(S.StudyError, match="not complete"):
        S.calibrated_values(results, studies)
    for r in cal_rows({"0.0001": 0.1, "0.0002": 0.3, "0.0004": 0.55}, {}):
        append_row(S.results_path("calibration", results), r)
    assert S.calibrated_values(results, studies) == {"lr": 0.0002}


def gain_job_spec(first_seed: int = 100) -> dict:
    cells = {"w": {"seeds": 3}, **{f"c{c}-b{b}": {"seeds": 3}
                                   for c in (1, 2) for b in (0, 5)}}
    cands = {f"{c},{b}": {"cell": f"c{c}-b{b}", "base": f"c{c}-b0"} for c in (1, 2) for b in (5,)}
    return {"name": "cal", "seeds": 3, "first_seed": first_seed, "cells": cells,
            "outcomes": {"acc": {"key": "a", "reduce": "last"}},
            "analysis": {"outcome": "acc", "select": {"token_cost,beta": {
                "rule": "gain-and-job", "outcome": "acc", "reference_cell": "w", "min_gain": 0.1,
                "candidates": cands}}}}


def gain_job_rows(values: dict, first_seed: int = 100) -> list:
    """values: {cell: (v_s0, v_s1, v_s2)} for seeds first_seed..first_seed + 2."""
    return [{"cell": c, "seed": first_seed + i, "outcomes": {"acc": v}, "cpu_s": 1.0,
             "wall_s": 1.0, "resumed_from_step": 0, **NO_RECORD}
            for c, vs in values.items() for i, v in enumerate(vs)]


def test_gain_and_job_selection_rule():
    """gain = mean(cell - warm start), job = mean(cell - its beta-0 base), score = min(gain - 0.1,
    job): the largest score wins; both criteria met = inside the range; worked by hand."""
    w = (0.5, 0.4, 0.6)
    vals = {"w": w,
            "c1-b0": (0.9, 0.8, 1.0), "c1-b5": (0.8, 0.7, 0.9),     # gain 0.3, job -0.1
            "c2-b0": (0.1, 0.0, 0.2), "c2-b5": (0.7, 0.6, 0.8)}     # gain 0.2, job 0.6
    s = S.select(gain_job_spec(), gain_job_rows(vals))["token_cost,beta"]
    assert s["complete"] and s["choice"] == (2.0, 5.0) and s["inside_range"]
    c1, c2 = s["candidates"]["1,5"], s["candidates"]["2,5"]
    assert abs(c1["gain"] - 0.3) < 1e-12 and abs(c1["job"] + 0.1) < 1e-12
    assert abs(c1["score"] + 0.1) < 1e-12
    assert abs(c2["score"] - 0.1) < 1e-12                       # min(0.2 - 0.1, 0.6)
    # no candidate gains 0.1: the best score still chooses, marked outside the range
    vals["c2-b5"] = (0.55, 0.45, 0.65)                            # gain 0.05, job 0.45
    s = S.select(gain_job_spec(), gain_job_rows(vals))["token_cost,beta"]
    assert s["choice"] == (2.0, 5.0) and not s["inside_range"]


def clip_binds_spec() -> dict:
    cells = {c: {"seeds": 3} for c in ("w", "on-a", "off-a", "on-b", "off-b1", "off-b2")}
    return {"name": "cal", "seeds": 3, "first_seed": 100, "cells": cells,
            "outcomes": {"acc": {"key": "a", "reduce": "last"}},
            "analysis": {"outcome": "acc", "select": {"lr,eps": {
                "rule": "clip-binds", "outcome": "acc", "reference_cell": "w", "min_gain": 0.1,
                "min_bind": 0.05, "bind": ["lo", "hi"],
                "candidates": {"3,2": {"on": "on-a", "off": ["off-a"]},
                               "6,1": {"on": "on-b", "off": ["off-b1", "off-b2"]}}}}}}


def clip_binds_rows(acc: dict, bind: dict) -> list:
    """acc: {cell: 3 values}; bind: {cell: (lo, hi)} the same for every seed."""
    return [{"cell": c, "seed": 100 + i, "cpu_s": 1.0, "wall_s": 1.0, "resumed_from_step": 0,
             "outcomes": {"acc": acc.get(c, (0.5,) * 3)[i], "lo": bind.get(c, (0, 0))[0],
                          "hi": bind.get(c, (0, 0))[1]}}
            for c in ("w", "on-a", "off-a", "on-b", "off-b1", "off-b2") for i in range(3)]


def test_clip_binds_selection_rule():
    """gain = mean(on - warm start), bind = the smallest mean clip share (lo + hi) over the
    candidate's off-policy cells; eligible when gain >= 0.1 and bind >= 0.05; the first eligible
    in the file's order wins, even when a later one scores higher; none eligible: no choice."""
    acc = {"w": (0.5, 0.4, 0.6), "on-a": (0.8, 0.7, 0.9), "on-b": (0.9, 0.8, 1.0)}  # +0.3, +0.4
    bind = {"off-a": (0.01, 0.03), "off-b1": (0.02, 0.04), "off-b2": (0.10, 0.20)}
    s = S.select(clip_binds_spec(), clip_binds_rows(acc, bind))["lr,eps"]
    a, b = s["candidates"]["3,2"], s["candidates"]["6,1"]
    assert abs(a["bind"] - 0.04) < 1e-12 and abs(b["bind"] - 0.06) < 1e-12   # min over cells
    assert abs(a["gain"] - 0.3) < 1e-12 and abs(b["score"] - 0.01) < 1e-12
    assert s["choice"] == (6.0, 1.0) and s["inside_range"] and s["complete"]
    bind["off-a"] = (0.05, 0.30)                         # a is eligible and listed first: chosen
    s = S.select(clip_binds_spec(), clip_binds_rows(acc, bind))["lr,eps"]
    assert s["choice"] == (3.0, 2.0)
    acc["on-a"] = acc["on-b"] = (0.55, 0.45, 0.65)       # gain 0.05 < 0.1 everywhere
    s = S.select(clip_binds_spec(), clip_binds_rows(acc, bind))["lr,eps"]
    assert s["choice"] is None and not s["inside_range"]


def test_a_calibration_on_its_own_seeds_chooses_several_values(tmp_path):
    """first_seed 100: seeds 100-102 are planned (a row for seed 0 is refused), the choice of a
    "token_cost,beta" rule gives both values."""
    import json
    studies, results = tmp_path / "studies", tmp_path / "results"
    studies.mkdir()
    spec = gain_job_spec()
    (studies / "cal.json").write_text(json.dumps({"common": {}, **{k: v for k, v in spec.items()
                                                                   if k != "name"}}))
    vals = {"w": (0.5, 0.4, 0.6), "c1-b0": (0.9, 0.8, 1.0), "c1-b5": (0.8, 0.7, 0.9),
            "c2-b0": (0.1, 0.0, 0.2), "c2-b5": (0.7, 0.6, 0.8)}
    assert list(S.planned_seeds(S.load_study("cal", studies), "w")) == [100, 101, 102]
    for r in gain_job_rows(vals):
        append_row(S.results_path("cal", results), r)
    assert S.calibrated_values(results, studies, "cal") == {"token_cost": 2.0, "beta": 5.0}
    append_row(S.results_path("cal", results), gain_job_rows({"w": (0.5,)}, first_seed=0)[0])
    with pytest.raises(S.StudyError, match=r"seed 0 of cell 'w' is not planned .*seeds 100-102"):
        S.calibrated_values(results, studies, "cal")


# ----------------------------------------------------------------------------------------------
# RESULTS.md
# ----------------------------------------------------------------------------------------------

def test_results_md_blocks_are_replaced_whole():
    text = f"intro\n{A.begin('x')}\nold numbers 0.123\n{A.end('x')}\nafter\n"
    new = A.fill_blocks(text, {"x": "| new | 0.456 |\n", "y": "not in the file\n"})
    assert new == f"intro\n{A.begin('x')}\n| new | 0.456 |\n{A.end('x')}\nafter\n"
    assert A.fill_blocks(new, {"x": "| new | 0.456 |\n"}) == new


def test_results_md_equals_the_generator_on_the_committed_results():
    """Every number RESULTS.md shows for a study is the generator's output on the committed
    results files (small_scale/results/*.jsonl): rerun python -m small_scale.study.analysis
    --all."""
    text = A.RESULTS_MD.read_text()
    blocks = A.generated()
    for study in blocks:
        assert A.begin(study) in text, f"RESULTS.md has no generated block for study {study}"
    assert A.fill_blocks(text, blocks) == text, "run: python -m small_scale.study.analysis --all"


def test_all_writes_reports_figures_and_results_md_blocks(tmp_path):
    """analysis.py --all on a study with results: its report and figures are written, its block
    in RESULTS.md is filled; --check passes on that file and fails once a number in it is
    edited."""
    import json
    studies, results = tmp_path / "studies", tmp_path / "results"
    studies.mkdir()
    spec = {"common": {}, "seeds": 20, "outcomes": {"acc": {"key": "a", "reduce": "last"}},
            "cells": {c: {"label": c.upper()} for c in SPEC["cells"]},
            "analysis": {**SPEC["analysis"], "figures": [{
                "name": "gap", "title": "t", "levels": ["1", "16"],
                "lines": {"a - b": ["interaction", "off"]}}]}}
    (studies / "syn.json").write_text(json.dumps(spec))
    rng = np.random.default_rng(5)
    for r in synthetic_rows({"on-a": 0.0, "on-b": 0.0, "off-a": -0.1, "off-b": -0.2}, 20, rng):
        append_row(S.results_path("syn", results), as_run(S.load_study("syn", studies), r))
    md = tmp_path / "RESULTS.md"
    md.write_text(f"# r\n{A.begin('syn')}\n{A.end('syn')}\ntail\n")
    args = ["--all", "--results", str(results), "--studies", str(studies), "--out",
            str(tmp_path / "out"), "--results-md", str(md)]
    assert A.main(args) == 0
    text = md.read_text()
    assert A.SUPPORTED in text and text.endswith(f"{A.end('syn')}\ntail\n")
    assert (tmp_path / "out" / "syn_gap.png").stat().st_size > 1000
    assert (tmp_path / "out" / "syn.md").read_text() in text
    assert A.main(args + ["--check"]) == 0
    cell = A.analyse(S.load_study("syn", studies), S.read_rows(S.results_path("syn", results)))
    mean = f"{cell['cells']['on-a']['mean']:.3f}"
    md.write_text(text.replace(mean, "0.999", 1))
    assert A.main(args + ["--check"]) == 1
