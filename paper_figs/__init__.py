"""paper_figs: the RPG paper's figures and tables, regenerated from code (``rpg-figs``).

Each figure family lives in one module with a pure ``*_data()`` (the plotted numbers, computed
through rpg_ref / derivations) and a ``plot_*()`` that draws them (PNG + PDF):

    clip_shapes     fig:ppo_dualclip_loss_vis, fig:offpolicy_rpg_rf_ppo_dualclip_v1 (+ variants)
    grpo_kl_error   GRPO KL term's gradient error vs distance from theta_old      (not in the paper)
    kl_estimators   k1 / k2 / k3 bias and spread                                 (not in the paper)
    grad_variance   normalized vs unnormalized estimators' gradient variance     (not in the paper)
    training        fig:main_8k / fig:ablation_clip / fig:ablation_kl shapes and tab:main_table_4k,
                    read from small_scale/logs
    results_tables  tab:main_table_{8k,4k,2k,4k_2,7b} as grouped bars from paper_results.json
                    (the paper's numbers, its contradictions marked), and the paper's AIME
                    columns beside the small-scale seq task (imports derivations: needs sympy)

``FIGURES`` maps a name (``rpg-figs --only NAME``) to a maker ``fn(out_dir, logs) -> [paths]``.
"""

from importlib import import_module

__all__ = ["DEFAULT_OUT", "FIGURES", "Figure", "render", "show"]


def __getattr__(name: str):
    """paper_figs.FIGURES, .render, ...: read from paper_figs.figures on first use, so that
    importing the package (rpg-figs, its --help) needs no matplotlib until a figure is drawn."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(import_module(".figures", __name__), name)

