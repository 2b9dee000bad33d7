"""The ``seq`` task: digit addition "a+b=" -> the digits of a+b then EOS, with a tiny Qwen3.

Tokens: 0-9 digits, 10 '+', 11 '=', 12 BOS, 13 EOS, 14 PAD. The answer is written least
significant digit first (the order in which a carry is computed), no leading zeros.
Reward 1 for an exact answer followed by EOS, else 0 (accuracy = reward before penalties).
The random-init policy (rpg_ref.tasks.tiny_lm) is first warm-started by a short supervised phase
on (prompt, answer) pairs so that it solves some problems; RL then raises the accuracy. The
warm-started weights are cached in --cache-dir, keyed by the model config, the warm-start options
and the initialization seed (--init-seed, default --seed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from rpg_ref.interfaces import Prompt
from rpg_ref.tasks.tiny_lm import TinyLM, TinyLMOptions


class SeqTask:
    """The Task protocol for digit addition (module docstring)."""

    name = "seq"
    default_engine = "hf"
    evaluation = "held-out"
    PLUS, EQ, BOS, EOS, PAD, VOCAB = 10, 11, 12, 13, 14, 16
    eos_id, pad_id = EOS, PAD

    @dataclass
    class Options(TinyLMOptions):
        TASK: ClassVar[str] = "seq"

        digits: int = field(default=2, metadata={"help": "digits per operand"})
        eval_size: int = field(
            default=256, metadata={"help": "held-out problems for greedy evaluation"}
        )

        def __post_init__(self):
            # operands below 10^18: int64
            self.check(("digits", 1 <= self.digits <= 18, "in [1, 18]"),
                       ("eval-size", self.eval_size >= 1, ">= 1"))

    def __init__(self, cfg, device: torch.device):
        self.opt = self.Options(**cfg.task_options)
        self.cfg, self.device = cfg, device
        need = self.opt.digits + 2
        if cfg.max_new_tokens < need:
            raise ValueError(
                f"seq with {self.opt.digits}-digit operands needs --max-new-tokens >= {need}"
            )
        self.eval_prompts = self.sample_prompts(
            self.opt.eval_size, torch.Generator().manual_seed(12345)
        )
        self.lm = TinyLM(self.VOCAB, self.BOS, self.EOS, self.PAD, max_positions=64)

    def _answer(self, s: int) -> list:
        return [int(c) for c in reversed(str(s))]

    def sample_prompts(self, n, gen):
        d = self.opt.digits
        out = []
        for a, b in torch.randint(0, 10**d, (n, 2), generator=gen).tolist():
            ids = ([self.BOS] + [int(c) for c in f"{a:0{d}d}"] + [self.PLUS]
                   + [int(c) for c in f"{b:0{d}d}"] + [self.EQ])
            out.append(Prompt(ids=ids, answer=self._answer(a + b)))
        return out

    def reward(self, prompts, responses):
        ok = torch.tensor([r == p.answer + [self.EOS] for p, r in zip(prompts, responses)])
        return ok.float().to(self.device), ok.to(self.device)

    def build_policy(self) -> nn.Module:
        warm = {k: v for k, v in dataclasses.asdict(self.opt).items() if k != "eval_size"}
        return self.lm.build(self.opt, self.cfg, self.device, warm, self._examples)

    def _examples(self, gen: torch.Generator) -> list:
        """A warm-start batch: random problems with their answers."""
        return [(p.ids, p.answer + [self.EOS])
                for p in self.sample_prompts(self.opt.warm_batch, gen)]

    def evaluate(self, policy, engine):
        gen = engine.generate(
            [p.ids for p in self.eval_prompts], 1, 0.0, 1.0, self.cfg.max_new_tokens
        )
        _, correct = self.reward(self.eval_prompts, gen.responses)
        return {"greedy_accuracy": float(correct.float().mean())}

    def summary(self, policy, cfg):
        return {}
