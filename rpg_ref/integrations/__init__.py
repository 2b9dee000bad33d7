"""Integrations with other RL frameworks (optional dependencies; import the submodule you need).

    rpg_ref.integrations.verl   registers the RPG losses in verl's policy-loss registry
    rpg_ref.integrations.trl    RPGConfig / RPGTrainer: the RPG losses inside TRL's GRPOTrainer
"""
