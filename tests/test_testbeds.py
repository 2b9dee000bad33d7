"""small_scale/study/testbeds.json and its block of RESULTS.md: every contrast it names is one its
study pre-registered, and the last column says "replicated" only where both testbeds ran the claim
on every planned seed and found a difference of the same sign."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("scipy")
import small_scale.study.analysis as A
import small_scale.study.files as S


def test_every_contrast_named_is_one_its_study_registered():
    """Each row's entry for each testbed names a contrast of the study file it cites (primary or
    secondary), or says why the testbed cannot express the claim."""
    testbeds = json.loads(A.TESTBEDS.read_text())
    assert testbeds["rows"] and len(testbeds["testbeds"]) >= 2
    for row in testbeds["rows"]:
        for side in testbeds["testbeds"]:
            entry = row[side]
            if "why" in entry:
                assert entry["why"].strip()
                continue
            spec = S.load_study(entry["study"])
            names = [c["name"] for fam in ("primary", "secondary")
                     for c in spec["analysis"].get(fam, [])]
            assert entry["contrast"] in names, (entry, row["claim"])


def side(verdict: str, mean: float, n: int = 20, planned: int = 20, half: float = 0.01,
         study: str = "X") -> dict:
    r = {"verdict": verdict, "mean": mean, "lo": mean - half, "hi": mean + half, "n": n,
         "final": n >= planned}
    if n < planned:   # what analysis.withhold_unfinished writes
        r["pending"] = f"{n} of {planned} seeds"
        r["verdict"] = f"pending ({r['pending']})"
    return {"r": r, "study": study}


@pytest.mark.parametrize("seq,carry,want", [
    (side(A.SUPPORTED, 0.1), side(A.SUPPORTED, 0.2), "**replicated**"),
    (side(A.CONTRADICTED, -0.1), side(A.CONTRADICTED, -0.3), "**replicated**"),
    (side(A.SUPPORTED, 0.1), side(A.SUPPORTED, -0.2, study="Y"),        # two-sided, opposite signs
     "the testbeds disagree (X - Y +0.300 [+0.286, +0.314])"),
    (side(A.SUPPORTED, 0.1), side("no difference larger than 0.05", 0.01, study="Y"),
     "the testbeds disagree (X - Y +0.090 [+0.076, +0.104])"),
    (side("no difference larger than 0.06", -0.028, half=0.03),   # the same sign, A's interval
     side(A.CONTRADICTED, -0.039, half=0.026, study="Y"),          # holds C's estimate
     "same sign, significance differs (X - Y +0.011 [-0.027, +0.049])"),
    (side("no difference larger than 0.06", 0.01, half=0.05),
     side(A.CONTRADICTED, -0.03, half=0.025, study="Y"),
     "opposite signs, within the noise (X - Y +0.040 [-0.015, +0.095])"),
    (side("no difference larger than 0.05", 0.01), side("no difference larger than 0.04", -0.02),
     "no difference on either"),
    (side(A.SUPPORTED, 0.1), side(A.SUPPORTED, 0.2, n=12, planned=22),
     "pending (X: 12 of 22 seeds)"),
    ({"why": "not expressible"}, side(A.SUPPORTED, 0.2), "one testbed only"),
])
def test_agreement_reads_replicated_only_where_both_agree(seq, carry, want):
    """Where the verdicts differ, the testbeds' difference with its 95 % Welch interval (worked
    by hand: se = half-width / t(0.975, 19) per side) says which kind of "differ" it is."""
    assert A.agreement(seq, carry) == want


def test_a_contrast_the_study_does_not_have_is_one_clear_error(tmp_path):
    """A row naming a contrast its study lacks stops the analysis with the file and the name."""
    bad = tmp_path / "testbeds.json"
    bad.write_text(json.dumps({"testbeds": {"seq": "s", "carry": "c"},
                               "rows": [{"claim": "c", "seq": {"why": "w"},
                                         "carry": {"study": "Z", "contrast": "no such"}}]}))
    studies = {"Z": {"primary": [], "secondary": [], "cells": {}}}
    with pytest.raises(S.StudyError, match="study Z has no contrast 'no such'"):
        A.two_testbeds_report(studies, bad)
    assert A.two_testbeds_report({}, bad) is None  # Z has no results here: no table


def test_a_third_testbed_is_an_entry_in_the_file_not_code(tmp_path):
    """A testbeds file naming three testbeds gives a table with three columns and an agreement
    over all three: replicated where the three agree; where one does not, the kind of difference
    (here the same estimate, significant on two testbeds only)."""
    def result(name, verdict, mean):
        return {"name": name, "verdict": verdict, "mean": mean, "lo": mean - 0.01,
                "hi": mean + 0.01, "n": 20, "final": True}
    studies = {s: {"primary": [result("up", A.SUPPORTED, 0.1),
                               result("mixed", A.SUPPORTED if s != "Z" else "no difference", 0.1)],
                   "secondary": []} for s in ("X", "Y", "Z")}
    spec = {"testbeds": {"one": "task one (X)", "two": "task two (Y)", "three": "task three (Z)"},
            "rows": [{"claim": f"claim {c}", **{bed: {"study": s, "contrast": c}
                                                for bed, s in (("one", "X"), ("two", "Y"),
                                                               ("three", "Z"))}}
                     for c in ("up", "mixed")]}
    path = tmp_path / "testbeds.json"
    path.write_text(json.dumps(spec))
    lines = A.two_testbeds_report(studies, path).splitlines()
    assert lines[0] == "| claim | task one (X) | task two (Y) | task three (Z) | all |"
    assert lines[2].startswith("| claim up | X: +0.100") and lines[2].endswith("| **replicated** |")
    last = lines[3].split(" | ")[-1]
    assert last.startswith("same sign, significance differs (X - Y +0.000 ["), lines[3]
    spec["rows"][0].pop("three")
    path.write_text(json.dumps(spec))
    with pytest.raises(S.StudyError, match=r"the row 'claim up' has no entry for \['three'\]"):
        A.two_testbeds_report(studies, path)
