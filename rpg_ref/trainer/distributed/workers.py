"""The loop's work split over the ranks of a torchrun job: sampling, scoring, evaluation and weight
syncs (``Workers``), the log-prob passes (``map_rows``) and the update's micro-batches
(``rank_micro_batches``). Each rank computes its contiguous share, and every rank gets the whole
result. One process: each is the plain call (rpg_ref/trainer/distributed/__init__.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from rpg_ref.interfaces import Batch, Generation
from rpg_ref.models import logprobs as model_logprobs
from rpg_ref.trainer.checkpoint_shards import plain_copy
from rpg_ref.trainer.collectives import (
    active,
    all_gather,
    gather_rows,
    main_decides,
    max_int_over_ranks,
    share,
)
from rpg_ref.trainer.distributed.sharding import gathered


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
        parts = all_gather(Generation(responses, logprobs))
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
        parts = all_gather((r.cpu(), correct.cpu()))  # the dtypes travel with the values
        return (torch.cat([p[0] for p in parts]).to(r.device),
                torch.cat([p[1] for p in parts]).to(correct.device))

    def sync_weights(self) -> None:
        """The engine takes the policy's weights after an update."""
        with gathered(self.policy):
            self.engine.sync_weights(self.policy)

    def restore(self, ck: Path) -> None:
        """After a resume from checkpoint folder ``ck`` (the engine was built before it was
        loaded): the engine as it was there, its weights included (rpg_ref.trainer.sampler_lag)."""
        with gathered(self.policy):
            self.engine.restore(self.policy, ck)

    def evaluate(self) -> dict:
        """The task's evaluation of the current policy, run by rank 0 on the full weights; every
        rank gets its result (the others wait)."""
        with gathered(self.policy):
            return main_decides(lambda: self.engine.evaluate(self.task, self.policy))

    def plain_policy(self) -> nn.Module | None:
        """Every rank calls this (collective): rank 0 gets the policy as an ordinary module with
        the full weights (``plain_copy``), the others None. One process: the policy itself."""
        return plain_copy(self.policy)

    def wake(self) -> None:
        self.engine.wake()

    def sleep(self) -> None:
        self.engine.sleep()


# =============================================================================================
# the batch's rows: log-prob passes and the update's micro-batches
# =============================================================================================


def map_rows(fn, batch: Batch, model: nn.Module) -> tuple:
    """``fn(rows)`` -> a tuple of [rows, T] tensors (or None), computed by each rank on its
    contiguous share of ``batch`` with ``model``'s full weights, and gathered: [N, T] each, on
    every rank. One process: ``fn(batch)``."""
    if not active():
        return fn(batch)
    lo, hi = share(len(batch))  # the same number of rows on every rank (checked by check_job)
    with gathered(model):
        out = fn(batch.index(slice(lo, hi)))
    return tuple(None if t is None else gather_rows(t) for t in out)


class MicroBatch(NamedTuple):
    """A micro-batch of this rank's rows of a mini-batch."""

    rows: Batch
    live: bool  # False: a repeat that only keeps the ranks' passes in step (its loss weight is 0)


def rank_micro_batches(mb: Batch, max_seqs: int, max_tokens: int) -> list[MicroBatch]:
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
        out += [MicroBatch(out[0].rows, False)] * (max_int_over_ranks(len(out)) - len(out))
    return out
