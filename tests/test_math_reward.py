"""Math reward: prompts, answer extraction, verified checking on the real eval sets, scoring."""
import os
import re
import sys

import pytest
from needs import needs_data

from rpg_ref.math import reward as mr
from rpg_ref.math.data import data_dir, load_problems
from rpg_ref.math.normalize import (
    answers_equal,
    canonical,
    comparable_pair,
    structure,
    structures_equal,
)

EVAL_SETS = ("aime24", "aime25", "amc23", "math500")
BACKENDS = ["normalizer"] + (["math_verify"] if mr.math_verify_available() else [])


def _eval_set(name):
    path = data_dir() / "eval" / f"{name}.jsonl"
    if not path.is_file():
        pytest.skip(
            f"{path} not found: set RPG_DATA_DIR to the shared data folder (eval/, train/, "
            "tokenizer/)"
        )
    return load_problems(name)


def _tokenizer():
    path = data_dir() / "tokenizer" / "qwen3"
    if not path.is_dir():
        pytest.skip(f"{path} not found: set RPG_DATA_DIR to the shared data folder")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module", params=BACKENDS)
def checker(request):
    with mr.AnswerChecker(request.param, timeout_s=10.0) as ck:
        yield ck


# --------------------------------------------------------------------------- prompts
def test_user_message_is_the_papers_instruction_problem_reminder():
    msg = mr.user_message("What is 2+2?")
    assert msg == (
        "Solve the following math problem step by step. The last line of your response "
        "should be of the form Answer: $Answer (without quotes) where $Answer is the answer "
        "to the problem.\n\nWhat is 2+2?\n\nRemember to put your answer on its own line "
        'after "Answer:".'
    )
    boxed = mr.user_message("What is 2+2?", "boxed")
    assert boxed.startswith("What is 2+2?\n\n") and "\\boxed{" in boxed
    with pytest.raises(ValueError, match="style"):
        mr.user_message("x", "latex")
    with pytest.raises(ValueError, match="problem"):
        mr.user_message("  ")


@needs_data("tokenizer", "qwen3")
def test_chat_prompt_uses_the_qwen3_template_and_thinking_switch():
    tok = _tokenizer()
    off = mr.chat_prompt(tok, "What is 2+2?", enable_thinking=False)
    on = mr.chat_prompt(tok, "What is 2+2?", enable_thinking=True)
    assert off.startswith("<|im_start|>user\n" + mr.PAPER_INSTRUCTION)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n")
    ids = mr.chat_prompt_ids(tok, "What is 2+2?")
    assert ids[:3] == [151644, 872, 198]  # <|im_start|> user \n
    assert tok.decode(ids) == off


# --------------------------------------------------------------------------- extraction
@pytest.mark.parametrize("text,expected", [
    ("work\nAnswer: 42", "42"),
    # the LAST Answer: counts; full stop dropped
    ("Answer: 1\nmore work\nanswer: 7.", "7"),
    ("**Answer:** $\\frac{1}{2}$", "\\frac{1}{2}"),
    ("Answer: \\boxed{3\\sqrt{2}}", "3\\sqrt{2}"),
    ("<think>Answer: 5</think>\nso\nAnswer: 6", "6"),
    ("<think>Answer: 5</think>\nno final line", None),         # answers inside <think> do not count
    ("The answer is 12", None),
    ("Answer:", None),
    ("x + y = 50.\n\n**Answer**: 25", "25"),                  # bold between the word and the colon
    ("So 73.\n\n**Answer:**\n\\[\n\\boxed{73}\n\\]", "73"),   # the answer in a display block below
    ("**Answer:**\n$$\n\\frac{7}{3}\n$$", "\\frac{7}{3}"),
    ("## Final Answer\n\n$$\\boxed{120}$$", "120"),           # a heading, no colon
    ("\\textbf{Answer:} 11", "11"),
    # several boxes: all of them, in order
    ("Answer: $\\boxed{2}$ and $\\boxed{-3}$", "2, -3"),
    ("Answer: $\\boxed{12}$ \\quad $\\boxed{12}$", "12"),         # ... each distinct one once
    ("Final Answer: The final answer is $18$. I hope it is correct.", "18"),
    ("The final answer is: 64", "64"),
    ("Answer: **210**", "210"),
])
def test_extract_answer_answer_style(text, expected):
    assert mr.extract_answer(text, "answer") == expected


def test_unfinished_thinking_has_no_answer():
    """Policy: when thinking is on, a response without "</think>" has no answer (it scores wrong),
    even if the draft inside the thinking has an Answer: line or a box; a "<think>" that never
    closes is unfinished whatever the flag says."""
    draft = "<think>\nSo it is 5.\nAnswer: 5\nLet me double-check \\boxed{5} once"
    # Qwen3-2507: <think> in the prompt
    template_opened = "So it is 5.\nAnswer: 5\nLet me double-check"
    for style in mr.STYLES:
        assert mr.extract_answer(draft, style, thinking=True) is None
        assert mr.extract_answer(draft, style, thinking=False) is None
        assert mr.extract_answer(template_opened, style, thinking=True) is None
    assert mr.extract_answer(template_opened, thinking=False) == "5"
    assert mr.extract_answer(template_opened + "</think>\n\nAnswer: 5", thinking=True) == "5"
    reward = mr.MathReward(backend="normalizer", thinking=True)
    rewards, info = reward([draft, template_opened, draft + "</think>\nAnswer: 5"], ["5"] * 3)
    reward.close()
    assert rewards == [-1.0, -1.0, 1.0]
    assert info["check"]["unfinished_thinking"] == 2 and info["check"]["no_answer"] == 2


def test_only_the_documented_tail_is_searched():
    """The answer is looked for in the last MAX_TAIL_CHARS characters (after </think>) only."""
    tail = "x" * (mr.MAX_TAIL_CHARS - 20)
    assert mr.extract_answer("Answer: 5\n" + tail) == "5"
    assert mr.extract_answer("Answer: 5\n" + tail + "y" * 20) is None
    assert mr.answer_region("a" * 10 + "</think>b") == "b"
    assert len(mr.answer_region("a" * (3 * mr.MAX_TAIL_CHARS))) == mr.MAX_TAIL_CHARS


@pytest.mark.parametrize("text,expected", [
    ("so \\boxed{12} and then \\boxed{\\frac{a}{b^{2}}}", "\\frac{a}{b^{2}}"),
    ("$\\boxed{ (1, 2) }$.", "(1, 2)"),
    ("\\boxed{unclosed", None),
    ("Answer: 3", None),
    ("\\boxed{\\boxed{ 5 }}", "5"),                                 # a box that fills a box
    # escaped braces are not braces
    ("\\boxed{\\{1, 2\\}} and \\{x\\}", "\\{1, 2\\}"),
    # unclosed boxes after a closed one
    ("\\boxed{5} then " + "\\boxed{" * 100, "5"),
])
def test_extract_answer_boxed_style(text, expected):
    assert mr.extract_answer(text, "boxed") == expected


# --------------------------------------------------------------------------- equivalence
SAME = [
    ("025", "25"),
    ("27", 27.0),
    ("-1", -1.0),
    ("0.34", "\\dfrac{17}{50}"),
    ("10080", "10,\\!080"),
    ("4/3", "\\frac43"),
    ("5/9", "\\frac 59"),
    ("1.8", "1\\frac{4}{5}"),
    ("90", "90^\\circ"),
    ("\\frac{1}{\\sqrt{3}}", "\\frac{\\sqrt{3}}{3}"),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("-2, 1", "1,-2"),
    ("1-\\sqrt{19}, 1+\\sqrt{19}", "1 \\pm \\sqrt{19}"),
    ("5", "x=5"),
    ("C", "\\text{(C)}"),
    ("\\sqrt{117}", "3\\sqrt{13}"),
    ("32348", "\\$32,\\!348"),
    ("864", "864 \\mbox{ inches}^2"),
    ("(b+2)(a+5)", "(a+5)(b+2)"),
    ("6-5i", "6 - 5i"),
    ("[-2, 7]", "x \\in [-2,7]"),
    ("\\frac{270}{7}", "\\frac{270}7\\text{ degrees}"),
    # labels before the value (dropped when the gold has none)
    ("xy = 25", "25"),
    ("a_{2023} = -1", "-1"),
    ("(p,q,r) = (6, 31, -1)", "(6,31,-1)"),
    ("m + n = 41", "41"),
    ("f(2) = 13", "13"),
    ("x = 3 \\text{ or } x = 5", "3, 5"),
    ("n = 12 \\times 17 = 204", "204"),
    ("y = 2x + 3", "y = 2x+3"),
    ("x \\in (5, \\infty)", "(5,\\infty)"),
    # unit words, currency, thousands
    ("204 minutes", "204"),
    ("27 miles", "27"),
    ("90 degrees", "90"),
    ("3\\sqrt{13} units", "3\\sqrt{13}"),
    ("864 in^2", "864"),
    ("15 cm^2", "15"),
    ("15\\,\\mathrm{cm}^2", "15\\mbox{ cm}^2"),
    ("60 km/h", "60"),
    ("12 square units", "12"),
    ("\\frac{3}{4} of the tank", "\\frac34"),
    ("$32,348", "\\$32,\\!348"),
    ("\\$1{,}250", "1250"),
    ("$5$ dollars", "5"),
    ("\\text{5 cm}", "5"),
    # unordered unions, Unicode, remarks, choice letters
    ("(3, 5] \\cup (-\\infty, 1)", "(-\\infty, 1) \\cup (3, 5]"),
    ("−3", "-3"),
    ("3√2", "3\\sqrt{2}"),
    ("12 (mod 1000)", "12"),
    ("\\textbf{(C)}\\ 12", "12"),
    ("\\textbf{(B)}\\ 15", "\\text{(B)}"),
]
DIFFERENT = [
    ("1/3", "0.333"),
    ("6+5i", "6 - 5i"),
    ("(3,4)", "(3,4]"),
    ("\\frac{14}{5}", "\\frac{14}{3}"),
    ("26", "025"),
    ("28", 27.0),
    ("1", "1,-2"),
    ("(2,1)", "(1,2)"),
    ("\\sqrt{13}", "3\\sqrt{13}"),
    ("2x+2", "2k+2"),
    ("\\text{west}", "\\text{east}"),
    # a label only where it names the asked value: not an equation, not another variable
    ("y = 5", "x = 5"),
    ("y=6", "x=6"),
    ("2x = 10", "10"),
    ("x + 1 = 5", "5"),
    ("x^2 = 25", "25"),
    ("\\frac{x}{2} = 3", "3"),
    ("\\sin x = \\frac12", "\\frac12"),
    ("x = 3 \\text{ or } x = 5", "5"),
    # unit stripping never eats a value: radicals, pi, scale words, variables
    ("5\\sqrt{2}", "5"),
    ("5\\sqrt{2} \\text{ units}", "5"),
    ("2 pi", "2"),
    ("5 hundred", "5"),
    ("27 thousand", "27"),
    ("2 xy", "2"),
    ("3 \\text{ or } 12", "12"),
    ("12 or 13", "12"),
    ("(3, 5) \\cup (-\\infty, 1)", "(-\\infty,1)\\cup(3,5]"),
    ("1,000", "1"),
    ("\\textbf{(B)}\\ 15", "\\text{(C)}"),
    ("\\frac12 (approximately 0.5)", "\\frac13"),
    # hedged or approximate values (math-verify alone reads 5 in each)
    ("5 \\text{ hundred}", "5"),
    ("5 \\text{ or more}", "5"),
    ("5 or more", "5"),
    ("\\approx 5", "5"),
    ("\\le 5", "5"),
    ("5 (or possibly 6)", "5"),
]


@pytest.mark.parametrize("pred,gold", SAME)
def test_equivalent_forms_are_accepted(checker, pred, gold):
    assert checker.check([pred], [gold]) == [True], (checker.backend, pred, gold)


@pytest.mark.parametrize("pred,gold", DIFFERENT)
def test_different_values_are_rejected(checker, pred, gold):
    assert checker.check([pred], [gold]) == [False], (checker.backend, pred, gold)


# --------------------------------------------------------------------------- the real eval sets
def _gold_str(a):
    return str(int(a)) if isinstance(a, float) else a


@needs_data("eval")
@pytest.mark.parametrize("name", EVAL_SETS)
def test_every_gold_answer_gets_full_marks(checker, name):
    """Every gold answer written as the final line "Answer: <gold>" and as \\boxed{<gold>} is
    correct."""
    golds = [p.answer for p in _eval_set(name)]
    answer_texts = [
        f"Let me think.\nThe computation gives it.\nAnswer: {_gold_str(g)}" for g in golds
    ]
    boxed_texts = [f"Let me think. The result is $\\boxed{{{_gold_str(g)}}}$." for g in golds]
    for style, texts in (("answer", answer_texts), ("boxed", boxed_texts)):
        ok = checker.check([mr.extract_answer(t, style) for t in texts], golds)
        missed = [g for g, o in zip(golds, ok) if not o]
        assert not missed, (
            f"{checker.backend}/{style}: {len(missed)}/{len(golds)} gold answers rejected: {missed}"
        )
    if name in ("aime24", "amc23"):  # "025" written as 25, 27.0 written as 27.0
        alt = [str(int(g)) if name == "aime24" else repr(g) for g in golds]
        assert all(checker.check(alt, golds))


def _wrong_answers(golds):
    """gold + 1 for integer answers; for the others the next different answer of the same set
    (checked by eye once: all 189 MATH-500 pairs are different values)."""
    ints = [g for g in golds if isinstance(g, float) or re.fullmatch(r"-?\d+", str(g))]
    others = [g for g in golds if g not in ints]
    key = lambda s: re.sub(r"\s+", "", s)
    wrong = {}
    for i, g in enumerate(others):
        j = (i + 1) % len(others)
        while key(others[j]) == key(g):
            j = (j + 1) % len(others)
        wrong[g] = others[j]
    return [str(int(float(g)) + 1) if g in ints else wrong[g] for g in golds]


@needs_data("eval")
@pytest.mark.parametrize("name", EVAL_SETS)
def test_wrong_answers_get_no_marks(checker, name):
    golds = [p.answer for p in _eval_set(name)]
    wrong = _wrong_answers(golds)
    ok = checker.check([mr.extract_answer(f"Answer: {w}") for w in wrong], golds)
    accepted = [(g, w) for g, w, o in zip(golds, wrong, ok) if o]
    assert not accepted, f"{checker.backend}: wrong answers accepted: {accepted}"
    assert checker.last_stats.timeouts == 0 and checker.last_stats.errors == 0


@needs_data("eval")
@pytest.mark.skipif(not mr.math_verify_available(), reason="math-verify not installed")
def test_math_verify_alone_verifies_every_gold():
    """math-verify (no canonical-string shortcut) parses and verifies every gold against itself."""
    golds = [_gold_str(p.answer) for name in EVAL_SETS for p in _eval_set(name)]
    missed = [g for g in golds if not mr._math_verify_equal(g, g)]
    assert not missed, missed


BASE_N_ANSWERS = {"52_8", "40_9", "2516_8", "4210_{5}", "204_5", "4343_6"}

@needs_data("eval")

def test_normalizer_parses_math500_golds():
    """The normalizer's parser understands every MATH-500 gold answer (its label, as in
    "x \\in [-2,7]", taken off as in every comparison) except the six base-n numerals (e.g. 52_8),
    which are compared as canonical strings only."""
    unparsed = set()
    for p in _eval_set("math500"):
        c = canonical(comparable_pair(p.answer, p.answer)[1])
        try:
            s = structure(c)
        except ValueError:
            unparsed.add(p.answer)
            continue
        assert structures_equal(s, s), p.answer
    assert unparsed == BASE_N_ANSWERS


def test_deep_nesting_is_no_match_not_an_exception():
    """The parser stops at a fixed depth: deep nesting is "not parseable" (no match), never a
    RecursionError; ordinary nesting still parses."""
    deep = "(" * 3000 + "1" + ")" * 3000
    with pytest.raises(ValueError, match="nested deeper"):
        structure(deep)
    assert answers_equal(deep, "1") is False
    assert answers_equal("\\frac{1}{" * 90 + "2" + "}" * 90, "2") is False  # 2, but past the cap
    assert answers_equal("-" * 1001 + "1", "-1") is False
    assert answers_equal("(" * 20 + "1" + ")" * 20, "1") is True
    assert answers_equal("\\frac{1}{" * 10 + "2" + "}" * 10, "2") is True


DEGENERATE = [  # what a model in a repetition loop writes in a 20k-token budget
    ("Let me compute. " + "\\boxed{" * 7_000, "boxed"),           # the 49 kB line of the issue
    ("Let me compute. " + "\\boxed{" * 150_000, "boxed"),         # 1 MB
    ("Answer: " + "\\boxed{" * 150_000, "answer"),
    ("}" * 1_000_000 + "\nAnswer: ", "answer"),
    ("Answer: " + "(" * 3_000 + "1" + ")" * 3_000, "answer"),
    ("Answer: $" + "\\frac{1}{" * 100 + "1" + "}" * 100 + "$", "answer"),
    ("Answer: " + "\\boxed{" * 570 + "1" + "}" * 570, "answer"),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_degenerate_responses_are_scored_within_the_time_limit(backend):
    """Extraction is linear and runs in the worker with the check: megabyte-long repetition loops
    score wrong with no timeout and no error (the old extraction took 39 s on the 49 kB line and
    did not finish on 1 MB, in the trainer's process)."""
    with mr.AnswerChecker(backend, timeout_s=5.0) as ck:
        ok, _ = ck.check_responses([t for t, _ in DEGENERATE[:4]], ["5"] * 4, "boxed")
        ok2, _ = ck.check_responses([t for t, _ in DEGENERATE[2:]], ["5"] * 5, "answer")
        assert ok + ok2 == [False] * 9
        assert ck.stats.timeouts == 0 and ck.stats.errors == 0, ck.stats.error_examples


# --------------------------------------------------------------------------- time limit
# more copies: see test_math_reward_load
HANG_REPEATS = int(os.environ.get("RPG_HANG_TEST_REPEATS", "1"))


@pytest.mark.parametrize("repeat", range(HANG_REPEATS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hanging_check_times_out_scores_wrong_and_is_counted(backend, repeat):
    """(x+1)^2000 vs (x+2)^2000 makes sympy expand for about a minute: the worker is killed after
    the time limit, the answer scores wrong, the stat counts it, and the next answer is still
    checked (by the warm spare worker: its start-up is never charged to that answer)."""
    with mr.AnswerChecker(backend, timeout_s=1.0) as ck:
        ok = ck.check(["(x+1)^{2000}", "0.5"], ["(x+2)^{2000}", "\\frac{1}{2}"])
        assert ok == [False, True]
        assert ck.last_stats.timeouts == 1 and ck.stats.timeouts == 1
        ok, answers = ck.check_responses(["Answer: $(x+1)^{2000}$", "Answer: $0.5$"],
                                         ["(x+2)^{2000}", "\\frac{1}{2}"])
        assert ok == [False, True] and answers == [None, "0.5"]
        assert ck.stats.timeouts == 2 and len(ck._workers) == 2  # one at work, one spare
        assert answers_equal("0.5", "\\frac12")


def test_a_slow_worker_start_is_not_charged_to_an_answer(monkeypatch):
    """Workers that take 3 s to start, a 1 s limit: every answer is still checked, because its
    limit starts only when a ready worker receives it (before the fix, the replacement's start-up
    after a kill counted against the next answer)."""
    monkeypatch.setattr(mr._Worker, "command",
                        ["/bin/sh", "-c", 'sleep 3; exec "$0" "$@"', *mr._Worker.command])
    with mr.AnswerChecker("normalizer", timeout_s=1.0) as ck:
        ok = ck.check(["(x+1)^{2000}", "0.5", "(x+1)^{2000}", "2/4"],
                      ["(x+2)^{2000}", "\\frac{1}{2}", "(x+2)^{2000}", "0.5"])
        assert ok == [False, True, False, True] and ck.stats.timeouts == 2


def test_workers_that_died_while_idle_are_replaced():
    with mr.AnswerChecker("normalizer", timeout_s=5.0) as ck:
        assert ck.check(["0.5"], ["\\frac12"]) == [True]
        for w in ck._workers:  # e.g. the out-of-memory killer, between two training steps
            w.proc.kill()
            w.proc.wait()
        assert ck.check(["0.5", "1/3"], ["\\frac12", "0.3"]) == [True, False]
        assert ck.last_stats.errors == 0 and ck.last_stats.timeouts == 0


def test_a_worker_that_cannot_start_is_an_error_not_a_wrong_answer(monkeypatch):
    monkeypatch.setattr(mr._Worker, "command", [sys.executable, "-c", "raise SystemExit(3)"])
    with mr.AnswerChecker("normalizer", timeout_s=1.0) as ck, \
            pytest.raises(RuntimeError, match="exited while starting"):
        ck.check(["1"], ["1"])


# --------------------------------------------------------------------------- scoring
def test_math_reward_scoring_options():
    texts = ["Answer: 7", "Answer: 8", "no answer here"]
    golds = ["7", "7", "7"]
    r = mr.MathReward(scoring="pm1", backend="normalizer")
    rewards, info = r(texts, golds)
    assert rewards == [1.0, -1.0, -1.0] and info["correct"] == [True, False, False]
    assert info["check"]["no_answer"] == 1 and info["check"]["correct"] == 1
    r.close()
    r = mr.MathReward(scoring="binary", backend="normalizer")
    rewards, _ = r(texts, golds)
    assert rewards == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="gold answers"):
        r(texts, golds[:2])
    r.close()
    with pytest.raises(ValueError, match="scoring"):
        mr.MathReward(scoring="pm2")


def test_bad_inputs_raise_clear_errors():
    with mr.AnswerChecker("normalizer") as ck:
        with pytest.raises(ValueError, match="gold answers"):
            ck.check(["1"], ["1", "2"])
        with pytest.raises(ValueError, match="gold answer must be"):
            ck.check(["1"], [None])
        with pytest.raises(ValueError, match="answer 0"):
            ck.check([1], ["1"])
    with pytest.raises(ValueError, match="backend"):
        mr.AnswerChecker("sympy")
    with pytest.raises(ValueError, match="timeout_s"):
        mr.AnswerChecker("normalizer", timeout_s=0)
