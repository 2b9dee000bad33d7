"""Engines: who samples responses (the Engine protocol of rpg_ref.interfaces).

    hf       batched sampling from the policy (or its bf16 copy), static KV cache, compiled on CUDA
    sample   a plain autoregressive sampler for any policy module (the bandit's)
    vllm     colocated vLLM with sleep/wake and a verified weight sync (optional dependency)
"""
