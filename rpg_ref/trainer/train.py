"""rpg-train's loop: the RPG paper's iterative-reference scheme, read top to bottom.

The paper trains (sec:experiments; Algorithm alg:offpolicy_rpg_rf_ppo_dualclip_v1's outer loop)

    for step = 1 .. steps:                                                      where below
      1. sample G responses to each of B prompts with pi_old (= the current policy)   rollout
      2. score them: R = reward(x) (+ DAPO's overlong penalty)                        rollout
      3. log pi_old(x) in one forward pass, stored: the ONLY copy of pi_old           train, "3."
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

Everything else lives next door: the flags and presets in rpg_ref/trainer/config.py and
rpg_ref/cli.py, what a task or an engine must provide in rpg_ref/interfaces.py, the tasks in
rpg_ref/tasks/, the samplers in rpg_ref/engines/, checkpoints in rpg_ref/trainer/checkpoint.py, the
metric keys in rpg_ref/trainer/metrics.py.
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
from torch import nn

from rpg_ref.core.advantages import compute_advantages
from rpg_ref.core.kl import k3
from rpg_ref.core.losses import LOSSES, LossOptions
from rpg_ref.interfaces import Batch, collate
from rpg_ref.models.logprobs import micro_batches, token_logprobs
from rpg_ref.registry import ENGINES, TASKS, resolve
from rpg_ref.strict_json import dumps, loads
from rpg_ref.trainer import distributed as D
from rpg_ref.trainer.checkpoint import (
    atomic_write,
    checkpoint_state,
    latest_step,
    load_checkpoint,
    save_checkpoint,
)
from rpg_ref.trainer.config import Config, loss_options, resolved_adv
from rpg_ref.trainer.interrupts import signals_deferred
from rpg_ref.trainer.metrics import (
    MetricsLog,
    Progress,
    Watch,
    live_parameter_count,
    peak_memory_mb,
)
from rpg_ref.trainer.rollout_correction import weights_for_batch
from rpg_ref.trainer.shaping import overlong_penalty

# =============================================================================================
# 1-2. rollout: sample with pi_old, score, DAPO dynamic sampling
# =============================================================================================


def rollout(task, engine, cfg: Config, gen: torch.Generator, device) -> tuple[Batch, dict]:
    """Sample prompts_per_step groups with pi_old and score them. With --dynamic-sampling, groups
    whose rewards are all equal carry no signal (A = 0): drop them and sample more prompts, up to
    --dynamic-sampling-rounds generation rounds (then complete the batch with dropped groups)."""
    G, rounds_cap = cfg.group_size, cfg.dynamic_sampling_rounds if cfg.dynamic_sampling else 1
    kept, dropped, rounds, t_gen, t_score, n_tok = [], [], 0, 0.0, 0.0, 0
    while len(kept) < cfg.prompts_per_step and rounds < rounds_cap:
        # the same on every rank
        prompts = task.sample_prompts(cfg.prompts_per_step - len(kept), gen)
        t0 = time.perf_counter()
        lo, hi, resp, lps = D.generate_share(engine, prompts, G, cfg)  # this rank's [lo, hi) of n*G
        t1 = time.perf_counter()
        r, correct = (
            task.reward([prompts[k // G] for k in range(lo, hi)], resp)
            if resp
            else (torch.zeros(0, device=device), torch.zeros(0, dtype=torch.bool, device=device))
        )
        lengths = torch.tensor([len(x) for x in resp], device=r.device)
        r = r + overlong_penalty(
            lengths, cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty
        )
        # [n*G]
        r, correct, tok, has_lp = D.gather_scores(r, correct, int(lengths.sum()), lps is not None)
        t_gen, t_score = t_gen + t1 - t0, t_score + time.perf_counter() - t1
        rounds, n_tok = rounds + 1, n_tok + tok
        pad = ([None] * lo, [None] * (len(prompts) * G - hi))  # responses that other ranks sampled
        resp, lps = pad[0] + resp + pad[1], pad[0] + lps + pad[1] if has_lp else None
        for i, p in enumerate(prompts):
            sl = slice(i * G, (i + 1) * G)
            group = (p, resp[sl], None if lps is None else lps[sl], r[sl], correct[sl])
            informative = bool((r[sl] != r[sl][0]).any())
            (kept if informative or not cfg.dynamic_sampling else dropped).append(group)
    groups = (kept + dropped[::-1])[: cfg.prompts_per_step]
    slp = None if any(x[2] is None for x in groups) else [lp for x in groups for lp in x[2]]
    lo, hi = D.share(len(groups) * G)  # this rank trains rows [lo, hi) of the batch
    resp, slp = D.take_share([y for x in groups for y in x[1]], slp)
    ids = [x[0].ids for x in groups for _ in range(G)][lo:hi]
    batch = Batch(**collate(ids, resp, task.pad_id, device, slp),
                  rewards=torch.cat([x[3] for x in groups])[lo:hi].float().to(device),
                  correct=torch.cat([x[4] for x in groups])[lo:hi].to(device))
    info = {"time_rollout": t_gen, "time_scoring": t_score, "gen_tokens": n_tok}
    if cfg.dynamic_sampling:
        info.update(dyn_rounds=rounds, dyn_kept=min(len(kept), cfg.prompts_per_step),
                    dyn_filled=int(len(kept) >= cfg.prompts_per_step))
    return batch, info


# =============================================================================================
# 3. log-probs: one forward pass per (micro-)batch
# =============================================================================================


@torch.no_grad()
def batch_logprobs(model: nn.Module, b: Batch, cfg: Config, entropy: bool) -> tuple:
    """Behaviour (or reference) log-probs [N, T] of the whole batch (and the entropy), micro-batch
    by micro-batch (rpg_ref.models.logprobs: padding cut, LM head in chunks); 0 at padding."""
    logp = ent = None
    max_seqs = cfg.micro_batch_size or cfg.mini_batch_size
    for idx, ub in micro_batches(b, max_seqs, cfg.micro_batch_tokens):
        out = token_logprobs(model, ub, cfg.temperature, entropy, cfg.logprob_chunk)
        lp, e = out if entropy else (out, None)
        if logp is None:
            logp = lp.new_zeros(b.mask.shape)
            ent = lp.new_zeros(b.mask.shape) if entropy else None
        logp[idx, : lp.shape[1]] = lp
        if entropy:
            ent[idx, : e.shape[1]] = e
    return logp, ent


# =============================================================================================
# 5. update: up to K optimizer steps on one rollout batch, KL(pi_theta || pi_old) early stop
# =============================================================================================

STAT_KEYS = ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "ratio_mean", "kl", "kl_old")


def update(policy: nn.Module, opt: torch.optim.Optimizer, b: Batch, cfg: Config,
           loss_opts: LossOptions) -> dict:
    """The inner loop: K optimizer steps on mini-batches of M responses, reshuffled every pass,
    each accumulated over micro-batches (at most --micro-batch-size responses and
    --micro-batch-tokens tokens: rpg_ref.models.logprobs.micro_batches). Stops before a step when
    the running mean of stats["kl_old"] over the last pass's worth of mini-batches exceeds kappa."""
    loss_fn, N, M = LOSSES[cfg.algo], len(b), cfg.mini_batch_size  # N: this rank's rows
    m = M // D.world()  # this rank's rows of each mini-batch of M
    mu, per_pass = cfg.micro_batch_size or m, N // m
    K = cfg.updates_per_step or per_pass
    params = [p for p in policy.parameters() if p.requires_grad]
    window = deque(maxlen=per_pass)
    acc = {k: [] for k in (*STAT_KEYS, "loss", "grad_norm")}
    n_upd, early, train_tokens = 0, False, 0
    while n_upd < K and not early:
        perm = torch.randperm(N).to(b.mask.device)
        for j in range(min(per_pass, K - n_upd)):
            mb = b.index(perm[j * m : (j + 1) * m])
            opt.zero_grad(set_to_none=True)
            mb_tokens = D.reduce_sum({"t": float(mb.mask.sum())})["t"]  # the global mini-batch's
            mstats = dict.fromkeys((*STAT_KEYS, "loss"), 0.0)
            # padding cut per micro-batch; every rank runs as many (FSDP's collectives are per pass)
            for ub, live in D.even_micro_batches(micro_batches(mb, mu, cfg.micro_batch_tokens)):
                # [mu, T']
                logp = token_logprobs(policy, ub, cfg.temperature, chunk=cfg.logprob_chunk)
                loss, stats = loss_fn(logp, ub.old_logp, ub.adv, ub.mask, ref_logp=ub.ref_logp,
                                      sample_weight=ub.rollout_weight, options=loss_opts)
                # the mini-batch loss = micro-batch losses weighted by their share of it
                # (tokens for token-mean, sequences for the seq-mean aggregations), over all ranks
                w = float(ub.mask.sum()) / mb_tokens if cfg.agg == "token-mean" else len(ub) / M
                w = w if live else 0.0
                (loss * w).backward()
                mstats["loss"] += float(loss.detach()) * w
                for k in STAT_KEYS:
                    mstats[k] += float(stats[k]) * w
            mstats = D.reduce_sum(mstats)  # the global mini-batch's statistics
            window.append(mstats["kl_old"])
            if sum(window) / len(window) > cfg.kappa:  # trust region left: this step is not applied
                early = True
                opt.zero_grad(set_to_none=True)
                break
            gn = torch.nn.utils.clip_grad_norm_(
                params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf
            )
            opt.step()
            n_upd += 1
            train_tokens += int(mb.mask.sum())
            for k, v in mstats.items():
                acc[k].append(v)
            acc["grad_norm"].append(float(gn))
    opt.zero_grad(set_to_none=True)  # free the gradients before the next rollout (16 GB at 4B)
    out = {k: sum(v) / len(v) if v else float("nan") for k, v in acc.items()}
    out["kl_loss"] = out.pop("kl")
    out.update(kl_old_last=sum(window) / len(window), updates=n_upd, early_stop=int(early),
               train_tokens=D.reduce_sum({"t": train_tokens})["t"])
    return out


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

    device: torch.device
    task: Any  # rpg_ref.interfaces.Task
    policy: nn.Module  # pi_theta; pi_old lives on as stored log-probs
    ref: nn.Module | None  # pi_ref (--ref init), else None: pi_ref = pi_old
    engine: Any  # rpg_ref.interfaces.Engine
    opt: torch.optim.Optimizer
    gen: torch.Generator  # the prompt stream
    loss: LossOptions  # the loss's options, resolved once (rpg_ref.trainer.config.loss_options)


def prepare(cfg: Config) -> Run:
    """Build the task (reads its data), the policy (loads its model), pi_ref, the engine and the
    optimizer. A bad input raises ValueError here, before OUT is created."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                          if cfg.device == "auto" else cfg.device)
    device = D.init(cfg, device)  # under torchrun: join the process group (cuda: cuda:LOCAL_RANK)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    engine_cls = resolve(ENGINES, cfg.engine, "engine")
    getattr(engine_cls, "check_available", lambda: None)()  # a missing vLLM: before any cache
    seed_everything(cfg.seed)
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
    engine = engine_cls(policy, task, cfg)
    policy, ref = D.shard(policy), D.shard(ref)  # FSDP2 under torchrun: 1/world of each per rank
    # fused AdamW (one kernel per step) where torch has it for every parameter: float on CPU/CUDA
    params = list(policy.parameters())
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=tuple(cfg.adam_betas), fused=fused)
    seed_everything(cfg.seed + 1 + D.seed_offset())  # the same stream, cached artifacts or not
    D.barrier()  # every rank has checked its inputs before rank 0 writes
    return Run(device, task, policy, ref, engine, opt, torch.Generator().manual_seed(cfg.seed + 2),
               loss_options(cfg))


def finished(cfg: Config) -> bool:
    """A resumed run that already reached cfg.steps and wrote its summary: nothing to do."""
    out = Path(cfg.out)
    return bool(cfg.resume) and latest_step(out) >= cfg.steps and (out / "summary.json").is_file()


def train(cfg: Config, run: Run | None = None) -> dict:
    """Run (or resume) the training described by ``cfg``; returns the summary dict."""
    out = Path(cfg.out)
    if finished(cfg):  # leave every file as it is
        return loads((out / "summary.json").read_text())
    device, task, policy, ref, engine, opt, gen, loss_opts = run or prepare(cfg)
    if D.is_main():  # rank 0 writes the run folder
        out.mkdir(parents=True, exist_ok=True)
        if not cfg.resume:
            atomic_write(out / "config.json", dumps(dataclasses.asdict(cfg), indent=1))
    start = load_checkpoint(out, policy, ref, opt, gen) if cfg.resume else 0
    if start:
        with D.gathered(policy):
            engine.sync_weights(policy)  # the engine was built before the checkpoint was loaded
    log = MetricsLog(out, start, cfg.tensorboard) if D.is_main() else None
    bar = Progress(cfg.steps, start, cfg.progress and D.is_main())
    model_params = sum(p.numel() for p in policy.parameters())
    row = log.last_row() if log else {}  # {} for a new run
    last_eval = {k: v for k, v in row.items() if k.startswith("eval_")}
    live_params, t_run = None, time.perf_counter()
    watch = Watch(cfg)  # non-finite values stop the run; a gradient that stays 0 is reported

    for step in range(start + 1, cfg.steps + 1):
        t_step = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)

        # --- 1-2. rollout with pi_old (= the current policy) and scoring ---
        with D.gathered(policy):  # torchrun: full weights for sampling and log-probs, then shards
            bar.phase("rollout")
            engine.wake()
            batch, info = rollout(task, engine, cfg, gen, device)
            engine.sleep()

            # --- 3. log pi_old, stored once (and log pi_ref); 4. advantages ---
            bar.phase("log-probs")
            t0 = time.perf_counter()
            batch.old_logp, ent = batch_logprobs(policy, batch, cfg, entropy=True)  # [N, T] each
        if ref is not None:
            with D.gathered(ref):
                batch.ref_logp, _ = batch_logprobs(ref, batch, cfg, entropy=False)
        m = batch.mask  # [N, T]
        batch.adv = D.advantages(  # torchrun: computed on the whole batch, this rank's rows kept
            compute_advantages, resolved_adv(cfg), batch.rewards, cfg.group_size, mask=m,
            old_logp=batch.old_logp, beta=loss_opts.reward_beta,
            ref_logp=batch.ref_logp if batch.ref_logp is not None else batch.old_logp)
        # --rollout-correction: pi_old / pi_sampler weights
        rc_stats = weights_for_batch(batch, cfg)
        t_lp = time.perf_counter() - t0

        # --- 5. the inner loop; 6. pi_old <- pi_theta (engines with their own weights re-sync) ---
        bar.phase("update")
        t0 = time.perf_counter()
        stats = update(policy, opt, batch, cfg, loss_opts)
        t_upd = time.perf_counter() - t0
        with D.gathered(policy):
            engine.sync_weights(policy)

        # --- 7. metrics (keys explained in rpg_ref/trainer/metrics.py) and checkpoint ---
        n_tok = m.sum()  # every value is over all ranks' rows (D.ratio, D.mean, D.reduce_*)
        kl_ref = (
            0.0 if ref is None else D.ratio((k3(batch.ref_logp - batch.old_logp) * m).sum(), n_tok)
        )
        row = {"step": step, "reward": D.mean(batch.rewards),
               "accuracy": D.mean(batch.correct.float()),
               "entropy": D.ratio((ent * m).sum(), n_tok), "response_len": D.mean(m.sum(1)),
               **{k: v for k, v in stats.items() if k != "train_tokens"},
               "kl_ref": kl_ref, "lr": opt.param_groups[0]["lr"]}
        if batch.sampler_logp is not None:
            diff = float(((batch.sampler_logp - batch.old_logp).abs() * m).max())
            row["logprob_diff_max"] = D.reduce_max({"d": diff})["d"]
        row.update(rc_stats)
        row.update({k: v for k, v in info.items() if k.startswith("dyn_")})
        row.update(gen_tokens_per_s=info["gen_tokens"] / max(info["time_rollout"], 1e-9),
                   train_tokens_per_s=stats["train_tokens"] / max(t_upd, 1e-9),
                   time_rollout=info["time_rollout"], time_scoring=info["time_scoring"],
                   time_logprob=t_lp, time_update=t_upd)
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            bar.phase("evaluation")
            with D.gathered(policy):  # torchrun: rank 0 evaluates, the others wait for its result
                ev = D.on_main(lambda: task.evaluate(policy, engine))
            last_eval = {f"eval_{k}": v for k, v in ev.items()}
            row.update(last_eval)
        row["time_step"] = time.perf_counter() - t_step
        row["peak_mem_mb"] = D.reduce_max({"m": peak_memory_mb(device)})["m"]  # the largest rank's
        if live_params is None:
            live_params = live_parameter_count()
        watch.check(row)  # before the row and the checkpoint are written
        ckpt = None
        if step % cfg.save_every == 0 or step == cfg.steps:
            bar.phase("checkpoint")
            ckpt = checkpoint_state(policy, ref, opt, gen)  # torchrun: a collective, kept outside
        with signals_deferred():  # a signal waits until the row and the checkpoint are both written
            if log:
                log.write(row)
            bar.update(step, cfg.steps, row)
            if ckpt is not None:
                save_checkpoint(out, step, ckpt, cfg, keep=cfg.keep_checkpoints)
    bar.close()

    if live_params is None:
        live_params = live_parameter_count()
    # torchrun: rank 0 summarizes and exports a plain copy (others: None)
    plain = D.plain_copy(policy)
    task_summary = D.on_main(lambda: task.summary(plain, cfg))
    summary = {"config": dataclasses.asdict(cfg), "steps_done": cfg.steps, "final": row,
               "eval": last_eval, "model_params": model_params, "live_params": live_params,
               "models_in_memory": live_params / model_params, "world_size": D.world(),
               "wall_time_s_this_process": time.perf_counter() - t_run, **task_summary}
    if hasattr(task, "finish"):  # the task's last artifacts; summary.json then marks the run done
        task.finish(plain, out)
    if D.is_main():
        atomic_write(out / "summary.json", dumps(summary, indent=1))
    return summary

