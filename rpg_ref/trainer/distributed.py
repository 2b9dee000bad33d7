"""Data parallel training under torchrun: FSDP2-sharded policy and optimizer, one engine per rank.

    torchrun --standalone --nproc_per_node N -m rpg_ref.cli [flags]      (docs/distributed.md)

The loop (rpg_ref/trainer/train.py) is written for one process over the step's whole batch; the
calls below are where the ranks split the work and where they meet. What a rank does, and what the
ranks decide together (so they never disagree):
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
  (``micro_batches``)
  and weights each micro-batch loss by its share of the GLOBAL mini-batch (tokens for token-mean,
  sequences otherwise). FSDP reduce-scatters the gradients with a plain SUM (gradient divide
  factor 1), so the summed gradient is the single-process gradient of the mini-batch. Gradient-norm
  clipping uses the global norm. The mini-batch's loss statistics are summed over the ranks
  (``sum_over_ranks``) before the kappa early stop reads them.
- Rank 0 writes the run folder; rank 0 alone runs the task's evaluation (``Workers.evaluate``) and
  the others wait for its result, and it gets the final policy as a plain module for the task's
  summary (``Workers.plain_policy``); peak memory is the largest rank's (``max_over_ranks``, in
  rpg_ref.trainer.metrics.peak_memory_mb).
- A rank that dies: torchrun's agent stops the others at once and the survivors' gloo/NCCL
  connections fail; a rank that hangs: every collective after set-up times out after
  --dist-timeout seconds. Joining the group and the set-up (``init`` to the end of ``shard``) wait
  up to STARTUP_TIMEOUT_S at least: ranks start apart (imports, data, a warm start) by more than a
  short --dist-timeout on a loaded machine, and that is no hang.

With one process (no torchrun, or WORLD_SIZE=1) every call here is the plain single-process call
(``Workers.generate`` is ``engine.generate``, ``map_rows(fn, b, m)`` is ``fn(b)``, ...), and a run
is bit for bit what it is without this module.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import sys
import warnings
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rpg_ref.interfaces import Batch, Generation
from rpg_ref.models import logprobs as model_logprobs
from rpg_ref.trainer.sampler_lag import evaluate, resync

STARTUP_TIMEOUT_S = 600.0  # the least a rank waits for the others while they set up
# torch's way to shorten a group's timeout once set up (torchtitan does the same); without it the
# group keeps --dist-timeout from the start
_set_pg_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
_collective_timeout_s: float | None = None   # --dist-timeout: set by init, applied by shard


def world() -> int:
    return (
        dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    )


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def active() -> bool:
    """True in a multi-process run (the process group is joined by ``init``)."""
    return dist.is_initialized() and dist.get_world_size() > 1


# =============================================================================================
# joining: checks before anything is built, the process group, devices, seeds
# =============================================================================================


class Rank(NamedTuple):
    """This process in the job (one process: rank 0 of 1)."""

    device: torch.device  # cuda:LOCAL_RANK under torchrun on CUDA
    index: int
    world: int

    @property
    def main(self) -> bool:
        """Rank 0: it writes the run folder and runs the evaluation."""
        return self.index == 0

    @property
    def seed_offset(self) -> int:
        """Added to the sampling seed: rank 0 keeps the single-process stream, the others their
        own."""
        return 1_000_003 * self.index


def check_config(cfg, n_ranks: int | None = None) -> None:
    """What a run of ``n_ranks`` processes needs (ValueError naming the fix, before any work)."""
    W = n_ranks or world()
    if cfg.resume:
        stored = checkpoint_world_size(Path(cfg.resume))
        if stored not in (None, W):
            how = (
                "one process (no torchrun)"
                if stored == 1
                else f"torchrun --nproc_per_node {stored}"
            )
            raise ValueError(
                f"--resume {cfg.resume}: its checkpoint was written by {stored} rank(s), "
                f"this run has {W}; a run resumes only on the same number: use {how} "
                f"(its model.safetensors is the full policy, loadable anywhere)"
            )
    if W == 1:
        return
    N, M = cfg.prompts_per_step * cfg.group_size, cfg.mini_batch_size
    if N % W or M % W:
        raise ValueError(
            f"bad configuration: {W} ranks need the batch ({cfg.prompts_per_step} prompts "
            f"x {cfg.group_size} = {N} responses) and --mini-batch-size ({M}) divisible "
            f"by {W}; change them or --nproc_per_node"
        )
    if cfg.micro_batch_size and (M // W) % cfg.micro_batch_size:
        raise ValueError(
            f"bad configuration: --micro-batch-size {cfg.micro_batch_size} counts responses "
            f"per rank and must divide each rank's mini-batch ({M} / {W} ranks = {M // W})"
        )
    if not cfg.dist_timeout > 0:
        raise ValueError(
            f"bad configuration: --dist-timeout must be > 0 seconds, got {cfg.dist_timeout}"
        )


def checkpoint_world_size(out: Path) -> int | None:
    """The world size of run folder ``out``'s latest checkpoint (None: no checkpoint yet)."""
    from rpg_ref.trainer.checkpoint import latest_state

    state = latest_state(out)
    return None if state is None else state.get("world_size", 1)


def init(cfg, device: torch.device) -> Rank:
    """Join torchrun's process group (gloo on CPU, NCCL on CUDA); returns this process's Rank.
    One process: nothing happens, and the Rank is (device, 0, 1)."""
    global _collective_timeout_s
    check_config(cfg)
    if world() == 1:
        return Rank(device, 0, 1)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():  # on CUDA the small CPU tensors of our reductions go through gloo
        wait = max(cfg.dist_timeout, STARTUP_TIMEOUT_S) if _set_pg_timeout else cfg.dist_timeout
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=wait))
        _collective_timeout_s = cfg.dist_timeout
        start_heartbeat()
    return Rank(device, rank(), world())


# =============================================================================================
# FSDP2: sharding and the gathered (full-weight) state
# =============================================================================================


def shard(policy: nn.Module, ref: nn.Module | None = None) -> tuple[nn.Module, nn.Module | None]:
    """FSDP2 over ``policy`` and ``ref`` (None: nothing), returned once every rank has sharded
    them, so every rank has built and checked its inputs before rank 0 writes anything. One
    process: both as they are."""
    if not active():
        return policy, ref
    policy, ref = _shard(policy), None if ref is None else _shard(ref)
    dist.barrier()
    if _set_pg_timeout and _collective_timeout_s is not None:  # set up: a wait is --dist-timeout
        _set_pg_timeout(timedelta(seconds=_collective_timeout_s))
    return policy, ref


def _shard(model: nn.Module) -> nn.Module:
    """Each decoder layer its own unit, then the root (the rest: embeddings, final norm, head, or
    a bandit's logits). Rank 0's weights are broadcast first, so every rank shards the same model.
    Gradients are reduce-scattered as a SUM (see the module docstring)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model.register_forward_hook(_visible_to_fsdp)  # runs before FSDP's own post-forward hook
    # a forward may return a view of a parameter (the bandit); nothing here modifies one in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    _TEMPLATES[id(model)] = (copy.deepcopy(model).to("meta"), _tied(model))  # for plain_copy
    _hidden_through_root(model)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, 0)
    for layer in _decoder_layers(model):
        fully_shard(layer)
    # the root stays unsharded from forward to backward: its output may be a view of a parameter
    # (the bandit's logits), which resharding would free (torchtitan does the same for the root)
    fully_shard(model, reshard_after_forward=False)
    for unit in (m for m in model.modules() if isinstance(m, FSDPModule)):
        unit.set_gradient_divide_factor(1.0)  # the gradients' plain SUM over the ranks ...
        # ... as a SUM collective (gloo: no PREMUL_SUM)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def _hidden_through_root(model: nn.Module) -> None:
    """rpg_ref.models.logprobs applies the LM head in chunks to the hidden states it gets from
    ``lm_parts``, which calls the inner model directly: that would skip the root's FSDP hooks (the
    embeddings, final norm and head stay sharded, their gradients are never reduced). Sharded, the
    hidden states come from the root's own forward (output_hidden_states: the last entry is the
    final norm's output, last_hidden_state) and the head runs on the root's unsharded weights."""
    parts = model_logprobs.lm_parts(model)
    if parts is None:
        return

    def hidden(**inputs):
        out = model(**inputs, logits_to_keep=1, output_hidden_states=True, use_cache=False)
        return out.hidden_states[-1]  # [B, L, H]

    model.lm_parts = lambda: model_logprobs.LMParts(hidden, parts.head, parts.vocab_size)


def _visible_to_fsdp(module, args, out):
    """Forward hook: FSDP2 looks for a forward's output tensors in tuples, lists, dicts (Hugging
    Face outputs) and dataclasses, and its gradient reduce-scatter waits for a hook on them; a
    SimpleNamespace output (the bandit's TabularPolicy) becomes a dataclass with the same fields."""
    if not isinstance(out, SimpleNamespace):
        return out
    cls = _OUTPUT_CLASSES.setdefault(
        tuple(vars(out)), dataclasses.make_dataclass("Output", list(vars(out)))
    )
    return cls(**vars(out))


_OUTPUT_CLASSES: dict = {}
_TEMPLATES: dict = {}  # id(sharded model) -> (its unsharded twin on the meta device, tied names)


def _tied(model: nn.Module) -> list:
    """Groups of parameter names that are one tensor (a tied embedding and LM head)."""
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _decoder_layers(model: nn.Module) -> list:
    for m in model.modules():  # a Hugging Face causal LM, possibly inside a wrapper
        layers = getattr(getattr(m, "model", None), "layers", None)
        if isinstance(layers, nn.ModuleList):
            return list(layers)
    return []


@contextmanager
def gathered(model: nn.Module | None):
    """Inside: ``model``'s parameters are full, plain tensors on every rank, and forwards issue no
    collective (so ranks may sample different numbers of tokens). A no-op for one process."""
    from torch.distributed.fsdp import FSDPModule

    units = (
        []
        if model is None or not active()
        else [m for m in model.modules() if isinstance(m, FSDPModule)]
    )
    for u in units:
        u.set_reshard_after_forward(False, recurse=False)
        u.unshard()
    try:
        yield model
    finally:
        for u in units:
            u.reshard()
            u.set_reshard_after_forward(u is not model, recurse=False)


# =============================================================================================
# the rollout: each rank samples and scores its share, every rank gets the whole batch
# =============================================================================================


def share(n: int) -> tuple[int, int]:
    """This rank's contiguous share [lo, hi) of n items (sizes differ by at most one)."""
    W, i = world(), rank()
    return i * n // W, (i + 1) * n // W


def _all_gather(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (any picklable object)."""
    parts = [None] * world()
    dist.all_gather_object(parts, obj)
    return parts


class Workers:
    """The task and the engine as the loop calls them, over every rank. ``generate`` and
    ``reward`` return the results for all the responses on every rank, each rank having computed
    its contiguous share; the engine's forwards run on the policy's full weights. One process:
    each method is the task's or the engine's own call."""

    def __init__(self, task, engine, policy: nn.Module | None):
        self.task, self.engine, self.policy = task, engine, policy

    def generate(self, prompts: list, n: int, temperature: float, top_p: float,
                 max_new_tokens: int) -> Generation:
        """n responses to each of the prompts (token id lists), groups consecutive, and the
        sampler's log-probs (None unless every rank's engine reported them). Consecutive prompts
        with as many responses in this rank's share are one engine call."""
        if not active():
            return self.engine.generate(prompts, n, temperature, top_p, max_new_tokens)
        lo, hi = share(len(prompts) * n)
        calls = []  # ([prompt indices], responses per prompt)
        for i in range(lo // n, -(-hi // n)):
            k = min(hi, (i + 1) * n) - max(lo, i * n)
            if calls and calls[-1][1] == k:
                calls[-1][0].append(i)
            else:
                calls.append(([i], k))
        responses, logprobs = [], []
        with gathered(self.policy):
            for idx, k in calls:
                part = self.engine.generate([prompts[i] for i in idx], k, temperature, top_p,
                                            max_new_tokens)
                responses += part.responses
                logprobs = (None if logprobs is None or part.logprobs is None
                            else logprobs + part.logprobs)
        parts = _all_gather(Generation(responses, logprobs))
        lps = None if any(p.logprobs is None for p in parts) else [x for p in parts
                                                                   for x in p.logprobs]
        return Generation([x for p in parts for x in p.responses], lps)

    def reward(self, prompts: list, responses: list) -> tuple[Tensor, Tensor]:
        """The task's (rewards [N], correct [N] bool) of the responses (``prompts``: the prompt of
        each response)."""
        if not active():
            return self.task.reward(prompts, responses)
        lo, hi = share(len(responses))
        r, correct = (self.task.reward(prompts[lo:hi], responses[lo:hi]) if hi > lo
                      else (torch.zeros(0), torch.zeros(0, dtype=torch.bool)))
        parts = _all_gather((r.cpu(), correct.cpu()))  # the dtypes travel with the values
        return (torch.cat([p[0] for p in parts]).to(r.device),
                torch.cat([p[1] for p in parts]).to(correct.device))

    def sync_weights(self, resumed: Path | None = None) -> None:
        """The engine takes the policy's weights after an update; after a resume from run folder
        ``resumed``, the weights it held when the checkpoint was written (sampler_lag.resync)."""
        with gathered(self.policy):
            if resumed is None:
                self.engine.sync_weights(self.policy)
            else:
                resync(self.engine, self.policy, resumed)

    def evaluate(self) -> dict:
        """The task's evaluation of the current policy, run by rank 0 on the full weights; every
        rank gets its result (the others wait)."""
        with gathered(self.policy):
            if not active():
                return evaluate(self.task, self.policy, self.engine)
            box = [evaluate(self.task, self.policy, self.engine) if is_main() else None]
            dist.broadcast_object_list(box, 0)
            return box[0]

    def plain_policy(self) -> nn.Module | None:
        """Every rank calls this (collective): rank 0 gets the policy as an ordinary module with
        the full weights (``plain_copy``), the others None. One process: the policy itself."""
        return plain_copy(self.policy)

    def wake(self) -> None:
        self.engine.wake()

    def sleep(self) -> None:
        self.engine.sleep()


# =============================================================================================
# the batch's rows: log-prob passes, mini-batches, the reductions of the update's statistics
# =============================================================================================


def map_rows(fn, batch: Batch, model: nn.Module) -> tuple:
    """``fn(rows)`` -> a tuple of [rows, T] tensors (or None), computed by each rank on its
    contiguous share of ``batch`` with ``model``'s full weights, and gathered: [N, T] each, on
    every rank. One process: ``fn(batch)``."""
    if not active():
        return fn(batch)
    lo, hi = share(len(batch))  # the same number of rows on every rank (checked by check_config)
    with gathered(model):
        out = fn(batch.index(slice(lo, hi)))
    return tuple(None if t is None else _gather_rows(t) for t in out)


def _gather_rows(x: Tensor) -> Tensor:
    """[n, ...] on every rank (same shape) -> [world * n, ...] in rank order."""
    parts = [torch.empty_like(x) for _ in range(world())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def from_main(x: Tensor) -> Tensor:
    """Rank 0's ``x`` on every rank (same shape and dtype everywhere). One process: ``x``."""
    if active():
        dist.broadcast(x, 0)
    return x


class MicroBatch(NamedTuple):
    """A micro-batch of this rank's rows of a mini-batch."""

    rows: Batch
    live: bool  # False: a repeat that only keeps the ranks' passes in step (its loss weight is 0)


def micro_batches(mb: Batch, max_seqs: int, max_tokens: int) -> list[MicroBatch]:
    """This rank's contiguous M / world rows of the global mini-batch ``mb`` (M rows), cut by
    rpg_ref.models.logprobs.micro_batches (at most ``max_seqs`` rows, 0: all of them, and
    ``max_tokens`` tokens each). Every rank runs as many forward/backward passes as the others
    (FSDP's collectives are per pass): a rank with fewer (token budgets cut differently) repeats
    its first with live False. One process: the micro-batches of ``mb``."""
    rows = mb
    if active():
        lo, hi = share(len(mb))
        rows = mb.index(slice(lo, hi))
    cut = model_logprobs.micro_batches(rows, max_seqs, max_tokens)
    out = [MicroBatch(ub, True) for _, ub in cut]
    if active():
        n = torch.tensor([len(out)])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        out += [MicroBatch(out[0].rows, False)] * (int(n) - len(out))
    return out


def sum_over_ranks(values: dict) -> dict:
    """{key: float} summed over the ranks (float64). One process: unchanged."""
    if not active():
        return values
    t = torch.tensor(list(values.values()), dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(values, t.tolist()))


def max_over_ranks(x: float) -> float:
    """The largest rank's x. One process: x."""
    if not active():
        return x
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


# =============================================================================================
# checkpoints: the full (gathered) state, written by rank 0; each rank's RNG
# =============================================================================================


def plain_copy(model: nn.Module | None) -> nn.Module | None:
    """Every rank calls this (collective): rank 0 gets an ordinary, unsharded module with the full
    weights on the CPU (what a task's summary, save_model and save_pretrained expect), the others
    None. One process: ``model`` itself."""
    if model is None or not active():
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if not is_main():
        return None
    template, tied = _TEMPLATES[id(model)]
    plain = template.to_empty(device="cpu")
    plain.load_state_dict(sd)
    for group in tied:  # moving to and from the meta device unties them: tie them again
        for name in group[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(plain.get_submodule(owner), attr, plain.get_parameter(group[0]))
    with torch.no_grad():  # buffers are not sharded (and non-persistent ones are not in sd)
        for (_, dst), (_, src) in zip(plain.named_buffers(), model.named_buffers()):
            dst.copy_(src)
    return plain


def full_states(policy, ref, opt, rng: dict) -> dict | None:
    """Every rank calls this (collective): rank 0 gets {file name: content} of the checkpoint (the
    policy and pi_ref as plain modules for save_model, so the files are a single process's; the
    full optimizer state; every rank's RNG state), the others {}. One process: None."""
    if not active():
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    files = {"model.safetensors": plain_copy(policy),
             "optimizer.pt": get_optimizer_state_dict(policy, opt, options=full)}
    if ref is not None:
        files["ref.safetensors"] = plain_copy(ref)
    ranks = [None] * world()
    dist.all_gather_object(ranks, rng)
    files["rng.pt"] = {**rng, "ranks": ranks}
    return files if is_main() else {}


def _load_model(model: nn.Module, path: Path) -> None:
    """A save_model file (tied weights stored once) into this rank's shards."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    sd = load_file(str(path))
    for group in _tied(model):  # every name of a tied parameter, from the one stored
        stored = next((sd[n] for n in group if n in sd), None)
        sd.update({n: stored for n in group if stored is not None})
    set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True))


def load_full_states(ck: Path, policy, ref, opt) -> dict:
    """Load checkpoint folder ``ck`` into this rank's shards; returns this rank's RNG state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    _load_model(policy, ck / "model.safetensors")
    if ref is not None:
        _load_model(ref, ck / "ref.safetensors")
    osd = torch.load(ck / "optimizer.pt", weights_only=True)
    set_optimizer_state_dict(policy, opt, osd, options=StateDictOptions(full_state_dict=True))
    return torch.load(ck / "rng.pt", weights_only=True)["ranks"][rank()]


# =============================================================================================
# which rank failed: heartbeats in torchrun's store
# =============================================================================================

BEAT_S = 1.0  # a rank writes "time pid host" under rpg/beat/<rank> this often (a daemon thread)


def _store():
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def start_heartbeat() -> None:
    """Every BEAT_S seconds, from a daemon thread: a stopped (SIGSTOP) or dead rank stops beating,
    so the rank that notices a failure can name it (``silent_peers``)."""
    import socket
    import threading
    import time

    store, key = _store(), f"rpg/beat/{rank()}"
    ident = f"{os.getpid()} {socket.gethostname()}"

    def beat():
        while True:
            try:
                store.set(key, f"{time.time():.3f} {ident}")
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return
            time.sleep(BEAT_S)

    threading.Thread(target=beat, name="rpg-heartbeat", daemon=True).start()


def mark_stopping() -> None:
    """A rank that ends on a signal says so first: it is not a rank that died."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):  # best effort, on the way out
            _store().set(f"rpg/stopping/{rank()}", "1")


def peers_stopping() -> bool:
    """Another rank ended on a signal (``mark_stopping``): a collective failing now is no fault."""
    if not active():
        return False
    try:
        store = _store()
        return any(store.check([f"rpg/stopping/{r}"]) for r in range(world()) if r != rank())
    except Exception:  # noqa: BLE001 - a report on the way out must not raise
        return False


def _gone(pid: str) -> bool:
    """The process has exited (no /proc entry, or a zombie its parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


def silent_peers(wait_s: float = 0.0, quiet_s: float = 3 * BEAT_S) -> list[str]:
    """'rank 1 (PID 42 on host) has exited' for another rank whose process is gone (same host)
    without saying it was stopping, 'rank 1 (PID 42 on host) gave no sign of life for 21 s' for
    one whose heartbeat is older than ``quiet_s``; [] when none is, or nothing can be read.
    ``wait_s``: look again until one is found or that time has passed (a rank that just died may
    not have exited yet, and its heartbeat goes quiet only after ``quiet_s``)."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        found = _silent_peers(quiet_s)
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def _silent_peers(quiet_s: float) -> list[str]:
    import socket
    import time

    if not active():
        return []
    try:
        store, out = _store(), []
        for r in range(world()):
            if r == rank() or not store.check([f"rpg/beat/{r}"]):
                continue
            t, pid, host = store.get(f"rpg/beat/{r}").decode().split()
            who = f"rank {r} (PID {pid} on {host})"
            if store.check([f"rpg/stopping/{r}"]):
                continue
            if host == socket.gethostname() and _gone(pid):
                out.append(f"{who} has exited")
            elif time.time() - float(t) > quiet_s:
                out.append(f"{who} gave no sign of life for {time.time() - float(t):.0f} s")
        return out
    except Exception:  # noqa: BLE001 - a report on the way out must not raise
        return []


def peer_failure(e: BaseException) -> bool:
    """An error of the process group (another rank died, or a collective timed out)."""
    return active() and (isinstance(e, dist.DistError)
                         or (isinstance(e, RuntimeError) and "gloo" in str(e)))


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int):
    """End the process with ``code`` once its work is done. A torchrun rank flushes its output and
    leaves by os._exit, skipping the interpreter's final teardown: there, after
    destroy_process_group, torch 2.13's gloo backend now and then aborts the process ("terminate
    called without an active exception", no Python frame), turning a finished run into a failed
    torchrun job. One process: sys.exit."""
    if world() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
