"""Math reasoning reward: prompts, final-answer extraction, verified answer checking, scoring.

The paper's setup (sec:experiments; its released code; the DAPO-Math-17k prompt format):
  * the user message is  PAPER_INSTRUCTION + "\\n\\n" + problem + "\\n\\n" + PAPER_REMINDER,
    put through the model's chat template (`chat_prompt`); a `\\boxed{}` variant
    (`style="boxed"`) is offered;
  * the final answer is the text after the last "Answer:" (`style="answer"`) or inside the last
    \\boxed{...} (`style="boxed"`), or, for short arithmetic, the number after the last "="
    (`style="number"`); for thinking models only the text after the last </think> counts;
  * reward +1 for a correct answer and -1 otherwise (`scoring="pm1"`; `"binary"` gives 1 / 0);
    DAPO's soft overlong punishment is added by the loop for every task (rpg_ref.trainer.shaping).

Final answer (`extract_answer`; every style runs in time linear in the response length):
  * where: after the last "</think>"; then only the last MAX_TAIL_CHARS (4,000) characters.
    Unfinished thinking has NO answer and scores wrong: with thinking on (`thinking=True`, Qwen3's
    enable_thinking) a response without "</think>" - one that ran out of tokens while thinking -
    and any response whose "<think>" never closes; a draft "Answer:" inside the thinking never
    counts;
  * style "answer": after the last marker ("Answer:", "**Answer**:", "**Answer:**", "Final answer:",
    "The final answer is:", or a heading line "**Final Answer**"), the rest of its line, or the
    display block that follows when the line is empty ("**Answer:**" then "\\[ \\boxed{73} \\]").
    Several \\boxed{} there are parts of one answer, joined in order ("\\boxed{2} and \\boxed{-3}"
    -> "2, -3"; a hedge "\\boxed{3} or \\boxed{12}" is a list, never a single gold);
  * style "boxed": the content of the last closed \\boxed{} (earlier boxes are often intermediate).
  * style "number": the first number after the last "=", else the last number ("47 + 28 = 75."
    -> "75", "The sum is 75" -> "75"): a small chat model writes "a + b = c" however it is asked,
    so neither a bare number nor a marker is required, and what it is scored on is the sum.

Answer checking (`AnswerChecker`): an extracted answer equals the gold answer when
  1. their canonical strings agree (rpg_ref.math.normalize.canonical: integers, "025", "27.0",
     commas, units, \\dfrac, ...); otherwise, after `normalize.comparable_pair` (units,
     currency and remarks off; a label such as "xy =" dropped only where it names the asked value,
     and an equation never matching a value: "2x = 10" is not 10, "y = 5" is not "x = 5"),
  2. backend "math_verify" (the default "auto" picks it when the math-verify package is installed):
     math_verify.parse both sides wrapped in $...$ and math_verify.verify(gold, pred); or
     backend "normalizer": rpg_ref.math.normalize.answers_equal (a hand-written parser, no eval).
Extraction and checking both run in a worker process with a per-answer time limit (`timeout_s`,
default 5 s); the caller's process only cuts the text (`answer_region`: str.rfind and slicing), so
no response can stall it. The limit is wall-clock time from when a READY worker receives the answer:
a worker says "ready" after its imports and a warm-up check, and `num_workers` checks run at a time
with one more worker kept started as a spare, so a worker killed for a timeout is replaced at once
and no answer is charged for a start-up. On timeout the worker is killed, the answer is scored as
WRONG, and `stats["timeouts"]` counts it; an exception inside a check also scores as wrong
(`stats["errors"]`). Extracted answers longer than MAX_ANSWER_CHARS are wrong without a check
(`stats["too_long"]`). A worker is a fresh `python -m rpg_ref.math.reward --worker BACKEND`
subprocess talking over pipes (select-based, so POSIX: Linux and macOS), which is safe to start from
a process that holds a CUDA context or threads and never re-imports the caller's __main__.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from rpg_ref.math.normalize import answers_equal, canonical, comparable_pair

PAPER_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
PAPER_REMINDER = 'Remember to put your answer on its own line after "Answer:".'
BOXED_INSTRUCTION = (
    "Solve the following math problem step by step, and give your final answer in the form "
    "\\boxed{answer} at the end of your response."
)
NUMBER_INSTRUCTION = "Answer with just the number."
STYLES = ("answer", "boxed", "number")
NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
SCORINGS = ("pm1", "binary")
BACKENDS = ("auto", "math_verify", "normalizer")
MAX_ANSWER_CHARS = 1000
# Only the last MAX_TAIL_CHARS characters of a response (after "</think>") are searched for the
# answer: room for an answer of MAX_ANSWER_CHARS plus 3,000 characters (about 750 tokens) of closing
# text after it. It bounds the work and the bytes sent per response whatever a model produces
# (verl's DAPO reward looks at the last 300 characters only; the longest MATH-500 gold has 159).
MAX_TAIL_CHARS = 4000
# a checker worker that is not ready by then is an error, not a wrong answer
STARTUP_LIMIT_S = 120.0


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
    if style == "number":
        return f"{problem} {NUMBER_INSTRUCTION}"
    return f"{problem}\n\n{BOXED_INSTRUCTION}"


def chat_prompt(
    tokenizer, problem: str, style: str = "answer", enable_thinking: bool = False
) -> str:
    """The prompt text through the tokenizer's chat template, ending with the assistant header.

    `enable_thinking` is passed to templates that use it (Qwen3: False appends an empty
    <think></think> block so the model answers directly; True lets it think first).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "tokenizer has no chat_template; math prompts need a chat model's tokenizer"
        )
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message(problem, style)}],
        tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking)


def chat_prompt_ids(tokenizer, problem: str, style: str = "answer",
                    enable_thinking: bool = False) -> list[int]:
    """Token ids of `chat_prompt` (special tokens come from the template text itself)."""
    text = chat_prompt(tokenizer, problem, style, enable_thinking)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------------- extraction
def answer_region(text: str, thinking: bool = False) -> str | None:
    """Where the final answer is looked for: the text after the last "</think>", cut to its last
    MAX_TAIL_CHARS characters; None when the thinking is unfinished (`thinking` is on and there is
    no "</think>", or a "<think>" is never closed). Only str.rfind and slicing: linear and cheap, so
    this is the one step that runs in the caller's process."""
    end = text.rfind("</think>")
    if end >= 0:
        text = text[end + len("</think>"):]
    elif thinking or "<think>" in text:
        return None
    return text[-MAX_TAIL_CHARS:]


# a box opener, an escaped brace or row break (not braces), or a brace
_BRACE_TOKEN_RE = re.compile(r"\\(?:boxed|fbox)\s*\{|\\[\\{}]|[{}]")
_MARKER_RE = re.compile(r"\banswer(?:[ \t]+is)?[ \t*_}]{0,8}:"         # Answer: / **Answer**: / ...
                        # a heading "**Final Answer**"
                        r"|^[ \t#>*_]{0,12}(?:\\textbf\{)?(?:final[ \t]+)?answer[ \t*_}]{0,12}$",
                        re.IGNORECASE | re.MULTILINE)
_BLOCKS = (("\\[", "\\]"), ("$$", "$$"), ("\\(", "\\)"), ("$", "$"))
_BEGIN_RE = re.compile(r"\\begin\{([A-Za-z]+\*?)\}")
_SENTENCE_END_RE = re.compile(r"\.\s+(?=[A-Z])")
_PHRASE_RE = re.compile(r"^(?:[A-Za-z][A-Za-z',]*\s+){0,12}?(?:is|are|equals|was)\s+(?=\S)")


def _boxes(text: str) -> tuple[list, dict]:
    """(outer boxes, every closed box by start) for each \\boxed{...}/\\fbox{...} whose brace
    closes; a box is (start, content_start, content_end) and an outer box is inside no other. One
    pass with a stack of open braces: linear time (an unclosed box is skipped, never re-scanned)."""
    stack, by_start = [], {}
    for m in _BRACE_TOKEN_RE.finditer(text):
        tok = m.group()
        if tok == "{":
            stack.append((-1, m.end()))
        elif tok == "}":
            if stack:
                start, content = stack.pop()
                if start >= 0:
                    by_start[start] = (start, content, m.start())
        elif tok[1] in "bf":
            stack.append((m.start(), m.end()))
    outer, last_end = [], -1
    for start in sorted(by_start):
        if start > last_end:
            outer.append(by_start[start])
            last_end = by_start[start][2]
    return outer, by_start


def _box_content(text: str, box: tuple[int, int, int], by_start: dict) -> str:
    """A box's content, with boxes that fill it unwrapped (\\boxed{\\boxed{5}} -> 5); linear."""
    _, lo, hi = box
    while True:
        while lo < hi and text[lo].isspace():
            lo += 1
        while hi > lo and text[hi - 1].isspace():
            hi -= 1
        inner = by_start.get(lo)
        if inner is None or inner[2] != hi - 1:
            return text[lo:hi]
        _, lo, hi = inner


def _joined_boxes(text: str, boxes: list, by_start: dict) -> str | None:
    """The boxes' contents in order, each distinct one once, joined by ", ". For the "Answer:" line:
    everything on it is the answer, so several boxes there are parts of one answer ("\\boxed{2}
    and \\boxed{-3}" -> "2, -3"), and a hedge "\\boxed{3} or \\boxed{12}" is a list that never
    equals a single gold."""
    contents = []
    for box in boxes:
        c = _box_content(text, box, by_start)
        if c and c not in contents:
            contents.append(c)
    return ", ".join(contents) or None


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) with balanced braces, else None
    (linear)."""
    outer, by_start = _boxes(text)
    return _box_content(text, outer[-1], by_start) if outer else None


def _first_block(rest: str) -> str:
    """The answer after a marker: the rest of its line, or, when a math block opened there
    ("\\[", "$$", \\begin{..}) closes only on a later line, the whole block."""
    line = rest.split("\n", 1)[0]
    m = _BEGIN_RE.match(rest)
    blocks = ((m.group(), f"\\end{{{m.group(1)}}}"),) if m else _BLOCKS
    for opener, closer in blocks:
        if rest.startswith(opener) and closer not in line[len(opener):]:
            end = rest.find(closer, len(opener))
            if end >= 0:
                return rest[:end + len(closer)]
    return line


def _tidy(ans: str) -> str:
    """Remove markdown, "The answer is", a following sentence ("$5$. I hope it is correct."), a
    full stop or line break, and $...$ / \\(...\\) / \\[...\\] around the answer."""
    for _ in range(2):
        ans = _SENTENCE_END_RE.split(_PHRASE_RE.sub("", ans.strip().strip("*`").strip()), 1)[0]
        ans = ans.strip().removesuffix("\\\\").removesuffix(".").strip()
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(ans) > len(left) + len(right) and ans.startswith(left) and ans.endswith(right) \
                    and not ans.endswith("\\" + right):
                ans = ans[len(left):-len(right)].strip()
                break
    return ans


def final_number(text: str) -> str | None:
    """The first number after the last "=", else the last number, else None (style "number")."""
    after = NUMBER_RE.search(text, text.rfind("=") + 1) if "=" in text else None
    if after is not None:
        return after.group()
    last = deque(NUMBER_RE.finditer(text), maxlen=1)
    return last[0].group() if last else None


def bare_number(text: str) -> str | None:
    """The response when it is nothing but a number (a full stop after it allowed), else None: the
    strict reading of "Answer with just the number"."""
    t = text.strip().removesuffix(".").strip()
    return t if NUMBER_RE.fullmatch(t) else None


def bare_number_correct(text: str, gold) -> bool:
    """The response is a bare number (`bare_number`) equal to the gold answer as a canonical
    string."""
    pred = bare_number(text)
    return pred is not None and canonical(pred) == canonical(_gold_text(gold))


def _extract(region: str, style: str) -> str | None:
    """The final answer in an answer region (see `extract_answer`); linear in len(region)."""
    if style == "boxed":
        return last_boxed(region)
    if style == "number":
        return final_number(region)
    last = deque(_MARKER_RE.finditer(region), maxlen=1)  # the last one counts
    if not last:
        return None
    marker = last[0]
    rest = region[marker.end():].lstrip(" \t*_}`")
    if not rest.split("\n", 1)[0].strip():  # "**Answer:**" with the answer on the next lines
        rest = rest.lstrip()
    ans = _first_block(rest)
    outer, by_start = _boxes(ans)
    ans = _joined_boxes(ans, outer, by_start) if outer else _tidy(ans)
    return ans or None


def extract_answer(text: str, style: str = "answer", thinking: bool = False) -> str | None:
    """The final answer of a response, or None when it has none in the requested form.

    Only `answer_region(text, thinking)` is searched: after the last "</think>", the last
    MAX_TAIL_CHARS characters; nothing when the thinking is unfinished.
    style "answer": after the LAST answer marker ("Answer:", "**Answer**:", "**Answer:**",
    "Final answer:", or a heading line "**Final Answer**"): the rest of its line, or when that is
    empty the block that follows ("\\[ \\boxed{73} \\]" on the next lines). Boxes in it are
    unwrapped (several: their contents joined by ", "); else markdown, "The answer is", a full stop
    and
    $...$ around it are removed.
    style "boxed": the content of the last \\boxed{...} (the usual convention: earlier boxes are
    often intermediate results; the instruction asks for one box at the end).
    style "number": the first number after the last "=", else the last number.
    Linear time in len(text).
    """
    _check_style(style)
    if not isinstance(text, str):
        raise ValueError(f"response must be a string, got {type(text).__name__}")
    region = answer_region(text, thinking)
    return None if region is None else _extract(region, style)


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


def _match(pred: str, gold: str, backend: str) -> tuple[bool, bool]:
    """(equal, decided by canonical strings alone) for an extracted answer and a gold string."""
    if canonical(pred) == canonical(gold):
        return True, True
    # decorations off, labels aligned: the same for both backends
    pair = comparable_pair(pred, gold)
    if pair is None:
        return False, False
    if canonical(pair[0]) == canonical(pair[1]):
        return True, True
    if backend == "math_verify":
        return _math_verify_equal(*pair), False
    return answers_equal(*pair), False


def answers_match(pred: str | None, gold, backend: str = "auto") -> bool:
    """Untimed check of one extracted answer against a gold answer (see the module docstring).

    Runs sympy/math-verify in the calling process: use AnswerChecker for model outputs.
    """
    backend = _resolve_backend(backend)
    gold_s = _gold_text(gold)
    if pred is None or len(pred) > MAX_ANSWER_CHARS:
        return False
    return _match(pred, gold_s, backend)[0]


def _score_job(job: dict, backend: str) -> dict:
    """One worker job: extract the answer (when given a response region) and check it."""
    ans = job["answer"] if "answer" in job else _extract(job["region"], job["style"])
    out = {"ok": False, "answer": ans, "how": "checked", "error": None}
    if ans is None:
        out["how"] = "no_answer"
    elif len(ans) > MAX_ANSWER_CHARS:
        out["how"] = "too_long"
    else:
        try:
            out["ok"], fast = _match(ans, job["gold"], backend)
            out["how"] = "fast_path" if fast else "checked"
        except Exception as e:  # noqa: BLE001  a crash in sympy/math-verify means "not verified", reported
            out["error"] = f"{type(e).__name__}: {e}"
    return out


def _serve(backend: str) -> None:
    """Worker loop (`python -m rpg_ref.math.reward --worker BACKEND`): warms up, writes "ready",
    then answers one JSON job per stdin line with one JSON result per stdout line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the parent's to handle:
    out = sys.stdout.buffer                       # it closes stdin, which ends this loop
    _score_job({"region": "Answer: $x = \\frac{1}{2}$", "style": "answer", "gold": "0.5"}, backend)
    _score_job({"answer": "(1, \\sqrt{2})", "gold": "(1, 2^{1/2})"}, backend)
    out.write(b'"ready"\n')  # imports and first-call set-up are done: time limits start from here
    out.flush()
    for line in sys.stdin.buffer:
        out.write(json.dumps(_score_job(json.loads(line), backend)).encode() + b"\n")
        out.flush()


class _Worker:
    """A checker subprocess: a fresh interpreter (no fork of a CUDA/threaded parent, no
    re-import of the caller's __main__), talking JSON lines over pipes. It takes jobs only once
    it has said "ready", so its start-up is never part of an answer's time limit."""

    command: ClassVar[list] = [sys.executable, "-m", "rpg_ref.math.reward", "--worker"]  # + backend

    def __init__(self, backend: str):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen([*self.command, backend], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.buf = b""
        self.ready = False
        self.start_deadline = time.monotonic() + STARTUP_LIMIT_S
        self.job: int | None = None
        self.sent_at = 0.0

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def send(self, job: int, msg: dict) -> None:
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        # the limit starts when a ready worker has it
        self.job, self.sent_at = job, time.monotonic()

    def read_messages(self) -> list:
        """The whole lines that have arrived; raises EOFError when the worker has died."""
        data = os.read(self.fileno(), 1 << 16)
        if not data:
            raise EOFError("answer-checker worker exited")
        *lines, self.buf = (self.buf + data).split(b"\n")
        return [json.loads(line) for line in lines]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            # a job still buffered for a dead worker: no one reads it
            with contextlib.suppress(OSError):
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
    unfinished_thinking: int = 0  # part of no_answer: no "</think>" (see answer_region)
    too_long: int = 0
    fast_path: int = 0
    timeouts: int = 0
    errors: int = 0
    max_seconds: float = 0.0  # the longest single check (from a ready worker receiving it)
    error_examples: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "error_examples"}

    def add(self, other: CheckStats) -> None:
        for k, v in other.as_dict().items():
            setattr(
                self, k, max(self.max_seconds, v) if k == "max_seconds" else getattr(self, k) + v
            )
        self.error_examples = (self.error_examples + other.error_examples)[-10:]


class AnswerChecker:
    """Checks many answers against gold answers with a per-answer time limit.

    `check_responses` takes whole responses: extraction and checking both run in a worker
    process. `check` takes answers already extracted. Worker processes start lazily and are
    reused: `num_workers` checks run at a time, and one more worker is kept started and ready,
    so a worker killed for a timeout is replaced at once and the next answer never waits on a
    start-up. Use as a context manager or call close(). `stats` accumulates over calls (see
    CheckStats); `last_stats` holds the last call's counts, `last_seconds` each answer's check
    time (None when no check ran).
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
        self._failed_starts = 0
        self.stats = CheckStats()
        self.last_stats = CheckStats()
        self.last_seconds: list[float | None] = []

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
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to clean reliably
            self.close()

    # -- checking
    def check(self, preds: Sequence[str | None], golds: Sequence) -> list[bool]:
        """One bool per pair: True when the extracted answer `preds[i]` matches `golds[i]`."""
        if len(preds) != len(golds):
            raise ValueError(f"{len(preds)} answers but {len(golds)} gold answers")
        golds_s = [_gold_text(g) for g in golds]
        for i, p in enumerate(preds):
            if p is not None and not isinstance(p, str):
                raise ValueError(f"answer {i} must be a string or None, got {type(p).__name__}")
        jobs = [None if p is None else {"answer": p, "gold": g} for p, g in zip(preds, golds_s)]
        return self._score(jobs, unfinished=0)[0]

    def check_responses(self, responses: Sequence[str], golds: Sequence, style: str = "answer",
                        thinking: bool = False) -> tuple[list[bool], list[str | None]]:
        """(correct, extracted answers) for whole responses: `extract_answer(responses[i], style,
        thinking)` checked against `golds[i]`, both inside the time-limited worker."""
        _check_style(style)
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
        golds_s = [_gold_text(g) for g in golds]
        for i, r in enumerate(responses):
            if not isinstance(r, str):
                raise ValueError(f"response {i} must be a string, got {type(r).__name__}")
        regions = [answer_region(r, thinking) for r in responses]
        jobs = [None if r is None else {"region": r, "style": style, "gold": g}
                for r, g in zip(regions, golds_s)]
        return self._score(jobs, unfinished=sum(r is None for r in regions))

    def _score(self, jobs: list, unfinished: int) -> tuple[list[bool], list[str | None]]:
        st = CheckStats(checked=len(jobs), unfinished_thinking=unfinished)
        results = self._run(jobs)
        self.last_seconds = [None if r is None else r["seconds"] for r in results]
        for r in results:
            if r is None:
                st.no_answer += 1
                continue
            if r["how"] in ("no_answer", "too_long", "fast_path"):
                setattr(st, r["how"], getattr(st, r["how"]) + 1)
            if r["how"] == "timeout":
                st.timeouts += 1
            if r["error"] is not None:
                st.errors += r["how"] != "timeout"
                st.error_examples.append(r["error"])
            st.max_seconds = max(st.max_seconds, r["seconds"])
        correct = [bool(r and r["ok"]) for r in results]
        st.correct = sum(correct)
        self.last_stats = st
        self.stats.add(st)
        return correct, [r and r["answer"] for r in results]

    def _run(self, jobs: list) -> list:
        """Results (dicts from `_score_job` plus "seconds") for the non-None jobs, None
        elsewhere."""
        results = [None] * len(jobs)
        queue = [i for i, j in enumerate(jobs) if j is not None][::-1]
        if not queue:
            return results
        while len(self._workers) < min(self.num_workers, len(queue)) + 1:  # + 1: the warm spare
            self._workers.append(_Worker(self.backend))
        while True:
            busy = [w for w in self._workers if w.job is not None]
            # jobs to ready idle workers, num_workers at a time
            for k, w in enumerate(self._workers):
                if queue and len(busy) < self.num_workers and w.ready and w.job is None:
                    i = queue.pop()
                    try:
                        w.send(i, jobs[i])
                    except OSError:  # it died while idle (killed from outside): replace, retry
                        queue.append(i)
                        w.job = None
                        w.kill()
                        self._workers[k] = _Worker(self.backend)
                        continue
                    busy.append(w)
            if not busy and not queue:
                return results
            starting = [w for w in self._workers if not w.ready]
            wake = [w.sent_at + self.timeout_s for w in busy] + [w.start_deadline for w in starting]
            readable, _, _ = select.select(busy + starting, [], [],
                                           max(0.0, min(wake) - time.monotonic()))
            for w in readable:
                self._receive(w, jobs, results)
            now = time.monotonic()
            for k, w in enumerate(self._workers):
                # kill; the spare goes on
                if w.job is not None and now >= w.sent_at + self.timeout_s:
                    results[w.job] = {"ok": False, "answer": None, "how": "timeout",
                                      "seconds": now - w.sent_at, "error": f"timeout after "
                                      f"{self.timeout_s} s: {_job_text(jobs[w.job])!r:.80}"}
                    w.kill()
                    self._workers[k] = _Worker(self.backend)
                elif not w.ready and now >= w.start_deadline:
                    raise RuntimeError(f"an answer-checker worker did not start within "
                                       f"{STARTUP_LIMIT_S:.0f} s (python -m rpg_ref.math.reward "
                                       f"--worker {self.backend})")

    def _receive(self, w: _Worker, jobs: list, results: list) -> None:
        try:
            messages = w.read_messages()
        except EOFError:
            k = self._workers.index(w)
            w.kill()
            if not w.ready:  # killed from outside (a signal): start another, up to 3 times in a row
                self._failed_starts += 1
                if w.proc.returncode >= 0 or self._failed_starts > 3:
                    raise RuntimeError(
                        f"an answer-checker worker exited while starting (exit "
                        f"code {w.proc.returncode}); its error output is above"
                    ) from None
            if w.job is not None:  # it died on this job (e.g. out of memory): wrong + error
                results[w.job] = {
                    "ok": False,
                    "answer": None,
                    "how": "checked",
                    "seconds": time.monotonic() - w.sent_at,
                    "error": "answer-checker worker died",
                }
            self._workers[k] = _Worker(self.backend)
            return
        for msg in messages:
            if msg == "ready":
                w.ready = True
                self._failed_starts = 0
            else:
                results[w.job] = dict(msg, seconds=time.monotonic() - w.sent_at)
                w.job = None


def _job_text(job: dict) -> str:
    return job["answer"] if "answer" in job else job["region"][-200:]


# ---------------------------------------------------------------------------- scoring
class MathReward:
    """reward(responses, golds) -> (rewards, info) for the math task: rewards[i] = score(correct_i).

    `thinking`: the prompts had thinking on, so a response without "</think>" has no answer (see
    `answer_region`).
    """

    def __init__(self, style: str = "answer", scoring: str = "pm1", backend: str = "auto",
                 timeout_s: float = 5.0, num_workers: int = 1, thinking: bool = False):
        _check_style(style)
        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
        self.style, self.scoring, self.thinking = style, scoring, bool(thinking)
        self.checker = AnswerChecker(backend, timeout_s, num_workers)

    def __call__(self, responses: Sequence[str], golds: Sequence) -> tuple[list[float], dict]:
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
        correct, preds = self.checker.check_responses(responses, golds, self.style, self.thinking)
        wrong = -1.0 if self.scoring == "pm1" else 0.0
        rewards = [1.0 if c else wrong for c in correct]
        info = {"correct": correct, "answers": preds, "check": self.checker.last_stats.as_dict()}
        return rewards, info

    def close(self) -> None:
        self.checker.close()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--worker" or sys.argv[2] not in BACKENDS[1:]:
        raise SystemExit("usage: python -m rpg_ref.math.reward --worker {math_verify,normalizer}  "
                         "(internal answer-checker worker)")
    _serve(sys.argv[2])
