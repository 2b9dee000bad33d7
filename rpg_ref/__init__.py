"""rpg-ref: reference implementation of the RPG paper's KL-regularized policy-gradient losses.

Subpackages (docs/architecture.md draws them and the direction of their imports):
``rpg_ref.core`` (the mathematics: ``losses`` registers every surrogate loss as the paper writes
it, ``losses_fused`` their closed-form fast path, ``kl``, ``advantages``, ``exact``),
``rpg_ref.trainer`` (the loop ``train`` and its config, checkpoints, metrics; ``rpg-train`` is
``rpg_ref.cli``), ``rpg_ref.tasks`` / ``rpg_ref.engines`` (the plug-ins, following
``rpg_ref.interfaces``), ``rpg_ref.models`` (Hugging Face policies), ``rpg_ref.math`` (the math
domain), ``rpg_ref.audit`` (which objective a loss follows), ``rpg_ref.integrations`` (verl, TRL).

The short paths ``rpg_ref.losses``, ``rpg_ref.train``, ... keep working: each is the very module
object of its subpackage (``rpg_ref.losses is rpg_ref.core.losses``), imported on first use.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

# short name -> the subpackage that holds it
_HOMES = {
    **dict.fromkeys(("kl", "divergences", "loss_spec", "loss_checks", "losses", "losses_fused",
                     "advantages", "exact"), "core"),
    **dict.fromkeys(("train", "config", "checkpoint", "metrics", "shaping", "rollout_correction",
                     "distributed"), "trainer"),
    "logprobs": "models",
}
SHORT_PATHS = {f"rpg_ref.{name}": f"rpg_ref.{home}.{name}" for name, home in _HOMES.items()}


class _ShortPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``rpg_ref.<name>`` as the module ``rpg_ref.<home>.<name>`` itself (no copy)."""

    def __init__(self):
        self.real_specs = {}  # short name -> the real module's spec, while it is being imported

    def find_spec(self, fullname, path=None, target=None):
        if fullname in SHORT_PATHS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(SHORT_PATHS[spec.name])
        self.real_specs[spec.name] = module.__spec__  # the import system sets the short one next
        return module

    def exec_module(self, module):
        module.__spec__ = self.real_specs.pop(module.__spec__.name)  # executed under its own name


if not any(isinstance(f, _ShortPaths) for f in sys.meta_path):
    sys.meta_path.append(_ShortPaths())
