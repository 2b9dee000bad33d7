"""The design space of KL terms, audited cell by cell: docs/design_space.md.

    python -m rpg_ref.audit.design_space --write docs/design_space.md    (the page, whole)
    python -m rpg_ref.audit.design_space --check docs/design_space.md    (exit 1 when stale)

A cell is one way to put a KL estimate into a policy-gradient loss:

    estimator  k1, k2, k3 of r = pi_ref / pi (Schulman's, each estimating KL(pi || pi_ref))
    place      loss:   beta k(pi_theta, pi_ref), differentiated
               reward: beta k(pi_old, pi_ref), a constant subtracted from the reward
    weighted   loss:   the estimate times w = pi_theta / pi_old (differentiable) or not
               reward: the policy term -w A (importance-weighted) or -A log pi_theta (not)
    level      token:    per token; in the reward, A_t = R - beta sum_{s>=t} k_s (return to go)
               sequence: k and w of the whole response's log-ratios, A = R - beta k

Each cell is audited (rpg_ref.audit.run.audit: exact expected gradients on small autoregressive
policies, V = 3, H = 1, 2, 3) in the four settings theta = / != theta_old x pi_ref = / != pi_old.
The library table maps a library's setting to its cell; tests/test_design_space.py checks that the
library code audited here (rpg-ref's losses, the twins) gets its cell's verdict.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from rpg_ref.audit.adapter import BETA, Adapter
from rpg_ref.audit.adapters.common import token_sum_mean
from rpg_ref.audit.core import SETTINGS, ZERO_NORM, Setting
from rpg_ref.audit.report import kl_cell
from rpg_ref.audit.run import audit

ESTIMATORS = ("k1", "k2", "k3")
PLACES = ("loss", "reward")
LEVELS = ("token", "sequence")
HORIZONS = (1, 2, 3)


def estimate(est: str, logp: Tensor, ref: Tensor) -> Tensor:
    """k(r), r = pi_ref / pi, x ~ pi: k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r."""
    lr = ref - logp
    if est == "k1":
        return -lr
    return 0.5 * lr * lr if est == "k2" else torch.expm1(lr) - lr


@dataclass(frozen=True)
class Cell:
    estimator: str
    place: str
    weighted: bool
    level: str

    @property
    def name(self) -> str:
        w = "w" if self.weighted else "no w"
        return f"{self.estimator} in the {self.place}, {w}, {self.level}"

    def formula(self) -> str:
        """The cell's loss, in the page's notation (R: the reward; sums over tokens t)."""
        k, seq = self.estimator, self.level == "sequence"
        if self.place == "loss":
            kl = (f"{'W·' if self.weighted else ''}{k}(Σt log r_t)" if seq
                  else f"Σt {'w_t·' if self.weighted else ''}{k}(r_t)")
            return f"−{'W' if seq else 'Σt w_t'}·R + β·{kl}"
        adv = f"R − β·{k}(Σt log r̄_t)" if seq else "A_t = R − β·Σ_{s≥t} " + f"{k}(r̄_s)"
        if seq:
            return f"−{'W' if self.weighted else 'log π(y)'}·({adv})"
        return f"−Σt {'w_t' if self.weighted else 'log π_t'}·A_t, {adv}"

    def adapter(self) -> Adapter:
        est, place, weighted, seq = (self.estimator, self.place, self.weighted,
                                     self.level == "sequence")

        def loss(logp, old, ref, adv, mask):
            if seq:                            # one log-ratio per response: sums over its tokens
                logp, old, ref = ((t * mask).sum(1, keepdim=True) for t in (logp, old, ref))
                mask = mask[:, :1]
            w = torch.exp(logp - old)
            if place == "loss":
                k = estimate(est, logp, ref) * (w if weighted else 1.0)
                return token_sum_mean(-w * adv[:, None] + BETA * k, mask)
            k = estimate(est, old, ref) * mask                              # constants
            a_tok = adv[:, None] - BETA * k.flip(1).cumsum(1).flip(1)       # return to go
            return token_sum_mean(-(w if weighted else logp) * a_tok.detach(), mask)

        return Adapter(self.name, loss, BETA, "design space", False, self.level, self.formula())


CELLS = tuple(Cell(e, p, wt, lv) for p in PLACES for lv in LEVELS for wt in (False, True)
              for e in ESTIMATORS)
CELL = {c.name: c for c in CELLS}

# (library, setting, cell, (adapter name, level) of the code audited here, or None; source)
_K = ("k1", "k2", "k3")
LIBRARY = (
    ("rpg-ref", "`grpo` (GRPO as published)", "k3 in the loss, no w, token", ("grpo", "token"),
     "own code"),
    ("rpg-ref", "`grpo-corrected`", "k3 in the loss, w, token", ("grpo-corrected", "token"),
     "own code"),
    ("rpg-ref", "`rpg-urkl` (level token)", "k3 in the loss, w, token", ("rpg-urkl", "token"),
     "own code"),
    ("rpg-ref", "`rpg-urkl` (level sequence)", "k3 in the loss, w, sequence",
     ("rpg-urkl", "sequence"), "own code"),
    ("rpg-ref", "`rpg-rkl` (level token)", "k1 in the loss, w, token", ("rpg-rkl", "token"),
     "own code"),
    ("rpg-ref", "`rpg-rkl` (level sequence)", "k1 in the loss, w, sequence",
     ("rpg-rkl", "sequence"), "own code"),
    ("rpg-ref", "`reinforce++` (PPO clip)", "k1 in the reward, w, token",
     ("reinforce++", "token"), "own code"),
    ("TRL", "`GRPOTrainer`, `beta > 0`", "k3 in the loss, no w, token",
     ("TRL GRPO use_bias_correction_kl=False", "token"), "twin"),
    ("TRL", "`use_bias_correction_kl=True`", "k3 in the loss, w, token",
     ("TRL GRPO use_bias_correction_kl=True", "token"), "twin"),
    *(("verl", f"`use_kl_loss=True`, `kl_loss_type={t}`", f"{k} in the loss, no w, token",
       (f"verl kl_loss_type={t}", "token"), "twin")
      for k, t in zip(_K, ("kl", "mse", "low_var_kl"))),
    *(("OpenRLHF", f"`kl_estimator={k}`", f"{k} in the loss, no w, token", None, "docs/audit.md")
      for k in _K),
    ("OpenRLHF", "`unbiased_gradient=True`", "k1 in the loss, w, token", None,
     "docs/audit.md (while w ≤ 10, its clamp)"),
    *(("SkyRL", f"0.4.0, `kl_estimator_type={k}`", f"{k} in the loss, no w, token", None,
       "docs/audit.md (0.3.1: no gradient at all)") for k in _K),
    *(("AReaL", f"`kl_estimator={k}` (in the reward, PPO clip)", f"{k} in the reward, w, token",
       None, "docs/audit.md") for k in _K),
    ("Oat", "`kl_penalty_coef` (PPO clip)", "k1 in the reward, w, token", None, "docs/audit.md"),
    ("Oat", "`beta`", "k3 in the loss, no w, token", None, "docs/audit.md"),
    *(("slime", f"`--use-kl-loss --use-unbiased-kl`, {k}", f"{k} in the loss, w, token",
       (f"slime {k} --use-unbiased-kl (twin)", "token"), "twin") for k in _K),
    ("DeepSeekMath", "GRPO as published", "k3 in the loss, no w, token",
     ("GRPO (published)", "token"), "twin"),
    ("DeepSeek-V3.2", "k3 · π_θ/π_old", "k3 in the loss, w, token",
     ("DeepSeek-V3.2 KL term", "token"), "twin"),
)

# the settings as columns: reference fixed (!= pi_old) first, then = pi_old
COLUMNS = (Setting(True, False), Setting(False, False), Setting(True, True), Setting(False, True))
assert set(COLUMNS) == set(SETTINGS)


def verdict(rows: list[dict]) -> str:
    """One setting's KL-part verdict over the horizons: merged where they agree; "none" with the
    smallest relative error to the closest candidate where no horizon has a verdict."""
    rows = sorted(rows, key=lambda r: r["horizon"])
    found = [bool(r["kl_matches"] or r["kl_combination"]
                  or (r["kl_all_zero"] and r["kl_grad_norm"] < ZERO_NORM))
             for r in rows]
    if not any(found):
        return f"none (error ≥ {min(r['kl_closest_err'] for r in rows):.2g})"
    texts = [kl_cell(r) if ok else "none" for r, ok in zip(rows, found)]
    texts = [t.split(" (same coefficients")[0] for t in texts]
    if len(set(texts)) == 1:
        return texts[0]
    if len(set(texts[1:])) == 1:
        return f"H = 1: {texts[0]}; H ≥ 2: {texts[1]}"
    return "; ".join(f"H = {r['horizon']}: {t}" for r, t in zip(rows, texts))


def verdicts(rows: list[dict]) -> dict[tuple[str, str, Setting], str]:
    """(adapter name, level, setting) -> its verdict."""
    by: dict[tuple[str, str, Setting], list[dict]] = {}
    for r in rows:
        by.setdefault((r["loss"], r["level"], Setting(r["on_policy"], r["ref_is_old"])),
                      []).append(r)
    return {key: verdict(rs) for key, rs in by.items()}


def audit_cells(horizons=HORIZONS) -> dict[tuple[str, Setting], str]:
    """cell name, setting -> the cell's verdict."""
    torch.set_num_threads(1)
    v = verdicts(audit([c.adapter() for c in CELLS], horizons))
    return {(name, s): text for (name, _level, s), text in v.items()}


HEAD = """\
# The design space of KL terms, audited

<!-- generated by `python -m rpg_ref.audit.design_space --write docs/design_space.md`; do not edit:
tests/test_design_space.py fails when this page is stale -->

Where does a KL estimate go in a policy-gradient loss, and which objective does the result follow?
Each row below is one cell — estimator × where it sits × importance weight or not × token or
sequence level — written as a loss of a few lines (`rpg_ref/audit/design_space.py`) and audited
by [rpg-audit](audit.md): its exact expected gradient on small autoregressive policies (vocabulary
3, responses of length H = 1, 2, 3, every response enumerated, float64) is compared with β∇D for
every candidate D. A verdict "D" means the loss's KL part follows E[R] − β·D; "−D": it *raises*
D; "D1 − D2": no single D fits, but this one combination does, with the same coefficients on
many independent draws of the policies; "none (error ≥ e)": no candidate and no combination fits
at any horizon, e being the smallest relative error to the closest candidate; "0 (every D: 0)":
θ = θ_old and π_ref = π_old, where every candidate's gradient vanishes.

Notation: r = π_ref/π per token, r̄ = π_ref/π_old (a constant: the sampler's log-probs), w_t =
π_θ/π_old per token, W = π_θ(y)/π_old(y) for the response; k1 = −log r, k2 = ½ (log r)², k3 = r − 1
− log r (each an estimator of KL(π‖ref) from samples of π). "Σt KL(π‖ref)" is the per-position
sum Σ_t E_{y<t∼π_old} KL(π_θ(·|y<t) ‖ π_ref(·|y<t)); "KL(π‖ref)" without Σt is the divergence of
whole responses; "= Σt" says the two coincide there. The policy term (−w·R) carries no KL and
does not change the verdicts; "β k in the reward" subtracts β·k from the reward and is then
weighted by the policy term.

The reference, three ways: **fixed** (π_ref ≠ π_old: the initial model), **= π_old** (the
paper's choice: the KL to the sampling policy, reset every step), and **iterative** (π_ref reset to
the current policy every K steps): between resets an iterative reference is a fixed one (the
π_ref ≠ π_old columns), at the step of a reset it is π_old (the π_ref = π_old columns). θ = θ_old
is the first gradient step on a batch; θ ≠ θ_old every later one (PPO epochs, mini-batches, stale
samplers).
"""

LIBRARY_HEAD = """\
## Which setting in your library

Each library setting is one cell above; its verdicts are the cell's. "own code" and "twin": the
library's loss runs in the audit here, and `tests/test_design_space.py` checks that it gets its
cell's verdicts (in every setting for a KL term in the loss; on-policy for a KL in the reward,
whose PPO clip changes the off-policy gradient where it binds). "docs/audit.md": the library's own
code, pinned, is audited there (CI's separate environment), with the same verdicts on-policy.
Settings that are no cell of this grid are audited in [audit.md](audit.md): TRL's
`importance_sampling_level="sequence"` (a sequence weight on per-token k3), NeMo-RL's factor
exp(log π − sg(log π)), verl's `k1+`, `k3+` and `abs`, SkyRL 0.3.1 (a KL loss without gradient).
"""


def cell_table(v: dict[tuple[str, Setting], str]) -> list[str]:
    head = ["cell", "loss"] + [f"π_ref {s.ref}, θ {s.theta}" for s in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in CELLS:
        cells = [c.name, f"`{c.formula()}`"] + [v[(c.name, s)] for s in COLUMNS]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return lines


def library_table(v: dict[tuple[str, Setting], str]) -> list[str]:
    head = ["library", "setting", "cell", "checked"] + [
        f"π_ref {s.ref}, θ {s.theta}" for s in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lib, setting, cell, _adapter, source in LIBRARY:
        row = [lib, setting, cell, source] + [v[(cell, s)] for s in COLUMNS]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
    return lines


def summary(v: dict[tuple[str, Setting], str]) -> list[str]:
    """The cells that follow some objective in every setting and at every horizon, read off the
    verdicts ("none" may be one horizon's: "H = 1: ...; H ≥ 2: none")."""
    every = [c.name for c in CELLS if not any("none" in v[(c.name, s)] for s in COLUMNS)]
    off = Setting(False, False)
    return ["## In short\n",
            f"Of the {len(CELLS)} cells, {len(every)} follow an objective in all four settings: "
            + "; ".join(f"**{n}** (off-policy with a fixed reference: {v[(n, off)]})"
                        for n in every) + ". Every other cell follows no objective in at least "
            "one of the settings (its row says which).",
            ""]


def render(v: dict[tuple[str, Setting], str]) -> str:
    parts = [HEAD, *summary(v), "## Every cell\n", *cell_table(v), "", LIBRARY_HEAD,
             *library_table(v), ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rpg_ref.audit.design_space",
                                 description="Write or check docs/design_space.md (the audited "
                                             "design space of KL terms).")
    act = ap.add_mutually_exclusive_group(required=True)
    act.add_argument("--write", metavar="FILE", help="write the page to FILE")
    act.add_argument("--check", metavar="FILE", help="exit 1 when FILE differs from the page")
    args = ap.parse_args(argv)
    path = Path(args.write or args.check)
    if args.write and not path.resolve().parent.is_dir():
        ap.exit(2, f"design_space: error: --write {path}: directory {path.parent} does not "
                   f"exist\n")
    if args.check and not path.is_file():
        ap.exit(2, f"design_space: error: --check {path}: no such file; write it with --write\n")
    page = render(audit_cells())
    if args.write:
        path.write_text(page, encoding="utf-8")
        return 0
    if path.read_text(encoding="utf-8") != page:
        print(f"{path} is stale: python -m rpg_ref.audit.design_space --write {path}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
