"""Which rank this process is, and the few ways the ranks of a torchrun job agree on a value.

Every function here is a plain value or a no-op for one process (no torchrun, or WORLD_SIZE=1),
so a run is bit for bit what it is without torchrun. Under torchrun each of the others is a
collective: every rank calls it at the same point of the run, or the others wait (until
--dist-timeout). They sit at the bottom of the trainer (docs/architecture.md): checkpoints,
metrics and the distribution layer above all use them, and they import nothing of the trainer.
"""

from __future__ import annotations

import os

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
    """Rank 0: it writes the run folder and runs the evaluation."""
    return rank() == 0


def active() -> bool:
    """True in a multi-process run (the process group is joined)."""
    return dist.is_initialized() and dist.get_world_size() > 1


def share(n: int) -> tuple[int, int]:
    """This rank's contiguous share [lo, hi) of n items (sizes differ by at most one)."""
    W, i = world(), rank()
    return i * n // W, (i + 1) * n // W


# =============================================================================================
# collectives: every rank calls them at the same point (one process: the value itself)
# =============================================================================================


def all_gather(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (any picklable object). One process:
    [obj]."""
    if not active():
        return [obj]
    parts = [None] * world()
    dist.all_gather_object(parts, obj)
    return parts


def gather_rows(x: Tensor) -> Tensor:
    """[n, ...] on every rank (same shape) -> [world * n, ...] in rank order. One process: x."""
    if not active():
        return x
    parts = [torch.empty_like(x) for _ in range(world())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def from_main(x: Tensor) -> Tensor:
    """Rank 0's ``x`` on every rank (same shape and dtype everywhere). One process: ``x``."""
    if active():
        dist.broadcast(x, 0)
    return x


def main_decides(fn):
    """fn() run by rank 0 alone, its result (any picklable object) on every rank. One process:
    fn()."""
    if not active():
        return fn()
    box = [fn() if is_main() else None]
    dist.broadcast_object_list(box, 0)
    return box[0]


def from_main_module(model: nn.Module) -> None:
    """Rank 0's parameters and buffers copied into ``model`` on every rank (the same
    architecture everywhere), so that every rank starts from one model."""
    if not active():
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, 0)


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


def max_int_over_ranks(n: int) -> int:
    """The largest rank's n. One process: n."""
    if not active():
        return n
    t = torch.tensor([n])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)
