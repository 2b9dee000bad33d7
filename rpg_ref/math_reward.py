"""Math reasoning reward: prompts, final-answer extraction, verified answer checking, scoring.

The paper's setup (sec:experiments; its released code; the DAPO-Math-17k prompt format):
  * the user message is  PAPER_INSTRUCTION + "\\n\\n" + problem + "\\n\\n" + PAPER_REMINDER, put through
    the model's chat template (`chat_prompt`); a `\\boxed{}` variant (`style="boxed"`) is offered;
  * the final answer is the text after the last "Answer:" (`style="answer"`) or inside the last
    \\boxed{...} (`style="boxed"`); for thinking models only the text after the last </think> counts;
  * reward +1 for a correct answer and -1 otherwise (`scoring="pm1"`; `"binary"` gives 1 / 0),
    plus DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. for R_length):
        R_length(y) = 0                              if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                    = -1                             if |y| > L_max
    i.e. min(-(|y| - (L_max - L_cache)) / L_cache, 0) floored at -1, with |y| the response length
    in tokens, L_max the maximum response length and L_cache the buffer (the paper's code: 512).

Answer checking (`AnswerChecker`): an extracted answer equals the gold answer when
  1. their canonical strings agree (rpg_ref.math_normalize.canonical: integers, "025", "27.0",
     commas, units, \\dfrac, ...) - checked in-process, no sympy involved; otherwise
  2. backend "math_verify" (the default "auto" picks it when the math-verify package is installed):
     math_verify.parse both sides wrapped in $...$ and math_verify.verify(gold, pred); or
     backend "normalizer": rpg_ref.math_normalize.answers_equal (a hand-written parser, no eval).
Step 2 runs in a separate worker process with a per-answer time limit (`timeout_s`, default 5 s).
On timeout the worker is killed and restarted, the answer is scored as WRONG, and
`stats["timeouts"]` counts it; an exception inside a check also scores as wrong
(`stats["errors"]`). Extracted answers longer than MAX_ANSWER_CHARS are wrong without a check
(`stats["too_long"]`). A worker is a fresh `python -m rpg_ref.math_reward --worker` subprocess
talking over pipes (select-based, so POSIX: Linux and macOS), which is safe to start from a
process that holds a CUDA context or threads and never re-imports the caller's __main__.
"""
from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rpg_ref.math_normalize import answers_equal, canonical

PAPER_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
PAPER_REMINDER = 'Remember to put your answer on its own line after "Answer:".'
BOXED_INSTRUCTION = (
    "Solve the following math problem step by step, and give your final answer in the form "
    "\\boxed{answer} at the end of your response."
)
STYLES = ("answer", "boxed")
SCORINGS = ("pm1", "binary")
BACKENDS = ("auto", "math_verify", "normalizer")
MAX_ANSWER_CHARS = 1000


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")


# ---------------------------------------------------------------------------- prompts
def user_message(problem: str, style: str = "answer") -> str:
    """The user turn: the paper's instruction + problem + reminder, or the \\boxed{} variant."""
    _check_style(style)
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(f"problem must be a non-empty string, got {problem!r}")
    if style == "answer":
        return f"{PAPER_INSTRUCTION}\n\n{problem}\n\n{PAPER_REMINDER}"
    return f"{problem}\n\n{BOXED_INSTRUCTION}"


def chat_prompt(tokenizer, problem: str, style: str = "answer", enable_thinking: bool = False) -> str:
    """The prompt text through the tokenizer's chat template, ending with the assistant header.

    `enable_thinking` is passed to templates that use it (Qwen3: False appends an empty
    <think></think> block so the model answers directly; True lets it think first).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("tokenizer has no chat_template; math prompts need a chat model's tokenizer")
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message(problem, style)}],
        tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking)


def chat_prompt_ids(tokenizer, problem: str, style: str = "answer",
                    enable_thinking: bool = False) -> list[int]:
    """Token ids of `chat_prompt` (special tokens come from the template text itself)."""
    text = chat_prompt(tokenizer, problem, style, enable_thinking)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------------- extraction
_ANSWER_RE = re.compile(r"answer\s*:\s*(.*)", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) with balanced braces, else None."""
    for start in sorted((m.start() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)),
                        reverse=True):
        open_at = text.index("{", start)
        depth = 0
        for j in range(open_at, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[open_at + 1:j].strip()
    return None


def extract_answer(text: str, style: str = "answer") -> str | None:
    """The final answer of a response, or None when it has none in the requested form.

    style "answer": the rest of the line after the LAST "Answer:" (case-insensitive; markdown
    bold and $...$ around it are removed; a \\boxed{} inside it is unwrapped).
    style "boxed": the content of the last \\boxed{...}.
    For thinking models, only the text after the last "</think>" is searched.
    """
    _check_style(style)
    if not isinstance(text, str):
        raise ValueError(f"response must be a string, got {type(text).__name__}")
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    if style == "boxed":
        return last_boxed(text)
    matches = [m.group(1) for m in _ANSWER_RE.finditer(text.replace("**Answer:**", "Answer:"))]
    if not matches:
        return None
    ans = matches[-1].strip().strip("*").strip()
    boxed = last_boxed(ans)
    if boxed is not None:
        ans = boxed
    ans = ans.strip().removesuffix(".").strip()  # a sentence's full stop is not part of it
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(ans) > len(left) + len(right) and ans.startswith(left) and ans.endswith(right) \
                and not ans.endswith("\\" + right):
            ans = ans[len(left):-len(right)].strip()
            break
    return ans or None


# ---------------------------------------------------------------------------- checking
def math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def _resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "math_verify" if math_verify_available() else "normalizer"
    if backend == "math_verify" and not math_verify_available():
        raise ValueError("backend='math_verify' but the math-verify package is not installed "
                         "(pip install 'math-verify>=0.7', or use backend='normalizer')")
    return backend


def _gold_text(gold) -> str:
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise ValueError(f"gold answer must be str, int or float, got {gold!r}")
    return canonical(gold) if isinstance(gold, float) else str(gold)


def _math_verify_equal(pred: str, gold: str) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    # math-verify's own signal-based timeouts are off (they only work in a main thread); the
    # caller's worker process enforces the limit, so silence its "timeout disabled" warning.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    cfg = [LatexExtractionConfig(), ExprExtractionConfig()]
    g = parse(f"${gold}$", extraction_config=cfg, parsing_timeout=None)
    p = parse(f"${pred}$", extraction_config=cfg, parsing_timeout=None)
    return bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=None))


def answers_match(pred: str | None, gold, backend: str = "auto") -> bool:
    """Untimed check of one extracted answer against a gold answer (see the module docstring).

    Runs sympy/math-verify in the calling process: use AnswerChecker for model outputs.
    """
    backend = _resolve_backend(backend)
    gold_s = _gold_text(gold)
    if pred is None or len(pred) > MAX_ANSWER_CHARS:
        return False
    if canonical(pred) == canonical(gold_s):
        return True
    if backend == "math_verify":
        return _math_verify_equal(pred, gold_s)
    return answers_equal(pred, gold_s)


def _serve() -> None:
    """Worker loop (run as `python -m rpg_ref.math_reward --worker`): one JSON job per stdin line
    ([pred, gold, backend]), one JSON result per stdout line ([ok, error_text_or_null])."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        pred, gold, backend = json.loads(line)
        try:
            res = [bool(answers_match(pred, gold, backend)), None]
        except Exception as e:  # noqa: BLE001  a crash in sympy/math-verify means "not verified", reported
            res = [False, f"{type(e).__name__}: {e}"]
        out.write(json.dumps(res).encode() + b"\n")
        out.flush()


class _Worker:
    """A checker subprocess: a fresh interpreter (no fork of a CUDA/threaded parent, no
    re-import of the caller's __main__), talking JSON lines over pipes."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "rpg_ref.math_reward", "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.buf = b""
        self.job: int | None = None
        self.deadline = 0.0

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def send(self, job: int, msg: list, timeout_s: float) -> None:
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        self.job, self.deadline = job, time.monotonic() + timeout_s

    def read_result(self) -> list | None:
        """Read what is available; the result once a whole line has arrived, else None.
        Raises EOFError when the worker has died."""
        data = os.read(self.fileno(), 1 << 16)
        if not data:
            raise EOFError("answer-checker worker exited")
        self.buf += data
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()

    def stop(self) -> None:
        try:
            self.proc.stdin.close()  # EOF ends the worker loop
            self.proc.wait(timeout=2.0)
            self.proc.stdout.close()
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


@dataclass
class CheckStats:
    checked: int = 0
    correct: int = 0
    no_answer: int = 0
    too_long: int = 0
    fast_path: int = 0
    timeouts: int = 0
    errors: int = 0
    error_examples: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "error_examples"}


class AnswerChecker:
    """Checks many (extracted answer, gold) pairs with a per-answer time limit.

    Worker processes are started lazily and reused; use as a context manager or call close().
    `stats` accumulates over calls (see CheckStats); `last_stats` holds the last call's counts.
    """

    def __init__(self, backend: str = "auto", timeout_s: float = 5.0, num_workers: int = 1):
        self.backend = _resolve_backend(backend)
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s must be a positive finite number, got {timeout_s!r}")
        if not (isinstance(num_workers, int) and num_workers >= 1):
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        self.timeout_s = float(timeout_s)
        self.num_workers = num_workers
        self._workers: list[_Worker] = []
        self.stats = CheckStats()
        self.last_stats = CheckStats()

    # -- worker management
    def close(self) -> None:
        for w in self._workers:
            w.stop()
        self._workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110  interpreter shutdown: nothing left to clean reliably
            pass

    # -- checking
    def check(self, preds: Sequence[str | None], golds: Sequence) -> list[bool]:
        """One bool per pair: True when the extracted answer `preds[i]` matches `golds[i]`."""
        if len(preds) != len(golds):
            raise ValueError(f"{len(preds)} answers but {len(golds)} gold answers")
        golds_s = [_gold_text(g) for g in golds]
        for i, p in enumerate(preds):
            if p is not None and not isinstance(p, str):
                raise ValueError(f"answer {i} must be a string or None, got {type(p).__name__}")
        st = CheckStats(checked=len(preds))
        out = [False] * len(preds)
        pending = []
        for i, (p, g) in enumerate(zip(preds, golds_s)):
            if p is None:
                st.no_answer += 1
            elif len(p) > MAX_ANSWER_CHARS:
                st.too_long += 1
            elif canonical(p) == canonical(g):
                out[i] = True
                st.fast_path += 1
            else:
                pending.append(i)
        self._run(pending, preds, golds_s, out, st)
        st.correct = sum(out)
        self.last_stats = st
        for k, v in st.as_dict().items():
            setattr(self.stats, k, getattr(self.stats, k) + v)
        self.stats.error_examples = (self.stats.error_examples + st.error_examples)[-10:]
        return out

    def _run(self, pending, preds, golds, out, st) -> None:
        queue = list(reversed(pending))
        while len(self._workers) < min(self.num_workers, len(pending)):
            self._workers.append(_Worker())
        while True:
            for w in self._workers:  # hand out jobs to idle workers
                if w.job is None and queue:
                    i = queue.pop()
                    w.send(i, [preds[i], golds[i], self.backend], self.timeout_s)
            busy = [w for w in self._workers if w.job is not None]
            if not busy:
                return
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready, _, _ = select.select(busy, [], [], timeout)
            for k, w in enumerate(self._workers):
                if w.job is None:
                    continue
                if w in ready:
                    try:
                        res = w.read_result()
                    except EOFError:  # the worker died (e.g. out of memory): wrong + error
                        res = [False, "answer-checker worker died"]
                        w.kill()
                        self._workers[k] = _Worker()
                    if res is None:
                        continue
                    out[w.job], err = res
                    w.job = None
                    if err is not None:
                        st.errors += 1
                        st.error_examples.append(err)
                elif time.monotonic() >= w.deadline:  # timed out: kill, count, score wrong
                    st.timeouts += 1
                    out[w.job] = False
                    st.error_examples.append(f"timeout after {self.timeout_s} s: {preds[w.job]!r:.80}")
                    w.kill()
                    self._workers[k] = _Worker()


# ---------------------------------------------------------------------------- scoring
def overlong_penalty(length: int, max_len: int, buffer: int) -> float:
    """DAPO soft overlong punishment R_length (formula in the module docstring)."""
    if not (isinstance(max_len, int) and isinstance(buffer, int) and 0 < buffer <= max_len):
        raise ValueError(f"need integers 0 < buffer <= max_len, got buffer={buffer}, max_len={max_len}")
    if not (isinstance(length, int) and length >= 0):
        raise ValueError(f"length must be an int >= 0, got {length!r}")
    if length > max_len:
        return -1.0
    return min(-(length - (max_len - buffer)) / buffer, 0.0)


class MathReward:
    """reward(responses, golds, lengths) -> (rewards, info) for the math task.

    rewards[i] = score(correct_i) + overlong_penalty(lengths[i]) (the latter only when
    `overlong_buffer` is set; then `max_response_len` is required).
    """

    def __init__(self, style: str = "answer", scoring: str = "pm1", backend: str = "auto",
                 timeout_s: float = 5.0, num_workers: int = 1,
                 overlong_buffer: int | None = None, max_response_len: int | None = None):
        _check_style(style)
        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
        if overlong_buffer is not None:
            if max_response_len is None:
                raise ValueError("overlong_buffer needs max_response_len")
            overlong_penalty(0, max_response_len, overlong_buffer)  # validates the pair
        self.style, self.scoring = style, scoring
        self.overlong_buffer, self.max_response_len = overlong_buffer, max_response_len
        self.checker = AnswerChecker(backend, timeout_s, num_workers)

    def __call__(self, responses: Sequence[str], golds: Sequence,
                 lengths: Sequence[int] | None = None) -> tuple[list[float], dict]:
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
        if self.overlong_buffer is not None and (lengths is None or len(lengths) != len(responses)):
            raise ValueError("the overlong penalty needs one length (in tokens) per response")
        preds = [extract_answer(r, self.style) for r in responses]
        correct = self.checker.check(preds, golds)
        wrong = -1.0 if self.scoring == "pm1" else 0.0
        rewards = [1.0 if c else wrong for c in correct]
        if self.overlong_buffer is not None:
            rewards = [r + overlong_penalty(int(n), self.max_response_len, self.overlong_buffer)
                       for r, n in zip(rewards, lengths)]
        info = {"correct": correct, "answers": preds, "check": self.checker.last_stats.as_dict()}
        return rewards, info

    def close(self) -> None:
        self.checker.close()


if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        raise SystemExit("usage: python -m rpg_ref.math_reward --worker  (internal answer-checker worker)")
    _serve()
