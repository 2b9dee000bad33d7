"""The ``seq`` task: digit addition "a+b=" -> the digits of a+b then EOS, with a tiny Qwen3.

Tokens: 0-9 digits, 10 '+', 11 '=', 12 BOS, 13 EOS, 14 PAD. The answer is written least
significant digit first (the order in which a carry is computed), no leading zeros.
Reward 1 for an exact answer followed by EOS, else 0 (accuracy = reward before penalties).
The random-init policy is first warm-started by a short supervised phase on (prompt, answer) pairs
so that it solves some problems; RL then raises the accuracy. The warm-started weights are cached
in --cache-dir, keyed by the model config, the warm-start options and the initialization seed
(--init-seed, default --seed).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from rpg_ref.interfaces import Prompt, init_seed
from rpg_ref.tasks.warm_cache import cached_warm_start


class SeqTask:
    """The Task protocol for digit addition (module docstring)."""

    name = "seq"
    default_engine = "hf"
    evaluation = "held-out"
    PLUS, EQ, BOS, EOS, PAD, VOCAB = 10, 11, 12, 13, 14, 16
    eos_id, pad_id = EOS, PAD

    @dataclass
    class Options:
        digits: int = field(default=2, metadata={"help": "digits per operand"})
        hidden: int = field(default=128, metadata={"help": "model width"})
        layers: int = field(default=2, metadata={"help": "transformer layers"})
        heads: int = field(default=4, metadata={"help": "attention heads"})
        warm_steps: int = field(
            default=250, metadata={"help": "supervised warm-start steps (0 = none)"}
        )
        warm_lr: float = field(default=3e-3, metadata={"help": "warm-start learning rate"})
        warm_batch: int = field(default=64, metadata={"help": "warm-start batch size"})
        eval_size: int = field(
            default=256, metadata={"help": "held-out problems for greedy evaluation"}
        )

        def __post_init__(self):
            # operands below 10^18: int64; a head at least 1 wide
            for name, ok, rule in (("digits", 1 <= self.digits <= 18, "in [1, 18]"),
                                   ("hidden", self.hidden >= 1, ">= 1"),
                                   ("heads", 1 <= self.heads <= self.hidden,
                                    f"in [1, --seq-hidden {self.hidden}]"),
                                   ("layers", self.layers >= 1, ">= 1"),
                                   ("warm-steps", self.warm_steps >= 0, ">= 0"),
                                   ("warm-lr", 0 < self.warm_lr < math.inf, "finite and > 0"),
                                   ("warm-batch", self.warm_batch >= 1, ">= 1"),
                                   ("eval-size", self.eval_size >= 1, ">= 1")):
                if not ok:
                    value = getattr(self, name.replace("-", "_"))
                    raise ValueError(f"bad configuration: --seq-{name} must be {rule}, got {value}")

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

    def model_config(self):
        from transformers import Qwen3Config

        o = self.opt
        return Qwen3Config(
            vocab_size=self.VOCAB, hidden_size=o.hidden, intermediate_size=2 * o.hidden,
            num_hidden_layers=o.layers, num_attention_heads=o.heads,
            num_key_value_heads=max(1, o.heads // 2), head_dim=o.hidden // o.heads,
            max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=self.BOS,
            eos_token_id=self.EOS, pad_token_id=self.PAD, attn_implementation="sdpa")

    def build_policy(self) -> nn.Module:
        from transformers import Qwen3ForCausalLM

        mcfg = self.model_config()
        model = Qwen3ForCausalLM(mcfg).to(self.device)
        if self.opt.warm_steps == 0:
            return model
        warm = {k: v for k, v in dataclasses.asdict(self.opt).items() if k != "eval_size"}
        key = json.dumps([mcfg.to_dict(), warm, init_seed(self.cfg)], sort_keys=True, default=str)
        return cached_warm_start(model, self.cfg.cache_dir, "seq-warm", key, self._warm_start)

    def _warm_start(self, model: nn.Module) -> None:
        """Supervised phase: cross-entropy on the answer tokens of random problems (own
        generator)."""
        from rpg_ref.interfaces import task_progress

        gen = torch.Generator().manual_seed(init_seed(self.cfg) + 7)
        opt = torch.optim.AdamW(model.parameters(), lr=self.opt.warm_lr)
        bar = task_progress(self.opt.warm_steps, f"supervised warm start (cached in "
                            f"{self.cfg.cache_dir} for later runs)", self.cfg.progress)
        for _ in range(self.opt.warm_steps):
            ps = self.sample_prompts(self.opt.warm_batch, gen)
            seqs = [p.ids + p.answer + [self.EOS] for p in ps]
            L = max(map(len, seqs))
            ids = torch.full((len(seqs), L), self.PAD)  # [B, L] right-padded
            labels = torch.full((len(seqs), L), -100)  # [B, L] loss on answers only
            for i, (p, s) in enumerate(zip(ps, seqs)):
                ids[i, : len(s)] = torch.tensor(s)
                labels[i, len(p.ids) : len(s)] = torch.tensor(s[len(p.ids) :])
            ids, labels = ids.to(self.device), labels.to(self.device)
            loss = model(input_ids=ids, attention_mask=(ids != self.PAD).long(), labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()

    def evaluate(self, policy, engine):
        gen = engine.generate(
            [p.ids for p in self.eval_prompts], 1, 0.0, 1.0, self.cfg.max_new_tokens
        )
        _, correct = self.reward(self.eval_prompts, gen.responses)
        return {"greedy_accuracy": float(correct.float().mean())}

    def summary(self, policy, cfg):
        return {}
