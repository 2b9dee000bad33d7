"""Score the public answer-format set (realistic responses with expected verdicts) with the reward.

    python -m rpg_ref.math.answer_formats [FILE.jsonl] [--backend B ...]

FILE defaults to the set shipped beside this module (answer_formats.jsonl, package data).

Each JSONL row: id, category, style ("answer" or "boxed"), thinking (bool: the prompt had thinking
on), response, gold, expected ("correct" or "wrong") and the reason; long degenerate responses are
stored as response + repeat[0] * repeat[1] + suffix (optional fields "repeat" and "suffix").
For each backend it prints, per category: the correct answers recognised (of the rows expected
correct), the false positives (rows expected wrong but scored correct) and the longest time one
case took (extraction and check, measured around `AnswerChecker.check_responses`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

from rpg_ref.math.reward import BACKENDS, STYLES, AnswerChecker, math_verify_available

DEFAULT_SET = Path(__file__).with_name("answer_formats.jsonl")  # package data: in the wheel
FIELDS = ("id", "category", "style", "thinking", "response", "gold", "expected", "reason")


def load_cases(path: str | Path) -> list[dict]:
    """The rows of an answer-format JSONL file, with long responses built from repeat/suffix."""
    cases = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [f for f in FIELDS if f not in row]
        if missing or row["expected"] not in ("correct", "wrong") or row["style"] not in STYLES:
            raise ValueError(f"{path}:{n}: need fields {FIELDS}, expected correct/wrong and style "
                             f"in {STYLES} (missing {missing})")
        text, times = row.get("repeat", ["", 0])
        row["response"] = row["response"] + text * times + row.get("suffix", "")
        cases.append(row)
    return cases


def score_cases(cases: list[dict], backend: str, timeout_s: float = 5.0) -> list[dict]:
    """Each case with "scored" (correct/wrong), the extracted "answer" and "seconds"."""
    out = []
    with AnswerChecker(backend, timeout_s) as checker:
        checker.check(["1"], ["1"])  # workers started: their start-up is no case's time
        for case in cases:
            t0 = time.monotonic()
            ok, answers = checker.check_responses([case["response"]], [case["gold"]], case["style"],
                                                  case["thinking"])
            out.append(dict(case, scored="correct" if ok[0] else "wrong", answer=answers[0],
                            seconds=time.monotonic() - t0, timeouts=checker.last_stats.timeouts))
    return out


def summarize(results: list[dict]) -> dict:
    """Per category and "all": recognised/expected-correct, false positives/expected-wrong, max
    s."""
    table = defaultdict(lambda: {"correct": 0, "recognised": 0, "wrong": 0, "false_positives": 0,
                                 "max_seconds": 0.0})
    for r in results:
        for key in (r["category"], "all"):
            row = table[key]
            row[r["expected"]] += 1
            if r["expected"] == "correct":
                row["recognised"] += r["scored"] == "correct"
            else:
                row["false_positives"] += r["scored"] == "correct"
            row["max_seconds"] = max(row["max_seconds"], r["seconds"])
    return dict(table)


def format_summary(summary: dict) -> str:
    lines = [f"{'category':<20} {'recognised':>12} {'rate':>7} {'false pos.':>11} {'max s':>7}"]
    for name, r in sorted(summary.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        rate = f"{r['recognised'] / r['correct']:.3f}" if r["correct"] else "-"
        lines.append(f"{name:<20} {r['recognised']:>5} / {r['correct']:<4} {rate:>7} "
                     f"{r['false_positives']:>4} / {r['wrong']:<4} {r['max_seconds']:>7.3f}")
    return "\n".join(lines)


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rpg_ref.math.answer_formats", description=__doc__.split("\n")[0]
    )
    ap.add_argument("path", nargs="?", default=str(DEFAULT_SET), help="answer-format JSONL")
    ap.add_argument("--backend", nargs="+", choices=BACKENDS[1:], default=None,
                    help="checkers to score with (default: both when math-verify is installed)")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds per answer check")
    ap.add_argument(
        "--show-misses", action="store_true", help="list every case scored unlike expected"
    )
    args = ap.parse_args(argv)
    backends = args.backend or (["math_verify"] if math_verify_available() else []) + ["normalizer"]
    try:
        cases = load_cases(args.path)
    except (OSError, ValueError) as e:
        print(f"answer_formats: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.path}: {len(cases)} responses, time limit {args.timeout} s per check")
    for backend in backends:
        results = score_cases(cases, backend, args.timeout)
        print(f"\nbackend {backend}\n{format_summary(summarize(results))}")
        if args.show_misses:
            for r in results:
                if r["scored"] != r["expected"]:
                    print(f"  {r['id']}: expected {r['expected']}, extracted {r['answer']!r:.60}, "
                          f"gold {r['gold']!r} ({r['reason']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
