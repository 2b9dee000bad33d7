"""The registry of paper_figs' figures (``FIGURES``, ``render``): what ``paper_figs`` exports,
imported on first use (every figure draws with matplotlib; the package docstring lists them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import clip_shapes, grad_variance, grpo_kl_error, kl_estimators, training
from ._common import DEFAULT_OUT, show

__all__ = ["DEFAULT_OUT", "FIGURES", "Figure", "render", "show"]


@dataclass(frozen=True)
class Figure:
    name: str
    paper_label: str          # the paper's label it reproduces, or "new: ..." for figures it lacks
    experiment: str | None  # small_scale experiment whose logs it reads (None: computed here)
    make: Callable             # (out_dir, logs) -> list of written paths


def _write(out_dir, name: str, text: str) -> Path:
    p = Path(out_dir) / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def _group(exp: str, group: str, logs) -> list:
    spec = training.load_experiment(exp, logs)["spec"]
    if group not in spec.get("groups", {}):
        raise ValueError(
            f"{exp}/experiment.json has no group {group!r}; groups: {list(spec.get('groups', {}))}"
        )
    return spec["groups"][group]


def _main_seq(out, logs):
    d = training.dynamics_data("seq", panels=training.SEQ_PANELS, logs=logs)
    paths = training.plot_dynamics(
        d, out, "main_seq", "seq task: training dynamics (fig:main_8k's shape)"
    )
    t = training.last_best_data("seq", logs=logs)
    g = training.gain_data("seq", logs=logs)
    return paths + [_write(out, "main_table_seq.md", training.to_markdown(t)),
                    _write(out, "main_table_seq.tex", training.to_latex(t)),
                    _write(out, "main_seq_gain.md", training.gain_markdown(g))]


def _ablation(group: str, title: str):
    def make(out, logs):
        runs = _group("ablation", group, logs)
        d = training.dynamics_data("ablation", runs=runs, panels=training.SEQ_PANELS, logs=logs)
        paths = training.plot_dynamics(d, out, group, title)
        t = training.last_best_data("ablation", runs=runs, logs=logs)
        g = training.gain_data("ablation", runs=runs, logs=logs)
        return paths + [_write(out, f"{group}_table.md", training.to_markdown(t)),
                        _write(out, f"{group}_table.tex", training.to_latex(t)),
                        _write(out, f"{group}_gain.md", training.gain_markdown(g))]
    return make


def _paper_table(label: str):
    def make(out, logs):
        # needs derivations (sympy); the other figures do not
        from . import results_tables
        return results_tables.plot_bars(results_tables.bars_data(label), out)
    return make


def _paper_vs_small_scale(out, logs):
    from . import results_tables
    d = results_tables.side_by_side_data(logs)
    return results_tables.plot_side_by_side(d, out) + [
        _write(out, "paper_vs_small_scale.md", results_tables.side_by_side_markdown(d))]


# the paper's results tables (derivations.tables.RESULTS_TABLES; tests check the two agree)
PAPER_TABLES = (
    "tab:main_table_8k",
    "tab:main_table_4k",
    "tab:main_table_2k",
    "tab:main_table_4k_2",
    "tab:main_table_7b",
)


def _bandit(out, logs):
    d = training.dynamics_data("bandit", panels=training.BANDIT_PANELS, logs=logs)
    d["panels"] = {"optimum_gap": training.bandit_gap_panel("bandit", logs), **d["panels"]}
    paths = training.plot_dynamics(d, out, "bandit_dynamics", "bandit (fixed reference)")
    t = training.bandit_table_data("bandit", logs)
    return (
        paths
        + training.plot_bandit_tv(t, out)
        + [_write(out, "bandit_table.md", training.bandit_markdown(t))]
    )


FIGURES: dict[str, Figure] = {
    f.name: f
    for f in [
        Figure(
            "ppo_dualclip_loss_vis",
            "fig:ppo_dualclip_loss_vis",
            None,
            lambda out, logs: clip_shapes.plot_dualclip_loss(clip_shapes.dualclip_loss_data(), out),
        ),
        Figure(
            "ppo_dualclip_loss_vis_differentiable_adv",
            "fig:ppo_dualclip_loss_vis (beta > 0: A_hat depends on theta)",
            None,
            lambda out, logs: clip_shapes.plot_dualclip_loss(
                clip_shapes.dualclip_loss_data(beta=0.5),
                out,
                "ppo_dualclip_loss_vis_differentiable_adv",
            ),
        ),
        Figure(
            "offpolicy_rpg_rf_ppo_dualclip_v1",
            "fig:offpolicy_rpg_rf_ppo_dualclip_v1",
            None,
            lambda out, logs: clip_shapes.plot_rpg_style_clip(
                clip_shapes.rpg_style_clip_data(), out
            ),
        ),
        Figure(
            "rpg_style_clip_pi_ref_eq_pi_old",
            "fig:offpolicy_rpg_rf_ppo_dualclip_v1 (pi_ref = pi_old, 4 divergences)",
            None,
            lambda out, logs: clip_shapes.plot_rpg_style_clip_natural(
                clip_shapes.rpg_style_clip_natural_data(), out
            ),
        ),
        Figure(
            "grpo_kl_gradient_error",
            "new: subsec:grpo_main",
            None,
            lambda out, logs: grpo_kl_error.plot_grpo_kl_error(
                grpo_kl_error.grpo_kl_error_data(), out
            ),
        ),
        Figure(
            "kl_estimators_bias_spread",
            "new: remark:k3_connection_main",
            None,
            lambda out, logs: kl_estimators.plot_kl_estimators(
                kl_estimators.kl_estimators_data(), out
            ),
        ),
        Figure(
            "grad_variance_normalized_vs_unnormalized",
            "new: app:normalized_kl",
            None,
            lambda out, logs: grad_variance.plot_grad_variance(
                grad_variance.grad_variance_data(), out
            ),
        ),
        Figure("bandit", "new: convergence to the KL-regularized optimum", "bandit", _bandit),
        Figure("main_seq", "fig:main_8k + tab:main_table_4k (shape)", "seq", _main_seq),
        Figure(
            "ablation_clip",
            "fig:ablation_clip (shape)",
            "ablation",
            _ablation(
                "ablation_clip", "ablation: clip ratios, RPG-REINFORCE (fig:ablation_clip's shape)"
            ),
        ),
        Figure(
            "ablation_kl",
            "fig:ablation_kl (shape)",
            "ablation",
            _ablation(
                "ablation_kl",
                "ablation: beta and iterative reference, RPG-REINFORCE-UFKL (fig:ablation_kl's "
                "shape)",
            ),
        ),
        *[
            Figure(
                f"paper_{label.removeprefix('tab:')}",
                f"{label} (the paper's numbers, paper_results.json)",
                None,
                _paper_table(label),
            )
            for label in PAPER_TABLES
        ],
        Figure(
            "paper_vs_small_scale",
            "tab:main_table_8k/4k AIME columns beside the seq task (+ claims table)",
            "seq",
            _paper_vs_small_scale,
        ),
    ]
}


def render(name: str, out_dir=DEFAULT_OUT, logs=training.DEFAULT_LOGS) -> list[Path]:
    """Render one figure (and its tables) into out_dir; returns the written files."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; valid: {', '.join(FIGURES)}")
    return FIGURES[name].make(Path(out_dir), Path(logs))
