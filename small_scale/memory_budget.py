"""Memory budget of full-parameter RL on one 80 GB GPU with a colocated vLLM (preset qwen3-4b-h100).

    python small_scale/memory_budget.py [--config PATH] [--gpu-gib 80] [--prompt-len 1024]

Counts parameters from a Hugging Face Qwen3 config.json (default: the shared Qwen3-4B config) and
prints, for 2K/4K/8K responses, what is resident on the GPU in the two phases of a step:

  training (vLLM asleep, level 1: its weights are in CPU memory and its KV cache is freed)
      fp32 master weights 4 B/param + fp32 grads 4 B/param + AdamW m, v fp32 8 B/param
      (or 8-bit AdamW: 2 B/param), bf16 autocast compute, gradient checkpointing per layer,
      micro-batch of 1 sequence, log-probs computed in chunks of --logit-chunk response tokens;
  rollout (vLLM awake: bf16 weights + KV cache; trainer grads freed)
      either the trainer's fp32 master + optimizer state stay on the GPU, or they are moved to
      pinned CPU memory for the rollout (recommended: ~45 GiB over PCIe each way, seconds per step).

Why fp32 master weights: bf16 keeps 8 significant bits, so a weight of magnitude 0.02 sits on a
grid of spacing 2^-6 * 2^-8 ~ 6e-5 and an AdamW step of lr = 1e-6 is rounded away; the script
checks this with torch. Estimates of activations are analytic (documented inline), not measured.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

GiB = 1024 ** 3
MAX_VLLM_UTIL = 0.90  # vLLM's share of the GPU; the rest: trainer CUDA context, fragmentation


def param_count(c: dict) -> dict:
    """Parameter count by part, from a Qwen3 config (attention_bias false, q/k RMSNorm per head)."""
    H, L, V, I = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", H // nh)
    attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 2 * hd       # q, k, v, o, q_norm, k_norm
    mlp = 3 * H * I                                                     # gate, up, down
    per_layer = attn + mlp + 2 * H                                      # + two RMSNorms
    embed = V * H
    head = 0 if c.get("tie_word_embeddings", False) else V * H
    return {"embed": embed, "lm_head": head, "layers": L * per_layer, "final_norm": H,
            "total": embed + head + L * per_layer + H}


def kv_bytes_per_token(c: dict, dtype_bytes: int = 2) -> int:
    hd = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * hd * dtype_bytes


def activation_bytes(c: dict, seq: int, resp: int, logit_chunk: int, micro: int = 1) -> dict:
    """Training activations with per-layer gradient checkpointing, bf16 compute.

    checkpoints: each layer's input [micro, seq, H] in bf16 is kept for the backward pass;
    layer recompute: one layer's q,k,v,attn-out and gate,up,act,prod tensors, doubled for their
    gradients (SDPA/flash attention keeps no [seq, seq] matrix);
    logits: a chunk of response tokens' logits in bf16 + fp32 log-softmax + its fp32 gradient.
    """
    H, L, V, I = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    hd = c.get("head_dim", H // c["num_attention_heads"])
    qkvo = (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * hd
    ckpt = L * micro * seq * H * 2
    layer = 2 * micro * seq * (qkvo + 4 * I + 4 * H) * 2
    logits = micro * min(resp, logit_chunk) * V * (2 + 4 + 4)
    return {"checkpoints": ckpt, "layer_recompute": layer, "logits_chunk": logits}


def bf16_loses_small_updates() -> tuple[bool, bool]:
    import torch
    w = torch.tensor(0.02)
    lost_bf16 = bool((w.bfloat16() + torch.tensor(1e-6).bfloat16()) == w.bfloat16())
    lost_fp32 = bool((w + 1e-6) == w)
    return lost_bf16, lost_fp32


def budget(c: dict, gpu_gib: float, prompt_len: int, resp: int, logit_chunk: int, adam_bytes: int,
           reserve_gib: float, vllm_sleep_residual_gib: float, vllm_act_gib: float) -> dict:
    n = param_count(c)["total"]
    seq = prompt_len + resp
    act = activation_bytes(c, seq, resp, logit_chunk)
    train = {"fp32 master weights": 4 * n, "fp32 gradients": 4 * n, f"AdamW m,v ({adam_bytes} B/param)": adam_bytes * n,
             **{f"activations: {k}": v for k, v in act.items()},
             "vLLM asleep (level 1): CUDA graphs, context": vllm_sleep_residual_gib * GiB,
             "CUDA context + allocator slack": reserve_gib * GiB}
    kv_tok = kv_bytes_per_token(c)
    out = {"params": n, "seq": seq, "train": train, "train_total": sum(train.values())}
    for mode, resident in (("offload", 0), ("resident", (4 + adam_bytes) * n)):
        free = gpu_gib * GiB - reserve_gib * GiB - resident
        util = min(MAX_VLLM_UTIL, math.floor(100 * free / (gpu_gib * GiB)) / 100)
        kv = util * gpu_gib * GiB - 2 * n - vllm_act_gib * GiB
        out[f"rollout_{mode}"] = {"trainer state on GPU": resident, "vLLM bf16 weights": 2 * n,
                                  "vLLM activations + CUDA graphs": vllm_act_gib * GiB, "KV cache": kv,
                                  "CUDA context + allocator slack": reserve_gib * GiB,
                                  "gpu_memory_utilization": util,
                                  "kv_tokens": int(kv // kv_tok), "concurrent_seqs": int(kv // kv_tok // seq)}
    return out


def main(argv=None) -> int:
    default_cfg = Path(os.environ.get("RPG_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")) \
        / "models" / "qwen3-4b" / "config.json"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(default_cfg))
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="H100 SXM/PCIe 80 GB: 79.6 GiB usable; use 80")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--logit-chunk", type=int, default=1024)
    ap.add_argument("--adam-bytes", type=int, default=8, help="8 = fp32 m,v; 2 = 8-bit AdamW")
    ap.add_argument("--reserve-gib", type=float, default=2.0, help="CUDA context + allocator fragmentation")
    ap.add_argument("--vllm-sleep-residual-gib", type=float, default=1.0)
    ap.add_argument("--vllm-act-gib", type=float, default=3.0, help="vLLM activations, sampler, CUDA graphs")
    args = ap.parse_args(argv)
    if not Path(args.config).is_file():
        raise SystemExit(f"config {args.config} not found (set RPG_DATA_DIR or pass --config)")
    c = json.loads(Path(args.config).read_text())
    parts = param_count(c)
    print(f"model: {args.config}")
    print("parameters: " + ", ".join(f"{k} {v / 1e9:.3f}B" for k, v in parts.items()))
    print(f"KV cache per token (bf16): {kv_bytes_per_token(c) / 1024:.0f} KiB")
    lost_bf16, lost_fp32 = bf16_loses_small_updates()
    print(f"0.02 + 1e-6 rounds back to 0.02: bf16 {lost_bf16}, fp32 {lost_fp32}  -> fp32 master weights")
    for resp in (2048, 4096, 8192):
        b = budget(c, args.gpu_gib, args.prompt_len, resp, args.logit_chunk, args.adam_bytes,
                   args.reserve_gib, args.vllm_sleep_residual_gib, args.vllm_act_gib)
        print(f"\n=== response {resp} tokens (sequence {b['seq']}), GPU {args.gpu_gib:.0f} GiB ===")
        print("training phase (vLLM asleep):")
        for k, v in b["train"].items():
            print(f"  {k:<46} {v / GiB:7.2f} GiB")
        print(f"  {'TOTAL':<46} {b['train_total'] / GiB:7.2f} GiB  "
              f"({'fits' if b['train_total'] <= args.gpu_gib * GiB else 'DOES NOT FIT'})")
        for mode in ("offload", "resident"):
            r = b[f"rollout_{mode}"]
            print(f"rollout phase, trainer state {'in CPU memory' if mode == 'offload' else 'on the GPU'}:")
            for k in ("trainer state on GPU", "vLLM bf16 weights", "vLLM activations + CUDA graphs", "KV cache"):
                print(f"  {k:<46} {r[k] / GiB:7.2f} GiB")
            print(f"  -> vLLM gpu_memory_utilization {r['gpu_memory_utilization']:.2f}, KV cache for "
                  f"{r['kv_tokens']:,} tokens = {r['concurrent_seqs']} concurrent sequences")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
