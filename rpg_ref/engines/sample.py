"""The ``sample`` engine: a plain autoregressive sampler for any policy module (no KV cache;
the bandit's engine, and a readable statement of what temperature and top-p sampling mean)."""

from __future__ import annotations

import torch

from rpg_ref.interfaces import Generation, InProcessEngine, cut_at_eos, left_pad


class SampleEngine(InProcessEngine):
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
            if temperature == 0:
                tok = logits.argmax(-1)
                lp = torch.zeros_like(tok, dtype=torch.float)
            else:
                logp = torch.log_softmax(logits / temperature, -1)  # [N, V]
                probs = logp.exp()
                if top_p < 1:
                    sp, si = probs.sort(-1, descending=True)
                    keep = (sp.cumsum(-1) - sp) < top_p  # always keeps the top token
                    probs = torch.zeros_like(probs).scatter(-1, si, sp * keep)
                tok = torch.multinomial(probs, 1)[:, 0]  # [N]
                lp = logp.gather(-1, tok[:, None])[:, 0]
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
