"""rpg-train's loop: the RPG paper's iterative-reference scheme, read top to bottom.

The paper trains (sec:experiments; Algorithm alg:offpolicy_rpg_rf_ppo_dualclip_v1's outer loop)

    for step = 1 .. steps:                                                      where below
      1. sample G responses to each of B prompts with pi_old (= the current policy)   rollout
         (--sampler-lag K: with the policy of K updates before, trainer.sampler_lag)
      2. score them: R = reward(x) (+ DAPO's overlong penalty)                        rollout
      3. log pi_old(x) in one forward pass, stored: the ONLY copy of pi_old           train, "3."
         (--pi-old sampler: pi_old is the policy that drew x, a stale sampler's own weights)
         (--ref init: also log pi_ref(x) of the frozen initial policy; --rollout-correction:
         weights pi_old(x) / pi_sampler(x) from the engine's log-probs: trainer.rollout_correction)
      4. A = advantage(R)  (group mean by default; core.advantages)                   train, "4."
      5. for k = 1 .. K, over shuffled mini-batches:                                  update
           L = loss(log pi_theta, log pi_old, A; beta, pi_ref, clip)  (core.losses)
           stop early if the running KL(pi_theta || pi_old) estimate > kappa
           AdamW step on L
      6. pi_old <- pi_theta: nothing to copy, the next rollout samples from it        train, "6."
      7. log metrics (trainer.metrics), checkpoint atomically (trainer.checkpoint)    train, "7."

(module names above are under rpg_ref.)

With ``--ref iterative`` (the default) pi_ref = pi_old: the loss gets ``ref_logp=None`` and one
model lives in memory. ``--ref init`` keeps a frozen copy of the initial policy as pi_ref (GRPO's
setting): a second model. Losses and advantages are imported, never re-implemented here.

The loop is single-process code over the step's whole batch. Under torchrun the ranks split the
work inside the calls of rpg_ref/trainer/distributed/workers.py (``Workers``: sampling, scoring,
evaluation and the final policy; ``map_rows``: log-probs; ``rank_micro_batches``: the update)
and meet in rpg_ref/trainer/collectives.py (``from_main``, ``sum_over_ranks``); with one process
each of them is the plain call.

Everything else lives next door: the flags in rpg_ref/trainer/config.py and rpg_ref/cli.py, the
presets in rpg_ref/trainer/presets.py, what a task or an engine must provide in
rpg_ref/interfaces.py, the tasks in rpg_ref/tasks/, the samplers in rpg_ref/engines/, checkpoints in
rpg_ref/trainer/checkpoint.py, the metric keys in rpg_ref/trainer/metrics.py.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import time
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from rpg_ref.core.advantages import compute_advantages
from rpg_ref.core.kl import k3
from rpg_ref.core.losses import LOSSES, LossOptions
from rpg_ref.interfaces import Batch, Prompt, collate, init_seed
from rpg_ref.models.logprobs import micro_batches, token_logprobs
from rpg_ref.registry import ENGINES, TASKS, resolve
from rpg_ref.strict_json import dumps, loads
from rpg_ref.trainer.checkpoint import (
    checkpoint_state,
    latest_step,
    load_checkpoint,
    save_checkpoint,
)
from rpg_ref.trainer.collectives import from_main, sum_over_ranks
from rpg_ref.trainer.config import Config, loss_options, resolved_adv
from rpg_ref.trainer.distributed.setup import Rank, agree, all_set_up, join
from rpg_ref.trainer.distributed.sharding import shard
from rpg_ref.trainer.distributed.workers import Workers, map_rows, rank_micro_batches
from rpg_ref.trainer.files import atomic_write
from rpg_ref.trainer.interrupts import signals_deferred
from rpg_ref.trainer.metrics import (
    MetricsLog,
    Progress,
    Watch,
    evaluation_at_start,
    live_parameter_count,
    peak_memory_mb,
)
from rpg_ref.trainer.rollout_correction import weights_for_batch
from rpg_ref.trainer.sampler_lag import OnPolicy, build_engine
from rpg_ref.trainer.shaping import overlong_penalty

# =============================================================================================
# 1-2. rollout: sample with pi_old, score, DAPO dynamic sampling
# =============================================================================================


class Group(NamedTuple):
    """One prompt and its G scored responses."""

    prompt: Prompt
    responses: list  # G token id lists
    sampler_logp: list | None  # G lists of the engine's own log-probs, when it reports them
    rewards: Tensor  # [G] incl. the overlong penalty
    correct: Tensor  # [G] bool


def rollout(task, workers, cfg: Config, gen: torch.Generator, device) -> tuple[Batch, dict]:
    """Sample prompts_per_step groups with pi_old and score them. With --dynamic-sampling, groups
    whose rewards are all equal carry no signal (A = 0): drop them and sample more prompts, up to
    --dynamic-sampling-rounds generation rounds (then complete the batch with dropped groups).
    ``workers`` samples with the engine and scores with the task (under torchrun each rank its
    share, and every rank gets all the responses, log-probs and rewards)."""
    G, rounds_cap = cfg.group_size, cfg.dynamic_sampling_rounds if cfg.dynamic_sampling else 1
    kept, dropped, rounds, t_gen, t_score, n_tok = [], [], 0, 0.0, 0.0, 0
    while len(kept) < cfg.prompts_per_step and rounds < rounds_cap:
        prompts = task.sample_prompts(cfg.prompts_per_step - len(kept), gen)  # n prompts
        t0 = time.perf_counter()
        sampled = workers.generate([p.ids for p in prompts], G, cfg.temperature, cfg.top_p,
                                   cfg.max_new_tokens)  # n x G responses, groups consecutive
        t1 = time.perf_counter()
        r, correct = workers.reward([p for p in prompts for _ in range(G)],
                                    sampled.responses)  # [n*G] each
        lengths = torch.tensor([len(x) for x in sampled.responses], device=r.device)
        r = r + overlong_penalty(lengths, cfg.max_new_tokens, cfg.overlong_buffer,
                                 cfg.overlong_penalty)
        t_gen, t_score = t_gen + t1 - t0, t_score + time.perf_counter() - t1
        rounds, n_tok = rounds + 1, n_tok + int(lengths.sum())
        for i, p in enumerate(prompts):
            sl = slice(i * G, (i + 1) * G)
            lps = None if sampled.logprobs is None else sampled.logprobs[sl]
            group = Group(p, sampled.responses[sl], lps, r[sl], correct[sl])
            informative = bool((group.rewards != group.rewards[0]).any())
            (kept if informative or not cfg.dynamic_sampling else dropped).append(group)
    groups = (kept + dropped[::-1])[: cfg.prompts_per_step]
    slp = (None if any(grp.sampler_logp is None for grp in groups)
           else [lp for grp in groups for lp in grp.sampler_logp])
    ids = [grp.prompt.ids for grp in groups for _ in range(G)]
    responses = [y for grp in groups for y in grp.responses]
    batch = Batch(**collate(ids, responses, task.pad_id, device, slp),
                  rewards=torch.cat([grp.rewards for grp in groups]).float().to(device),
                  correct=torch.cat([grp.correct for grp in groups]).to(device))
    info = {"time_rollout": t_gen, "time_scoring": t_score, "gen_tokens": n_tok}
    if cfg.dynamic_sampling:
        info.update(dyn_rounds=rounds, dyn_kept=min(len(kept), cfg.prompts_per_step),
                    dyn_filled=int(len(kept) >= cfg.prompts_per_step))
    return batch, info


# =============================================================================================
# 3. log-probs: one forward pass per (micro-)batch
# =============================================================================================


@torch.no_grad()
def batch_logprobs(model: nn.Module, b: Batch, cfg: Config,
                   entropy: bool) -> tuple[Tensor, Tensor | None]:
    """Behaviour (or reference) log-probs [N, T] of the whole batch (and the entropy [N, T]),
    micro-batch by micro-batch (rpg_ref.models.logprobs: padding cut, LM head in chunks); 0 at
    padding. Under torchrun each rank computes its share of the rows, and every rank gets all."""

    def rows_logprobs(rows: Batch) -> tuple[Tensor, Tensor | None]:
        logp = ent = None
        max_seqs = cfg.micro_batch_size or cfg.mini_batch_size
        for idx, ub in micro_batches(rows, max_seqs, cfg.micro_batch_tokens):
            res = token_logprobs(model, ub, cfg.temperature, entropy, cfg.logprob_chunk)
            lp, e = res if entropy else (res, None)  # [mu, T'] each
            if logp is None:
                logp = lp.new_zeros(rows.mask.shape)
                ent = lp.new_zeros(rows.mask.shape) if entropy else None
            logp[idx, : lp.shape[1]] = lp
            if entropy:
                ent[idx, : e.shape[1]] = e
        return logp, ent

    return map_rows(rows_logprobs, b, model)


# =============================================================================================
# 5. update: up to K optimizer steps on one rollout batch, KL(pi_theta || pi_old) early stop
# =============================================================================================

STAT_KEYS = ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "ratio_mean", "kl", "kl_old")


def update(policy: nn.Module, opt: torch.optim.Optimizer, b: Batch, cfg: Config,
           loss_opts: LossOptions) -> dict:
    """The inner loop: K optimizer steps on mini-batches of M responses, reshuffled every pass,
    each accumulated over micro-batches (at most --micro-batch-size responses and
    --micro-batch-tokens tokens: rpg_ref.models.logprobs.micro_batches). Stops before a step when
    the running mean of stats["kl_old"] over the last pass's worth of mini-batches exceeds kappa.
    Under torchrun each rank runs its share of every mini-batch (rpg_ref.trainer.distributed)."""
    loss_fn, N, M = LOSSES[cfg.algo], len(b), cfg.mini_batch_size
    per_pass = N // M
    K = cfg.updates_per_step or per_pass
    params = [p for p in policy.parameters() if p.requires_grad]
    window = deque(maxlen=per_pass)
    acc = {k: [] for k in (*STAT_KEYS, "loss", "grad_norm")}
    n_upd, early, train_tokens = 0, False, 0
    while n_upd < K and not early:
        # [N] one order for every rank (rank 0's draw): the ranks share each mini-batch
        perm = from_main(torch.randperm(N)).to(b.mask.device)
        for j in range(min(per_pass, K - n_upd)):
            mb = b.index(perm[j * M : (j + 1) * M])  # [M] rows
            opt.zero_grad(set_to_none=True)
            mb_tokens = float(mb.mask.sum())
            mb_stats = dict.fromkeys((*STAT_KEYS, "loss"), 0.0)
            # padding cut per micro-batch; torchrun: this rank's share of mb (and as many
            # micro-batches on every rank: FSDP's collectives are per pass)
            for ub, live in rank_micro_batches(mb, cfg.micro_batch_size, cfg.micro_batch_tokens):
                # [mu, T']
                logp = token_logprobs(policy, ub, cfg.temperature, chunk=cfg.logprob_chunk)
                loss, stats = loss_fn(logp, ub.old_logp, ub.adv, ub.mask, ref_logp=ub.ref_logp,
                                      sample_weight=ub.rollout_weight, options=loss_opts)
                # the mini-batch loss = micro-batch losses weighted by their share of it
                # (tokens for token-mean, sequences for the seq-mean aggregations)
                frac = float(ub.mask.sum()) / mb_tokens if cfg.agg == "token-mean" else len(ub) / M
                frac = frac if live else 0.0
                (loss * frac).backward()
                mb_stats["loss"] += float(loss.detach()) * frac
                for k in STAT_KEYS:
                    mb_stats[k] += float(stats[k]) * frac
            mb_stats = sum_over_ranks(mb_stats)  # torchrun: the ranks' shares add up
            window.append(mb_stats["kl_old"])
            if sum(window) / len(window) > cfg.kappa:  # trust region left: this step is not applied
                early = True
                opt.zero_grad(set_to_none=True)
                break
            gn = torch.nn.utils.clip_grad_norm_(params,
                                                cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            opt.step()
            n_upd += 1
            train_tokens += int(mb.mask.sum())
            for k, v in mb_stats.items():
                acc[k].append(v)
            acc["grad_norm"].append(float(gn))
    opt.zero_grad(set_to_none=True)  # free the gradients before the next rollout (16 GB at 4B)
    result = {k: sum(v) / len(v) if v else float("nan") for k, v in acc.items()}
    result["kl_loss"] = result.pop("kl")
    result.update(kl_old_last=sum(window) / len(window), updates=n_upd, early_stop=int(early),
                  train_tokens=train_tokens)
    return result


def lr_at(step: int, cfg: Config) -> float:
    """Learning rate for training step ``step`` (1-based): linear warm-up, then constant or
    cosine."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.lr_decay == "cosine":
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * t))
    return cfg.lr


# =============================================================================================
# the loop
# =============================================================================================


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Run(NamedTuple):
    """Everything the loop needs; built by ``prepare`` before anything is written."""

    rank: Rank  # this process: its device; under torchrun its rank and the world size
    task: Any  # rpg_ref.interfaces.Task
    policy: nn.Module  # pi_theta; pi_old lives on as stored log-probs
    ref: nn.Module | None  # pi_ref (--ref init), else None: pi_ref = pi_old
    engine: OnPolicy  # the Engine protocol, and the engine's part of a checkpoint (sampler_lag)
    opt: torch.optim.Optimizer
    gen: torch.Generator  # the prompt stream
    loss: LossOptions  # the loss's options, resolved once (rpg_ref.trainer.config.loss_options)


def prepare(cfg: Config) -> Run:
    """Build the task (reads its data), the policy (loads its model), pi_ref, the engine and the
    optimizer. A bad input raises ValueError here, before OUT is created (torchrun: on every rank,
    at once)."""
    rank = join(cfg)  # torchrun: the process group, cuda:LOCAL_RANK
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    engine_cls, task, policy, ref = agree(lambda: build(cfg, rank.device))
    engine = build_engine(engine_cls, policy, task, cfg)  # --sampler-lag K: K updates old
    policy, ref = shard(policy, ref)  # torchrun: FSDP2, 1/world of each per rank
    all_set_up()  # torchrun: once every rank has built and checked its inputs
    # fused AdamW (one kernel per step) where torch has it for every parameter: float on CPU/CUDA
    params = list(policy.parameters())
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=tuple(cfg.adam_betas), fused=fused)
    seed_everything(cfg.seed + 1 + rank.seed_offset)  # the same stream, cached artifacts or not
    return Run(rank, task, policy, ref, engine, opt, torch.Generator().manual_seed(cfg.seed + 2),
               loss_options(cfg))


def build(cfg: Config, device: torch.device) -> tuple:
    """(the engine's class, the task, the policy, pi_ref or None), each input checked."""
    engine_cls = resolve(ENGINES, cfg.engine, "engine")
    getattr(engine_cls, "check_available", lambda: None)()  # a missing vLLM: before any cache
    seed_everything(init_seed(cfg))  # the model's init and the task's warm start: --init-seed
    task = resolve(TASKS, cfg.task, "task")(cfg, device)
    previous_dtype = torch.get_default_dtype()  # models are built in float32 whatever the caller's
    torch.set_default_dtype(torch.float32)      # default (mixed precision is a task option)
    try:
        policy = task.build_policy().to(device)
    finally:
        torch.set_default_dtype(previous_dtype)
    # no dropout, ever: w = pi_theta / pi_old must be exactly 1 before the first update
    policy.eval()
    ref = copy.deepcopy(policy).eval().requires_grad_(False) if cfg.ref == "init" else None
    return engine_cls, task, policy, ref


def finished(cfg: Config) -> bool:
    """A resumed run that already reached cfg.steps and wrote its summary: nothing to do."""
    out = Path(cfg.out)
    return bool(cfg.resume) and latest_step(out) >= cfg.steps and (out / "summary.json").is_file()


def train(cfg: Config, run: Run | None = None) -> dict:
    """Run (or resume) the training described by ``cfg``; returns the summary dict."""
    out = Path(cfg.out)
    if finished(cfg):  # leave every file as it is
        return loads((out / "summary.json").read_text())
    run = run or prepare(cfg)
    rank, task, policy, ref, opt, gen = run.rank, run.task, run.policy, run.ref, run.opt, run.gen
    device, loss_opts = rank.device, run.loss
    # the task and the engine over every rank (one process: their own calls)
    workers = Workers(task, run.engine, policy)
    if rank.main:  # rank 0 writes the run folder
        out.mkdir(parents=True, exist_ok=True)
        if not cfg.resume:
            atomic_write(out / "config.json", dumps(dataclasses.asdict(cfg), indent=1))
    resumed = load_checkpoint(out, policy, ref, opt, gen) if cfg.resume else None
    start = resumed.step if resumed else 0
    if resumed:
        workers.restore(resumed.folder)  # the engine was built before the checkpoint was loaded
    log = MetricsLog(out, start, cfg.tensorboard) if rank.main else None
    bar = Progress(cfg.steps, start, cfg.progress and rank.main)
    model_params = sum(p.numel() for p in policy.parameters())
    rows = log.rows() if log else []  # a resumed run's rows so far
    row = rows[-1] if rows else {}
    last_eval = {k: v for k, v in row.items() if k.startswith("eval_")}
    live_params, t_run = None, time.perf_counter()
    watch = Watch(cfg, rows)  # non-finite values stop the run; health is judged at its end

    with bar:  # the progress bar, cleared if the loop ends on an exception
        bar.phase("evaluation")
        start_eval = evaluation_at_start(out, workers, device, fresh=not start, main=rank.main)
        for step in range(start + 1, cfg.steps + 1):
            t_step = time.perf_counter()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for param_group in opt.param_groups:
                param_group["lr"] = lr_at(step, cfg)

            # --- 1-2. rollout with pi_old (= the current policy) and scoring ---
            bar.phase("rollout")
            workers.wake()
            batch, info = rollout(task, workers, cfg, gen, device)  # N = prompts x G rows
            workers.sleep()

            # --- 3. log pi_old, stored once (and log pi_ref); 4. advantages ---
            bar.phase("log-probs")
            t0 = time.perf_counter()
            # --pi-old sampler: pi_old is the policy that drew x (coupled); else the current one
            pi_old = run.engine.behaviour(policy) if cfg.pi_old == "sampler" else policy
            batch.old_logp, ent = batch_logprobs(pi_old, batch, cfg, entropy=True)  # [N, T] each
            if ref is not None:
                batch.ref_logp, _ = batch_logprobs(ref, batch, cfg, entropy=False)
            mask = batch.mask  # [N, T]
            batch.adv = compute_advantages(  # [N], or [N, T] for the token-level estimators
                resolved_adv(cfg), batch.rewards, cfg.group_size, mask=mask,
                old_logp=batch.old_logp, beta=loss_opts.reward_beta,
                ref_logp=batch.ref_logp if batch.ref_logp is not None else batch.old_logp)
            # --rollout-correction: pi_old / pi_sampler weights
            rc_stats = weights_for_batch(batch, cfg)
            t_lp = time.perf_counter() - t0

            # --- 5. the inner loop; 6. pi_old <- pi_theta (engines with own weights re-sync) ---
            bar.phase("update")
            t0 = time.perf_counter()
            upd = update(policy, opt, batch, cfg, loss_opts)
            t_upd = time.perf_counter() - t0
            workers.sync_weights()

            # --- 7. metrics (keys explained in rpg_ref/trainer/metrics.py) and checkpoint ---
            n_tok = mask.sum()  # the batch's response tokens
            row = {"step": step, "reward": float(batch.rewards.mean()),
                   "accuracy": float(batch.correct.float().mean()),
                   "entropy": float((ent * mask).sum() / n_tok),
                   "response_len": float(mask.sum(1).mean()),
                   **{k: v for k, v in upd.items() if k != "train_tokens"},
                   "kl_ref": 0.0, "lr": opt.param_groups[0]["lr"]}
            if ref is not None:  # token-mean k3 estimate of KL(pi_old || pi_ref)
                row["kl_ref"] = float((k3(batch.ref_logp - batch.old_logp) * mask).sum() / n_tok)
            if batch.sampler_logp is not None:
                diff = (batch.sampler_logp - batch.old_logp).abs() * mask  # [N, T]
                row["logprob_diff_max"] = float(diff.max())
            row.update(rc_stats)
            row.update({k: v for k, v in info.items() if k.startswith("dyn_")})
            row.update(gen_tokens_per_s=info["gen_tokens"] / max(info["time_rollout"], 1e-9),
                       train_tokens_per_s=upd["train_tokens"] / max(t_upd, 1e-9),
                       time_rollout=info["time_rollout"], time_scoring=info["time_scoring"],
                       time_logprob=t_lp, time_update=t_upd)
            if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
                bar.phase("evaluation")
                last_eval = {f"eval_{k}": v for k, v in workers.evaluate().items()}  # rank 0's
                row.update(last_eval)
            row["time_step"] = time.perf_counter() - t_step
            row["peak_mem_mb"] = peak_memory_mb(device)  # torchrun: the largest rank's
            if live_params is None:
                live_params = live_parameter_count()
            watch.check(row)  # before the row and the checkpoint are written
            ckpt = None
            if step % cfg.save_every == 0 or step == cfg.steps:
                bar.phase("checkpoint")
                ckpt = checkpoint_state(policy, ref, opt, gen)  # torchrun: a collective: outside
                ckpt.update(run.engine.state())  # --sampler-lag: the sampler's weight history
            with signals_deferred():  # a signal waits until the row and the checkpoint are written
                if log:
                    log.write(row)
                bar.update(step, cfg.steps, row)
                if ckpt is not None:
                    save_checkpoint(out, step, ckpt, cfg, keep=cfg.keep_checkpoints)

    if rank.main and (warning := watch.verdict()):  # a collapse, or a policy that stopped learning
        bar.say(warning)
    if live_params is None:
        live_params = live_parameter_count()
    # torchrun: every rank takes part; rank 0 gets a plain copy of the policy, the others None
    plain = workers.plain_policy()
    summary = {"config": dataclasses.asdict(cfg), "steps_done": cfg.steps, "final": row,
               "eval": last_eval, "eval_at_start": start_eval,
               "evaluation": getattr(task, "evaluation", "evaluation"),
               "model_params": model_params, "live_params": live_params,
               "models_in_memory": live_params / model_params, "world_size": rank.world,
               "wall_time_s_this_process": time.perf_counter() - t_run, "health": watch.health(),
               **(task.summary(plain, cfg) if rank.main else {})}
    if hasattr(task, "finish"):  # the task's last artifacts; summary.json then marks the run done
        task.finish(plain, out)
    if rank.main:
        atomic_write(out / "summary.json", dumps(summary, indent=1))
    return summary
