"""Gradient variance of the normalized vs unnormalized estimators (app:normalized_kl) by Monte
Carlo through rpg_ref.core.losses -- a figure the paper lacks.

For a normalized policy, FKL and UFKL (and RKL and URKL) have the same expected gradient, but
their per-sample estimators differ by beta * w * grad log pi_theta (mean zero, not variance zero).
Setting: a K-outcome softmax pi_theta = softmax(theta), x ~ pi_old, 0/1 rewards with the baseline
E_old[R], theta = theta_old + s * (a fixed random direction). For N samples (fixed seed) one loss
call on a [N, 1] batch with agg="seq-mean-token-sum" gives d loss / d log pi(x_i) = g_i / N, and
the per-sample gradient w.r.t. theta is g_i * (onehot(x_i) - pi_theta) (grad of log-softmax).
We report the total variance sum_j Var[grad_j] of one sample's gradient, with its standard error.
The REINFORCE twins have per-sample gradients identical to the fully differentiable losses
(prop:equiv_rf_fd) and therefore the same variance; only the latter are drawn.
"""

from __future__ import annotations

import numpy as np
import torch

from rpg_ref.core.losses import get_loss

from ._common import plt, save

DTYPE = torch.float64
LOSS_NAMES = ("rpg-fkl", "rpg-ufkl", "rpg-rkl", "rpg-urkl")
SCALES = (0.0, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5)


def bandit_policy(K: int = 6, seed: int = 0, scale: float = 0.0):
    """(theta, old_logp, advantages): theta_old ~ N(0, I), theta = theta_old + scale * z,
    R ~ Bernoulli(0.5) per outcome, advantages R - E_old[R]."""
    g = torch.Generator().manual_seed(seed)
    th_old = torch.randn(K, generator=g, dtype=DTYPE)
    z = torch.randn(K, generator=g, dtype=DTYPE)
    R = (torch.rand(K, generator=g, dtype=DTYPE) < 0.5).to(DTYPE)
    old_logp = torch.log_softmax(th_old, -1)
    return th_old + scale * z, old_logp, R - (old_logp.exp() * R).sum()


def per_sample_grads(name: str, theta, old_logp, adv, x, beta: float):
    """[N, K] gradient w.r.t. theta of each sample's loss L(x_i), from one rpg_ref loss call."""
    logp_all = torch.log_softmax(theta, -1)                                  # [K]
    n = x.shape[0]
    logp = logp_all[x].detach().view(n, 1).requires_grad_(True)               # [N, 1] leaf
    loss, _ = get_loss(name)(logp, old_logp[x].view(n, 1), adv[x], torch.ones(n, 1, dtype=DTYPE),
                             beta=beta, agg="seq-mean-token-sum")             # mean over samples
    (dl,) = torch.autograd.grad(loss, logp)                                   # [N, 1] = g_i / N
    onehot = torch.nn.functional.one_hot(x, theta.shape[0]).to(DTYPE)         # [N, K]
    return n * dl * (onehot - logp_all.exp())                                 # [N, K]


def grad_variance_data(scales=SCALES, beta: float = 0.5, n: int = 20_000, K: int = 6, seed: int = 0,
                       losses=LOSS_NAMES) -> dict:
    """Per scale s: KL(pi_theta || pi_old) and, per loss, the MC mean gradient, total variance of
    one sample's gradient and the standard error of that variance estimate (n samples, fixed
    seed)."""
    out = {"scale": np.asarray(scales, float), "beta": beta, "n": n, "K": K, "kl": [],
           **{name: {"var": [], "var_se": [], "mean_grad": []} for name in losses}}
    for i, s in enumerate(scales):
        th, old_logp, adv = bandit_policy(K, seed, s)
        lp = torch.log_softmax(th, -1)
        out["kl"].append(float((lp.exp() * (lp - old_logp)).sum()))
        x = torch.multinomial(old_logp.exp(), n, replacement=True,
                              generator=torch.Generator().manual_seed(seed + 1000 + i))    # [N]
        for name in losses:
            G = per_sample_grads(name, th, old_logp, adv, x, beta)               # [N, K]
            sq = ((G - G.mean(0)) ** 2).sum(1)                                   # [N]
            out[name]["var"].append(float(sq.mean()))
            out[name]["var_se"].append(float(sq.std() / n ** 0.5))
            out[name]["mean_grad"].append(G.mean(0).numpy())
    out["kl"] = np.asarray(out["kl"])
    for name in losses:
        out[name] = {k: np.asarray(v) for k, v in out[name].items()}
    return out


def plot_grad_variance(
    data: dict, out_dir=None, name: str = "grad_variance_normalized_vs_unnormalized"
):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    x = data["scale"]
    for ax, pair in zip(axes, (("rpg-fkl", "rpg-ufkl"), ("rpg-rkl", "rpg-urkl"))):
        for nm, c in zip(pair, ("tab:blue", "tab:red")):
            ax.errorbar(x, data[nm]["var"], yerr=2 * data[nm]["var_se"], color=c, marker="o", ms=3,
                        capsize=2, label=f"{nm} (and rpg-reinforce twin)")
        ax.set_xlabel(r"distance $s$ of $\theta$ from $\theta_{old}$")
        ax.set_ylabel("total variance of one sample's gradient")
        sec = ax.secondary_xaxis("top", functions=(lambda s: np.interp(s, x, data["kl"]),
                                                   lambda k: np.interp(k, data["kl"], x)))
        sec.set_xlabel(r"KL$(\pi_\theta\|\pi_{old})$", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"normalized vs unnormalized estimators: MC n={data['n']}, K={data['K']}, "
                 f"beta={data['beta']:g} (error bars: 2 s.e.)", fontsize=9)
    fig.tight_layout()
    return save(fig, out_dir, name)
