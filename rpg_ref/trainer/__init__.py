"""rpg-train's machinery: the loop and what it needs (the command line is rpg_ref/cli.py).

    train               the loop, read top to bottom: rollout, log-probs, advantages, updates
    config              the Config dataclass (its field docs are --help), presets, validation
    checkpoint          atomic checkpoints and resume
    interrupts          the end of a step (row, checkpoint), which SIGINT and SIGTERM wait for
    metrics             metrics.jsonl, TensorBoard, the progress bar
    shaping             DAPO's overlong penalty, added to every task's reward
    rollout_correction  importance weights for a sampler that is not pi_old
    distributed         torchrun data parallel (FSDP2), a no-op in one process
"""
