"""rpg_ref/models/logprobs.py: the LM head in chunks and micro-batches by tokens change the cost of
the trainer's log-prob passes and update, not their numbers (float64, tiny Qwen3)."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rpg_ref.interfaces import Batch, collate
from rpg_ref.models.logprobs import lm_parts, micro_batches, token_logprobs
from rpg_ref.trainer import config, train

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11], [12, 13], [3, 3, 3, 3], [5], [7, 8]]
RESPONSES = [
    [2, 9, 14, 4],
    [5],
    [1, 1, 2, 3, 5, 8],
    [13, 7],
    [0, 2],
    [9, 9, 9],
    [4, 4, 4, 4, 4],
    [1],
]


def tiny_qwen3(seed: int = 0, tie: bool = True):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        tie_word_embeddings=tie, attn_implementation="sdpa")
    return transformers.Qwen3ForCausalLM(cfg).double().eval()


def batch(prompts=PROMPTS, responses=RESPONSES) -> Batch:
    b = Batch(**collate(prompts, responses, 15, "cpu", None), rewards=torch.zeros(len(prompts)),
              correct=torch.zeros(len(prompts), dtype=torch.bool))
    b.mask = b.mask.double()
    return b


def reference_logprobs(model, b: Batch, temperature: float):
    """The textbook formula on the full logits, written here: log_softmax(z / t)[y] and
    -sum p log p for every position of the padded batch."""
    T = b.mask.shape[1]
    z = model(input_ids=b.input_ids, attention_mask=b.attention_mask,
              position_ids=b.position_ids).logits[:, -T - 1 : -1] / temperature  # [B, T, V]
    logp_all = torch.log_softmax(z, -1)
    logp = logp_all.gather(-1, b.input_ids[:, -T:, None])[..., 0]
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def policies():
    """A plain HF Qwen3 (the seq task's policy) and the math task's wrapper around one (with
    gradient checkpointing, so the chunks run inside checkpointed layers' autograd too)."""
    from rpg_ref.models.policy import HFPolicy

    return {
        "hf": tiny_qwen3(tie=True),
        "HFPolicy": HFPolicy(tiny_qwen3(tie=False), "float32", gradient_checkpointing=True).eval(),
    }


@pytest.mark.parametrize("kind", ["hf", "HFPolicy"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_equal_unchunked_values_and_gradients(kind, temperature):
    """Log-probs through the LM head in chunks of 3 response tokens (so 12 chunks, each
    recomputed in the backward pass) equal the full-logits formula at every response token to
    1e-10 in float64, are 0 at padding, and give the same gradient of sum(c * logp) w.r.t. every
    parameter (random c) to 1e-10; so do the no-grad entropies. The policy exposes its parts."""
    policy = policies()[kind]
    b = batch()
    assert lm_parts(policy) is not None
    m = b.mask
    c = torch.randn(m.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grads = {}
    for name, chunk in (("reference", None), ("chunked", 3), ("one chunk", 10**6)):
        policy.zero_grad(set_to_none=True)
        if chunk is None:
            logp, _ = reference_logprobs(policy, b, temperature)
        else:
            logp = token_logprobs(policy, b, temperature, chunk=chunk)
        (c * logp * m).sum().backward()
        grads[name] = {n: p.grad.clone() for n, p in policy.named_parameters()}
        if chunk is None:
            ref = logp.detach()
        else:
            assert (logp.detach() - ref).mul(m).abs().max() < 1e-10, name
            assert torch.equal(logp.detach() * (1 - m), torch.zeros_like(m)), "0 at padding"
    for name in ("chunked", "one chunk"):
        for n, g in grads["reference"].items():
            assert (grads[name][n] - g).abs().max() < 1e-10, (name, n)
    with torch.no_grad():
        _, ent_ref = reference_logprobs(policy, b, temperature)
        _, ent = token_logprobs(policy, b, temperature, entropy=True, chunk=3)
    assert ((ent - ent_ref) * m).abs().max() < 1e-10


def test_micro_batches_cover_the_batch_within_the_token_budget():
    """Every row lands in exactly one micro-batch; a micro-batch of more than one row computes at
    most max_tokens tokens (rows x (longest prompt + longest response)) after its padding is
    cut, at most max_seqs rows; the cut keeps every real token and its position."""
    b = batch()
    for max_seqs, max_tokens in ((0, 20), (3, 0), (2, 24), (0, 1)):
        parts = micro_batches(b, max_seqs, max_tokens)
        rows = sorted(i for idx, _ in parts for i in idx.tolist())
        assert rows == list(range(len(b)))
        for idx, ub in parts:
            n, L = ub.input_ids.shape
            assert n == 1 or not max_tokens or n * L <= max_tokens, (max_seqs, max_tokens, n, L)
            assert n <= (max_seqs or len(b))
            assert ub.mask.shape[1] == int(ub.mask.sum(1).max())  # cut to the longest response
            assert int(ub.attention_mask[:, : ub.prompt_len].sum(1).max()) == ub.prompt_len
            for j, i in enumerate(idx.tolist()):
                real_full = b.attention_mask[i].bool()
                real_cut = ub.attention_mask[j].bool()
                assert b.input_ids[i][real_full].tolist() == ub.input_ids[j][real_cut].tolist()
                assert (
                    b.position_ids[i][real_full].tolist() == ub.position_ids[j][real_cut].tolist()
                )
    assert len(micro_batches(b, 0, 1)) == len(b)  # a budget below every sequence: one row each


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_token_budget_micro_batches_accumulate_the_sequence_micro_batch_gradient(agg):
    """rpg_ref.trainer.train.update over one mini-batch of 8 sequences of different lengths, with
    gradient accumulation over (a) one micro-batch, (b) micro-batches of 2 sequences, (c)
    micro-batches of at most 20 tokens after sorting by length: one SGD step of lr 1 on the
    accumulated gradient moves every parameter by the same amount in all three to 1e-12 (float64;
    a missing or wrong micro-batch weight changes them by ~1e-2). pi_old != pi_theta, so the
    importance weights and the clip are exercised."""
    b = batch()
    base = tiny_qwen3(seed=3)
    with torch.no_grad():
        logp = token_logprobs(base, b, 1.0)
    noise = torch.randn(
        b.mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2)
    )
    b.old_logp = (logp + 0.3 * noise) * b.mask
    b.adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.25, -0.25], dtype=torch.float64)
    moved = {}
    for name, extra in (("whole", {}), ("sequences", {"micro_batch_size": 2}),
                        ("tokens", {"micro_batch_tokens": 20})):
        policy = tiny_qwen3(seed=3)
        start = {n: p.detach().clone() for n, p in policy.named_parameters()}
        cfg = config.Config(prompts_per_step=1, group_size=8, mini_batch_size=8, grad_clip=0.0,
                            algo="rpg-reinforce-urkl", clip=[0.2, 0.28, 3.0], agg=agg, **extra)
        torch.manual_seed(0)
        stats = train.update(policy, torch.optim.SGD(policy.parameters(), lr=1.0), b, cfg,
                             config.loss_options(cfg))
        assert stats["updates"] == 1 and math.isfinite(stats["loss"])
        moved[name] = {n: p.detach() - start[n] for n, p in policy.named_parameters()}
    assert max(float(d.abs().max()) for d in moved["whole"].values()) > 1e-2
    for name in ("sequences", "tokens"):
        for n, d in moved["whole"].items():
            assert (moved[name][n] - d).abs().max() < 1e-12, (name, n)


def test_batch_logprobs_sorted_micro_batches_return_rows_in_batch_order():
    """The trainer's no-grad pass (old log-probs, entropy) over token-budget micro-batches, which
    are formed after sorting the rows by length, puts every row's log-probs back in its place:
    equal to one pass over the whole batch to 1e-12."""
    policy, b = tiny_qwen3(), batch()
    whole = config.Config(prompts_per_step=1, group_size=8, mini_batch_size=8)
    split = config.Config(
        prompts_per_step=1, group_size=8, mini_batch_size=8, micro_batch_tokens=12, logprob_chunk=2
    )
    (lp_a, ent_a), (lp_b, ent_b) = (
        train.batch_logprobs(policy, b, c, entropy=True) for c in (whole, split)
    )
    assert len(micro_batches(b, 8, 12)) > 3
    assert (lp_a - lp_b).abs().max() < 1e-12 and (ent_a - ent_b).abs().max() < 1e-12
