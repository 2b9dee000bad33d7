"""rpg-train's machinery: the loop and what it needs (the command line is rpg_ref/cli.py), in
layers; a module imports only its own layer and those below (docs/architecture.md).

    7  train               the loop, read top to bottom: rollout, log-probs, advantages, updates
       interrupts          the end of a step (row, checkpoint), which SIGINT and SIGTERM wait for
       shaping             DAPO's overlong penalty, added to every task's reward
    6  sampler_lag         the engine as the loop holds it: itself, or K updates behind
    5  distributed/        torchrun data parallel (FSDP2): set-up, sharding, workers, liveness
    4  config_checks       a Config against the run folder, the ranks and the machine
       metrics             metrics.jsonl, TensorBoard, the progress bar, each row's checks
    3  checkpoint          atomic checkpoints and resume
       checkpoint_shards   a sharded run's checkpoint: gathered on rank 0, loaded into the shards
    2  run_folder          one writer per run folder
    1  config, presets     the Config dataclass (its field docs are --help), presets, validation
       rollout_correction  importance weights for a sampler that is not pi_old
    0  errors, files       the one-line endings of a run; atomic file writes
       collectives         which rank this is, and how the ranks agree on a value
"""
