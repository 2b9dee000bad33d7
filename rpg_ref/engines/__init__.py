"""Rollout engines that live outside rpg_ref.train (optional dependencies, imported lazily).

    rpg_ref.engines.vllm_engine.VLLMEngine   colocated vLLM with sleep/wake and verified weight sync
"""
