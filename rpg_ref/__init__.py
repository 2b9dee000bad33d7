"""rpg-ref: reference implementation of the RPG paper's KL-regularized policy-gradient losses.

Subpackages (docs/architecture.md draws them and the direction of their imports):
``rpg_ref.core`` (the mathematics: ``losses`` registers every surrogate loss as the paper writes
it, ``kl``, ``advantages``, ``exact``),
``rpg_ref.trainer`` (the loop ``train`` and its config, checkpoints, metrics; ``rpg-train`` is
``rpg_ref.cli``), ``rpg_ref.tasks`` / ``rpg_ref.engines`` (the plug-ins, following
``rpg_ref.interfaces``), ``rpg_ref.models`` (Hugging Face policies), ``rpg_ref.math`` (the math
domain), ``rpg_ref.audit`` (which objective a loss follows), ``rpg_ref.integrations`` (verl, TRL).
Modules are imported by their full path: ``from rpg_ref.core.losses import LOSSES``.
"""

__version__ = "0.1.0"
