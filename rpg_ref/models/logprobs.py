"""Log-probs of response tokens for the trainer's passes, without wasted compute or memory.

    token_logprobs(policy, b, temperature)   log pi(y_t | x, y_<t) of a Batch's responses  [B, T]
    micro_batches(b, max_seqs, max_tokens)   a (mini-)batch split for gradient accumulation
    lm_parts(policy)                         how a policy exposes its hidden states and LM head

Chunked LM head. For Qwen3's 151,936-token vocabulary the fp32 logits of one 8K-token response
take 4.6 GiB, and the backward pass of a log-softmax holds several tensors of that size. Here the
LM head is applied to at most ``chunk`` response tokens at a time, each chunk reduced at once to
the two numbers a token needs (its logit and the log-sum-exp), and in the backward pass each
chunk's logits are recomputed (activation checkpointing). So at most one chunk of logits exists
at any time, forward or backward, and padding never reaches the LM head. The values are the
unchunked computation's up to summation order (tests/test_logprobs.py, float64, 1e-10).

Micro-batches by tokens. The update accumulates a mini-batch's gradient over micro-batches. With
a token budget they are formed after sorting the sequences by length, so sequences of similar
length share a micro-batch; every micro-batch is cut to its own longest prompt and response.
Any partition gives the mini-batch gradient when each micro-batch's loss is weighted by its share
(rpg_ref.trainer.train.update), so this changes only the cost.

A policy exposes hidden states and head either with a method ``lm_parts() -> LMParts | None``
(rpg_ref.models.policy.HFPolicy: the parts of its model, run in its autocast and checkpointing), or
by being a plain Hugging Face causal LM whose logits are ``lm_head(last hidden state)`` (Qwen3,
Llama, ...; not models that rescale or soft-cap their logits). Any other policy (the bandit's
TabularPolicy) is called for its full logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from rpg_ref.interfaces import Batch

AUTO_CHUNK_BYTES = 512 * 2**20  # chunk = tokens whose fp32 logits take 512 MiB (883 for Qwen3)
_RESCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class LMParts(NamedTuple):
    hidden: Callable  # (input_ids, attention_mask, position_ids) -> last hidden states [B, L, H]
    head: Callable  # hidden states [..., H] -> logits [..., V]
    vocab_size: int


def hf_lm_parts(model: nn.Module) -> LMParts | None:
    """The parts of a plain Hugging Face causal LM, or None if ``model`` is not one."""
    base = getattr(model, "base_model", None)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    cfg = getattr(model, "config", None)
    if base is None or base is model or not isinstance(head, nn.Linear) or cfg is None:
        return None
    if any(getattr(cfg, k, None) for k in _RESCALED_LOGITS):
        return None

    def hidden(**inputs):
        return base(**inputs, use_cache=False).last_hidden_state

    return LMParts(hidden, head, head.out_features)


def lm_parts(policy: nn.Module) -> LMParts | None:
    """How ``policy`` exposes hidden states and LM head (module docstring), or None."""
    if hasattr(policy, "lm_parts"):
        return policy.lm_parts()
    return hf_lm_parts(policy)


# =============================================================================================
# the LM head in chunks
# =============================================================================================


def _head_chunk(head: Callable, h: Tensor, y: Tensor, temperature: float, entropy: bool):
    """(log softmax(head(h) / temperature)[y], entropy or None) for n tokens: h [n, H], y [n]."""
    z = head(h)  # [n, V]
    z = z.to(torch.promote_types(z.dtype, torch.float32))  # bf16 logits -> fp32; fp64 stays
    if temperature != 1:
        z = z / temperature
    lse = torch.logsumexp(z, -1)  # [n]
    logp = z.gather(-1, y[:, None])[:, 0] - lse
    if not entropy:
        return logp, None
    return logp, lse - (torch.softmax(z, -1) * z).sum(-1)  # H = lse - E_p[z]


def head_logprobs(head: Callable, h: Tensor, y: Tensor, temperature: float, chunk: int,
                  entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [n] of tokens y [n] given hidden states h [n, H] (and, without gradients, the
    entropies [n]), applying ``head`` to at most ``chunk`` tokens at a time. With gradients and
    more than one chunk, each chunk is checkpointed: its logits are recomputed in the backward
    pass instead of being kept."""
    if entropy and torch.is_grad_enabled():
        raise ValueError("the entropy is computed in no-grad passes only")
    n = h.shape[0]
    recompute = torch.is_grad_enabled() and n > chunk
    logps, ents = [], []
    for s in range(0, n, chunk):
        hs, ys = h[s : s + chunk], y[s : s + chunk]
        if recompute:
            logps.append(checkpoint(lambda a, b: _head_chunk(head, a, b, temperature, False)[0],
                                    hs, ys, use_reentrant=False, preserve_rng_state=False))
        else:
            lp, ent = _head_chunk(head, hs, ys, temperature, entropy)
            logps.append(lp)
            ents.append(ent)
    if n == 0:  # no response tokens at all
        return h.new_zeros(0), (h.new_zeros(0) if entropy else None)
    return torch.cat(logps), (torch.cat(ents) if entropy else None)


def token_logprobs(policy: nn.Module, b: Batch, temperature: float, entropy: bool = False,
                   chunk: int = 0):
    """log policy(y_t | prefix) of the response tokens at the sampling temperature: [B, T], 0 at
    padding (+ the entropy [B, T] in no-grad passes). ``chunk``: response tokens per LM-head call
    (0 = AUTO_CHUNK_BYTES of fp32 logits)."""
    parts = lm_parts(policy)
    if parts is None:
        return _full_logits_logprobs(policy, b, temperature, entropy)
    T = b.mask.shape[1]
    h = parts.hidden(input_ids=b.input_ids, attention_mask=b.attention_mask,
                     position_ids=b.position_ids)[:, -T - 1 : -1]  # [B, T, H] predict y_1..y_T
    keep = b.mask.bool()  # [B, T]: response tokens only
    chunk = chunk or max(1, AUTO_CHUNK_BYTES // (4 * parts.vocab_size))
    lp, ent = head_logprobs(parts.head, h[keep], b.input_ids[:, -T:][keep], temperature, chunk,
                            entropy)
    logp = lp.new_zeros(keep.shape).masked_scatter(keep, lp)  # [B, T]
    if not entropy:
        return logp
    return logp, ent.new_zeros(keep.shape).masked_scatter(keep, ent)


def _full_logits_logprobs(model: nn.Module, b: Batch, temperature: float, entropy: bool):
    """The generic path: the model's logits of the last T + 1 positions, all at once."""
    T = b.mask.shape[1]
    out = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids,
                logits_to_keep=T + 1)
    z = out.logits[:, :-1]  # [B, T, V] predicts y_1..y_T
    B, _, V = z.shape
    logp, ent = _head_chunk(lambda x: x, z.reshape(B * T, V), b.input_ids[:, -T:].reshape(-1),
                            temperature, entropy)
    m = b.mask.to(logp.dtype).reshape(-1)  # 0 at padding, as the chunked path
    logp = (logp * m).reshape(B, T)
    return (logp, (ent * m).reshape(B, T)) if entropy else logp


# =============================================================================================
# micro-batches
# =============================================================================================


def micro_batches(b: Batch, max_seqs: int = 0, max_tokens: int = 0) -> list[tuple[Tensor, Batch]]:
    """Split ``b`` into micro-batches: (row indices into b, those rows cut to their own padding).

    max_seqs: at most this many sequences per micro-batch (0: no limit). max_tokens: at most
    this many tokens computed per micro-batch, rows x (longest prompt + longest response) after
    the cut (0: no limit); a sequence longer than that gets a micro-batch of its own. When b is
    split, the rows are first sorted by response length, then prompt length (longest first), so
    that a micro-batch holds sequences of similar length and the longest comes first."""
    n = len(b)
    max_seqs = min(max_seqs or n, n)
    if max_seqs >= n and not max_tokens:
        return [(torch.arange(n, device=b.mask.device), b.trimmed())]
    resp = b.mask.sum(1).long().tolist()
    prompt = b.attention_mask[:, : b.prompt_len].sum(1).tolist()
    order = sorted(range(n), key=lambda i: (-resp[i], -prompt[i], i))
    groups, cur, long_p, long_r = [], [], 0, 0
    for i in order:
        p, r = max(long_p, prompt[i]), max(long_r, resp[i], 1)
        if cur and (len(cur) == max_seqs or (max_tokens and (len(cur) + 1) * (p + r) > max_tokens)):
            groups.append(cur)
            cur, p, r = [], prompt[i], max(resp[i], 1)
        cur.append(i)
        long_p, long_r = p, r
    groups.append(cur)
    out = []
    for g in groups:
        idx = torch.tensor(g, device=b.mask.device)
        out.append((idx, b.index(idx).trimmed()))
    return out
