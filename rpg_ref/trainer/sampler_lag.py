"""--sampler-lag K: step t's rollouts come from the policy of K updates before, as in
asynchronous RL (AReaL, verl's off-policy modes, prime-rl), where the sampler generates while the
trainer is still updating on earlier batches.

``LaggedEngine`` wraps the run's engine (hf, sample, vllm), built on a copy of the policy (the
sampler), and keeps the weights of the last K + 1 policies as CPU tensors:

    history = [w_{u-K}, ..., w_u]      w_u: the policy after u updates (w_0: the initial one)

``sync_weights(policy)``, called by the loop after update u, appends w_u, drops what is older than
w_{u-K}, loads history[0] into the sampler and syncs the inner engine from it (the hf engine's bf16
copy, vLLM's own weights). So step t samples with w_{max(0, t-1-K)}, and the engine's log-probs
(Generation.logprobs) are that policy's: pi_sampler != pi_old, which the loop still recomputes
with the current weights; --rollout-correction weights pi_old / pi_sampler (docs/trainer.md).

Around it, the loop's three hooks (each is today's code for an engine that is not lagged):
``evaluate`` runs the task's evaluation with the CURRENT weights in the engine (the sampler is
loaded with the policy, then given back its lagged weights); ``checkpoint_files`` adds the history
to the checkpoint (LAG_FILE), so a resumed run samples what the uninterrupted one did;
``resync`` restores it after a resume. Under torchrun every rank builds its sampler from rank 0's
initial weights and receives the same gathered weights at each sync, so all ranks sample with the
same lagged policy.

Memory: a second copy of the policy (the sampler, on the policy's device) and K + 1 CPU copies of
its parameters, in their own dtype.
"""

from __future__ import annotations

import copy
from collections import deque
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from rpg_ref.trainer.checkpoint import latest_checkpoint

LAG_FILE = "sampler_lag.pt"  # in the checkpoint folder: {"history": [{name: tensor}, ...]}


def snapshot(model: nn.Module) -> dict:
    """{name: CPU copy} of the parameters (a tied tensor once)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}


@torch.no_grad()
def load_weights(model: nn.Module, weights: dict) -> None:
    """Copy ``weights`` ({name: tensor}) into model's parameters, every one of them."""
    params = dict(model.named_parameters())
    if params.keys() != weights.keys():
        raise ValueError(f"sampler weights do not match the policy: "
                         f"{sorted(params.keys() ^ weights.keys())[:3]}")
    for n, p in params.items():
        p.copy_(weights[n])


class LaggedEngine:
    """The Engine protocol (rpg_ref.interfaces) around an engine that samples with weights
    ``cfg.sampler_lag`` updates old (module docstring)."""

    def __init__(self, engine_cls, policy: nn.Module, task, cfg):
        self.lag = cfg.sampler_lag
        self.sampler = copy.deepcopy(policy).eval().requires_grad_(False)
        if dist.is_initialized() and dist.get_world_size() > 1:  # rank 0's, as shard does
            for t in [*self.sampler.parameters(), *self.sampler.buffers()]:
                dist.broadcast(t.data, 0)
        self.history = deque([snapshot(self.sampler)])  # [w_{u-K}, ..., w_u], oldest first
        self.inner = engine_cls(self.sampler, task, cfg)

    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        return self.inner.generate(prompts, n, temperature, top_p, max_new_tokens)

    def sync_weights(self, policy: nn.Module) -> None:
        """After an update: remember the policy's weights, sample next with those K updates old."""
        self.history.append(snapshot(policy))
        while len(self.history) > self.lag + 1:
            self.history.popleft()
        self._load_sampler()

    def _load_sampler(self) -> None:
        load_weights(self.sampler, self.history[0])
        self.inner.sync_weights(self.sampler)

    def sleep(self) -> None:
        self.inner.sleep()

    def wake(self) -> None:
        self.inner.wake()

    @contextmanager
    def current(self, policy: nn.Module):
        """Inside: the engine samples with the weights of ``policy`` (evaluation); after: lagged."""
        load_weights(self.sampler, dict(policy.named_parameters()))
        self.inner.sync_weights(self.sampler)
        try:
            yield
        finally:
            self._load_sampler()

    def state(self) -> dict:
        return {"history": list(self.history)}

    def restore(self, state: dict) -> None:
        """The history of a checkpoint (``state``), loaded into the sampler and the engine."""
        history = state["history"]
        if not 1 <= len(history) <= self.lag + 1:
            raise ValueError(f"{LAG_FILE} holds {len(history)} weight snapshots, a run with "
                             f"--sampler-lag {self.lag} keeps 1 to {self.lag + 1}")
        self.history = deque(history)
        self._load_sampler()


# ---------------------------------------------------------------------------- the loop's hooks
def build_engine(engine_cls, policy: nn.Module, task, cfg):
    """The run's engine: ``engine_cls`` itself, or lagged when --sampler-lag > 0."""
    if cfg.sampler_lag:
        return LaggedEngine(engine_cls, policy, task, cfg)
    return engine_cls(policy, task, cfg)


def evaluate(task, policy: nn.Module, engine) -> dict:
    """task.evaluate with the current policy's weights in the engine."""
    if not isinstance(engine, LaggedEngine):
        return task.evaluate(policy, engine)
    with engine.current(policy):
        return task.evaluate(policy, engine)


def checkpoint_files(engine) -> dict:
    """{file name: content} the engine adds to a checkpoint (a lagged one: its history)."""
    return {LAG_FILE: engine.state()} if isinstance(engine, LaggedEngine) else {}


def resync(engine, policy: nn.Module, out: Path) -> None:
    """After a resume: the engine samples with the weights it held when the checkpoint was
    written (the policy's, or, lagged, the history's oldest)."""
    if not isinstance(engine, LaggedEngine):
        engine.sync_weights(policy)
        return
    path = latest_checkpoint(out) / LAG_FILE
    if not path.is_file():
        raise ValueError(f"--sampler-lag {engine.lag}: checkpoint {path.parent} has no {LAG_FILE}")
    engine.restore(torch.load(path, weights_only=True))
