"""The public answer-format set (rpg_ref/math/answer_formats.jsonl): realistic responses in the
paper's format and the others models write, with expected verdicts, scored by the reward with
each backend (`python -m rpg_ref.math.answer_formats` prints the same numbers per category)."""
import json

import pytest

from rpg_ref.math import answer_formats as af
from rpg_ref.math import reward as mr

CASES = af.load_cases(af.DEFAULT_SET)
BACKENDS = ["normalizer"] + (["math_verify"] if mr.math_verify_available() else [])
TIMEOUT_S = 5.0
# share of the responses expected correct that each backend must recognise (measured on this set:
# math-verify 178/179, normalizer 177/179; the floors sit just below)
RECOGNITION_FLOOR = {"math_verify": 0.97, "normalizer": 0.98}
CATEGORIES = {"paper_format", "thinking_closed", "thinking_unfinished", "boxed", "markdown_bold",
              "multiple_boxes", "units", "labels", "dollars", "intervals", "tuples", "fractions",
              "radicals_pi", "near_miss", "degenerate", "long"}


def test_the_set_is_large_varied_and_well_formed():
    assert len(CASES) >= 150
    assert {c["category"] for c in CASES} == CATEGORIES
    assert len({c["id"] for c in CASES}) == len(CASES)
    assert sum(c["expected"] == "wrong" for c in CASES) >= 50
    assert all(c["reason"].strip() and isinstance(c["thinking"], bool) for c in CASES)
    assert max(len(c["response"]) for c in CASES) >= 1_000_000  # the degenerate 1 MB lines


@pytest.fixture(scope="module", params=BACKENDS)
def scored(request):
    return request.param, af.score_cases(CASES, request.param, TIMEOUT_S)


def _misses(results, expected):
    return [(r["id"], r["answer"], r["gold"]) for r in results
            if r["expected"] == expected and r["scored"] != expected]


def test_no_false_positives(scored):
    """No response expected wrong (close-but-wrong values, hedges, unfinished thinking, ...) is
    scored correct, with either backend."""
    backend, results = scored
    assert not _misses(results, "wrong"), backend


def test_correct_answers_are_recognised(scored):
    backend, results = scored
    expected_correct = [r for r in results if r["expected"] == "correct"]
    missed = _misses(results, "correct")
    rate = 1 - len(missed) / len(expected_correct)
    assert rate >= RECOGNITION_FLOOR[backend], (backend, rate, missed)


def test_no_case_takes_longer_than_the_time_limit_plus_one_second(scored):
    backend, results = scored
    slow = [(r["id"], round(r["seconds"], 2)) for r in results if r["seconds"] > TIMEOUT_S + 1]
    assert not slow, backend


def test_the_report_prints_per_category_rates_and_rejects_a_bad_file(scored, tmp_path, capsys):
    _, results = scored
    table = af.format_summary(af.summarize(results))
    assert table.splitlines()[-1].startswith("all") and "units" in table
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "response": "Answer: 1"}) + "\n")
    assert af.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("answer_formats: error:")
        and "bad.jsonl:1" in err
        and len(err.splitlines()) == 1
    )
