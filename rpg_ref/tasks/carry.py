"""The ``carry`` task: multi-digit addition with a written scratchpad, one step per digit.

A laptop-sized reasoning task: the policy may write its work before the answer, and the work is
what makes long sums solvable. Prompt "a+b=" (operands of 1..--carry-max-digits digits, most
significant digit first); a response is either

    reasoning:  a0 b0 c0 s0 ;  a1 b1 c1 s1 ;  ...  > answer EOS      (5 tokens a digit)
    direct:     > answer EOS

where step i reads the i-th digits from the right of a and b (0 past an operand's end), the carry
c_i into it, and writes s_i = (a_i + b_i + c_i) mod 10; the answer is a + b, most significant
digit first, which the work gives read backwards. Reasoning responses are 5n + 2 + len(a + b)
tokens long (n = the longer operand's digits), so lengths vary across problems.

Two measures, as in RL for LLMs where the reward is a proxy of what is wanted:
- ``correct`` (the gold measure, logged as accuracy; greedy held-out accuracy is the evaluation):
  the digits after the first ">" are exactly a + b, followed by EOS;
- the training reward: correct minus --carry-token-cost per response token, an efficiency reward
  that a policy can exploit by answering directly: short, cheap, and often wrong on long sums.

The random-init policy is warm-started by a short supervised phase on a mixture of reasoning
(1 - --carry-direct-frac) and direct responses, like a pretrained model that sometimes writes its
work and sometimes does not. RL then raises the accuracy of the work it writes; the KL term to the
warm start is what keeps it writing (docs/carry_task.md). The warm-started weights are cached in
--cache-dir, keyed by the model config, the warm-start options and --init-seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from rpg_ref.interfaces import Prompt
from rpg_ref.tasks.tiny_lm import TinyLM, TinyLMOptions

# the options that shape the warm-started weights (the cache key); the reward's and the
# evaluation's options do not
WARM_KEYS = ("max_digits", "direct_frac", "hidden", "layers", "heads", "warm_steps", "warm_lr",
             "warm_batch")
EVAL_SEED = 20240611  # the evaluation's own sampling stream: the same draws at every evaluation


class CarryTask:
    """The Task protocol for addition with a scratchpad (module docstring)."""

    name = "carry"
    default_engine = "hf"
    evaluation = "held-out"
    PLUS, EQ, BOS, EOS, PAD, STEP, ANSWER, VOCAB = 10, 11, 12, 13, 14, 15, 16, 18
    eos_id, pad_id = EOS, PAD
    TOKENS = "0123456789+=^$_;>"  # one character per id, for reading responses (``show``)

    @dataclass
    class Options(TinyLMOptions):
        TASK: ClassVar[str] = "carry"

        max_digits: int = field(default=6, metadata={"help": "operands have 1..max-digits digits"})
        direct_frac: float = field(
            default=0.3, metadata={"help": "share of direct answers (no work) in the warm start"})
        credit: str = field(
            default="exact", metadata={"help": "training reward's credit: 'exact' (1 for the "
                                       "right answer) or 'digits' (the share of its digits right)"})
        token_cost: float = field(
            default=0.02, metadata={"help": "training reward: correct minus this per response "
                                            "token (0: reward = correct)"})
        warm_steps: int = field(
            default=800, metadata={"help": "supervised warm-start steps (0 = none)"})
        eval_size: int = field(
            default=256, metadata={"help": "held-out problems of the evaluation"})
        eval_samples: int = field(
            default=4, metadata={"help": "k of the evaluation's Mean@k: responses sampled per "
                                         "held-out problem at --temperature (the paper reports "
                                         "Mean@32); 0: one greedy response each"})

        def __post_init__(self):
            self.check(("max-digits", 1 <= self.max_digits <= 17, "in [1, 17]"),
                       ("direct-frac", 0 <= self.direct_frac <= 1, "in [0, 1]"),
                       ("credit", self.credit in ("exact", "digits"), "'exact' or 'digits'"),
                       ("token-cost", 0 <= self.token_cost < math.inf, "finite and >= 0"),
                       ("eval-size", self.eval_size >= 1, ">= 1"),
                       ("eval-samples", self.eval_samples >= 0, ">= 0"))

    def __init__(self, cfg, device: torch.device):
        self.opt = self.Options(**cfg.task_options)
        self.cfg, self.device = cfg, device
        need = self.max_response_len(self.opt.max_digits)
        if cfg.max_new_tokens < need:
            raise ValueError(f"carry with --carry-max-digits {self.opt.max_digits} needs "
                             f"--max-new-tokens >= {need} (the longest worked answer)")
        self.eval_prompts = self.sample_prompts(self.opt.eval_size,
                                                torch.Generator().manual_seed(12345))
        D = self.opt.max_digits  # prompt + longest response: 54 at the default 6 digits
        self.lm = TinyLM(self.VOCAB, self.BOS, self.EOS, self.PAD,
                         max_positions=max(128, 2 * D + 3 + self.max_response_len(D)))

    @staticmethod
    def max_response_len(digits: int) -> int:
        return 5 * digits + 1 + (digits + 1) + 1

    # --- problems and answers ---

    def sample_prompts(self, n, gen):
        D, out = self.opt.max_digits, []
        for _ in range(n):
            da, db = (int(x) for x in torch.randint(1, D + 1, (2,), generator=gen))
            a, b = (int(torch.randint(10 ** (d - 1) if d > 1 else 0, 10**d, (1,), generator=gen))
                    for d in (da, db))
            ids = [self.BOS, *map(int, str(a)), self.PLUS, *map(int, str(b)), self.EQ]
            out.append(Prompt(ids=ids, answer=(a, b)))
        return out

    def work(self, a: int, b: int) -> list:
        """The scratchpad of a + b: one step (a_i, b_i, c_i, s_i, ';') per digit, LSB first."""
        n, steps, carry = max(len(str(a)), len(str(b))), [], 0
        for i in range(n):
            ai, bi = a // 10**i % 10, b // 10**i % 10
            s = ai + bi + carry
            steps += [ai, bi, carry, s % 10, self.STEP]
            carry = s // 10
        return steps

    def target(self, a: int, b: int, direct: bool) -> list:
        """The warm start's response: the work (unless direct), '>', a + b, EOS."""
        return ([] if direct else self.work(a, b)) + [self.ANSWER, *map(int, str(a + b)), self.EOS]

    def reward(self, prompts, responses):
        ok = torch.tensor([self._correct(p.answer, r) for p, r in zip(prompts, responses)])
        credit = (ok.float() if self.opt.credit == "exact" else torch.tensor(
            [self._digits_right(p.answer, r) for p, r in zip(prompts, responses)]))
        lengths = torch.tensor([len(r) for r in responses], dtype=torch.float32)
        r = credit - self.opt.token_cost * lengths
        return r.to(self.device), ok.to(self.device)

    def _correct(self, answer, response: list) -> bool:
        if self.ANSWER not in response:
            return False
        tail = response[response.index(self.ANSWER) + 1:]
        return tail == [*map(int, str(answer[0] + answer[1])), self.EOS]

    def _digits_right(self, answer, response: list) -> float:
        """The share of the answer's digits right, aligned from the least significant, over the
        longer of the true and the written answer (0 without '>' ... EOS)."""
        if self.ANSWER not in response or response[-1] != self.EOS:
            return 0.0
        got = response[response.index(self.ANSWER) + 1:-1]
        want = [*map(int, str(answer[0] + answer[1]))]
        if any(t > 9 for t in got):
            return 0.0
        same = sum(x == y for x, y in zip(reversed(got), reversed(want)))
        return same / max(len(got), len(want))

    def reasons(self, response: list) -> bool:
        """Whether a response writes work before its answer (anything before the first '>')."""
        return bool(response) and response[0] != self.ANSWER

    def show(self, ids: list) -> str:
        return "".join(self.TOKENS[i] if i < len(self.TOKENS) else "?" for i in ids)

    # --- the policy ---

    def build_policy(self) -> nn.Module:
        warm = {k: getattr(self.opt, k) for k in WARM_KEYS}
        return self.lm.build(self.opt, self.cfg, self.device, warm, self._examples)

    def _examples(self, gen: torch.Generator) -> list:
        """A warm-start batch: random problems, each written with its work or directly
        (--carry-direct-frac)."""
        ps = self.sample_prompts(self.opt.warm_batch, gen)
        direct = (torch.rand(len(ps), generator=gen) < self.opt.direct_frac).tolist()
        return [(p.ids, self.target(*p.answer, d)) for p, d in zip(ps, direct)]

    # --- evaluation ---

    def evaluate(self, policy, engine):
        """Mean@k on the held-out problems: k responses each at the run's --temperature, sampled
        from a stream of its own (the same draws at every evaluation; the training stream is
        left as it was), or greedy accuracy with --carry-eval-samples 0; with the share of
        responses that write their work and their mean length."""
        k = self.opt.eval_samples
        name, n, temperature = ("sampled", k, self.cfg.temperature) if k else ("greedy", 1, 0.0)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(EVAL_SEED)
            gen = engine.generate([p.ids for p in self.eval_prompts], n, temperature, 1.0,
                                  self.cfg.max_new_tokens)
        prompts = [p for p in self.eval_prompts for _ in range(n)]
        _, correct = self.reward(prompts, gen.responses)
        return {f"{name}_accuracy": float(correct.float().mean()),
                f"{name}_reasoning": sum(map(self.reasons, gen.responses)) / len(prompts),
                f"{name}_len": sum(map(len, gen.responses)) / len(prompts)}

    def summary(self, policy, cfg):
        return {}
