"""Run by tests/test_distributed.py under `torchrun --nproc_per_node 2` (gloo, CPU).

One update (rpg_ref.trainer.train.update) of a float64 tiny Qwen3 on 2 ranks, each holding half of a
fixed batch, against the same update in one process on the whole batch (computed on every rank with
the collectives switched off), for each case of CASES; then the bytes of parameters and AdamW state
each rank holds. Rank 0 writes the results as JSON to argv[1].
"""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.distributed as dist

from rpg_ref.interfaces import Batch, collate
from rpg_ref.trainer import distributed as D
from rpg_ref.trainer import train
from rpg_ref.trainer.config import Config, loss_options

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
    # --rollout-correction: each rank weights its own rows; the statistics are over both ranks
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


def one_process_update(model, b, cfg):
    """rpg_ref.trainer.train.update in one process (after the rollout-correction weights of b, if
    any): rpg_ref.trainer.distributed's collectives switched off."""
    active, world = D.active, D.world
    D.active, D.world = (lambda: False), (lambda: 1)
    try:
        opt = make_opt(model)
        return {**rollout_weights(b, cfg), **train.update(model, opt, b, cfg, loss_options(cfg))}
    finally:
        D.active, D.world = active, world


def advantages_check() -> dict:
    """Every estimator through rpg_ref.trainer.distributed.advantages on this rank's rows (12
    responses in groups of 4: the middle group spans both ranks; each rank's tensors cut to its own
    longest response) against rpg_ref.core.advantages on the whole batch: max |difference| per
    estimator."""
    from rpg_ref.core.advantages import ADVANTAGES, compute_advantages

    g = torch.Generator().manual_seed(3)
    n, G, T = 12, 4, 6
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()  # [n, T]
    rewards = torch.randint(0, 3, (n,), generator=g).double()
    old, ref = (torch.randn(n, T, generator=g, dtype=torch.float64) * mask for _ in range(2))
    lo, hi = D.share(n)
    t = int(lengths[lo:hi].max())
    out = {}
    for name in ADVANTAGES:
        want = compute_advantages(name, rewards, G, mask=mask, old_logp=old, ref_logp=ref, beta=0.1)
        got = D.advantages(compute_advantages, name, rewards[lo:hi], G, mask=mask[lo:hi, :t],
                           old_logp=old[lo:hi, :t], ref_logp=ref[lo:hi, :t], beta=0.1)
        want = want[lo:hi, :t] if want.dim() == 2 else want[lo:hi]
        diff = torch.tensor(
            float((got - want).abs().max()) if got.shape == want.shape else float("inf")
        )
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        out[name] = float(diff)
    return out


def full_params(model) -> dict:
    with D.gathered(model):
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
        lo, hi = D.share(N)
        share = b.index(slice(lo, hi))
        single = copy.deepcopy(base)
        torch.manual_seed(2)
        s_stats = one_process_update(single, b, cfg)
        sharded = D.shard(copy.deepcopy(base))
        torch.manual_seed(2)
        d_stats = {**rollout_weights(share, cfg),
                   **train.update(sharded, make_opt(sharded), share, cfg, loss_options(cfg))}
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
    results["advantages"] = advantages_check()
    # bytes per rank: parameters (local shards) and AdamW's exp_avg, exp_avg_sq (local shards)
    model = D.shard(copy.deepcopy(base))
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
    if D.is_main():
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    D.exit_process(0)  # as rpg-train's ranks do: no interpreter teardown after the process group
