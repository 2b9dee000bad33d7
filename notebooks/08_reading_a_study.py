# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 8. Reading a study: from committed rows to a verdict
#
# **What this shows.** How a line of small_scale/RESULTS.md's study C comes out of the committed
# per-run rows (`small_scale/results/C.jsonl`): the seeds a pre-registered rule excludes, the
# paired difference of two cells by seed, its 95 % interval, the minimum detectable effect (MDE),
# why "no difference larger than x" is not "the same", and Holm's correction over a family of
# contrasts. Everything is recomputed here with numpy and scipy and compared with the table that
# `python -m small_scale.study.analysis --all` generated into RESULTS.md.
#
# **Paper labels.** Section 5 (`sec:experiments`) (the claims the study tests at laptop scale),
# Appendix I (`sec:additional_exp`). Paper:
# [arXiv:2505.17508](https://arxiv.org/abs/2505.17508).
#
# Study C trains a 0.3M-parameter model on addition with written work (the carry task,
# docs/carry_task.md) in 27 cells (rpg-train settings) x 22 seeds. Seed $s$ of every cell starts
# from the same warm start and draws the same RL seed, so two cells differ, seed by seed, only
# by their setting: the comparison is *paired*. The study file (`small_scale/studies/C.json`)
# fixed before any run what is compared, on which outcome, and the verdict's words.

# %%
import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from scipy import optimize, stats

from paper_figs import show

ROOT = Path.cwd().parent  # the kernel runs in notebooks/
rows = [json.loads(line) for line in (ROOT / "small_scale/results/C.jsonl").open()]
spec = json.loads((ROOT / "small_scale/studies/C.json").read_text())
results_md = (ROOT / "small_scale/RESULTS.md").read_text()
# study C's generated block of RESULTS.md: the tables the project's analysis wrote from these rows
c_block = results_md.split("--all (C) -->", 1)[1].split("<!-- end generated (C)", 1)[0]
print(f"{len(rows)} rows; one of them:")
print({k: rows[1][k] for k in ("study", "cell", "seed")},
      {k: round(v, 3) for k, v in rows[1]["outcomes"].items() if k.startswith("heldout")})

# %% [markdown]
# ## 1. The exclusion rule, then pairs
#
# The warm start must have learned the task: seeds whose warm start scores under 0.2 held-out are
# excluded from every cell, by a rule written before the runs (`analysis.exclude`).

# %%
rule = spec["analysis"]["exclude"]
excluded = {r["seed"] for r in rows if r["cell"] == rule["reference_cell"]
            and r["outcomes"][rule["outcome"]] < rule["below"]}
print("rule:", rule, "-> excluded seeds:", sorted(excluded))


def by_seed(cell, outcome="heldout"):
    return {r["seed"]: r["outcomes"][outcome] for r in rows
            if r["cell"] == cell and r["seed"] not in excluded}


def paired(a, b, outcome="heldout"):
    va, vb = by_seed(a, outcome), by_seed(b, outcome)
    seeds = sorted(set(va) & set(vb))
    return np.array([va[s] for s in seeds]), np.array([vb[s] for s in seeds])


# %% [markdown]
# ## 2. A paired difference and its 95 % interval
#
# Contrast "URKL + clip > GRPO, 4 updates": cells `urkl-u4` and `grpo-u4`. With $d_s$ the
# difference on seed $s$, $n$ seeds, the interval is
# $\bar d \pm t_{0.975,\,n-1}\, s_d/\sqrt n$.

# %%
def interval(d, level=0.95):
    n = len(d)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * d.std(ddof=1) / np.sqrt(n)
    return d.mean(), d.mean() - half, d.mean() + half


a, b = paired("urkl-u4", "grpo-u4")
d = a - b
mean, lo, hi = interval(d)
p = stats.ttest_1samp(d, 0.0).pvalue
print(f"n = {len(d)}, mean diff {mean:+.3f} [{lo:+.3f}, {hi:+.3f}], p (t) = {p:.3f}")
line = next(x for x in c_block.splitlines()
            if x.startswith("| URKL + clip > GRPO, 4 updates | heldout |"))
print("RESULTS.md:", line)
assert f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]" in line

# unpaired, the same numbers give a much wider interval: the seeds' common part is not removed
welch = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
print(f"unpaired (Welch) interval [{welch.low:+.3f}, {welch.high:+.3f}]: "
      f"{(welch.high - welch.low) / (hi - lo):.1f}x as wide")

fig, axes = plt.subplots(1, 2, figsize=(9, 3))
for s in range(len(a)):
    axes[0].plot([0, 1], [a[s], b[s]], color="0.6", lw=0.8, marker="o", ms=3)
axes[0].set_xticks([0, 1], ["urkl-u4", "grpo-u4"])
axes[0].set_ylabel("held-out accuracy (one line per seed)")
axes[1].hist(d, bins=12, color="0.7")
axes[1].axvline(0, color="k", lw=0.8)
axes[1].axvspan(lo, hi, color="C0", alpha=0.3, label="95 % interval of the mean")
axes[1].set_xlabel("paired difference urkl-u4 - grpo-u4")
axes[1].legend(fontsize=8)
fig.tight_layout()
show(fig)


# %% [markdown]
# The seeds vary much more between each other (left: the lines' heights) than the two settings
# differ on one seed (the lines' slopes). Pairing removes the first from the comparison.
#
# ## 3. The minimum detectable effect, and why "no difference" is not "the same"
#
# The interval contains 0: the study found no difference. But it also contains every difference
# up to its bound, so the verdict's words are "no difference larger than" that bound. How large a
# true difference would the study have found? The MDE: the difference a two-sided t test at
# $\alpha = 0.05$ detects with power 0.8, given the seeds' spread. Under a true difference
# $\delta$, $T = \bar d/(s_d/\sqrt n)$ follows a noncentral $t$ with $n - 1$ degrees of freedom
# and noncentrality $\delta\sqrt n/\sigma_d$. RESULTS.md's MDE column is computed at
# $\alpha/m$, $m$ the number of contrasts in the family (21 secondary ones here; section 4): the
# level of the first step of Holm's correction, so an MDE for the family, not for one test.

# %%
def power(delta, sd, n, alpha=0.05):
    tc = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = delta * np.sqrt(n) / sd
    return stats.nct.sf(tc, n - 1, nc) + stats.nct.sf(tc, n - 1, -nc)


def mde(sd, n, alpha=0.05, target=0.8):
    return optimize.brentq(lambda x: power(x, sd, n, alpha) - target, 1e-9, 10 * sd)


sd, n = d.std(ddof=1), len(d)
m = mde(sd, n)
m_family = mde(sd, n, alpha=0.05 / len(spec["analysis"]["secondary"]))
print(f"sd of the differences {sd:.3f}, n = {n}: MDE = {m:.3f} for one test at 0.05, "
      f"{m_family:.3f} at 0.05 / 21")
assert f"| {m_family:.3f} |" in line  # the table's MDE column
bound = max(abs(lo), abs(hi))
print(f"verdict: no difference larger than {bound:.3f}")

fig, ax = plt.subplots(figsize=(6, 3))
grid = np.linspace(0, 2.5 * m, 100)
ax.plot(grid, power(grid, sd, n), label=f"n = {n} seeds")
ax.plot(grid, power(grid, sd, 4 * n), ls="--", label=f"n = {4 * n} seeds")
ax.axhline(0.8, color="k", lw=0.6)
ax.axvline(m, color="C0", lw=0.6)
ax.set(xlabel="true difference", ylabel="power (chance to find it)")
ax.legend(fontsize=8)
ax.set_title("a difference below the MDE is likely to be missed", fontsize=9)
show(fig)

# %% [markdown]
# A true difference of half the MDE would be found less than a third of the time. "No
# difference" here means "none larger than the bound, and none this study could reliably see":
# an equivalence claim would need a margin fixed in advance and an interval inside it. Four times
# the seeds halve the MDE (dashed): it shrinks as $1/\sqrt n$.

# %%
print(f"power at MDE / 2: {power(m / 2, sd, n):.2f}; MDE with 4n seeds: {mde(sd, 4 * n):.3f}")


# %% [markdown]
# ## 4. Many contrasts: Holm's correction
#
# Study C tests 21 secondary contrasts. At $\alpha = 0.05$ each, about one would come out
# "significant" by chance if none were real. Holm's step-down procedure controls the chance of
# *any* false finding in the family at $\alpha$: sort the $m$ p-values, multiply the $i$-th
# smallest by $m - i + 1$, keep the sequence non-decreasing, cap at 1.

# %%
def holm(pvalues):
    order = np.argsort(pvalues)
    adjusted, running = np.empty(len(pvalues)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


family = spec["analysis"]["secondary"]
pvals = []
for c in family:
    a_, b_ = paired(c["a"], c["b"], c.get("outcome", "heldout"))
    pvals.append(stats.ttest_1samp(a_ - b_, 0.0).pvalue)
adjusted = holm(np.array(pvals))


def fmt(x):
    return "<0.001" if x < 0.001 else f"{x:.3f}"


table = {}
for x in c_block.split("Secondary contrasts", 1)[1].splitlines():
    cells = [c.strip() for c in x.strip("|").split("|")]
    if len(cells) == 9 and re.match(r"[+-]\d", cells[3]):
        table[cells[0]] = cells
print(f"{'contrast':58s} {'p (t)':>7s} {'Holm':>7s}  RESULTS.md")
for c, p_, p_adj in zip(family, pvals, adjusted):
    row = table[c["claim"]]
    print(f"{c['claim'][:58]:58s} {fmt(p_):>7s} {fmt(p_adj):>7s}  {row[4]:>7s} {row[5]:>7s}")
    assert (fmt(p_), fmt(p_adj)) == (row[4], row[5])
print(f"raw p < 0.05: {sum(p < 0.05 for p in pvals)}; after Holm: {sum(adjusted < 0.05)}")

# %% [markdown]
# Some contrasts that pass at 0.05 alone do not survive Holm (e.g. GRPO's KL weighting, raw
# p = 0.028): RESULTS.md reads them as "no difference larger than …", and every number above is
# the table's.

# %% [markdown]
# ## What we learned
#
# A study line is a paired difference over seeds (the first figure: seeds differ more than
# settings do, and pairing removes that), its t interval, an MDE from the noncentral t (the power
# figure: what the study could not have seen), and a Holm-adjusted p within its family. "No
# difference larger than x" bounds the difference; it does not say the two are the same.

# %% [markdown]
# ## Exercises
#
# Solutions: `notebooks/solutions.py` (run by `tests/test_notebook_solutions.py`).
#
# 1. *Run.* Recompute the primary contrast "URKL + clip > DAPO, 16 updates per batch" (cells
#    `urkl-u16`, `dapo-u16`): its mean difference and 95 % interval, as RESULTS.md prints them.
#    (`ex08_1_urkl_vs_dapo_at_16_updates`)
# 2. *Predict, then compute.* How many paired seeds would make the MDE of the contrast above
#    (urkl-u4 vs grpo-u4, the same spread of differences) at most 0.02?
#    (`ex08_2_seeds_for_an_mde_of_0_02`)
# 3. *Derive.* For a family of $m$ contrasts with all null hypotheses true and independent
#    p-values, Holm's chance of any rejection at $\alpha = 0.05$ is at most 0.05; check by
#    simulation with 21 uniform p-values. (`ex08_3_holm_family_error_rate`)
