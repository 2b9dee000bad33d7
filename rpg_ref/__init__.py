"""rpg-ref: reference implementation of the RPG paper's KL-regularized policy-gradient losses.

Modules: ``rpg_ref.losses`` (every surrogate loss as the paper writes it, registry ``LOSSES``;
``rpg_ref.losses_fused``: their closed-form fast path), ``rpg_ref.kl`` (k1/k2/k3 and exact KL/UKL),
``rpg_ref.advantages`` (baselines), ``rpg_ref.exact`` (exact expectations by enumeration),
``rpg_ref.audit`` (which objective a loss follows), ``rpg_ref.train`` (the training loop;
``rpg-train`` is ``rpg_ref.cli``), ``rpg_ref.tasks`` / ``rpg_ref.engines`` (the plug-ins, following
``rpg_ref.interfaces``), ``rpg_ref.math`` (the math domain), ``rpg_ref.models`` (Hugging Face
policies). The rooms and the direction of their imports: docs/architecture.md.
"""

__version__ = "0.1.0"
