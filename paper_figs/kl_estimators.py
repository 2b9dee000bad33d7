"""Bias and spread of Schulman's KL estimators k1, k2, k3 (rpg_ref.core.kl) -- a figure the paper
lacks, behind remark:k3_connection_main and subsec:grpo_main.

x ~ q and r = p(x)/q(x); the sample mean of k_i(log r) estimates KL(q || p):
    k1 = -log r (unbiased, can be negative), k2 = (log r)^2 / 2 (biased, low variance),
    k3 = r - 1 - log r (unbiased for normalized p, q; >= 0).

Gaussian (as in Schulman's note): q = N(0, 1), p = N(mu, 1), KL(q||p) = mu^2 / 2; Monte Carlo
with a fixed seed, values from rpg_ref.core.kl. Categorical: q = pi_old = softmax(theta_old),
p = pi_theta = softmax(theta_old + t d); exact means and standard deviations by enumeration.
"""

from __future__ import annotations

import numpy as np
import torch

from rpg_ref.core import kl as K

from ._common import plt, save

DTYPE = torch.float64
ESTIMATORS = {"k1": K.k1, "k2": K.k2, "k3": K.k3}
COLORS = {"k1": "tab:blue", "k2": "tab:orange", "k3": "tab:green"}


def gaussian_data(
    mus=(0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0), n: int = 200_000, seed: int = 0
) -> dict:
    """Per mu: true KL and, for each estimator, the Monte Carlo mean, std and standard error of
    the mean over n samples x ~ N(0, 1) (the same samples for every mu and estimator)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=DTYPE)   # [n] ~ q
    out = {"mu": np.asarray(mus, float), "n": n, "seed": seed,
           "kl": np.asarray([m * m / 2 for m in mus])}
    for name, f in ESTIMATORS.items():
        means, stds = [], []
        for mu in mus:
            log_r = mu * x - mu * mu / 2                       # log N(x; mu, 1) - log N(x; 0, 1)
            v = f(log_r)                                       # [n]
            means.append(float(v.mean()))
            stds.append(float(v.std()))
        out[name] = {"mean": np.asarray(means), "std": np.asarray(stds),
                     "sem": np.asarray(stds) / np.sqrt(n)}
    return out


def categorical_data(ts=None, K_: int = 10, seed: int = 0) -> dict:
    """Exact E_q[k_i] and Std_q[k_i] for q = pi_old, p = softmax(theta_old + t d), by enumeration,
    and the exact KL(q || p) from rpg_ref.core.kl.kl."""
    ts = np.geomspace(0.05, 4.0, 24) if ts is None else np.asarray(ts, float)
    g = torch.Generator().manual_seed(seed)
    th_old = torch.randn(K_, generator=g, dtype=DTYPE)
    d = torch.randn(K_, generator=g, dtype=DTYPE)
    # unit direction off the softmax null space
    d = (d - d.mean()) / (d - d.mean()).norm()
    lq = torch.log_softmax(th_old, -1)                         # [K] log q
    q = lq.exp()
    out = {
        "t": ts,
        "K": K_,
        "seed": seed,
        "kl": [],
        **{name: {"mean": [], "std": []} for name in ESTIMATORS},
    }
    for t in ts:
        lp = torch.log_softmax(th_old + float(t) * d, -1)       # [K] log p
        out["kl"].append(float(K.kl(lq, lp)))
        for name, f in ESTIMATORS.items():
            # [K] value of the estimator at each outcome
            v = f(lp - lq)
            m = (q * v).sum()
            out[name]["mean"].append(float(m))
            out[name]["std"].append(float((q * (v - m) ** 2).sum().sqrt()))
    out["kl"] = np.asarray(out["kl"])
    for name in ESTIMATORS:
        out[name] = {k: np.asarray(v) for k, v in out[name].items()}
    return out


def kl_estimators_data() -> dict:
    return {"gaussian": gaussian_data(), "categorical": categorical_data()}


def plot_kl_estimators(data: dict, out_dir=None, name: str = "kl_estimators_bias_spread"):
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    gd, cd = data["gaussian"], data["categorical"]
    for name_, c in COLORS.items():
        axes[0].errorbar(
            gd["kl"],
            gd[name_]["mean"] / gd["kl"] - 1,
            yerr=gd[name_]["sem"] / gd["kl"],
            color=c,
            marker="o",
            ms=3,
            label=name_,
            capsize=2,
        )
        axes[1].plot(gd["kl"], gd[name_]["std"] / gd["kl"], color=c, marker="o", ms=3, label=name_)
        axes[2].plot(cd["kl"], cd[name_]["mean"] / cd["kl"] - 1, color=c, label=name_)
        axes[3].plot(cd["kl"], cd[name_]["std"] / cd["kl"], color=c, label=name_)
    titles = [f"Gaussian, MC n={gd['n']}: relative bias", "Gaussian: std / KL",
              f"categorical K={cd['K']}, exact: relative bias", "categorical: std / KL"]
    for ax, t in zip(axes, titles):
        ax.set_xscale("log")
        ax.set_xlabel(r"KL$(q\,\|\,p)$")
        ax.set_title(t, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in (axes[1], axes[3]):
        ax.set_yscale("log")
    axes[0].set_ylabel(r"E[$k_i$] / KL $- 1$")
    axes[1].set_ylabel(r"Std[$k_i$] / KL (one sample)")
    fig.tight_layout()
    return save(fig, out_dir, name)
