"""Data parallel training under torchrun: FSDP2-sharded policy and optimizer, one engine per rank.

    torchrun --standalone --nproc_per_node N -m rpg_ref.cli [flags]      (docs/distributed.md)

The loop (rpg_ref/trainer/train.py) is written for one process over the step's whole batch; the
calls of this package are where the ranks split the work and where they meet:

    setup     joining the job (the process group, devices, the set-up's long wait) and leaving it
    sharding  FSDP2 over the policy and pi_ref; ``gathered``: the full weights for a while
    workers   the work split over the ranks: ``Workers`` (sampling, scoring, evaluation, weight
              syncs, the final policy), ``map_rows`` (log-prob passes), ``rank_micro_batches``
              (the update)
    liveness  heartbeats: which rank died or hangs, and which one is stopping on a signal

The ranks' primitives (which rank this is; rank 0's value to all; sums and maxima over ranks) are
rpg_ref/trainer/collectives.py, and a sharded checkpoint is gathered and loaded by
rpg_ref/trainer/checkpoint_shards.py: layers below this one (docs/architecture.md).

What a rank does, and what the ranks decide together (so they never disagree):
- Every rank draws the same prompts from the shared prompt stream. ``Workers`` cuts the step's
  prompts x G responses into world contiguous shares by response index; each rank samples
  (``Workers.generate``) and scores (``Workers.reward``) its share with its own engine and its own
  random stream (``Rank.seed_offset``), and every rank then holds all the token lists, sampler
  log-probs and rewards. So DAPO's dynamic sampling, the batch, the advantages (groups may span
  ranks; REINFORCE++ whitens over every token) and the logged rollout values are computed by every
  rank on the whole batch, exactly as one process computes them.
- The policy (and pi_ref with --ref init) is sharded with FSDP2 (``shard``: ``fully_shard`` per
  decoder layer, then the root), so parameters, gradients and AdamW state are 1/world per rank.
  Sampling, the log-prob passes, evaluation and weight syncs run inside ``gathered(model)``: the
  full weights are all-gathered once per call, every forward is then local (ranks may run
  different numbers of them), and the shards are restored after.
- The log-prob passes (``map_rows``): each rank computes its contiguous N / world rows, and the
  [rows, T] results are all-gathered, so every rank holds log pi_old (and log pi_ref) of the batch.
- The update: the mini-batches are slices of one permutation of the whole batch, drawn by rank 0
  and sent to all (``from_main``); each rank trains its contiguous M / world rows of each
  (``rank_micro_batches``) and weights each micro-batch loss by its share of the GLOBAL mini-batch
  (tokens for token-mean, sequences otherwise). FSDP reduce-scatters the gradients with a plain SUM
  (gradient divide factor 1), so the summed gradient is the single-process gradient of the
  mini-batch. Gradient-norm clipping uses the global norm. The mini-batch's loss statistics are
  summed over the ranks (``sum_over_ranks``) before the kappa early stop reads them.
- Rank 0 writes the run folder; rank 0 alone runs the task's evaluation (``Workers.evaluate``) and
  the others wait for its result, and it gets the final policy as a plain module for the task's
  summary (``Workers.plain_policy``); peak memory is the largest rank's (``max_over_ranks``, in
  rpg_ref.trainer.metrics.peak_memory_mb).
- Every rank joins the job before rank 0 takes the run folder (rpg-train, rpg_ref/cli.py), so a
  refusal (a folder in use, bad input) is every rank's at once: each exits with code 2 within
  seconds, and torchrun's report names the project's line as each rank's cause.
- A rank that dies: torchrun's agent stops the others at once and the survivors' gloo/NCCL
  connections fail; a rank that hangs: every collective after set-up times out after
  --dist-timeout seconds. Joining the group and the set-up (``join`` to ``all_set_up``) wait up to
  STARTUP_TIMEOUT_S at least: ranks start apart (imports, data, a warm start) by more than a short
  --dist-timeout on a loaded machine, and that is no hang.

With one process (no torchrun, or WORLD_SIZE=1) every call here is the plain single-process call
(``Workers.generate`` is ``engine.generate``, ``map_rows(fn, b, m)`` is ``fn(b)``, ...), and a run
is bit for bit what it is without this package.
"""
