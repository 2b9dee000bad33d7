"""The tiny language model of the seq and carry tasks: a small Qwen3 over a task's own token ids,
warm-started by a short supervised phase and cached.

A task gives its vocabulary, its special ids and its longest sequence (``TinyLM``), its options
(a subclass of ``TinyLMOptions``: the model's size and the warm start's steps, learning rate and
batch, each a flag ``--<task>-<option>``), the options that shape the warm-started weights (the
cache key, with the model config and --init-seed) and ``examples(gen)``: a warm-start batch of
(prompt ids, response ids) drawn from the warm start's own generator. The supervised loss is the
cross-entropy on the response tokens. The weights are cached in --cache-dir
(rpg_ref.tasks.warm_cache): a later run with the same key loads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from rpg_ref.interfaces import init_seed, task_progress
from rpg_ref.tasks.warm_cache import cached_warm_start


@dataclass
class TinyLMOptions:
    """The options every tiny-LM task has (its own ``Options`` adds the task's)."""

    TASK: ClassVar[str] = ""  # the task's name: its flags are --<TASK>-<option>

    hidden: int = field(default=128, metadata={"help": "model width"})
    layers: int = field(default=2, metadata={"help": "transformer layers"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    warm_steps: int = field(
        default=250, metadata={"help": "supervised warm-start steps (0 = none)"})
    warm_lr: float = field(default=3e-3, metadata={"help": "warm-start learning rate"})
    warm_batch: int = field(default=64, metadata={"help": "warm-start batch size"})

    def check(self, *rules: tuple) -> None:
        """The model's and the warm start's rules, then the task's own ``rules`` ((option, holds,
        what it must be) each): ValueError naming the first flag that breaks one."""
        for name, ok, rule in (
                ("hidden", self.hidden >= 1, ">= 1"),
                ("heads", 1 <= self.heads <= self.hidden,
                 f"in [1, --{self.TASK}-hidden {self.hidden}]"),
                ("layers", self.layers >= 1, ">= 1"),
                ("warm-steps", self.warm_steps >= 0, ">= 0"),
                ("warm-lr", 0 < self.warm_lr < math.inf, "finite and > 0"),
                ("warm-batch", self.warm_batch >= 1, ">= 1"),
                *rules):
            if not ok:
                value = getattr(self, name.replace("-", "_"))
                raise ValueError(f"bad configuration: --{self.TASK}-{name} must be {rule}, "
                                 f"got {value}")


@dataclass(frozen=True)
class TinyLM:
    """A task's tiny Qwen3: its vocabulary, special ids and longest sequence (prompt + response)."""

    vocab: int
    bos: int
    eos: int
    pad: int
    max_positions: int

    def config(self, opt: TinyLMOptions):
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=self.vocab, hidden_size=opt.hidden, intermediate_size=2 * opt.hidden,
            num_hidden_layers=opt.layers, num_attention_heads=opt.heads,
            num_key_value_heads=max(1, opt.heads // 2), head_dim=opt.hidden // opt.heads,
            max_position_embeddings=self.max_positions, tie_word_embeddings=True,
            bos_token_id=self.bos, eos_token_id=self.eos, pad_token_id=self.pad,
            attn_implementation="sdpa")

    def build(self, opt: TinyLMOptions, cfg, device: torch.device, warm_key: dict,
              examples: Callable[[torch.Generator], list]) -> nn.Module:
        """The policy: a random-init Qwen3 (the run's --init-seed is already set), warm-started
        on ``examples`` unless --<task>-warm-steps is 0, from the cache when a run has trained the
        same (model config, ``warm_key``, --init-seed)."""
        from transformers import Qwen3ForCausalLM

        mcfg = self.config(opt)
        model = Qwen3ForCausalLM(mcfg).to(device)
        if opt.warm_steps == 0:
            return model
        key = json.dumps([mcfg.to_dict(), warm_key, init_seed(cfg)], sort_keys=True, default=str)
        return cached_warm_start(model, cfg.cache_dir, f"{opt.TASK}-warm", key,
                                 lambda m: self.warm_start(m, opt, cfg, device, examples))

    def warm_start(self, model: nn.Module, opt: TinyLMOptions, cfg, device: torch.device,
                   examples: Callable[[torch.Generator], list]) -> None:
        """Supervised phase: AdamW on the cross-entropy of the response tokens of
        ``examples(gen)`` batches, from a generator of its own (--init-seed + 7). Its progress bar
        is cleared however the phase ends (Ctrl-C's line then stands on its own line)."""
        gen = torch.Generator().manual_seed(init_seed(cfg) + 7)
        adam = torch.optim.AdamW(model.parameters(), lr=opt.warm_lr)
        bar = task_progress(opt.warm_steps, f"supervised warm start (cached in {cfg.cache_dir} "
                            f"for later runs)", cfg.progress)
        try:
            for _ in range(opt.warm_steps):
                pairs = examples(gen)  # [(prompt ids, response ids)]
                L = max(len(p) + len(r) for p, r in pairs)
                ids = torch.full((len(pairs), L), self.pad)  # [B, L] right-padded
                labels = torch.full((len(pairs), L), -100)  # [B, L] loss on responses only
                for i, (p, r) in enumerate(pairs):
                    ids[i, : len(p) + len(r)] = torch.tensor(p + r)
                    labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
                ids, labels = ids.to(device), labels.to(device)
                loss = model(input_ids=ids, attention_mask=(ids != self.pad).long(),
                             labels=labels).loss
                adam.zero_grad()
                loss.backward()
                adam.step()
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
