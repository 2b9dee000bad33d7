"""Chapter 8 solutions: back-of-the-envelope sizes for a GPU run (assumptions in the chapter)."""


def gpu_hours(params, prompts_per_step, samples_per_prompt, tokens_per_response, steps,
              epochs=1, forwards=2, gpu_flops=989e12, mfu_train=0.25, mfu_generate=0.05):
    """Exercise 8.1: GPU-hours of an RL run by FLOPs. Tokens per step T = prompts x samples x
    response tokens (prompt tokens ignored). Generation 2 N T FLOPs at mfu_generate; the update
    (forward + backward, 6 N T) once per epoch over the batch, plus ``forwards`` scoring passes
    (2 N T each: pi_old and pi_ref; 1 when pi_ref = pi_old), at mfu_train. gpu_flops: dense bf16
    peak (989e12: an H100 SXM)."""
    T = prompts_per_step * samples_per_prompt * tokens_per_response
    generate = 2 * params * T / (gpu_flops * mfu_generate)
    train = (6 * epochs + 2 * forwards) * params * T / (gpu_flops * mfu_train)
    return steps * (generate + train) / 3600


def logits_gib(batch_tokens, vocab, bytes_per_value=4):
    """Exercise 8.2: memory of the full-vocabulary logits of batch_tokens tokens, in GiB."""
    return batch_tokens * vocab * bytes_per_value / 2**30
