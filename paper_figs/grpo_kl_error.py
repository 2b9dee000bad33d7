"""GRPO's KL term: the error of its expected gradient vs distance from theta_old (subsec:grpo_main)
-- a figure the paper lacks.

GRPO adds beta * k3(pi_ref/pi_theta) per token sampled from pi_old, with no importance weight.
Its expected gradient is E_old[(1 - pi_ref/pi_theta) grad log pi_theta], which equals
grad UKL(pi_theta || pi_ref) only when pi_old = pi_theta; the corrected term w * k3(pi_ref/pi_theta)
(rpg_ref's ``grpo-corrected``, the paper's fix) is exact for every theta. Along
theta = theta_old + t d (d a fixed random unit direction) we plot
||E[grad term] - grad UKL|| / ||grad UKL|| for both terms, in the RPG setting pi_ref = pi_old and in
GRPO's setting of a fixed reference pi_ref != pi_old.

The numbers come from ``derivations.grpo_kl.error_curve`` (exact enumeration through
rpg_ref.core.losses). When the derivations package cannot be imported, the same curve is computed
here with ``rpg_ref.core.exact`` (same construction, same seed) and ``source`` says so.
"""

from __future__ import annotations

import numpy as np
import torch

from rpg_ref.core import exact

from ._common import plt, save

DTYPE = torch.float64
DISTANCES = tuple([0.0] + list(np.round(np.geomspace(0.02, 4.0, 22), 6)))
SETTINGS = (("pi_ref = pi_old (RPG, iterative reference)", None),
            ("pi_ref != pi_old (GRPO, fixed reference)", 0.8))


def _error_curve_exact(distances, K=6, seed=0, ref_dist=0.8) -> list[dict]:
    """The rows of derivations.grpo_kl.error_curve, computed with rpg_ref.core.exact."""
    g = torch.Generator().manual_seed(seed)
    th_old = torch.randn(K, generator=g, dtype=DTYPE)
    d = torch.randn(K, generator=g, dtype=DTYPE)
    d = (d - d.mean()) / (d - d.mean()).norm()
    ref = th_old + (0.0 if ref_dist is None else ref_dist) * torch.randn(
        K, generator=g, dtype=DTYPE
    )
    old_logp, ref_logp = torch.log_softmax(th_old, -1), torch.log_softmax(ref, -1)
    zero = torch.zeros(K, dtype=DTYPE)
    rows = []
    for t in distances:
        th = th_old + t * d
        g_pub = exact.expected_loss_grad("grpo", th, old_logp, zero, 1.0, ref_logp)
        g_cor = exact.expected_loss_grad("grpo-corrected", th, old_logp, zero, 1.0, ref_logp)
        g_true = exact.objective_grad("urkl", th, zero, -1.0, ref_logp)   # J = 0 + D: grad D
        lp = torch.log_softmax(th, -1)
        deg = float(g_true.norm()) < 1e-14
        rows.append(
            {
                "distance": float(t),
                "kl_theta_old": float((lp.exp() * (lp - old_logp)).sum()),
                "rel_err": None if deg else float((g_pub - g_true).norm() / g_true.norm()),
                "corrected_rel_err": None
                if deg
                else float((g_cor - g_true).norm() / g_true.norm()),
                "cosine": None if deg else float(g_pub @ g_true / (g_pub.norm() * g_true.norm())),
            }
        )
    return rows


def _error_curve(distances, ref_dist):
    try:
        from derivations.grpo_kl import error_curve
    except ImportError:
        return _error_curve_exact(distances, ref_dist=ref_dist), "paper_figs (rpg_ref.core.exact)"
    return error_curve(distances=distances, ref_dist=ref_dist), "derivations.grpo_kl.error_curve"


def _arr(rows, key):
    return np.asarray([np.nan if r[key] is None else r[key] for r in rows], dtype=float)


def grpo_kl_error_data(distances=DISTANCES, settings=SETTINGS) -> dict:
    """{setting label: {distance, kl_theta_old, rel_err, corrected_rel_err, cosine}} (NaN where
    grad UKL = 0, i.e. at t = 0 with pi_ref = pi_old), plus ``source``."""
    out, source = {}, None
    for label, ref_dist in settings:
        rows, source = _error_curve(list(distances), ref_dist)
        out[label] = {k: _arr(rows, k) for k in ("distance", "kl_theta_old", "rel_err",
                                                  "corrected_rel_err", "cosine")}
    return {"settings": out, "source": source}


def plot_grpo_kl_error(data: dict, out_dir=None, name: str = "grpo_kl_gradient_error"):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for (label, s), c in zip(data["settings"].items(), ("tab:blue", "tab:red")):
        ok = s["distance"] > 0
        x = s["kl_theta_old"][ok]
        axes[0].plot(x, s["rel_err"][ok], color=c, marker="o", ms=3, label=f"GRPO $k_3$: {label}")
        # the corrected term is exact: its error is float64 round-off, floored for the log axis
        axes[0].plot(x, np.maximum(s["corrected_rel_err"][ok], 1e-17), color=c, ls="--",
                     label=f"$w\\,k_3$ (corrected): {label}")
        axes[1].plot(x, s["cosine"][ok], color=c, marker="o", ms=3, label=label)
    axes[0].set_yscale("log")
    axes[0].set_ylabel(
        r"$\|E[\nabla\,\mathrm{term}] - \nabla\,\mathrm{UKL}(\pi_\theta\|\pi_{ref})\|"
        r" / \|\nabla\,\mathrm{UKL}\|$",
        fontsize=8,
    )
    axes[1].set_ylabel("cosine(GRPO term's gradient, true gradient)", fontsize=8)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel(r"KL$(\pi_\theta\,\|\,\pi_{old})$")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"GRPO's KL term off-policy (exact, K=6; {data['source']})", fontsize=9)
    fig.tight_layout()
    return save(fig, out_dir, name)
