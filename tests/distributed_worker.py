"""Run by tests/test_distributed.py under `torchrun --nproc_per_node 2` (gloo, CPU).

One update (rpg_ref.trainer.train.update) of a float64 tiny Qwen3 on 2 ranks, each training its
share of every mini-batch of a fixed batch, against the same update in one process (computed on
every rank with the collectives switched off), for each case of CASES; the rollout's calls
(rpg_ref.trainer.distributed.workers: Workers, map_rows) and the advantages every rank computes
from them; then the bytes of parameters and AdamW state each rank holds. Rank 0 writes the
results as JSON to argv[1].
"""

from __future__ import annotations

import copy
import json
import os
import sys
from unittest import mock

import torch
import torch.distributed as dist

from rpg_ref.interfaces import Batch, Generation, collate
from rpg_ref.trainer import train
from rpg_ref.trainer.collectives import is_main
from rpg_ref.trainer.config import Config, loss_options
from rpg_ref.trainer.distributed.setup import exit_process
from rpg_ref.trainer.distributed.sharding import gathered, shard
from rpg_ref.trainer.distributed.workers import Workers, map_rows

# (name, Config fields): token-mean and seq-mean losses, with micro-batches by count and by token
# budget (ranks then cut different numbers: zero-weight padding), clipping and --ref init
CASES = [
    ("token-mean", dict(algo="rpg-reinforce-urkl", agg="token-mean", clip=[0.2, 0.28, 3.0])),
    ("seq-mean-token-mean", dict(algo="rpg-rkl", agg="seq-mean-token-mean")),
    (
        "token-mean micro-batches by tokens, ref",
        dict(algo="grpo", agg="token-mean", micro_batch_tokens=40, ref="init"),
    ),
    (
        "seq-mean micro-batches of 2",
        dict(algo="rpg-fkl", agg="seq-mean-token-mean", micro_batch_size=2),
    ),
    # several mini-batches and passes: the ranks must train the same mini-batches
    (
        "two mini-batches, two passes",
        dict(algo="rpg-reinforce-urkl", agg="token-mean", mini_batch_size=4, updates_per_step=4),
    ),
    # --rollout-correction: every rank weights the whole batch and trains its share
    (
        "rollout correction tis, token",
        dict(
            algo="rpg-reinforce-urkl",
            agg="token-mean",
            rollout_correction="tis",
            rollout_correction_cap=1.2,
        ),
    ),
    (
        "rollout correction mis, sequence",
        dict(
            algo="rpg-rkl",
            agg="seq-mean-token-mean",
            rollout_correction="mis",
            rollout_correction_level="sequence",
            rollout_correction_cap=1.1,
        ),
    ),
]
N = 8  # responses in the union batch: 4 per rank


def tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=24,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(cfg).double().eval()


def union_batch(model) -> Batch:
    """N responses of different prompt and response lengths; pi_old and pi_ref are the model's
    log-probs moved by fixed noise (ratios != 1, so clipping acts)."""
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(1, 24, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for _ in range(N)
    ]
    responses = [
        torch.randint(1, 24, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in range(N)
    ]
    b = Batch(**collate(prompts, responses, 0, "cpu", None), rewards=torch.zeros(N),
              correct=torch.zeros(N, dtype=torch.bool))
    from rpg_ref.models.logprobs import token_logprobs

    with torch.no_grad():
        lp = token_logprobs(model, b, 1.0)
        b.old_logp = (lp + 0.3 * torch.randn(lp.shape, generator=g, dtype=lp.dtype)) * b.mask
        b.ref_logp = (lp + 0.3 * torch.randn(lp.shape, generator=g, dtype=lp.dtype)) * b.mask
    b.adv = torch.randn(N, generator=g, dtype=torch.float64)
    return b


def make_opt(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)


def rollout_weights(b, cfg) -> dict:
    """rpg_ref.trainer.rollout_correction.weights_for_batch on b (sets b.rollout_weight): its
    statistics."""
    from rpg_ref.trainer.rollout_correction import weights_for_batch

    return weights_for_batch(b, cfg)


def one_process(fn):
    """fn() as one process sees the world (no process group, WORLD_SIZE 1): every collective of
    the trainer (rpg_ref.trainer.collectives) is then the plain call."""
    with mock.patch.object(dist, "is_initialized", return_value=False), \
            mock.patch.dict(os.environ, {"WORLD_SIZE": "1", "RANK": "0"}):
        return fn()


def one_process_update(model, b, cfg):
    """rpg_ref.trainer.train.update in one process (after the rollout-correction weights of b, if
    any)."""
    return one_process(lambda: {**rollout_weights(b, cfg),
                                **train.update(model, make_opt(model), b, cfg, loss_options(cfg))})


class FakeEngine:
    """A response to prompt [p] is [p, k, ..., k] (k + 1 tokens, k = 1 + c % 3 for a counter c that
    starts at 7 x rank: the ranks sample different responses); log-probs -0.1 x token. Counts the
    responses it sampled."""

    def __init__(self):
        self.c, self.sampled = 7 * dist.get_rank(), 0

    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        out = []
        for p in prompts:
            for _ in range(n):
                out.append([p[0]] + [1 + self.c % 3] * (1 + self.c % 3))
                self.c, self.sampled = self.c + 1, self.sampled + 1
        return Generation(out, [[-0.1 * t for t in r] for r in out])


class FakeTask:
    """Reward: the sum of the response's tokens times its prompt id, mod 5; counts the scored."""

    def __init__(self):
        self.scored = 0

    def reward(self, prompts, responses):
        self.scored += len(responses)
        r = torch.tensor([float(sum(x) * p[0] % 5) for p, x in zip(prompts, responses)],
                         dtype=torch.float64)
        return r, r > 2


def whole_batch_check() -> dict:
    """The rollout's calls on 2 ranks (12 responses in groups of 4: the middle group spans both
    ranks): Workers.generate and .reward (rpg_ref.trainer.distributed.workers: each rank samples
    and scores its 6, every rank gets all 12 responses, log-probs and rewards), map_rows (each
    rank computes the log-probs of its 6 rows, every rank gets the 12); then every estimator of
    rpg_ref.core.advantages on what a rank holds against the same computed by one process on the
    whole batch: max |difference| per estimator (over both ranks)."""
    from rpg_ref.core.advantages import ADVANTAGES, compute_advantages

    G, prompts = 4, [[1], [2], [3]]
    engine, task = FakeEngine(), FakeTask()
    workers = Workers(task, engine, None)
    gen = workers.generate(prompts, G, 1.0, 1.0, 8)
    per_response = [p for p in prompts for _ in range(G)]
    r, correct = workers.reward(per_response, gen.responses)
    b = Batch(**collate(per_response, gen.responses, 0, "cpu", gen.logprobs), rewards=r,
              correct=correct)
    g = torch.Generator().manual_seed(3)
    noise = torch.randn(b.mask.shape, generator=g, dtype=torch.float64)  # the same on both ranks

    def logprobs(rows):  # a function of each row alone: the sampler's log-probs, moved
        moved = rows.sampler_logp.double() + 0.3 * rows.input_ids[:, -rows.mask.shape[1]:]
        return moved * rows.mask, -moved * rows.mask

    old, ref = map_rows(logprobs, b, None)
    whole, counts = [None] * dist.get_world_size(), [None] * dist.get_world_size()
    dist.all_gather_object(whole, (gen.responses, gen.logprobs, r.tolist(), old.tolist()))
    dist.all_gather_object(counts, (engine.sampled, task.scored))
    out = {"every_rank_holds_the_same": all(w == whole[0] for w in whole),
           "sampled_scored_per_rank": counts, "responses": len(gen.responses),
           "groups_in_order": [x[0] for x in gen.responses] == [p[0] for p in per_response],
           "advantages": {}}
    one = logprobs(b)  # one process: the whole batch at once
    out["logprobs_equal_one_process"] = bool(torch.equal(old, one[0]) and torch.equal(ref, one[1]))
    rewards = torch.tensor([float(sum(x) * p[0] % 5) for p, x in zip(per_response, gen.responses)],
                           dtype=torch.float64)
    out["rewards_equal_one_process"] = bool(torch.equal(r, rewards))
    for name in ADVANTAGES:
        kw = dict(mask=b.mask.double(), beta=0.1)
        got = compute_advantages(name, r, G, old_logp=old + noise * b.mask, ref_logp=ref, **kw)
        want = compute_advantages(name, rewards, G, old_logp=one[0] + noise * b.mask,
                                  ref_logp=one[1], **kw)
        diff = torch.tensor(float((got - want).abs().max()))
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        out["advantages"][name] = float(diff)
    return out


def full_params(model) -> dict:
    with gathered(model):
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    base = tiny_qwen3()
    results = {"cases": {}}
    for name, fields in CASES:
        cfg = Config(**{**dict(task="seq", prompts_per_step=N, group_size=1, adv="batch-mean",
                               mini_batch_size=N,
                               updates_per_step=1, grad_clip=0.5, logprob_chunk=3, beta=0.05,
                               temperature=1.0), **fields})
        b = union_batch(base)
        if cfg.ref != "init":
            b.ref_logp = None
        if cfg.rollout_correction != "none":  # a sampler mu != pi_old
            g = torch.Generator().manual_seed(4)
            b.sampler_logp = (
                b.old_logp + 0.2 * torch.randn(b.mask.shape, generator=g, dtype=torch.float64)
            ) * b.mask
        single = copy.deepcopy(base)
        torch.manual_seed(2)
        s_stats = one_process_update(single, b, cfg)
        sharded, _ = shard(copy.deepcopy(base))
        torch.manual_seed(2 + 1000 * dist.get_rank())  # only rank 0's mini-batch order is used
        d_stats = {**rollout_weights(b, cfg),
                   **train.update(sharded, make_opt(sharded), b, cfg, loss_options(cfg))}
        want, got = {n: p.detach() for n, p in single.named_parameters()}, full_params(sharded)
        results["cases"][name] = {
            "param_max_abs_diff": max(float((got[n] - want[n]).abs().max()) for n in want),
            "param_max_abs_change": max(
                float((want[n] - base.get_parameter(n).detach()).abs().max()) for n in want
            ),
            "loss_grad_norm_max_abs_diff": max(
                abs(d_stats[k] - s_stats[k]) for k in ("loss", "grad_norm")
            ),
            "stats_max_abs_diff": max(
                abs(d_stats[k] - s_stats[k])
                for k in s_stats
                if k not in ("train_tokens", "updates", "early_stop")
            ),
            "grad_clipped": s_stats["grad_norm"] > cfg.grad_clip,
            "rc_stats": {k: (s_stats[k], d_stats[k]) for k in s_stats if k.startswith("rc_")},
        }
    results["whole_batch"] = whole_batch_check()
    # bytes per rank: parameters (local shards) and AdamW's exp_avg, exp_avg_sq (local shards)
    model, _ = shard(copy.deepcopy(base))
    opt = make_opt(model)
    loss = model(input_ids=torch.randint(0, 24, (2, 5))).logits.sum()
    loss.backward()
    opt.step()
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t
    param_bytes = sum(local(p).numel() * p.element_size() for p in model.parameters())
    opt_bytes = sum(local(v).numel() * v.element_size() for st in opt.state.values()
                    for k, v in st.items() if k != "step")
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, {"param_bytes": param_bytes, "opt_bytes": opt_bytes})
    model_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    results.update(world_size=dist.get_world_size(), per_rank=per_rank, model_bytes=model_bytes,
                   step_counters_bytes=sum(st["step"].numel() * st["step"].element_size()
                                           for st in opt.state.values()))
    if is_main():
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    exit_process(0)  # as rpg-train's ranks do: no interpreter teardown after the process group
