"""Hugging Face causal LMs as rpg-train policies.

    policy  HFPolicy: the trainer's calling convention, the precision choice, gradient checkpointing
    load    a model from a checkpoint, a hub id or a bare config.json; the tokenizer; the export
    hub     is a model's source reachable, before anything slow starts
    gguf    a GGUF file or a packaged model (smollm2-135m-instruct) converted once to a folder
    logprobs  response log-probs with the LM head applied in chunks; micro-batches by token budget

The math task (rpg_ref/tasks/math.py) builds its policy from these; nothing here knows a task.
"""
