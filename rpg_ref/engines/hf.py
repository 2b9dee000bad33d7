"""The ``hf`` engine: transformers ``generate`` on the policy module itself (colocated: the
engine samples with the weights being trained, so there is nothing to sync)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rpg_ref.interfaces import Generation, InProcessEngine, cut_at_eos, left_pad


class RecordLogprobs:
    """Logits processor that keeps the sampler's log-prob of each sampled token.

    Custom processors run before HF's temperature/top-p warpers, so ``scores`` are the model's
    raw logits; at call t it reads the token sampled at call t-1 from input_ids. Memory: one [B, V].
    """

    def __init__(self, temperature: float):
        self.t, self.prev, self.out = temperature, None, []

    def __call__(self, input_ids, scores):
        if self.prev is not None:
            self.out.append(self.prev.gather(-1, input_ids[:, -1:]))  # [B, 1]
        self.prev = torch.log_softmax(scores.float() / self.t, -1)  # [B, V]
        return scores

    def finish(self, last_tokens: Tensor) -> Tensor:
        self.out.append(self.prev.gather(-1, last_tokens[:, None]))
        return torch.cat(self.out, 1)  # [B, T]


class HFEngine(InProcessEngine):
    """transformers ``generate`` on the policy module itself."""

    @dataclass
    class Options:
        chunk: int = field(default=0, metadata={
            "help": "generate at most this many sequences at once (0 = all)"})
        sampler_logprobs: bool = field(default=True, metadata={
            "help": "record the sampler's log-probs to compare with the recomputed ones"})

    def __init__(self, policy, task, cfg):
        self.policy, self.task = policy, task
        self.opt = self.Options(**cfg.engine_options)

    def _generation_config(self, temperature, top_p, max_new_tokens):
        from transformers import GenerationConfig

        ends = dict(max_new_tokens=max_new_tokens, eos_token_id=self.task.eos_id,
                    pad_token_id=self.task.pad_id)
        if temperature > 0:
            return GenerationConfig(do_sample=True, temperature=temperature, top_p=top_p, top_k=0, **ends)
        return GenerationConfig(do_sample=False, **ends)

    @torch.no_grad()
    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        from transformers import LogitsProcessorList

        flat = [p for p in prompts for _ in range(n)]
        chunk = self.opt.chunk or len(flat)
        record = temperature > 0 and self.opt.sampler_logprobs
        responses, logprobs = [], [] if record else None
        was_training = self.policy.training
        self.policy.eval()
        for s in range(0, len(flat), chunk):
            ids, am = left_pad(flat[s : s + chunk], self.task.pad_id, self.policy.device)  # [b, P]
            rec = RecordLogprobs(temperature) if record else None
            seq = self.policy.generate(
                input_ids=ids, attention_mask=am,
                generation_config=self._generation_config(temperature, top_p, max_new_tokens),
                logits_processor=LogitsProcessorList([rec] if rec else []))
            new = seq[:, ids.shape[1] :]  # [b, T_gen]
            lp = rec.finish(new[:, -1]).tolist() if rec else None
            for i, row in enumerate(new.tolist()):
                r = cut_at_eos(row, self.task.eos_id)
                responses.append(r)
                if lp is not None:
                    logprobs.append(lp[i][: len(r)])
        self.policy.train(was_training)
        return Generation(responses, logprobs)
