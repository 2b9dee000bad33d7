"""The engine as the loop holds it, chosen once when it is built: the engine itself (``OnPolicy``),
or, with --sampler-lag K, the engine sampling with the policy of K updates before
(``LaggedEngine``), as in asynchronous RL (AReaL, verl's off-policy modes, prime-rl), where the
sampler generates while the trainer is still updating on earlier batches.

Both follow the Engine protocol (rpg_ref.interfaces: generate, sync_weights, sleep, wake) and add
what the loop needs beyond it, the same three calls for every run:

    evaluate(task, policy)  the task's evaluation with the CURRENT policy's weights in the engine
    behaviour(policy)       the module whose weights drew the last samples (--pi-old sampler)
    state()                 {file name: content} the engine adds to every checkpoint
    restore(policy, ck)     after a resume from checkpoint folder ck: the engine as it was there

``LaggedEngine`` wraps the run's engine (hf, sample, vllm), built on a copy of the policy (the
sampler), and keeps the weights of the last K + 1 policies as CPU tensors:

    history = [w_{u-K}, ..., w_u]      w_u: the policy after u updates (w_0: the initial one)

``sync_weights(policy)``, called by the loop after update u, appends w_u, drops what is older than
w_{u-K}, loads history[0] into the sampler and syncs the inner engine from it (the hf engine's bf16
copy, vLLM's own weights). So step t samples with w_{max(0, t-1-K)}, and the engine's log-probs
(Generation.logprobs) are that policy's: pi_sampler != pi_old, which the loop still recomputes
with the current weights; --rollout-correction weights pi_old / pi_sampler (docs/trainer.md).
Its evaluation loads the policy into the sampler, then gives it back its lagged weights; its
checkpoint file (LAG_FILE) holds the history, so a resumed run samples what the uninterrupted one
did. Under torchrun every rank builds its sampler from rank 0's initial weights and receives the
same gathered weights at each sync, so all ranks sample with the same lagged policy.

Memory: a second copy of the policy (the sampler, on the policy's device) and K + 1 CPU copies of
its parameters, in their own dtype.
"""

from __future__ import annotations

import copy
from collections import deque
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from rpg_ref.trainer.collectives import from_main_module

LAG_FILE = "sampler_lag.pt"  # in the checkpoint folder: {"history": [{name: tensor}, ...]}


def build_engine(engine_cls, policy: nn.Module, task, cfg) -> OnPolicy:
    """The run's engine: ``engine_cls`` on the policy, or lagged when --sampler-lag > 0."""
    if cfg.sampler_lag:
        return LaggedEngine(engine_cls, policy, task, cfg)
    return OnPolicy(engine_cls(policy, task, cfg))


class OnPolicy:
    """The engine itself: it samples with the current policy, and a checkpoint needs nothing of
    it but the policy's weights."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        return self.engine.generate(prompts, n, temperature, top_p, max_new_tokens)

    def sync_weights(self, policy: nn.Module) -> None:
        self.engine.sync_weights(policy)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()

    def evaluate(self, task, policy: nn.Module) -> dict:
        return task.evaluate(policy, self.engine)

    def behaviour(self, policy: nn.Module) -> nn.Module:
        """The module whose weights drew the last samples (--pi-old sampler): the policy."""
        return policy

    def state(self) -> dict:
        return {}

    def restore(self, policy: nn.Module, ck: Path) -> None:
        self.engine.sync_weights(policy)


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


class LaggedEngine(OnPolicy):
    """The engine sampling with weights ``cfg.sampler_lag`` updates old (module docstring)."""

    def __init__(self, engine_cls, policy: nn.Module, task, cfg):
        self.lag = cfg.sampler_lag
        self.sampler = copy.deepcopy(policy).eval().requires_grad_(False)
        from_main_module(self.sampler)  # torchrun: rank 0's, as the sharding does
        self.history = deque([snapshot(self.sampler)])  # [w_{u-K}, ..., w_u], oldest first
        super().__init__(engine_cls(self.sampler, task, cfg))

    def sync_weights(self, policy: nn.Module) -> None:
        """After an update: remember the policy's weights, sample next with those K updates old."""
        self.history.append(snapshot(policy))
        while len(self.history) > self.lag + 1:
            self.history.popleft()
        self._load_sampler()

    def _load_sampler(self) -> None:
        load_weights(self.sampler, self.history[0])
        self.engine.sync_weights(self.sampler)

    @contextmanager
    def current(self, policy: nn.Module):
        """Inside: the engine samples with the weights of ``policy``; after: lagged again."""
        load_weights(self.sampler, dict(policy.named_parameters()))
        self.engine.sync_weights(self.sampler)
        try:
            yield
        finally:
            self._load_sampler()

    def evaluate(self, task, policy: nn.Module) -> dict:
        with self.current(policy):
            return task.evaluate(policy, self.engine)

    def behaviour(self, policy: nn.Module) -> nn.Module:
        """The sampler, which holds the weights K updates old that drew the last samples."""
        return self.sampler

    def state(self) -> dict:
        return {LAG_FILE: {"history": list(self.history)}}

    def restore(self, policy: nn.Module, ck: Path) -> None:
        """The history of checkpoint folder ``ck``, loaded into the sampler and the engine."""
        path = ck / LAG_FILE
        if not path.is_file():
            raise ValueError(f"--sampler-lag {self.lag}: checkpoint {ck} has no {LAG_FILE}")
        history = torch.load(path, weights_only=True)["history"]
        if not 1 <= len(history) <= self.lag + 1:
            raise ValueError(f"{LAG_FILE} holds {len(history)} weight snapshots, a run with "
                             f"--sampler-lag {self.lag} keeps 1 to {self.lag + 1}")
        self.history = deque(history)
        self._load_sampler()
