"""The ``sample`` engine: a plain autoregressive sampler for any policy module (no KV cache;
the bandit's engine), and ``sample_next``: what temperature and top-p sampling mean, shared with
the ``hf`` engine."""

from __future__ import annotations

import torch
from torch import Tensor

from rpg_ref.interfaces import Generation, InProcessEngine, cut_at_eos, left_pad


def sample_next(logits: Tensor, temperature: float, top_p: float) -> tuple[Tensor, Tensor]:
    """One token per row of ``logits`` [N, V] (float): (tokens [N], their log-probs [N]).

    temperature 0 is greedy (log-prob reported as 0). Otherwise the distribution is
    softmax(logits / temperature), restricted for top_p < 1 to the nucleus: the most probable
    tokens, in order, while the mass before a token is below top_p (the top token always stays),
    renormalized. The log-prob reported is the sampled token's under softmax(logits / temperature)
    before the nucleus cut: what the trainer recomputes (rpg_ref.models.logprobs) and compares."""
    if temperature == 0:
        tok = logits.argmax(-1)
        return tok, torch.zeros_like(tok, dtype=logits.dtype)
    logp = torch.log_softmax(logits / temperature, -1)  # [N, V]
    probs = logp.exp()
    if top_p < 1:
        sp, si = probs.sort(-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(-1, si, sp * keep)
    tok = torch.multinomial(probs, 1)[:, 0]  # [N] (multinomial renormalizes)
    return tok, logp.gather(-1, tok[:, None])[:, 0]


class SampleEngine(InProcessEngine):
    @classmethod
    def sampler_logprobs_missing(cls, cfg) -> str | None:
        return None  # always reported (the trainer samples at temperature > 0)

    def __init__(self, policy, task, cfg):
        self.policy, self.task = policy, task

    @torch.no_grad()
    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        flat = [p for p in prompts for _ in range(n)]
        dev = next(self.policy.parameters()).device
        eos = self.task.eos_id
        ids, am = left_pad(flat, self.task.pad_id, dev)  # [N, P]
        done = torch.zeros(len(flat), dtype=torch.bool, device=dev)
        toks, lps = [], []
        for _ in range(max_new_tokens):
            pos = (am.cumsum(-1) - 1).clamp(min=0)
            logits = self.policy(input_ids=ids, attention_mask=am, position_ids=pos,
                                 logits_to_keep=1).logits[:, -1].float()  # [N, V]
            tok, lp = sample_next(logits, temperature, top_p)
            if eos is not None:
                tok = torch.where(done, torch.full_like(tok, self.task.pad_id), tok)
            toks.append(tok)
            lps.append(lp)
            ids = torch.cat([ids, tok[:, None]], 1)
            am = torch.cat([am, (~done).long()[:, None]], 1)
            if eos is not None:
                done |= tok == eos
                if bool(done.all()):
                    break
        T = torch.stack(toks, 1).tolist()  # [N, T]
        L = torch.stack(lps, 1).tolist()
        responses = [cut_at_eos(r, eos) for r in T]
        logprobs = None if temperature == 0 else [lp[: len(r)] for lp, r in zip(L, responses)]
        return Generation(responses, logprobs)
