"""Tasks and engines by name. Entries are "module:Class" strings imported on first use, so an
optional dependency (transformers, vLLM) is needed only by the run that uses it, and a new task or
engine plugs in with one line here (or ``TASKS["mine"] = MyTask`` from your own code)."""

from __future__ import annotations

import importlib
from typing import Any

TASKS: dict[str, Any] = {
    "bandit": "rpg_ref.tasks.bandit:BanditTask",
    "seq": "rpg_ref.tasks.seq:SeqTask",
    "carry": "rpg_ref.tasks.carry:CarryTask",
    "math": "rpg_ref.tasks.math:MathTask",
}
ENGINES: dict[str, Any] = {
    "hf": "rpg_ref.engines.hf:HFEngine",
    "sample": "rpg_ref.engines.sample:SampleEngine",
    "vllm": "rpg_ref.engines.vllm:VLLMEngine",
}


def resolve(registry: dict, name: str, kind: str, quiet: bool = False):
    """The class registered under ``name`` (imported if it is a "module:Class" string).

    Raises ValueError naming the valid choices, or returns None when ``quiet``."""
    if name not in registry:
        if quiet:
            return None
        raise ValueError(
            f"bad configuration: unknown {kind} {name!r}; valid: {', '.join(registry)}"
        )
    obj = registry[name]
    if isinstance(obj, str):
        module, _, cls = obj.partition(":")
        try:
            obj = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError) as e:
            if quiet:
                return None
            raise ValueError(f"bad configuration: {kind} {name!r} lives in {obj}, which cannot be "
                             f"imported here: {e}") from e
    return obj
