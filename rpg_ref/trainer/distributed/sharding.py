"""FSDP2 over the policy (and pi_ref): parameters, gradients and AdamW state 1/world per rank, and
``gathered``: the full weights on every rank for a while (sampling, log-prob passes, evaluation,
weight syncs). One process: the models as they are (rpg_ref/trainer/distributed/__init__.py).
"""

from __future__ import annotations

import dataclasses
import warnings
from contextlib import contextmanager
from types import SimpleNamespace

from torch import nn

from rpg_ref.models import logprobs as model_logprobs
from rpg_ref.trainer.checkpoint_shards import remember_layout
from rpg_ref.trainer.collectives import active, from_main_module


def shard(policy: nn.Module, ref: nn.Module | None = None) -> tuple[nn.Module, nn.Module | None]:
    """FSDP2 over ``policy`` and ``ref`` (None: nothing). One process: both as they are."""
    if not active():
        return policy, ref
    return _shard(policy), None if ref is None else _shard(ref)


def _shard(model: nn.Module) -> nn.Module:
    """Each decoder layer its own unit, then the root (the rest: embeddings, final norm, head, or
    a bandit's logits). Rank 0's weights are broadcast first, so every rank shards the same model.
    Gradients are reduce-scattered as a SUM (rpg_ref/trainer/distributed/__init__.py)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard  # seconds to import: torchrun only

    model.register_forward_hook(_visible_to_fsdp)  # runs before FSDP's own post-forward hook
    # a forward may return a view of a parameter (the bandit); nothing here modifies one in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    remember_layout(model)  # a checkpoint rebuilds the plain module from it
    _hidden_through_root(model)
    from_main_module(model)
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
    if model is None or not active():
        yield model
        return
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for u in units:
        u.set_reshard_after_forward(False, recurse=False)
        u.unshard()
    try:
        yield model
    finally:
        for u in units:
            u.reshard()
            u.set_reshard_after_forward(u is not model, recurse=False)
