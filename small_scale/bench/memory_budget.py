"""Memory budget (an ESTIMATE) of full-parameter RL of Qwen3-4B on one 80 GB GPU (preset
qwen3-4b-h100).

    python -m small_scale.bench.memory_budget [--config PATH] [--gpu-gib 80] [--prompt-len 1024]
                                        [--engine vllm|hf] [--unchunked] [--ranks N]
                                        [--responses 2048 4096 8192]

Counts parameters from a Hugging Face Qwen3 config.json (default: the shared Qwen3-4B config) and
prints, for each response length, what is resident on the GPU in the two phases of a step:

  training (the rollout engine asleep: vLLM level 1 keeps its weights in CPU memory and frees its
      KV cache; the hf engine frees its bf16 copy of the weights)
      fp32 master weights 4 B/param + fp32 grads 4 B/param + AdamW m, v fp32 8 B/param
      (or 8-bit AdamW: 2 B/param), bf16 autocast compute, gradient checkpointing per layer,
      micro-batch of 1 sequence, and the LM head applied to chunks of response tokens as
      rpg_ref.models.logprobs does (--logit-chunk, default its automatic size; --unchunked: the
      whole response at once, as the trainer did before chunking);
  rollout (the trainer's gradients are freed)
      vllm: vLLM's bf16 weights + KV cache, the trainer's state either on the GPU or moved to
      pinned CPU memory; hf: the trainer's state stays, plus the engine's bf16 copy and a static
      KV cache for as many sequences as fit.

--ranks N: per GPU of an N-rank torchrun run (FSDP2: rpg_ref/trainer/distributed/): weights,
gradients and AdamW state are 1/N each; during the update the root unit (embeddings = tied head,
final norm) stays unsharded from forward to backward with its gradient, and a decoder layer is
all-gathered at a time (plus FSDP's prefetch of the next, plus one layer's unsharded gradient);
during the rollout and the log-prob passes the whole fp32 policy is gathered on every rank (so ranks
can sample different lengths), next to the engine.

Why fp32 master weights: bf16 keeps 8 significant bits, so a weight of magnitude 0.02 sits on a
grid of spacing 2^-6 * 2^-8 ~ 6e-5 and an AdamW step of lr = 1e-6 is rounded away; the script
checks this with torch. Activations are analytic estimates (documented inline), not measurements.
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
    H, L, V, F = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", H // nh)
    attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 2 * hd       # q, k, v, o, q_norm, k_norm
    mlp = 3 * H * F                                                     # gate, up, down
    per_layer = attn + mlp + 2 * H                                      # + two RMSNorms
    embed = V * H
    head = 0 if c.get("tie_word_embeddings", False) else V * H
    return {"embed": embed, "lm_head": head, "layers": L * per_layer, "final_norm": H,
            "total": embed + head + L * per_layer + H}


def kv_bytes_per_token(c: dict, dtype_bytes: int = 2) -> int:
    hd = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * hd * dtype_bytes


# bytes per element of a [tokens, vocab] block of logits at the peak of its backward pass, bf16
# autocast: the bf16 logits (2) and their fp32 copy (4), then softmax (4), the log-sum-exp and
# gather gradients (4 + 4) and their sum (4), cast to bf16 for the matrix product (2). An upper
# count (not all are alive at once), the same for one chunk (rpg_ref.models.logprobs) as for a whole
# response (the trainer before chunking). Calibration: the issue-11 H100 run of that earlier
# trainer (Qwen3-4B, 1,024-token responses, ~123-token prompts, micro-batch 1, hf engine)
# peaked at 68.6 GiB; this script gives 68.8 GiB for it (--engine hf --unchunked
# --prompt-len 123 --responses 1024).
LOGIT_BYTES = 24
# under autocast each LM-head call casts the fp32 head weight to bf16 (2 B/param) and its backward
# makes a bf16 gradient (2) converted to fp32 (4) before it is added to the weight's gradient
HEAD_WEIGHT_BYTES = 8


def auto_logit_chunk(c: dict) -> int:
    """The trainer's automatic chunk (rpg_ref.models.logprobs.AUTO_CHUNK_BYTES of fp32 logits)."""
    from rpg_ref.models.logprobs import AUTO_CHUNK_BYTES

    return max(1, AUTO_CHUNK_BYTES // (4 * c["vocab_size"]))


def activation_bytes(c: dict, seq: int, resp: int, logit_chunk: int, micro: int = 1,
                     unchunked: bool = False) -> dict:
    """Training activations with per-layer gradient checkpointing, bf16 compute.

    checkpoints: each layer's input [micro, seq, H] in bf16 is kept for the backward pass;
    layer recompute: one layer's q,k,v,attn-out and gate,up,act,prod tensors, doubled for their
    gradients (SDPA/flash attention keeps no [seq, seq] matrix);
    logits: one chunk of response tokens (or the whole response, unchunked) at the bytes per
    element above, plus the head weight's bf16 cast and gradient.
    """
    H, L, V, F = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    hd = c.get("head_dim", H // c["num_attention_heads"])
    qkvo = (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * hd
    ckpt = L * micro * seq * H * 2
    layer = 2 * micro * seq * (qkvo + 4 * F + 4 * H) * 2
    tokens = micro * (resp + 1) if unchunked else min(micro * resp, logit_chunk)
    logits = tokens * V * LOGIT_BYTES
    return {"checkpoints": ckpt, "layer_recompute": layer, "logits_chunk": logits,
            "lm_head_weight_bf16_cast_and_grad": HEAD_WEIGHT_BYTES * V * H}


def bf16_loses_small_updates() -> tuple[bool, bool]:
    import torch
    w = torch.tensor(0.02)
    lost_bf16 = bool((w.bfloat16() + torch.tensor(1e-6).bfloat16()) == w.bfloat16())
    lost_fp32 = bool((w + 1e-6) == w)
    return lost_bf16, lost_fp32


def budget(c: dict, gpu_gib: float, prompt_len: int, resp: int, logit_chunk: int, adam_bytes: int,
           reserve_gib: float, vllm_sleep_residual_gib: float, vllm_act_gib: float,
           engine: str = "vllm", unchunked: bool = False, ranks: int = 1) -> dict:
    parts = param_count(c)
    n = parts["total"]
    seq = prompt_len + resp
    act = activation_bytes(c, seq, resp, logit_chunk or auto_logit_chunk(c), unchunked=unchunked)
    shard = "" if ranks == 1 else f" (1/{ranks} shard)"
    train = {f"fp32 master weights{shard}": 4 * n / ranks, f"fp32 gradients{shard}": 4 * n / ranks,
             f"AdamW m,v ({adam_bytes} B/param){shard}": adam_bytes * n / ranks}
    if ranks > 1:  # FSDP2 units (rpg_ref.trainer.distributed.sharding.shard)
        root = parts["embed"] + parts["lm_head"] + parts["final_norm"]
        layer = parts["layers"] / c["num_hidden_layers"]
        train["FSDP root unit unsharded fp32 + its gradient"] = 8 * root
        train["FSDP 2 layers gathered + 1 layer's gradient"] = 3 * 4 * layer
    train.update({f"activations: {k}": v for k, v in act.items()})
    if engine == "vllm":
        train["vLLM asleep (level 1): CUDA graphs, context"] = vllm_sleep_residual_gib * GiB
    train["CUDA context + allocator slack"] = reserve_gib * GiB
    kv_tok = kv_bytes_per_token(c)
    out = {"params": n, "seq": seq, "train": train, "train_total": sum(train.values())}
    # rpg_ref.trainer.checkpoint_shards.plain_copy: the full fp32 policy
    gathered = 0 if ranks == 1 else 4 * n
    if engine == "hf":  # the trainer's weights and AdamW state stay; gradients were freed
        resident = (4 + adam_bytes) * n / ranks + gathered
        kv = gpu_gib * GiB - reserve_gib * GiB - resident - 2 * n
        out["rollout_hf"] = {
            "trainer state on GPU": resident,
            "hf engine bf16 copy": 2 * n,
            "KV cache + sampling": kv,
            "CUDA context + allocator slack": reserve_gib * GiB,
            "kv_tokens": int(kv // kv_tok),
            "concurrent_seqs": int(kv // kv_tok // seq),
        }
        return out
    for mode, resident in (
        ("offload", gathered),
        ("resident", (4 + adam_bytes) * n / ranks + gathered),
    ):
        free = gpu_gib * GiB - reserve_gib * GiB - resident
        util = min(MAX_VLLM_UTIL, math.floor(100 * free / (gpu_gib * GiB)) / 100)
        kv = util * gpu_gib * GiB - 2 * n - vllm_act_gib * GiB
        out[f"rollout_{mode}"] = {
            "trainer state on GPU": resident,
            "vLLM bf16 weights": 2 * n,
            "vLLM activations + CUDA graphs": vllm_act_gib * GiB,
            "KV cache": kv,
            "CUDA context + allocator slack": reserve_gib * GiB,
            "gpu_memory_utilization": util,
            "kv_tokens": int(kv // kv_tok),
            "concurrent_seqs": int(kv // kv_tok // seq),
        }
    return out


def main(argv=None) -> int:
    default_cfg = (
        Path(
            os.environ.get("RPG_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "data")
        )
        / "models"
        / "qwen3-4b"
        / "config.json"
    )
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(default_cfg))
    ap.add_argument(
        "--gpu-gib", type=float, default=80.0, help="H100 SXM/PCIe 80 GB: 79.6 GiB usable; use 80"
    )
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--logit-chunk", type=int, default=0,
                    help="response tokens per LM-head chunk (0 = the trainer's automatic size)")
    ap.add_argument("--unchunked", action="store_true",
                    help="the whole response's logits at once (the trainer before chunking)")
    ap.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    ap.add_argument("--responses", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--adam-bytes", type=int, default=8, help="8 = fp32 m,v; 2 = 8-bit AdamW")
    ap.add_argument(
        "--reserve-gib", type=float, default=2.0, help="CUDA context + allocator fragmentation"
    )
    ap.add_argument("--vllm-sleep-residual-gib", type=float, default=1.0)
    ap.add_argument(
        "--vllm-act-gib", type=float, default=3.0, help="vLLM activations, sampler, CUDA graphs"
    )
    ap.add_argument(
        "--ranks", type=int, default=1, help="per GPU of a torchrun run on this many GPUs (FSDP2)"
    )
    args = ap.parse_args(argv)
    if not Path(args.config).is_file():
        raise SystemExit(f"config {args.config} not found (set RPG_DATA_DIR or pass --config)")
    c = json.loads(Path(args.config).read_text())
    parts = param_count(c)
    print(f"model: {args.config}")
    print("parameters: " + ", ".join(f"{k} {v / 1e9:.3f}B" for k, v in parts.items()))
    print(f"KV cache per token (bf16): {kv_bytes_per_token(c) / 1024:.0f} KiB")
    lost_bf16, lost_fp32 = bf16_loses_small_updates()
    print(
        f"0.02 + 1e-6 rounds back to 0.02: bf16 {lost_bf16}, fp32 {lost_fp32}  -> fp32 master "
        "weights"
    )
    chunk = args.logit_chunk or auto_logit_chunk(c)
    print("ESTIMATES (analytic, not measured); LM head " + ("unchunked (the whole response)" if
          args.unchunked else f"in chunks of {chunk} response tokens") + f"; engine {args.engine}")
    for resp in args.responses:
        b = budget(c, args.gpu_gib, args.prompt_len, resp, args.logit_chunk, args.adam_bytes,
                   args.reserve_gib, args.vllm_sleep_residual_gib, args.vllm_act_gib,
                   args.engine, args.unchunked, args.ranks)
        print(f"\n=== response {resp} tokens (sequence {b['seq']}), GPU {args.gpu_gib:.0f} GiB"
              + (f", per rank of {args.ranks}" if args.ranks > 1 else "") + " ===")
        print(f"training phase ({'vLLM' if args.engine == 'vllm' else 'hf engine'} asleep):")
        for k, v in b["train"].items():
            print(f"  {k:<46} {v / GiB:7.2f} GiB")
        print(
            f"  {'TOTAL (estimate)':<46} {b['train_total'] / GiB:7.2f} GiB  "
            f"({'fits' if b['train_total'] <= args.gpu_gib * GiB else 'DOES NOT FIT'}, by the "
            "estimate)"
        )
        if args.engine == "hf":
            r = b["rollout_hf"]
            print("rollout phase (hf engine):")
            for k in ("trainer state on GPU", "hf engine bf16 copy", "KV cache + sampling"):
                print(f"  {k:<46} {r[k] / GiB:7.2f} GiB")
            print(
                f"  -> KV cache for {r['kv_tokens']:,} tokens = {r['concurrent_seqs']} concurrent "
                "sequences"
            )
            continue
        for mode in ("offload", "resident"):
            r = b[f"rollout_{mode}"]
            print(
                "rollout phase, trainer state "
                f"{'in CPU memory' if mode == 'offload' else 'on the GPU'}:"
            )
            for k in (
                "trainer state on GPU",
                "vLLM bf16 weights",
                "vLLM activations + CUDA graphs",
                "KV cache",
            ):
                print(f"  {k:<46} {r[k] / GiB:7.2f} GiB")
            print(
                f"  -> vLLM gpu_memory_utilization {r['gpu_memory_utilization']:.2f}, KV cache for "
                f"{r['kv_tokens']:,} tokens = {r['concurrent_seqs']} concurrent sequences"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
