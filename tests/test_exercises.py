"""Every exercise's solution (docs/learn/exercises/) still does what its chapter says it does: the
expected values are the exercises' derivations (closed forms, hand computations, RESULTS.md's
numbers), not the solutions' output."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rpg_ref.audit.core import SETTINGS, candidate_grads, make_problem
from rpg_ref.audit.design_space import Cell
from rpg_ref.core.exact import objective_grad
from rpg_ref.tasks.bandit import kl_regularized_optimum

EXERCISES = Path(__file__).resolve().parents[1] / "docs" / "learn" / "exercises"
TOL = 1e-10


def solutions(name):
    spec = importlib.util.spec_from_file_location(f"exercises_{name}", EXERCISES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def close(a, b, tol=TOL):
    return float((a - b).abs().max()) <= tol


# --- chapter 1 ---

def softmax_reward_gradient(theta, R):
    """d/dtheta sum_x softmax(theta)_x R_x in closed form: pi_k (R_k - E_pi[R])."""
    pi = torch.softmax(theta, 0)
    return pi * (R - (pi * R).sum())


def test_1_1_score_function_gradient_is_the_gradient_of_the_expected_reward():
    theta, R = t(0.3, -1.0, 0.5, 0.0), t(1.0, 0.0, 2.0, -1.0)
    g_score, g_true = solutions("ch1_policy_gradients").reinforce_estimator_is_the_gradient(
        theta, R)
    assert close(g_score, softmax_reward_gradient(theta, R))
    assert close(g_true, softmax_reward_gradient(theta, R))


def test_1_2_off_policy_the_importance_weight_is_what_makes_it_exact():
    theta, theta_old, R = t(0.3, -1.0, 0.5, 0.0), t(-0.5, 0.4, 0.0, 0.2), t(1.0, 0.0, 2.0, -1.0)
    weighted, unweighted, g_true = solutions("ch1_policy_gradients").importance_weight_needed(
        theta, theta_old, R)
    target = softmax_reward_gradient(theta, R)
    assert close(g_true, target) and close(weighted, target)
    pi, pi_old = torch.softmax(theta, 0), torch.softmax(theta_old, 0)
    assert close(unweighted, pi_old * R - pi * (pi_old * R).sum())  # E_old[R (e_x - pi)]
    assert float((unweighted - target).norm()) > 0.05


# --- chapter 2 ---

def test_2_1_k1_and_k3_are_unbiased_k2_is_not():
    means, kl = solutions("ch2_kl_estimators").estimator_means(t(0.5, 0.5).log(), t(0.8, 0.2).log())
    hand = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)         # KL(q || p) by hand
    assert abs(kl - hand) < TOL
    assert abs(means["k1"] - hand) < TOL and abs(means["k3"] - hand) < TOL
    assert abs(means["k2"] - hand) > 0.01


def test_2_2_k3_estimates_the_unnormalized_kl():
    q, mu = t(0.2, 0.3, 0.5), t(0.5, 0.9, 0.1)                                # mu: mass 1.5
    e_k3, ukl, plain = solutions("ch2_kl_estimators").k3_with_an_unnormalized_reference(q.log(),
                                                                                        mu.log())
    hand = float((q * (q / mu).log()).sum() + mu.sum() - q.sum())
    assert abs(e_k3 - hand) < TOL and abs(ukl - hand) < TOL
    assert abs(hand - plain - 0.5) < TOL                          # off by the mass correction 0.5


# --- chapter 3 ---

REF, R, BETA = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.0, 0.5, 1.0, 0.2]), 0.5


def test_3_1_grpo_k3_reaches_the_forward_kl_optimum_and_w_k3_the_reverse_one():
    train = solutions("ch3_where_the_kl_sits").train_on_bandit
    reverse = REF * np.exp(R / BETA) / (REF * np.exp(R / BETA)).sum()      # closed form
    forward = kl_regularized_optimum(REF, R, BETA, "fkl")
    stationarity = R + BETA * REF / forward                               # equal in every arm
    assert np.ptp(stationarity) < 1e-9
    assert np.abs(train("grpo-corrected", REF, R, BETA) - reverse).max() < 1e-6
    p = train("grpo", REF, R, BETA)
    assert np.abs(p - forward).max() < 1e-6
    assert np.abs(p - reverse).max() > 0.01


def test_3_2_k1_as_a_loss_has_no_expected_gradient_on_policy():
    assert solutions("ch3_where_the_kl_sits").k1_loss_gradient_on_policy() < 1e-12


def test_3_3_k2_as_a_loss_is_k1_in_the_reward_without_return_to_go():
    ch3 = solutions("ch3_where_the_kl_sits")
    k2_loss, k1_per_token, k1_return_to_go = ch3.k2_loss_vs_k1_reward()
    assert close(k2_loss, k1_per_token) and float(k2_loss.norm()) > 0.01
    assert float((k1_return_to_go - k2_loss).norm()) > 1e-3     # another vector at two tokens
    # the targets from the KL's definition: beta grad sum_t KL(pi || ref) per position, and
    # beta grad KL(pi || ref) of whole responses (the audit's candidates, not the losses)
    on_policy_fixed_ref = next(s for s in SETTINGS if s.on_policy and not s.ref_is_old)
    cands = candidate_grads(make_problem(on_policy_fixed_ref, 2, 0))
    beta = Cell("k2", "loss", False, "token").adapter().beta
    assert close(k2_loss.reshape(-1), beta * cands["tok-rkl"])
    assert close(k1_return_to_go.reshape(-1), beta * cands["seq-rkl"])


# --- chapter 4 ---

def test_4_1_reinforce_style_and_fully_differentiable_have_one_gradient_per_sample():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.1
    old = logp + 0.3 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    beta, w, log_w = 0.3, (logp - old).exp(), logp - old
    c_kl = {"fkl": beta * torch.ones_like(w), "rkl": -beta * w * (log_w + 1),   # Table 2, Prop. F.*
            "ufkl": -beta * (w - 1), "urkl": -beta * w * log_w}
    for kl in ("fkl", "rkl", "ufkl", "urkl"):
        a, b = solutions("ch4_rpg_losses").per_sample_gradients(logp, old, adv, beta, kl)
        by_hand = -(w * adv[:, None] + c_kl[kl]) / w.numel()      # token-mean of -(w A + C_KL)
        assert close(a, by_hand) and close(b, by_hand), kl


def test_4_2_with_ref_logp_the_loss_follows_the_kl_to_pi_ref():
    theta, theta_old, theta_ref, R = t(0.4, -0.2, 0.1), t(0.0, 0.3, -0.3), t(1.0, -0.5, 0.0), \
        t(1.0, 0.0, 0.5)
    with_ref, without, _, _ = solutions("ch4_rpg_losses").ref_is_not_old(
        theta, theta_old, theta_ref, R, 0.3)
    target_ref = -objective_grad("urkl", theta, R, 0.3, torch.log_softmax(theta_ref, 0))
    target_old = -objective_grad("urkl", theta, R, 0.3, torch.log_softmax(theta_old, 0))
    assert close(with_ref, target_ref) and close(without, target_old)
    assert float((with_ref - without).norm()) > 0.01


# --- chapter 5 ---

def test_5_1_ppo_clip_six_cases():
    got = solutions("ch5_clipping").six_cases()
    flat = {(1.5, 1.0), (0.5, -1.0)}                 # clipped: no gradient
    for (w, A), g in got.items():
        assert g == (0.0 if (w, A) in flat else pytest.approx(-w * A, abs=TOL)), (w, A)


def test_5_2_rpg_style_clip_flows_through_log_pi_not_w():
    grad = solutions("ch5_clipping").rpg_clip_gradient
    # inside the band: d(-SG(w A) log pi)/d log pi = -w A; on a flat segment: 0
    assert grad(0.9, 1.0) == pytest.approx(-0.9, abs=TOL)
    assert grad(1.5, 1.0) == 0.0                      # w >= 1 + eps_high, A > 0
    assert grad(0.5, -1.0) == 0.0                     # w <= 1 - eps_low, A < 0
    assert grad(1.5, -1.0) == pytest.approx(1.5, abs=TOL)   # lo < w < c, A < 0: not clipped
    assert grad(4.0, -1.0) == 0.0                     # w >= c: the dual clip


# --- chapter 6 ---

TH, TH_OLD, TH_MU, RW = t(0.3, -0.2, 0.1), t(0.0, 0.2, -0.1), t(-0.8, 0.9, 0.4), t(1.0, 0.0, 0.5)


def test_6_1_tis_is_exact_until_its_cap_binds():
    ch6 = solutions("ch6_off_policy")
    r_max = float((torch.log_softmax(TH_OLD, 0) - torch.log_softmax(TH_MU, 0)).exp().max())
    unc, tis, capped, _ = ch6.tis_and_its_cap(TH, TH_OLD, TH_MU, RW, 0.3, cap=1.2)
    target = -objective_grad("urkl", TH, RW, 0.3, torch.log_softmax(TH_OLD, 0))
    assert r_max > 1.2
    assert close(tis, target)
    assert float((unc - target).norm()) > 0.01 and float((capped - target).norm()) > 1e-3
    _, _, loose, _ = ch6.tis_and_its_cap(TH, TH_OLD, TH_MU, RW, 0.3, cap=r_max + 1)
    assert close(loose, target)


def test_6_2_coupled_pulls_towards_the_sampler_decoupled_does_not():
    coupled, decoupled = solutions("ch6_off_policy").coupled_vs_decoupled(TH, TH_MU, RW, 0.3)
    assert close(coupled, -objective_grad("urkl", TH, RW, 0.3, torch.log_softmax(TH_MU, 0)))
    assert close(decoupled, -objective_grad("urkl", TH, RW, 0.0, torch.log_softmax(TH, 0)))
    assert float((coupled - decoupled).norm()) > 0.01


# --- chapter 7 (the numbers RESULTS.md prints for study C) ---

def test_7_1_paired_intervals_from_the_rows():
    ch7 = solutions("ch7_experiments")
    mean, lo, hi, n = ch7.paired_difference("urkl-u1", "warm-start")
    assert n == 21 and (round(mean, 3), round(lo, 3), round(hi, 3)) == (0.320, 0.291, 0.349)
    mean, lo, hi, n = ch7.paired_difference("urkl-u16", "warm-start")
    assert n == 21 and (round(mean, 3), round(lo, 3), round(hi, 3)) == (-0.043, -0.106, 0.020)


def test_7_2_the_clip_binds_on_few_tokens_at_4_updates_and_with_a_stale_sampler():
    share = solutions("ch7_experiments").clip_share
    percent = {c: round(100 * share(c), 2) for c in ("urkl-u4", "urkl-lag4-coupled", "urkl-u16")}
    assert percent == {"urkl-u4": 0.36, "urkl-lag4-coupled": 0.65, "urkl-u16": 2.03}


# --- chapter 8 ---

def test_8_1_gpu_hours_by_hand():
    hours = solutions("ch8_scaling_up").gpu_hours(1e9, 1, 1, 1000, 1, gpu_flops=1e15,
                                                  mfu_train=0.5, mfu_generate=0.5)
    assert hours == pytest.approx((2e12 / 5e14 + 10e12 / 5e14) / 3600, rel=1e-12)


def test_8_2_full_vocabulary_logits():
    gib = solutions("ch8_scaling_up").logits_gib(8192, 151936)
    assert gib == pytest.approx(8192 * 151936 * 4 / 1024**3, rel=1e-12)
    assert 4.6 < gib < 4.7
