"""paper_figs: the numbers behind every figure are rpg_ref's (not pixels), and every figure renders.

Expected values come from the paper's algorithms and closed forms written out here, never from
paper_figs itself. Monte-Carlo comparisons use fixed seeds and a Bonferroni-corrected CLT
threshold: each test's false-failure probability is at most ALPHA = 1e-6 under the CLT.
"""

import io
import json
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from paper_figs import (
    FIGURES,
    clip_shapes,
    grad_variance,
    grpo_kl_error,
    kl_estimators,
    render,
    training,
)
from paper_figs.__main__ import main as figs_main
from rpg_ref.core import exact
from rpg_ref.core.losses import get_loss

DT = torch.float64
ALPHA = 1e-6
EDGE = 1e-9          # grid points this close to a clip boundary are not asserted (ties)


def z_star(d: int) -> float:
    """|z| threshold for d simultaneous comparisons with total false-failure rate ALPHA."""
    return NormalDist().inv_cdf(1 - ALPHA / (2 * d))


def batched_grads(name, w, A, *, beta, clip, ref_log_rho=None):
    """d L_i / d log pi(x_i) for all grid points from ONE batched loss call (B = len(w), T = 1):
    a different call path from paper_figs' per-point calls."""
    n = len(w)
    logp = torch.full((n, 1), -1.0, dtype=DT, requires_grad=True)
    old = (-1.0 - torch.log(torch.as_tensor(w, dtype=DT))).view(n, 1)
    ref = (
        None if ref_log_rho is None else (-1.0 - torch.as_tensor(ref_log_rho, dtype=DT)).view(n, 1)
    )
    loss, _ = get_loss(name)(logp, old, torch.full((n,), A, dtype=DT), torch.ones(n, 1, dtype=DT),
                             beta=beta, ref_logp=ref, clip=clip, agg="seq-mean-token-sum")
    (g,) = torch.autograd.grad(loss, logp)
    return (g.view(n) * n).numpy()


def away_from(w, *edges):
    return np.all([np.abs(w - e) > EDGE for e in edges], axis=0)


# ------------------------------------------------------------------------------------------------
# fig:ppo_dualclip_loss_vis
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dualclip():
    return clip_shapes.dualclip_loss_data()


def test_fig_ppo_dualclip_loss_vis(dualclip):
    """fig:ppo_dualclip_loss_vis / alg:offpolicy_rpg_ppo_dualclip with A_hat constant (beta = 0):
    the plotted loss is max(-wA, -clip(w)A) for A >= 0 and min(max(...), -cA) for A < 0; the
    gradient is zero exactly on w > 1+eps_high (A >= 0) and on w < 1-eps_low or w > c (A < 0), and
    -w A (d/d log pi of -wA) elsewhere; the solid/dotted mask is (autograd gradient != 0)."""
    d = dualclip
    w, (el, eh), c = d["w"], d["eps"], d["c"]
    assert d["loss"] == "rpg-rkl" and d["beta"] == 0.0
    assert [p["A"] for p in d["panels"]] == [1.0, -1.0]          # drawn order: A >= 0 first
    for p in d["panels"]:
        A = p["A"]
        clipped = np.clip(w, 1 - el, 1 + eh)
        expect = np.maximum(-w * A, -clipped * A)
        if A < 0:
            expect = np.minimum(expect, -c * A)
        np.testing.assert_allclose(p["loss"], expect, rtol=0, atol=1e-12)
        flat = (w > 1 + eh) if A >= 0 else ((w < 1 - el) | (w > c))
        ok = away_from(w, 1 - el, 1 + eh, c)
        assert np.array_equal(p["has_grad"][ok], ~flat[ok]), (
            f"A={A}: flat segments differ from the algorithm"
        )
        assert flat[ok].any() and (~flat[ok]).any()
        np.testing.assert_allclose(p["grad"][~flat & ok], -w[~flat & ok] * A, rtol=1e-12, atol=0)
        assert np.all(p["grad"][flat & ok] == 0.0)
        g = batched_grads("rpg-rkl", w, A, beta=0.0, clip=(el, eh, c))
        np.testing.assert_allclose(p["grad"], g, rtol=1e-12, atol=1e-15)
        assert np.array_equal(p["has_grad"], g != 0.0)


def test_fig_ppo_dualclip_loss_vis_caption_gradient_via_ahat():
    """fig:ppo_dualclip_loss_vis caption: on the clipped segments no gradient flows through w,
    "though it might flow via A_hat if A_hat depends on theta". With rpg-rkl and beta > 0,
    A_hat = A - beta log w and the clipped loss -clip(w) A_hat has d/d log pi = beta * clip(w)
    (beta * c on the dual segment): non-zero, so no segment is flat."""
    beta = 0.5
    d = clip_shapes.dualclip_loss_data(beta=beta)
    w, (el, eh), c = d["w"], d["eps"], d["c"]
    for p in d["panels"]:
        A = p["A"]
        a_hat = A - beta * np.log(w)
        # the case does not switch on the grid
        assert np.all(np.sign(a_hat) == np.sign(A))
        clipped = np.clip(w, 1 - el, 1 + eh)
        expect = np.maximum(-w * a_hat, -clipped * a_hat)
        if A < 0:
            expect = np.minimum(expect, -c * a_hat)
        np.testing.assert_allclose(p["loss"], expect, rtol=0, atol=1e-12)
        ok = away_from(w, 1 - el, 1 + eh, c)
        if A >= 0:
            seg = (w > 1 + eh) & ok
            np.testing.assert_allclose(p["grad"][seg], beta * (1 + eh), rtol=1e-12)
        else:
            lo, dual = (w < 1 - el) & ok, (w > c) & ok
            np.testing.assert_allclose(p["grad"][lo], beta * (1 - el), rtol=1e-12)
            np.testing.assert_allclose(p["grad"][dual], beta * c, rtol=1e-12)
        assert p["has_grad"].all()


# ------------------------------------------------------------------------------------------------
# fig:offpolicy_rpg_rf_ppo_dualclip_v1
# ------------------------------------------------------------------------------------------------

def rpg_style_expected(w, A, ckl, el, eh, c):
    """Algorithm alg:offpolicy_rpg_rf_ppo_dualclip_v1 with ell = 1: (value, flat mask)."""
    psi = A + ckl / w                                               # A' * ell
    value = np.where(
        psi >= 0,
        np.where(w < 1 + eh, A * w + ckl, A * (1 + eh) + ckl),
        np.where(w <= 1 - el, A * (1 - el) + ckl, np.where(w < c, A * w + ckl, A * c + ckl)),
    )
    flat = np.where(psi >= 0, w >= 1 + eh, (w <= 1 - el) | (w >= c))
    return value, flat


def test_fig_offpolicy_rpg_rf_ppo_dualclip_v1():
    """fig:offpolicy_rpg_rf_ppo_dualclip_v1 in the paper's plotted setting (A_R = +-1, C_KL = +-0.1,
    ell = 1): the plotted values are Algorithm 2's (A_R w + C_KL on gradient segments, A_R w_high +
    C_KL, A_R w_low + C_KL, A_R c + C_KL on the flat ones); gradients vanish exactly on the
    algorithm's SG(ell) segments and equal -(A_R w + C_KL) = d/d log pi of (A_R w + C_KL) *
    (-log pi) elsewhere."""
    d = clip_shapes.rpg_style_clip_data()
    w, (el, eh), c, beta = d["w"], d["eps"], d["c"], d["beta"]
    assert d["loss"] == "rpg-reinforce-urkl" and d["ell"] == 1.0
    assert [(p["A"], p["C_KL"]) for p in d["panels"]] == [(1.0, 0.1), (-1.0, -0.1)]
    for p in d["panels"]:
        A, ckl = p["A"], p["C_KL"]
        value, flat = rpg_style_expected(w, A, ckl, el, eh, c)
        np.testing.assert_allclose(p["loss"], value, rtol=0, atol=1e-12)
        ok = away_from(w, 1 - el, 1 + eh, c)
        assert np.array_equal(p["has_grad"][ok], ~flat[ok])
        np.testing.assert_allclose(p["grad"][~flat & ok], -(A * w + ckl)[~flat & ok], rtol=1e-12)
        g = batched_grads(
            "rpg-reinforce-urkl", w, A, beta=beta, clip=(el, eh, c), ref_log_rho=-ckl / (beta * w)
        )
        np.testing.assert_allclose(p["grad"], g, rtol=1e-12, atol=1e-15)
        assert np.array_equal(p["has_grad"], g != 0.0)


def test_rpg_style_clip_pi_ref_eq_pi_old():
    """Algorithm 2 in the paper's training setting pi_ref = pi_old (rho = w): C_KL = -beta w h(w)
    with h = -1/w (FKL: C_KL = beta, constant), 1 - 1/w (UFKL), log w + 1 (RKL), log w (URKL);
    values and flat segments as in the algorithm."""
    d = clip_shapes.rpg_style_clip_natural_data()
    w, (el, eh), c, b = d["w"], d["eps"], d["c"], d["beta"]
    ckl = {"fkl": b * np.ones_like(w), "ufkl": -b * (w - 1), "rkl": -b * w * (np.log(w) + 1),
           "urkl": -b * w * np.log(w)}
    for p in d["panels"]:
        for div, cur in p["curves"].items():
            value, flat = rpg_style_expected(w, p["A"], ckl[div], el, eh, c)
            np.testing.assert_allclose(cur["loss"], value, rtol=0, atol=1e-12, err_msg=div)
            ok = away_from(w, 1 - el, 1 + eh, c)
            assert np.array_equal(cur["has_grad"][ok], ~flat[ok]), div
            assert np.array_equal(cur["has_grad"], cur["grad"] != 0.0)


# ------------------------------------------------------------------------------------------------
# figures the paper lacks
# ------------------------------------------------------------------------------------------------

def test_grpo_kl_gradient_error_curve():
    """subsec:grpo_main: the plotted error of GRPO's KL term equals an independent exact computation
    with rpg_ref.core.exact (same construction); the corrected w*k3 term is exact at every distance;
    with pi_ref = pi_old the published term's error vanishes at theta_old and grows with
    distance."""
    ds = (0.0, 0.02, 0.1, 0.5, 1.0, 2.0, 4.0)
    d = grpo_kl_error.grpo_kl_error_data(distances=ds)
    for (label, ref_dist), s in zip(grpo_kl_error.SETTINGS, d["settings"].values()):
        # independent: the published term's expected gradient by rpg_ref.core.exact, grad UKL by
        # autograd here
        g = torch.Generator().manual_seed(0)
        th_old = torch.randn(6, generator=g, dtype=DT)
        u = torch.randn(6, generator=g, dtype=DT)
        u = (u - u.mean()) / (u - u.mean()).norm()
        ref = th_old + (0.0 if ref_dist is None else ref_dist) * torch.randn(
            6, generator=g, dtype=DT
        )
        old_lp, ref_lp, zero = (
            torch.log_softmax(th_old, -1),
            torch.log_softmax(ref, -1),
            torch.zeros(6, dtype=DT),
        )
        for i, t in enumerate(ds):
            th = th_old + t * u
            g_pub = exact.expected_loss_grad("grpo", th, old_lp, zero, 1.0, ref_lp)
            th_ = th.clone().requires_grad_(True)
            # UKL(pi_theta || pi_ref) from its definition
            lpt = torch.log_softmax(th_, -1)
            (g_true,) = torch.autograd.grad(
                (lpt.exp() * (lpt - ref_lp)).sum() + (ref_lp.exp() - lpt.exp()).sum(), th_
            )
            if float(g_true.norm()) < 1e-14:
                assert ref_dist is None and t == 0.0 and math.isnan(s["rel_err"][i])
                continue
            rel = float((g_pub - g_true).norm() / g_true.norm())
            assert abs(s["rel_err"][i] - rel) < 1e-10, (label, t, s["rel_err"][i], rel)
            assert s["corrected_rel_err"][i] < 1e-12, (label, t)
    rpg = d["settings"][grpo_kl_error.SETTINGS[0][0]]
    e = rpg["rel_err"][1:]
    assert e[0] < 0.02 and np.all(np.diff(e) > 0), e


def test_grpo_kl_fallback_matches_derivations():
    """The rpg_ref.core.exact fallback of paper_figs reproduces derivations.grpo_kl.error_curve."""
    der = pytest.importorskip("derivations.grpo_kl")
    ds = [0.0, 0.3, 1.5]
    for ref_dist in (None, 0.8):
        a = der.error_curve(distances=ds, ref_dist=ref_dist)
        b = grpo_kl_error._error_curve_exact(ds, ref_dist=ref_dist)
        for ra, rb in zip(a, b):
            for k in ("rel_err", "corrected_rel_err", "kl_theta_old"):
                if ra[k] is None:
                    assert rb[k] is None
                else:
                    assert abs(ra[k] - rb[k]) < 1e-10 * max(1.0, abs(ra[k])), (
                        ref_dist,
                        k,
                        ra[k],
                        rb[k],
                    )


def test_kl_estimators_gaussian_schulman():
    """k1, k3 are unbiased for KL(q||p) = mu^2/2 with q = N(0,1), p = N(mu,1); E[k2] = (mu^2 +
    mu^4/4)/2. The plotted Monte-Carlo means agree with these closed forms within the CLT threshold
    (the standard error of each mean is its sample std / sqrt(n))."""
    d = kl_estimators.gaussian_data(mus=(0.1, 0.5, 1.0, 2.0), n=100_000, seed=3)
    mu = d["mu"]
    exact_mean = {"k1": mu ** 2 / 2, "k2": (mu ** 2 + mu ** 4 / 4) / 2, "k3": mu ** 2 / 2}
    zs = z_star(3 * len(mu))
    for k, m in exact_mean.items():
        z = (d[k]["mean"] - m) / d[k]["sem"]
        assert np.all(np.abs(z) < zs), f"{k}: estimate {d[k]['mean']}, exact {m}, N={d['n']}, z={z}"
    np.testing.assert_allclose(d["kl"], mu ** 2 / 2, rtol=1e-15)
    # k1 = -(mu x - mu^2/2): its sample std is mu * std(x), the same for every mu up to the factor
    np.testing.assert_allclose(d["k1"]["std"] / mu, d["k1"]["std"][0] / mu[0], rtol=1e-12)


def test_kl_estimators_categorical_exact():
    """Categorical, exact enumeration: E_q[k1] = E_q[k3] = KL(q||p) and E_q[k2] = sum q (log p/q)^2
    / 2; standard deviations as sums over outcomes (numpy, float64)."""
    d = kl_estimators.categorical_data(ts=(0.1, 1.0, 3.0), K_=10, seed=0)
    g = torch.Generator().manual_seed(0)
    th_old = torch.randn(10, generator=g, dtype=DT).numpy()
    u = torch.randn(10, generator=g, dtype=DT).numpy()
    u = (u - u.mean()) / np.linalg.norm(u - u.mean())
    lsm = lambda z: z - np.log(np.exp(z - z.max()).sum()) - z.max()
    for i, t in enumerate(d["t"]):
        lq, lp = lsm(th_old), lsm(th_old + t * u)
        q, r = np.exp(lq), lp - lq
        kl = float((q * (lq - lp)).sum())
        vals = {"k1": -r, "k2": r ** 2 / 2, "k3": np.exp(r) - 1 - r}
        assert abs(d["kl"][i] - kl) < 1e-12
        for k, v in vals.items():
            m = (q * v).sum()
            assert abs(d[k]["mean"][i] - m) < 1e-12, (k, t)
            assert abs(d[k]["std"][i] - math.sqrt((q * (v - m) ** 2).sum())) < 1e-12, (k, t)
        assert abs(d["k1"]["mean"][i] - kl) < 1e-12 and abs(d["k3"]["mean"][i] - kl) < 1e-12


def test_grad_variance_normalized_vs_unnormalized():
    """app:normalized_kl: the plotted Monte-Carlo total variance of one sample's gradient agrees
    with the exact variance by enumeration (each outcome's gradient by autograd through theta, one
    loss call per outcome); REINFORCE twins have identical per-sample gradients
    (prop:equiv_rf_fd)."""
    scales, n, beta = (0.0, 0.5, 1.0), 20_000, 0.5
    d = grad_variance.grad_variance_data(scales=scales, n=n, beta=beta)
    zs = z_star(len(scales) * len(grad_variance.LOSS_NAMES))
    for i, s in enumerate(scales):
        th, old_lp, adv = grad_variance.bandit_policy(6, 0, s)
        p_old = old_lp.exp()
        for name in grad_variance.LOSS_NAMES:
            G = []
            for x in range(6):
                th_ = th.clone().requires_grad_(True)
                lp = torch.log_softmax(th_, -1)
                loss, _ = get_loss(name)(lp[x].view(1, 1), old_lp[x].view(1, 1), adv[x].view(1),
                                         torch.ones(1, 1, dtype=DT), beta=beta)
                G.append(torch.autograd.grad(loss, th_)[0])
            G = torch.stack(G)                                                  # [K, K]
            mean = (p_old[:, None] * G).sum(0)
            var = float((p_old * ((G - mean) ** 2).sum(1)).sum())
            z = (d[name]["var"][i] - var) / d[name]["var_se"][i]
            assert abs(z) < zs, (
                f"{name} s={s}: estimate {d[name]['var'][i]}, exact {var}, N={n}, z={z}"
            )
        x = torch.multinomial(
            p_old, 500, replacement=True, generator=torch.Generator().manual_seed(1)
        )
        for div in ("fkl", "ufkl", "rkl", "urkl"):
            a = grad_variance.per_sample_grads(f"rpg-{div}", th, old_lp, adv, x, beta)
            b = grad_variance.per_sample_grads(f"rpg-reinforce-{div}", th, old_lp, adv, x, beta)
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------------------------------
# training logs -> figures and tables
# ------------------------------------------------------------------------------------------------

def write_logs(root, exp, runs, seeds=(0, 1, 2), steps=10, eval_every=5, groups=None, bandit=False):
    """Synthetic logs in small_scale/logs' layout (<exp>.jsonl: the experiment record, then per run
    and seed its summary and metrics rows in rpg_ref/trainer/train.py's format), known values:
    metric(run r, seed s, step t) = 0.01 * t + 0.1 * r + 0.001 * s."""
    spec = {"runs": {r: {"label": r.upper()} for r in runs}, "groups": groups or {}}
    recs = [{"experiment": spec}]
    for ri, run in enumerate(runs):
        for s in seeds:
            rows = []
            for t in range(1, steps + 1):
                v = 0.01 * t + 0.1 * ri + 0.001 * s
                row = {
                    "step": t,
                    "reward": v,
                    "accuracy": v,
                    "entropy": 1 - v,
                    "response_len": 3 + v,
                    "kl_old": v / 10,
                }
                if bandit:
                    row["kl_ref"] = v / 5
                if t % eval_every == 0 or t == steps:
                    row.update(
                        {"eval_expected_reward": v, "eval_p_best": v}
                        if bandit
                        else {"eval_greedy_accuracy": v}
                    )
                rows.append(row)
            summ = {"final": rows[-1]}
            if bandit:
                summ.update(
                    policy=[0.5, 0.5],
                    rewards=[1.0, 0.0],
                    optimum=[0.6, 0.4],
                    tv_distance=0.1 + 0.01 * s,
                    optimum_note="test",
                )
            recs.append({"run": run, "seed": s, "summary": summ})
            recs += [{"run": run, "seed": s, "metrics": r} for r in rows]
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{exp}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    write_logs(root, "seq", ["a", "b"], steps=20)
    write_logs(root, "ablation", ["c1", "c2", "k1", "k2"], steps=20,
               groups={"ablation_clip": ["c1", "c2"], "ablation_kl": ["c1", "k1", "k2"]})
    write_logs(root, "bandit", ["x", "y"], steps=20, bandit=True)
    return root


def test_training_dynamics_and_last_best_table(logs):
    """tab:main_table_4k's shape: Last = value at the final step, Best = max over steps (train
    metrics after a trailing mean of TRAIN_SMOOTH steps); mean and sample std over seeds; the
    curves are the seeds' mean, drawn over each seed's line."""
    d = training.dynamics_data("seq", logs=logs)
    s = d["panels"]["eval_accuracy"]["b"]
    assert s["key"] == "eval_greedy_accuracy" and list(s["step"]) == [5, 10, 15, 20]
    vals = np.array([[0.01 * t + 0.1 + 0.001 * k for t in (5, 10, 15, 20)] for k in range(3)])
    np.testing.assert_allclose(s["values"], vals, rtol=1e-12)
    np.testing.assert_allclose(s["mean"], vals.mean(0), rtol=1e-12)
    np.testing.assert_allclose(s["lo"], vals[0], rtol=1e-12)
    np.testing.assert_allclose(s["hi"], vals[2], rtol=1e-12)
    t = training.last_best_data("seq", logs=logs)
    cell = t["rows"]["b"]["eval_accuracy"]
    assert abs(cell["last"] - 0.301) < 1e-12 and abs(cell["best"] - 0.301) < 1e-12
    assert abs(cell["last_std"] - 0.001) < 1e-12
    # trailing mean of steps 16..20: 0.18 + 0.001 s
    acc = t["rows"]["a"]["accuracy"]
    assert abs(acc["last"] - 0.181) < 1e-12 and abs(acc["best"] - 0.181) < 1e-12
    # linear series: gain = 0.01 * (20 - 5)
    g = training.gain_data("seq", k=5, logs=logs)
    np.testing.assert_allclose(g["rows"]["a"], 0.15, rtol=1e-12)
    with pytest.raises(ValueError, match="need >= 22"):
        training.gain_data("seq", k=11, logs=logs)
    md, tex = training.to_markdown(t), training.to_latex(t)
    assert "| B | **0.301 ± 0.001**" in md and "<u>0.201 ± 0.001</u>" in md
    assert r"\textbf{0.301 $\pm$ 0.001}" in tex and r"\underline{0.201 $\pm$ 0.001}" in tex


def test_training_logs_refuse_inconsistent_or_missing(tmp_path):
    """Seeds logged at different steps, a run without logs, or a missing experiment raise a clear
    error."""
    write_logs(tmp_path, "seq", ["a"], seeds=(0, 1))
    p = tmp_path / "seq.jsonl"
    # seed 1 loses its last step
    p.write_text("".join(p.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(ValueError, match="different steps"):
        training.dynamics_data("seq", logs=tmp_path)
    lines = p.read_text().splitlines(keepends=True)
    spec = json.loads(lines[0])
    spec["experiment"]["runs"]["ghost"] = {}
    p.write_text(json.dumps(spec) + "\n" + "".join(lines[1:]))
    with pytest.raises(FileNotFoundError, match=r"python -m small_scale\.study seq"):
        training.load_experiment("seq", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"python -m small_scale\.study bandit"):
        training.load_experiment("bandit", tmp_path)
    p.write_text(p.read_text() + "{not json\n")
    with pytest.raises(ValueError, match="not a JSON object"):
        training.load_experiment("seq", tmp_path)
    p.write_text(json.dumps({"run": "a", "seed": 0, "rows": []}) + "\n")
    with pytest.raises(ValueError, match="without seed and config/summary/metrics"):
        training.load_experiment("seq", tmp_path)


def test_run_experiments_writes_the_layout_the_figures_read(tmp_path):
    """small_scale/run_experiments.py's writer and paper_figs' reader agree: a log read and written
    back is the same file, byte for byte (runs in the experiment's order, seeds increasing), and a
    run added to it is read back whole."""
    from small_scale import run_experiments

    write_logs(tmp_path / "a", "seq", ["a", "b"], seeds=(0, 1), steps=4)
    log = run_experiments.read_log(tmp_path / "a" / "seq.jsonl")
    for seeds in log["runs"].values():
        for r in seeds.values():
            r["config"] = {"seed": 0}
    run_experiments.write_log(tmp_path / "b.jsonl", log)
    again = run_experiments.read_log(tmp_path / "b.jsonl")
    assert again == log
    run_experiments.write_log(tmp_path / "c.jsonl", again)
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    again["runs"]["b"][2] = {"config": {"seed": 2}, "summary": {"final": {"step": 1}},
                             "metrics": [{"step": 1, "reward": 0.5}]}
    run_experiments.write_log(tmp_path / "d.jsonl", again)
    back = run_experiments.read_log(tmp_path / "d.jsonl")
    assert list(back["runs"]["b"]) == [0, 1, 2] and back["runs"]["b"][2] == again["runs"]["b"][2]
    assert not list(tmp_path.glob("*.tmp*"))
    assert run_experiments.read_log(tmp_path / "none.jsonl")["runs"] == {}


def test_figures_read_a_study_where_there_is_no_legacy_log(logs, tmp_path):
    """An experiment without a legacy log is read from its study (small_scale/studies/<exp>.json
    and small_scale/results/<exp>.jsonl beside the logs folder): the same runs, labels, groups,
    series and summaries give the same tables."""
    legacy = training.read_experiment_log(logs / "ablation.jsonl")
    spec = {"cells": {r: {"label": v["label"]} for r, v in legacy["experiment"]["runs"].items()},
            "groups": legacy["experiment"]["groups"], "common": {}, "seeds": 3,
            "outcomes": {"acc": {"key": "accuracy", "reduce": "last"}}}
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "ablation.json").write_text(json.dumps(spec))
    (tmp_path / "results").mkdir()
    rows = [{"cell": run, "seed": seed, "series": r["metrics"], "summary": r["summary"],
             "outcomes": {"acc": r["metrics"][-1]["accuracy"]}, "cpu_s": 1.0, "wall_s": 1.0,
             "resumed_from_step": 0, "argv": ["python"], "study_sha256": ""}
            for run, seeds in legacy["runs"].items() for seed, r in seeds.items()]
    (tmp_path / "results" / "ablation.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "logs").mkdir()
    a = training.last_best_data("ablation", runs=["c1", "k2"], logs=tmp_path / "logs")
    b = training.last_best_data("ablation", runs=["c1", "k2"], logs=logs)
    assert a == b
    assert render("ablation_kl", tmp_path / "out", tmp_path / "logs")


def test_bandit_table_from_summaries(logs):
    """The bandit table reads the trainer's summaries: TV distance to the analytic optimum per
    seed and the expected reward sum_i p_i R_i of the final and of the optimal policy."""
    t = training.bandit_table_data("bandit", logs)
    np.testing.assert_allclose(t["rows"]["x"]["tv"], [0.10, 0.11, 0.12], rtol=1e-12)
    np.testing.assert_allclose(t["rows"]["x"]["optimum_reward"], 0.6, rtol=1e-15)
    np.testing.assert_allclose(t["rows"]["y"]["expected_reward"], 0.5, rtol=1e-15)


def test_committed_small_scale_logs_load():
    """The logs committed in small_scale/logs (what rpg-figs reads in a fresh clone) are
    complete."""
    if not (training.DEFAULT_LOGS / "seq.jsonl").exists():
        pytest.skip(
            f"no committed logs in {training.DEFAULT_LOGS} (run small_scale/run_experiments.py)"
        )
    for exp in ("bandit", "seq", "ablation"):
        ex = training.load_experiment(exp)
        for run, recs in ex["runs"].items():
            assert len(recs) >= 3, f"{exp}/{run}: {len(recs)} seeds"
    t = training.last_best_data("seq")
    assert len(t["rows"]) == len(training.load_experiment("seq")["spec"]["runs"])
    training.bandit_table_data("bandit")


def test_render_every_figure(logs, tmp_path):
    """Smoke: every registered figure renders (PNG + PDF, tables as .md/.tex) through the CLI."""
    assert figs_main(["--out", str(tmp_path), "--logs", str(logs)]) == 0
    for name in FIGURES:
        assert (tmp_path / f"{name}.png").exists() or name in ("bandit",), name
    for f in (
        "bandit_dynamics",
        "bandit_tv_to_optimum",
        "main_seq",
        "ablation_clip",
        "ablation_kl",
    ):
        assert (tmp_path / f"{f}.png").stat().st_size > 1000 and (tmp_path / f"{f}.pdf").exists()
    for f in (
        "main_table_seq.md",
        "main_table_seq.tex",
        "main_seq_gain.md",
        "ablation_clip_table.md",
        "ablation_kl_gain.md",
        "bandit_table.md",
    ):
        assert (tmp_path / f).read_text().strip()
    with pytest.raises(ValueError, match="unknown figure"):
        render("no-such-figure", tmp_path, logs)
    assert figs_main(["--only", "nope"]) == 2


def test_rpg_figs_says_in_one_line_what_is_missing(tmp_path, monkeypatch, capsys):
    """Without matplotlib, rpg-figs (even --list) stops with the install hint; without a logs
    folder (an installed package has none), with the --logs / --skip-missing-logs hint, before
    anything is written. The default logs folder is paper_figs.training's."""
    import importlib.util

    import paper_figs.__main__ as figs

    assert figs.LOGS == training.DEFAULT_LOGS
    assert figs_main(["--logs", str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --logs CLONE/small_scale/logs, or --skip-missing" in err
    assert not (tmp_path / "out").exists()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert figs_main(["--list"]) == 2
    assert capsys.readouterr().err == "rpg-figs: needs matplotlib: pip install 'rpg-ref[plots]'\n"


# ------------------------------------------------------------------------------------------------
# the paper's results tables (paper_figs/paper_results.json) as bars, and beside the small scale
# ------------------------------------------------------------------------------------------------

def test_paper_tables_registered_are_the_checked_ones():
    """rpg-figs draws exactly the tables the derivation checks cover."""
    from derivations import tables as checks
    from paper_figs import PAPER_TABLES
    assert PAPER_TABLES == checks.RESULTS_TABLES
    assert {f"paper_{t.removeprefix('tab:')}" for t in PAPER_TABLES} <= set(FIGURES)


def test_paper_main_table_8k_bars():
    """tab:main_table_8k as bars: the AIME25 values read off the LaTeX (l.775-785), the strongest
    baseline (DAPO) as the reference lines, and the contradictions of ERRATA E11/E12 flagged on
    exactly the bars they concern; RPG / RPG-REINFORCE / baselines told apart."""
    from paper_figs import results_tables as rt
    d = rt.bars_data("tab:main_table_8k")
    assert d["methods"] == [
        "GRPO",
        "DAPO",
        "RPG-UFKL",
        "RPG-URKL",
        "RPG-REINFORCE-UFKL",
        "RPG-REINFORCE-URKL",
    ]
    assert [d["family"][m] for m in d["methods"]] == ["baseline"] * 2 + ["rpg"] * 2 + [
        "rpg-reinforce"
    ] * 2
    assert d["benchmarks"] == ["AIME24", "AIME25", "AMC23"]
    assert d["bars"]["AIME25"]["Last"] == [0.3354, 0.4469, 0.4698, 0.5261, 0.4833, 0.5073]
    assert d["bars"]["AIME25"]["Best"] == [0.4063, 0.4740, 0.4865, 0.4938, 0.5031, 0.5208]
    assert d["marks"]["AIME25"]["Last"] == [None, None, None, None, "underline", "bold"]
    assert d["baseline_best"]["AIME25"] == {"Last": {"method": "DAPO", "value": 0.4469},
                                            "Best": {"method": "DAPO", "value": 0.4740}}
    got = {
        (c["benchmark"], c["method"], c["metric"], c["kind"], c["line"])
        for c in d["contradictions"]
    }
    assert got == {
        ("AIME25", "RPG-URKL", "Last", "Best < Last", 780),
        ("AIME25", "RPG-URKL", "Best", "Best < Last", 780),
        ("AIME25", "RPG-URKL", "Last", "mark", 780),
        ("AIME25", "RPG-REINFORCE-UFKL", "Last", "mark", 783),
        ("AIME25", "RPG-REINFORCE-URKL", "Last", "mark", 785),
    }
    assert rt.bars_data("tab:main_table_4k")["contradictions"] == []


def test_paired_t_verdicts_and_quantile():
    """The replication verdict is a paired t-test: t quantiles match closed forms (df = 1, 2) and
    the table value for df = 10; verdicts follow the sign and size of t."""
    from paper_figs import results_tables as rt
    p = 0.975
    assert abs(rt.t_quantile(p, 1) - math.tan(math.pi * (p - 0.5))) < 1e-6
    assert abs(rt.t_quantile(p, 2) - (2 * p - 1) / math.sqrt(2 * p * (1 - p))) < 1e-6
    assert abs(rt.t_quantile(p, 10) - 2.2281) < 1e-4
    s = rt.paired([0.1, 0.2, 0.3])                       # t = 0.2 / (0.1 / sqrt 3) = 3.46 < 4.30
    assert abs(s["t"] - 0.2 / (0.1 / math.sqrt(3))) < 1e-9 and s["verdict"] == "not resolved"
    assert rt.paired([0.10, 0.11, 0.12])["verdict"] == "replicates"
    assert rt.paired([-0.10, -0.11, -0.12])["verdict"] == "contradicted"


def test_paper_vs_small_scale_side_by_side(tmp_path):
    """Small-scale columns = mean and sample std over seeds of Last/Best held-out accuracy (the
    synthetic logs' known values), paired by seed against the paper's methods; the claims rows
    evaluate the paper's margin claim on them."""
    from paper_figs import results_tables as rt
    write_logs(tmp_path, "seq", ["dapo", "grpo", "rpg-reinforce-urkl"], steps=20)
    d = rt.side_by_side_data(tmp_path)
    i = d["methods"].index("RPG-REINFORCE-URKL")
    # eval at step 20: 0.2 + 0.1 * 2 + 0.001 * seed
    mean, sd = d["small"]["Last"][i]
    assert abs(mean - 0.401) < 1e-12 and abs(sd - 0.001) < 1e-12
    assert d["small"]["Best"][d["methods"].index("DAPO")][0] == pytest.approx(0.201, abs=1e-12)
    # not run here
    assert d["small"]["Last"][d["methods"].index("REINFORCE++-Baseline")] is None
    assert d["methods"][:4] == ["REINFORCE++-Baseline", "REINFORCE++", "GRPO", "DAPO"]
    margin = d["claims"][0]
    assert margin["stats"][0]["a"] == "RPG-REINFORCE-URKL" and margin["stats"][0]["b"] == "DAPO"
    assert (
        margin["stats"][0]["mean"] == pytest.approx(0.2, abs=1e-12)
        and margin["verdict"] == "replicates"
    )
    assert "+6.15" in margin["paper"]
    md = rt.side_by_side_markdown(d)
    assert "| RPG-REINFORCE-URKL | 0.5708 | 0.5781 | **0.5073** | **0.5208** |" in md
    assert "**0.401 ± 0.001**" in md


def test_results_md_has_the_generated_side_by_side():
    """small_scale/RESULTS.md quotes paper_vs_small_scale.md as generated from the committed
    logs."""
    from paper_figs import results_tables as rt
    if not (training.DEFAULT_LOGS / "seq.jsonl").exists():
        pytest.skip(
            f"no committed logs in {training.DEFAULT_LOGS} (run small_scale/run_experiments.py)"
        )
    results_md = (training.DEFAULT_LOGS.parent / "RESULTS.md").read_text()
    pasted = rt.side_by_side_markdown(rt.side_by_side_data()) in results_md
    assert pasted, (
        "re-paste paper_vs_small_scale.md (rpg-figs --only paper_vs_small_scale) into "
        "small_scale/RESULTS.md"
    )


def test_plot_without_out_dir_shows_inline_and_writes_nothing(tmp_path, monkeypatch):
    """out_dir=None (the notebooks): the figure is displayed once as a palette PNG (small enough to
    commit inside a notebook), nothing is written, and the call returns None (no Out[] value)."""
    ipy = pytest.importorskip("IPython.display", reason="inline figures need the [notebooks] extra")
    from PIL import Image

    shown = []
    monkeypatch.setattr(ipy, "display", shown.append)
    monkeypatch.chdir(tmp_path)
    d = clip_shapes.dualclip_loss_data()
    assert clip_shapes.plot_dualclip_loss(d) is None
    assert list(tmp_path.iterdir()) == []
    assert len(shown) == 1 and shown[0].format == "png"
    img = Image.open(io.BytesIO(shown[0].data))
    assert img.mode == "P" and "Software" not in img.info
    with_files = clip_shapes.plot_dualclip_loss(d, tmp_path)
    assert [p.name for p in with_files] == [
        "ppo_dualclip_loss_vis.png",
        "ppo_dualclip_loss_vis.pdf",
    ]
    assert len(shown) == 1
