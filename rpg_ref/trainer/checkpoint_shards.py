"""A checkpoint of a sharded (torchrun, FSDP2) run: the full state gathered on rank 0 and written
as one process writes it, and a checkpoint loaded back into each rank's shards.

The files are a single process's (rpg_ref/trainer/checkpoint.py writes them): the policy and pi_ref
as plain modules (``plain_copy``), the full AdamW state, every rank's RNG state. So a checkpoint
loads anywhere, and a resume on the same number of ranks continues bitwise. To rebuild a plain
module from the shards, the sharding (rpg_ref/trainer/distributed/sharding.py) leaves here each
model's unsharded layout on the meta device before it shards it (``remember_layout``).

With one process none of this runs: ``full_states`` returns None and the loop's own modules are
written as they are.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from rpg_ref.trainer.collectives import active, all_gather, is_main, rank

_LAYOUTS: dict = {}  # id(sharded model) -> (its unsharded twin on the meta device, tied names)


def _dcp():
    """torch.distributed.checkpoint.state_dict, imported on first use: it takes seconds to import
    and only a sharded run needs it."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _full(cpu_offload: bool = True):
    return _dcp().StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)


def tied(model: nn.Module) -> list:
    """Groups of parameter names that are one tensor (a tied embedding and LM head)."""
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def remember_layout(model: nn.Module) -> None:
    """Keep ``model``'s unsharded layout (no weights) for ``plain_copy``: called before it is
    sharded."""
    _LAYOUTS[id(model)] = (copy.deepcopy(model).to("meta"), tied(model))


def plain_copy(model: nn.Module | None) -> nn.Module | None:
    """Every rank calls this (collective): rank 0 gets an ordinary, unsharded module with the full
    weights on the CPU (what a task's summary, save_model and save_pretrained expect), the others
    None. One process: ``model`` itself."""
    if model is None or not active():
        return model
    sd = _dcp().get_model_state_dict(model, options=_full())
    if not is_main():
        return None
    template, groups = _LAYOUTS[id(model)]
    plain = template.to_empty(device="cpu")
    plain.load_state_dict(sd)
    for group in groups:  # moving to and from the meta device unties them: tie them again
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
    files = {"model.safetensors": plain_copy(policy),
             "optimizer.pt": _dcp().get_optimizer_state_dict(policy, opt, options=_full())}
    if ref is not None:
        files["ref.safetensors"] = plain_copy(ref)
    files["rng.pt"] = {**rng, "ranks": all_gather(rng)}
    return files if is_main() else {}


def _load_model(model: nn.Module, path: Path) -> None:
    """A save_model file (tied weights stored once) into this rank's shards."""
    sd = load_file(str(path))
    for group in tied(model):  # every name of a tied parameter, from the one stored
        stored = next((sd[n] for n in group if n in sd), None)
        sd.update({n: stored for n in group if stored is not None})
    _dcp().set_model_state_dict(model, sd, options=_full(cpu_offload=False))


def load_full_states(ck: Path, policy, ref, opt) -> dict:
    """Load checkpoint folder ``ck`` into this rank's shards; returns this rank's RNG state."""
    _load_model(policy, ck / "model.safetensors")
    if ref is not None:
        _load_model(ref, ck / "ref.safetensors")
    osd = torch.load(ck / "optimizer.pt", weights_only=True)
    _dcp().set_optimizer_state_dict(policy, opt, osd, options=_full(cpu_offload=False))
    return torch.load(ck / "rng.pt", weights_only=True)["ranks"][rank()]
