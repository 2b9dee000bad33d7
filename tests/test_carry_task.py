"""The carry task (rpg_ref/tasks/carry.py): its problems, its written work, its two measures
(gold correctness and the training reward), its evaluation's own sampling stream, its refusals,
and one rpg-train run end to end. Expected values are written out by hand or computed with
Python's integers, never read back from the task."""

import json
import random
import subprocess
import sys
import types

import pytest
import torch

from rpg_ref.tasks.carry import CarryTask

DIGITS, PLUS, EQ, BOS, EOS, STEP, ANSWER = range(10), 10, 11, 12, 13, 15, 16


def task(**options) -> CarryTask:
    cfg = types.SimpleNamespace(task_options=options, max_new_tokens=40, seed=0, init_seed=None,
                                cache_dir="unused", progress=False, temperature=1.0)
    return CarryTask(cfg, torch.device("cpu"))


def digits(n: int) -> list:
    return [int(c) for c in str(n)]


def test_the_work_of_a_sum_is_written_digit_by_digit():
    """758 + 67: steps (8,7,0,5) (5,6,1,2) (7,0,1,8), each ending ';', then '>' 825 EOS."""
    t = task()
    want = [8, 7, 0, 5, STEP, 5, 6, 1, 2, STEP, 7, 0, 1, 8, STEP, ANSWER, 8, 2, 5, EOS]
    assert t.target(758, 67, direct=False) == want
    assert t.target(758, 67, direct=True) == [ANSWER, 8, 2, 5, EOS]
    # a final carry is the answer's leading digit, not a step of its own
    assert t.target(95, 7, direct=False) == [5, 7, 0, 2, STEP, 9, 0, 1, 0, STEP,
                                             ANSWER, 1, 0, 2, EOS]


def test_every_step_of_the_work_is_right_and_the_answer_is_the_work_read_backwards():
    """For 2,000 random sums of 1..6-digit operands: step i holds the i-th digits from the right,
    the carry into it and (a_i + b_i + c_i) mod 10; the carry out of the last step and the sum
    digits, read backwards, are a + b; the response is 5n + 2 + len(a + b) tokens."""
    t, rng = task(), random.Random(1)
    for _ in range(2000):
        a, b = (rng.randrange(10 ** (d - 1) if d > 1 else 0, 10**d)
                for d in (rng.randint(1, 6), rng.randint(1, 6)))
        resp = t.target(a, b, direct=False)
        n = max(len(str(a)), len(str(b)))
        assert len(resp) == 5 * n + 2 + len(str(a + b))
        carry, sums = 0, []
        for i in range(n):
            ai, bi, ci, si, sep = resp[5 * i : 5 * i + 5]
            assert (ai, bi, ci, sep) == (a // 10**i % 10, b // 10**i % 10, carry, STEP)
            assert si == (ai + bi + ci) % 10
            carry, sums = (ai + bi + ci) // 10, [si, *sums]
        assert resp[5 * n] == ANSWER and resp[-1] == EOS
        assert resp[5 * n + 1 : -1] == digits(a + b) == ([1] if carry else []) + sums


def test_problems_have_1_to_max_digits_without_leading_zeros_and_replay_from_the_generator():
    t = task(max_digits=4)
    ps = t.sample_prompts(500, torch.Generator().manual_seed(3))
    again = t.sample_prompts(500, torch.Generator().manual_seed(3))
    assert [p.ids for p in ps] == [p.ids for p in again]
    lengths = set()
    for p in ps:
        a, b = p.answer
        assert p.ids == [BOS, *digits(a), PLUS, *digits(b), EQ]
        assert 0 <= a < 10**4 and 0 <= b < 10**4
        lengths |= {len(str(a)), len(str(b))}
    assert lengths == {1, 2, 3, 4}


@pytest.mark.parametrize("credit", ["exact", "digits"])
def test_gold_correctness_and_the_training_reward(credit):
    """correct: the digits after the first '>' are a + b, then EOS (the work is not graded);
    reward: the credit minus token_cost per response token."""
    t = task(token_cost=0.01, credit=credit)
    p = t.sample_prompts(1, torch.Generator().manual_seed(0))[0]
    p.answer = (758, 67)   # 825
    right = t.target(758, 67, direct=False)
    cases = {                                         # response: (correct, digits credit)
        tuple(right): (True, 1.0),
        (ANSWER, 8, 2, 5, EOS): (True, 1.0),          # direct and right
        (1, 2, 3, STEP, ANSWER, 8, 2, 5, EOS): (True, 1.0),  # wrong work, right answer
        (ANSWER, 8, 2, 4, EOS): (False, 2 / 3),       # one digit off
        (ANSWER, 1, 8, 2, 5, EOS): (False, 3 / 4),    # an extra leading digit
        (ANSWER, 2, 5, EOS): (False, 2 / 3),          # a digit short
        (ANSWER, 8, 2, 5): (False, 0.0),              # no EOS (cut at max_new_tokens)
        (8, 2, 5, EOS): (False, 0.0),                 # no '>'
        (ANSWER, 8, STEP, 5, EOS): (False, 0.0),      # not digits
    }
    r, ok = t.reward([p] * len(cases), [list(c) for c in cases])
    for i, (resp, (correct, share)) in enumerate(cases.items()):
        assert bool(ok[i]) is correct, resp
        credit_value = float(correct) if credit == "exact" else share
        assert float(r[i]) == pytest.approx(credit_value - 0.01 * len(resp), abs=1e-6), resp


def test_reasons_tells_work_from_a_direct_answer():
    t = task()
    assert t.reasons(t.target(12, 3, direct=False))
    assert not t.reasons(t.target(12, 3, direct=True))
    assert not t.reasons([])


@pytest.mark.parametrize("option, value, words", [
    ("max_digits", 0, "--carry-max-digits must be in [1, 17]"),
    ("direct_frac", 1.5, "--carry-direct-frac must be in [0, 1]"),
    ("token_cost", -0.1, "--carry-token-cost must be finite and >= 0"),
    ("credit", "partial", "--carry-credit must be 'exact' or 'digits'"),
    ("eval_samples", -1, "--carry-eval-samples must be >= 0"),
])
def test_bad_options_are_one_line_naming_the_flag(option, value, words):
    with pytest.raises(ValueError, match="^bad configuration: " + words.replace("[", r"\[")
                       .replace("]", r"\]")):
        task(**{option: value})


def test_max_new_tokens_must_fit_the_longest_worked_answer():
    """6-digit operands: 6 steps of 5 tokens, '>', 7 answer digits, EOS = 39 tokens."""
    cfg = types.SimpleNamespace(task_options={"max_digits": 6}, max_new_tokens=38, seed=0,
                                init_seed=None, cache_dir="unused", progress=False,
                                temperature=1.0)
    with pytest.raises(ValueError, match="needs --max-new-tokens >= 39"):
        CarryTask(cfg, torch.device("cpu"))
    cfg.max_new_tokens = 39
    CarryTask(cfg, torch.device("cpu"))


class RecordingEngine:
    """An engine that answers every prompt with the right work, sampling one random number per
    call from the global stream (as a sampler would), and records the temperatures asked for."""

    def __init__(self, t):
        self.t, self.calls, self.draws = t, [], []

    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        self.calls.append((n, temperature))
        self.draws.append(float(torch.rand(())))
        flat = [p for p in self.t.eval_prompts for _ in range(n)]
        return types.SimpleNamespace(
            responses=[self.t.target(*p.answer, direct=False) for p in flat])


@pytest.mark.parametrize("k", [3, 0])
def test_evaluation_samples_from_its_own_stream_and_leaves_the_training_stream_as_it_was(k):
    """Mean@k at --temperature (k > 0) or greedy (k = 0), each evaluation with the same draws."""
    t = task(eval_size=8, eval_samples=k)
    eng = RecordingEngine(t)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    out = t.evaluate(None, eng)
    assert torch.equal(torch.get_rng_state(), before)      # the training stream is untouched
    assert eng.calls == [(k, 1.0) if k else (1, 0.0)]
    name = "sampled" if k else "greedy"
    assert set(out) == {f"{name}_accuracy", f"{name}_reasoning", f"{name}_len"}
    assert out[f"{name}_accuracy"] == out[f"{name}_reasoning"] == 1.0
    assert out[f"{name}_len"] == sum(len(t.target(*p.answer, direct=False))
                                     for p in t.eval_prompts) / 8
    t.evaluate(None, eng)
    assert eng.draws[1] == eng.draws[0]


def test_rpg_train_runs_the_carry_preset_end_to_end(tmp_path):
    """A short run from the command line: the warm start, two RL steps, the evaluation keys."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rpg_ref.cli", "--preset", "carry", "--steps", "2",
           "--carry-warm-steps", "3", "--carry-eval-size", "4", "--carry-eval-samples", "2",
           "--carry-max-digits", "3", "--max-new-tokens", "24", "--prompts-per-step", "4",
           "--group-size", "2", "--mini-batch-size", "8", "--eval-every", "1", "--out", str(out),
           "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("eval_sampled_accuracy", "eval_sampled_reasoning", "eval_sampled_len"):
        assert 0 <= rows[-1][key] <= (24 if key.endswith("len") else 1)
    assert list((tmp_path / "cache").glob("carry-warm-*.safetensors"))
