"""Data parallel training under torchrun: FSDP2-sharded policy and optimizer, one engine per rank.

    torchrun --standalone --nproc_per_node N -m rpg_ref.cli [flags]      (docs/distributed.md)

What a rank does, and what the ranks decide together (so they never disagree):
- Every rank draws the same prompts from the shared prompt stream; the step's N = prompts x G
  responses are cut into N / world contiguous shares by response index, and each rank samples and
  scores its share with its own engine and its own RNG stream (``generate_share``). A group may
  span two ranks: the advantages are computed from the all-gathered rewards of the whole batch
  (``advantages``), so group statistics are the single-process ones. DAPO dynamic sampling decides
  on the gathered rewards and then moves the responses of the selected groups to the rank that
  trains them (``take_share``).
- The policy (and pi_ref with --ref init) is sharded with FSDP2 (``fully_shard`` per decoder layer,
  then the root), so parameters, gradients and AdamW state are 1/world per rank. Sampling, the
  log-prob passes, evaluation and weight syncs run inside ``gathered(model)``: the full weights are
  all-gathered once, every forward is then local (ranks may run different numbers of them), and
  the shards are restored after.
- The loss is the global batch's: each rank weights its micro-batch losses by their share of the
  GLOBAL mini-batch (tokens for token-mean, sequences otherwise) and FSDP reduce-scatters the
  gradients with a plain SUM (gradient divide factor 1), so the summed gradient is the
  single-process gradient of the union batch. Gradient-norm clipping uses the global norm.
- Every logged quantity and every decision (kappa early stop, dynamic sampling) is reduced over
  the ranks first. Rank 0 writes the run folder; rank 0 alone runs the task's evaluation.
- A rank that dies: torchrun's agent stops the others at once and the survivors' gloo/NCCL
  connections fail; a rank that hangs: every collective times out after --dist-timeout seconds.

With one process (no torchrun, or WORLD_SIZE=1) every function here is the identity, and a run is
bit for bit what it was without this module.
"""

from __future__ import annotations

import bisect
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

import torch
import torch.distributed as dist
from torch import Tensor, nn


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


def init(cfg, device: torch.device) -> torch.device:
    """Join torchrun's process group (gloo on CPU, NCCL on CUDA); returns this rank's device.
    One process: nothing happens and ``device`` is returned as it is."""
    check_config(cfg)
    if world() == 1:
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():  # on CUDA the small CPU tensors of our reductions go through gloo
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=cfg.dist_timeout))
        start_heartbeat()
    return device


def seed_offset() -> int:
    """Added to the sampling seed: rank 0 keeps the single-process stream, the others their own."""
    return 1_000_003 * rank()


def barrier() -> None:
    if active():
        dist.barrier()


# =============================================================================================
# FSDP2: sharding and the gathered (full-weight) state
# =============================================================================================


def shard(model: nn.Module | None) -> nn.Module | None:
    """FSDP2 over ``model``: each decoder layer its own unit, then the root (the rest: embeddings,
    final norm, head, or a bandit's logits). Rank 0's weights are broadcast first, so every rank
    shards the same model. Gradients are reduce-scattered as a SUM (see the module docstring)."""
    if model is None or not active():
        return model
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
    from rpg_ref.models.logprobs import LMParts, lm_parts

    parts = lm_parts(model)
    if parts is None:
        return

    def hidden(**inputs):
        out = model(**inputs, logits_to_keep=1, output_hidden_states=True, use_cache=False)
        return out.hidden_states[-1]  # [B, L, H]

    model.lm_parts = lambda: LMParts(hidden, parts.head, parts.vocab_size)


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
# rollout: this rank's share of the responses
# =============================================================================================


def share(n: int) -> tuple[int, int]:
    """This rank's contiguous share [lo, hi) of n items (sizes differ by at most one)."""
    W, r = world(), rank()
    return r * n // W, (r + 1) * n // W


def generate_share(engine, prompts: list, G: int, cfg) -> tuple[int, int, list, list | None]:
    """Sample this rank's share of the len(prompts) x G responses (groups consecutive): returns
    (lo, hi, responses, sampler log-probs or None). Consecutive prompts with as many responses in
    the share are one engine call (one process: a single call, the whole batch)."""
    lo, hi = share(len(prompts) * G)
    calls = []  # ([prompt indices], responses per prompt)
    for i in range(lo // G, -(-hi // G)):
        n = min(hi, (i + 1) * G) - max(lo, i * G)
        if calls and calls[-1][1] == n:
            calls[-1][0].append(i)
        else:
            calls.append(([i], n))
    responses, logprobs = [], []
    for idx, n in calls:
        g = engine.generate(
            [prompts[i].ids for i in idx], n, cfg.temperature, cfg.top_p, cfg.max_new_tokens
        )
        responses += g.responses
        logprobs = None if logprobs is None or g.logprobs is None else logprobs + g.logprobs
    return lo, hi, responses, logprobs


def gather_scores(r: Tensor, correct: Tensor, n_tok: int, has_logprobs: bool) -> tuple:
    """This rank's rewards and correctness [hi - lo] -> the whole round's (concatenated in rank
    order), the round's generated tokens, and whether every rank's engine reported log-probs.
    One process: returned as they are."""
    if not active():
        return r, correct, n_tok, has_logprobs
    parts = [None] * world()
    dist.all_gather_object(parts, (r.tolist(), correct.tolist(), n_tok, has_logprobs))
    R = torch.tensor([x for p in parts for x in p[0]], dtype=r.dtype, device=r.device)
    C = torch.tensor([x for p in parts for x in p[1]], dtype=correct.dtype, device=correct.device)
    return R, C, sum(p[2] for p in parts), all(p[3] for p in parts)


def take_share(responses: list, logprobs: list | None) -> tuple[list, list | None]:
    """The step's N selected responses in batch order (None where another rank sampled one) and
    their sampler log-probs -> this rank's share [lo:hi] of both, every response it lacks sent by
    the rank that sampled it (only those rows travel)."""
    N = len(responses)
    lo, hi = share(N)
    if not active():
        return responses[lo:hi], None if logprobs is None else logprobs[lo:hi]
    starts = [r * N // world() for r in range(world())]
    outgoing = {i: (responses[i], None if logprobs is None else logprobs[i]) for i in range(N)
                if responses[i] is not None and bisect.bisect_right(starts, i) - 1 != rank()}
    parts = [None] * world()
    dist.all_gather_object(parts, outgoing)
    received = {i: v for p in parts for i, v in p.items()}
    mine = [(responses[i], None if logprobs is None else logprobs[i]) if responses[i] is not None
            else received[i] for i in range(lo, hi)]
    return [x[0] for x in mine], None if logprobs is None else [x[1] for x in mine]


# =============================================================================================
# advantages, update and metrics on global quantities
# =============================================================================================


def _gather_rows(x: Tensor) -> Tensor:
    """[n, ...] on every rank (same n) -> [world * n, ...] in rank order; [n, T] with different T
    are right-padded with zeros to the longest first."""
    if x.dim() == 2:
        T = torch.tensor([x.shape[1]])
        dist.all_reduce(T, op=dist.ReduceOp.MAX)
        x = torch.nn.functional.pad(x, (0, int(T) - x.shape[1]))
    parts = [torch.empty_like(x) for _ in range(world())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def advantages(compute, name: str, rewards: Tensor, G: int, mask: Tensor, old_logp: Tensor,
               ref_logp: Tensor, beta: float) -> Tensor:
    """``compute(name, rewards, G, mask=, old_logp=, ref_logp=, beta=)`` on the whole batch
    (all-gathered: groups may span ranks, REINFORCE++ whitens over every token), then this rank's
    rows (and response columns). One process: ``compute`` on the batch as it is."""
    if not active():
        return compute(name, rewards, G, mask=mask, old_logp=old_logp, ref_logp=ref_logp, beta=beta)
    token_level = name.startswith("reinforce++")
    R = _gather_rows(rewards)
    kw = dict(mask=mask, old_logp=old_logp, ref_logp=ref_logp)
    if token_level:  # [N, T] inputs of the whole batch
        kw = {k: _gather_rows(v) for k, v in kw.items()}
    A = compute(name, R, G, beta=beta, **kw)
    lo, n = rank() * len(rewards), len(rewards)
    return A[lo : lo + n, : mask.shape[1]] if token_level else A[lo : lo + n]


def even_micro_batches(parts: list) -> list:
    """Micro-batches (index, batch) -> (batch, live). Every rank must run as many forward/backward
    passes as the others (FSDP's collectives are per pass): a rank with fewer (token budgets cut
    differently) repeats its first with weight 0 (live False)."""
    out = [(ub, True) for _, ub in parts]
    if active():
        n = torch.tensor([len(out)])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        out += [(out[0][0], False)] * (int(n) - len(out))
    return out


def reduce_sum(values: dict) -> dict:
    """{key: float} summed over the ranks (float64). One process: unchanged."""
    if not active():
        return values
    t = torch.tensor(list(values.values()), dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(values, t.tolist()))


def reduce_max(values: dict) -> dict:
    if not active():
        return values
    t = torch.tensor(list(values.values()), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(values, t.tolist()))


def ratio(num: Tensor, den: Tensor) -> float:
    """float(num / den) over the whole batch: num and den summed over the ranks."""
    if not active():
        return float(num / den)
    s = reduce_sum({"num": float(num), "den": float(den)})
    return s["num"] / s["den"]


def mean(x: Tensor) -> float:
    """The mean of x over every rank's elements."""
    return ratio(x.sum(), torch.tensor(float(x.numel()))) if active() else float(x.mean())


def on_main(fn):
    """fn() on rank 0, its result sent to every rank (the others wait). One process: fn()."""
    if not active():
        return fn()
    box = [fn() if is_main() else None]
    dist.broadcast_object_list(box, 0)
    return box[0]


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
