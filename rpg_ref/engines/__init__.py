"""Engines: who samples responses (the Engine protocol of rpg_ref.interfaces).

    hf       transformers ``generate`` on the policy module itself
    sample   a plain autoregressive sampler for any policy module (the bandit's)
    vllm     colocated vLLM with sleep/wake and a verified weight sync (optional dependency)
"""
