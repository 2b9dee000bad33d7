"""The built-in adapters: rpg-ref's losses, twins written from documentation, and the peers' own
code (each pinned to the version it was run on; left out, with a note, where not installed)."""

from __future__ import annotations

from rpg_ref.audit.adapter import BETA, Adapter
from rpg_ref.audit.adapters.common import VERL_KL_TYPES, k3
from rpg_ref.audit.adapters.peers import peer_adapters
from rpg_ref.audit.adapters.rpg_ref_losses import rpg_ref_adapters
from rpg_ref.audit.adapters.trl import trl_adapters
from rpg_ref.audit.adapters.twins import docs_adapters
from rpg_ref.audit.adapters.verl import verl_adapters

__all__ = [
    "BETA",
    "VERL_KL_TYPES",
    "Adapter",
    "all_adapters",
    "docs_adapters",
    "k3",
    "peer_adapters",
    "rpg_ref_adapters",
    "trl_adapters",
    "verl_adapters",
]


def all_adapters() -> tuple[list[Adapter], list[str]]:
    verl_own, notes = verl_adapters()
    trl_own, trl_notes = trl_adapters()
    peers, peer_notes = peer_adapters()
    return (
        rpg_ref_adapters() + docs_adapters() + verl_own + trl_own + peers,
        notes + trl_notes + peer_notes,
    )
