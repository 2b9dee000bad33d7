"""Exact tests of rpg_ref.core.losses against the objectives' definitions.

The exact expectation of a loss under pi_old is a finite sum over outcomes weighted by
pi_old's mass; its autograd gradient must equal -grad J(theta), with J computed here
independently from its definition  sum_x pi_theta(x) R(x) - beta * D(pi_theta, pi_ref).
"""

import inspect
import math

import pytest
import torch

import rpg_ref.core.losses as L

pytestmark = pytest.mark.usefixtures("float64_default")

RPG_FD = ["rpg-fkl", "rpg-rkl", "rpg-ufkl", "rpg-urkl"]
RPG_RF = ["rpg-reinforce-fkl", "rpg-reinforce-rkl", "rpg-reinforce-ufkl", "rpg-reinforce-urkl"]
DIV_OF = {n: n.rsplit("-", 1)[1] for n in RPG_FD + RPG_RF}
TOL = 1e-10


def divergence(div, logp_theta, logp_ref):
    """D(pi_theta, pi_ref) written out from the definitions (pi_ref may be unnormalized)."""
    p, r = logp_theta.exp(), logp_ref.exp()
    if div == "fkl":
        return (r * (logp_ref - logp_theta)).sum()
    if div == "rkl":
        return (p * (logp_theta - logp_ref)).sum()
    if div == "ufkl":
        return (r * (logp_ref - logp_theta)).sum() + (p - r).sum()
    if div == "urkl":
        return (p * (logp_theta - logp_ref)).sum() + (r - p).sum()
    raise AssertionError(div)


def objective_grad(div, theta, R, beta, logp_ref):
    th = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(th, 0)
    J = (logp.exp() * R).sum() - beta * divergence(div, logp, logp_ref)
    (g,) = torch.autograd.grad(J, th)
    return g


def expected_loss_grad(name, theta, logp_old, R, beta, ref_logp=None, clip=None, baseline=0.0):
    """grad of sum_x pi_old(x) * L(x): each outcome x is one sample (B=1, T=1)."""
    th = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(th, 0)
    fn = L.get_loss(name)
    total = 0.0
    for x in range(len(theta)):
        loss, _ = fn(logp[x].view(1, 1), logp_old[x].view(1, 1), (R[x] - baseline).view(1),
                     torch.ones(1, 1), beta=beta,
                     ref_logp=None if ref_logp is None else ref_logp[x].view(1, 1), clip=clip)
        total = total + logp_old[x].exp() * loss
    (g,) = torch.autograd.grad(total, th)
    return g


def _policy(seed, K=6, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(K, generator=gen) * scale
    theta_old = theta + 0.5 * torch.randn(K, generator=gen)      # theta != theta_old
    theta_ref = theta + 0.7 * torch.randn(K, generator=gen)
    R = torch.randn(K, generator=gen)
    return theta, torch.log_softmax(theta_old, 0), torch.log_softmax(theta_ref, 0), R


def _assert_close(got, want, what):
    err = (got - want).abs().max().item()
    assert err < TOL, f"{what}: max |got - want| = {err:.3e} > {TOL}\n got  {got}\n want {want}"


@pytest.mark.parametrize("name", RPG_FD + RPG_RF)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_gradient_equivalence_ref_is_old(name, seed):
    """E_old[grad L] = -grad J with pi_ref = pi_old (the paper's tables), theta != theta_old."""
    theta, logp_old, _, R = _policy(seed)
    beta = 0.37
    want = -objective_grad(DIV_OF[name], theta, R, beta, logp_old)
    _assert_close(expected_loss_grad(name, theta, logp_old, R, beta), want, name)


@pytest.mark.parametrize("name", RPG_FD + RPG_RF)
@pytest.mark.parametrize("seed", [3, 4])
def test_exact_gradient_equivalence_ref_differs(name, seed):
    """With pi_ref != pi_old the weights u = pi_ref/pi_old keep E_old[grad L] = -grad J."""
    theta, logp_old, logp_ref, R = _policy(seed)
    beta = 0.8
    want = -objective_grad(DIV_OF[name], theta, R, beta, logp_ref)
    got = expected_loss_grad(name, theta, logp_old, R, beta, ref_logp=logp_ref)
    _assert_close(got, want, name)


@pytest.mark.parametrize("name", RPG_FD + RPG_RF)
def test_exact_gradient_unnormalized_old_measure(name):
    """General pi_old of mass Z_old != 1 (pi_ref = pi_old): sum_x pi_old(x) L(x) = Z_old
    E_~old[L]."""
    theta, logp_old, _, R = _policy(5)
    logp_old = logp_old + math.log(2.5)                     # Z_old = 2.5
    beta = 0.5
    want = -objective_grad(DIV_OF[name], theta, R, beta, logp_old)
    _assert_close(expected_loss_grad(name, theta, logp_old, R, beta), want, name)


@pytest.mark.parametrize("name", RPG_FD + RPG_RF)
def test_baseline_does_not_change_expected_gradient(name):
    """A = R - b gives the same expected gradient as R for a normalized pi_theta."""
    theta, logp_old, logp_ref, R = _policy(6)
    g0 = expected_loss_grad(name, theta, logp_old, R, 0.3, ref_logp=logp_ref)
    g1 = expected_loss_grad(
        name, theta, logp_old, R, 0.3, ref_logp=logp_ref, baseline=0.77
    )
    _assert_close(g1, g0, name)


@pytest.mark.parametrize("name", RPG_FD + RPG_RF)
def test_clipped_exact_at_theta_old(name):
    """At theta = theta_old (w = 1) clipping is inactive: E_old[grad L_clip] = -grad J."""
    theta, _, logp_ref, R = _policy(7)
    logp_old = torch.log_softmax(theta, 0)
    beta = 0.4
    want = -objective_grad(DIV_OF[name], theta, R, beta, logp_ref)
    got = expected_loss_grad(
        name, theta, logp_old, R, beta, ref_logp=logp_ref, clip=(0.2, 0.28, 3.0)
    )
    _assert_close(got, want, name)


def test_sequence_level_exact_gradient():
    """level='sequence': whole-response ratios give -grad J for the sequence-level objective.

    Autoregressive tabular policy, vocabulary 3, length 2 (9 responses, all enumerated).
    """
    V, T = 3, 2
    gen = torch.Generator().manual_seed(11)
    th = torch.randn(1 + V, V, generator=gen)          # row 0: first token; row 1+a: after token a
    th_old = th + 0.4 * torch.randn(1 + V, V, generator=gen)
    R = torch.randn(V * V, generator=gen)
    seqs = [(a, b) for a in range(V) for b in range(V)]

    def tok_logps(table):
        lp = torch.log_softmax(table, 1)
        return torch.stack([torch.stack([lp[0, a], lp[1 + a, b]]) for a, b in seqs])   # [9, 2]

    old = tok_logps(th_old).detach()
    for name in RPG_FD + RPG_RF:
        div = DIV_OF[name]
        t = th.clone().requires_grad_(True)
        lp = tok_logps(t)
        seq_lp = lp.sum(1)
        seq_old = old.sum(1)
        J = (seq_lp.exp() * R).sum() - 0.3 * divergence(div, seq_lp, seq_old)
        (gJ,) = torch.autograd.grad(J, t)
        t2 = th.clone().requires_grad_(True)
        lp2 = tok_logps(t2)
        fn = L.get_loss(name)
        total = 0.0
        for i in range(len(seqs)):
            loss, _ = fn(lp2[i:i + 1], old[i:i + 1], R[i:i + 1], torch.ones(1, T), beta=0.3,
                         level="sequence", agg="seq-mean-token-sum")
            total = total + seq_old[i].exp() * loss
        (gL,) = torch.autograd.grad(total, t2)
        _assert_close(gL, -gJ, name)


def _batch(seed, B=16, T=5):
    """Ragged [B, T] log-probs with ratios to pi_old and pi_ref from about 1/3 to 3."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 2 - 0.05
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]).double()
    old = logp - 1.1 * (2 * torch.rand(B, T, generator=g) - 1)
    ref = logp - 1.1 * (2 * torch.rand(B, T, generator=g) - 1)
    return logp, old, ref, torch.randn(B, generator=g), mask


def _grad(name, logp, *args, **kw):
    x = logp.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(L.get_loss(name)(x, *args, **kw)[0], x)
    return g


@pytest.mark.parametrize("div", ["fkl", "rkl", "ufkl", "urkl"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("ref", ["ref=old", "ref!=old"])
def test_reinforce_weight_is_minus_beta_times_the_kl_terms_derivative(div, level, ref):
    """C_KL = -beta dd/dlog pi_theta sample by sample, not only in expectation: unclipped, the
    REINFORCE-style loss -SG(w A + C_KL) log pi_theta and the fully differentiable loss
    -w A + beta d of the same divergence have the same gradient at every unit (float64)."""
    logp, old, ref_logp, adv, mask = _batch(13)
    kw = dict(beta=0.7, ref_logp=None if ref == "ref=old" else ref_logp, level=level)
    g_rf = _grad(f"rpg-reinforce-{div}", logp, old, adv, mask, **kw)
    g_fd = _grad(f"rpg-{div}", logp, old, adv, mask, **kw)
    _assert_close(g_rf, g_fd, f"{div} {level} {ref}")


def _one_token_rows(name, log_w, **kw):
    """Loss, d loss / d logp and statistics of two one-token rows with log-ratio log_w to pi_old
    (pi_ref = pi_old), advantages 1 and -1."""
    logp = torch.full((2, 1), -1.0, requires_grad=True)
    loss, stats = L.get_loss(name)(logp, logp.detach() - log_w, torch.tensor([1.0, -1.0]),
                                   torch.ones(2, 1), **kw)
    (g,) = torch.autograd.grad(loss, logp)
    return loss.item(), g, stats


@pytest.mark.parametrize("name", sorted(L.LOSSES))
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_beyond_the_clamp_value_and_gradient_are_those_at_the_clamp(name, sign):
    """A log-ratio log w beyond +-LOG_RATIO_CLAMP gives the loss, gradient and statistics of
    log w at the clamp: the weight saturates, nothing overflows, and the gradient is the
    formula's at the clamp (not 0 for the unclipped rpg losses; the PPO-clip baselines are flat
    there)."""
    spec, C = L.SPECS[name], L.LOG_RATIO_CLAMP
    kw = dict(beta=0.3 if spec.has_kl and not spec.kl_in_reward else 0.0)
    at = _one_token_rows(name, sign * C, **kw)
    beyond = _one_token_rows(name, sign * (C + 9.0), **kw)
    assert math.isfinite(at[0]) and beyond[0] == pytest.approx(at[0], rel=1e-12)
    assert torch.allclose(beyond[1], at[1], rtol=1e-12, atol=0)
    assert spec.always_clips or at[1].abs().min() > 0
    for k, v in at[2].items():
        assert beyond[2][k].item() == pytest.approx(v.item(), rel=1e-12), k


# ---------------------------------------------------------------------------
# clipping: which segments are flat (figures fig:ppo_dualclip_loss_vis and
# fig:offpolicy_rpg_rf_ppo_dualclip_v1), checked sample by sample
# ---------------------------------------------------------------------------

EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 3.0
W_GRID = [0.5, 0.79, 0.81, 1.0, 1.27, 1.29, 2.0, 2.99, 3.01, 4.0]


def _grad_wrt_logp(name, w, adv, beta, logp_value=-1.3):
    """d L / d logp for one token with ratio w (pi_ref = pi_old)."""
    logp = torch.tensor([[logp_value]], requires_grad=True)
    old = logp.detach() - math.log(w)
    loss, _ = L.get_loss(name)(logp, old, torch.tensor([adv]), torch.ones(1, 1), beta=beta,
                               clip=(EPS_LOW, EPS_HIGH, C))
    (g,) = torch.autograd.grad(loss, logp)
    return g.item()


@pytest.mark.parametrize("name", RPG_FD)
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_fd_dual_clip_flat_segments(name, adv):
    """alg:offpolicy_rpg_ppo_dualclip with A_hat constant (beta=0): gradient -w A_hat on the solid
    segments of fig:ppo_dualclip_loss_vis and exactly 0 on the dotted ones:
    A_hat >= 0: flat for w > 1+eps_high; A_hat < 0: flat for w < 1-eps_low and w > c."""
    for w in W_GRID:
        flat = (w > 1 + EPS_HIGH) if adv >= 0 else (w < 1 - EPS_LOW or w > C)
        want = 0.0 if flat else -w * adv          # d(-w A)/d logp = -w A
        got = _grad_wrt_logp(name, w, adv, 0.0)
        assert got == 0.0 if flat else abs(got - want) < TOL, f"{name} A={adv} w={w}: grad {got}"


@pytest.mark.parametrize("name", RPG_FD)
def test_fd_dual_clip_gradient_through_a_hat(name):
    """With beta > 0 a clipped segment still carries gradient through A_hat(theta): exactly
    -w_clip * dA_hat/dlogp (checked against a finite difference of A_hat)."""
    beta, adv, w = 0.5, 1.0, 2.0                  # A_hat >= 0 and w > 1+eps_high: clipped at 1.28
    div = DIV_OF[name]
    h = 1e-6

    def a_hat(lw):                                # A - beta d/w, d/w from the definitions (rho = w)
        rho = math.exp(lw)
        g = {"fkl": -lw / rho, "rkl": lw, "ufkl": 1 - (1 + lw) / rho, "urkl": 1 / rho - 1 + lw}[div]
        return adv - beta * g

    lw = math.log(w)
    assert a_hat(lw) >= 0
    da = (a_hat(lw + h) - a_hat(lw - h)) / (2 * h)
    want = -(1 + EPS_HIGH) * da
    got = _grad_wrt_logp(name, w, adv, beta)
    assert abs(got - want) < 1e-7, f"{name}: grad {got} want {want}"


@pytest.mark.parametrize("name", RPG_RF)
@pytest.mark.parametrize("adv", [1.0, -1.0])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_rpg_style_clip_flat_segments(name, adv, beta):
    """alg:offpolicy_rpg_rf_ppo_dualclip_v1: gradient -SG(w A') on the solid segments of
    fig:offpolicy_rpg_rf_ppo_dualclip_v1 and exactly 0 on the dotted ones:
    psi >= 0: flat for w >= 1+eps_high; psi < 0: flat for w <= 1-eps_low and w >= c."""
    div = DIV_OF[name]
    for w in W_GRID:
        lw = math.log(w)
        h = {"fkl": -1 / w, "ufkl": 1 - 1 / w, "rkl": lw + 1, "urkl": lw}[div]
        a_prime = adv - beta * h
        psi_pos = a_prime * 1.3 >= 0              # ell = -logp = 1.3 > 0
        flat = (w >= 1 + EPS_HIGH) if psi_pos else (w <= 1 - EPS_LOW or w >= C)
        want = 0.0 if flat else -w * a_prime
        got = _grad_wrt_logp(name, w, adv, beta)
        assert abs(got - want) < TOL, f"{name} A={adv} w={w}: grad {got} want {want}"


@pytest.mark.parametrize("name", RPG_RF)
def test_rpg_style_clip_values_continuous(name):
    """The loss value is continuous in w at the clip boundaries
    (fig:offpolicy_rpg_rf_ppo_dualclip_v1)."""
    fn = L.get_loss(name)

    def value(w, adv):
        logp = torch.tensor([[-1.3]])
        loss, _ = fn(logp, logp - math.log(w), torch.tensor([adv]), torch.ones(1, 1), beta=0.05,
                     clip=(EPS_LOW, EPS_HIGH, C))
        return loss.item()

    for w0, adv in [(1 + EPS_HIGH, 1.0), (1 - EPS_LOW, -1.0), (C, -1.0)]:
        assert abs(value(w0 * (1 - 1e-9), adv) - value(w0 * (1 + 1e-9), adv)) < 1e-6


# ---------------------------------------------------------------------------
# GRPO's KL term (subsec:grpo_main)
# ---------------------------------------------------------------------------

def _kl_term_grad(name, theta, logp_old, logp_ref):
    """Exact expected gradient of the beta=1 KL term alone (A = 0 removes the PPO term)."""
    return expected_loss_grad(
        name, theta, logp_old, torch.zeros_like(theta), 1.0, ref_logp=logp_ref
    )


def _ukl_grad(theta, logp_ref):
    th = theta.clone().requires_grad_(True)
    lp = torch.log_softmax(th, 0)
    (g,) = torch.autograd.grad(divergence("urkl", lp, logp_ref), th)
    return g


def test_grpo_published_kl_is_biased_off_policy():
    """The published term beta*k3(pi_ref/pi_theta) without w: its expected gradient under
    pi_old differs from grad UKL(pi_theta || pi_ref) when theta != theta_old."""
    theta, logp_old, logp_ref, _ = _policy(8)
    got, want = _kl_term_grad("grpo", theta, logp_old, logp_ref), _ukl_grad(theta, logp_ref)
    rel = ((got - want).norm() / want.norm()).item()
    assert rel > 0.05, f"expected a visible bias, relative error only {rel:.3e}"


def test_grpo_corrected_kl_is_exact():
    """The corrected term beta*w*k3(pi_ref/pi_theta) has expected gradient grad
    UKL(pi_theta||pi_ref)."""
    for seed in (8, 9, 10):
        theta, logp_old, logp_ref, _ = _policy(seed)
        _assert_close(_kl_term_grad("grpo-corrected", theta, logp_old, logp_ref),
                      _ukl_grad(theta, logp_ref), f"grpo-corrected seed {seed}")


# ---------------------------------------------------------------------------
# aggregation, registry, statistics
# ---------------------------------------------------------------------------

def test_aggregation_modes_hand_computed():
    """With w = 1 the PPO term is -A per token; check the three aggregations by hand."""
    A = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    lp = torch.full((2, 3), -0.5)
    expect = {"token-mean": -(1 + 2 + 4 + 5 + 6) / 5,
              "seq-mean-token-mean": -((1 + 2) / 2 + (4 + 5 + 6) / 3) / 2,
              "seq-mean-token-sum": -((1 + 2) + (4 + 5 + 6)) / 2}
    for agg, want in expect.items():
        loss, _ = L.get_loss("dapo")(lp, lp, A, m, agg=agg)
        assert abs(loss.item() - want) < 1e-12, (agg, loss.item(), want)


def test_sequence_level_aggregation_hand_computed():
    """level='sequence' with w = 1: the sequence loss of rpg-rkl (beta=0) is -A_i; it counts
    as the sequence's token-sum."""
    A = torch.tensor([1.0, 3.0])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    lp = torch.full((2, 3), -0.5)
    expect = {"token-mean": -(1 + 3) / 5, "seq-mean-token-mean": -(1 / 2 + 3 / 3) / 2,
              "seq-mean-token-sum": -(1 + 3) / 2}
    for agg, want in expect.items():
        loss, _ = L.get_loss("rpg-rkl")(lp, lp, A, m, level="sequence", agg=agg)
        assert abs(loss.item() - want) < 1e-12, (agg, loss.item(), want)


def test_every_loss_is_registered_under_its_literal_name():
    """grep '"<name>"' rpg_ref/core/losses.py finds the decorator of each loss's definition, and
    the name is a LossSpec built by keyword."""
    source = inspect.getsource(L)
    for name in L.LOSSES:
        assert f'@register_loss("{name}",' in source, name
    with pytest.raises(TypeError):
        L.LossSpec("x", "rpg", "group-mean", "")                    # keywords only


def test_registry_and_get_loss():
    """Every name of the issue is registered; unknown names list the valid ones."""
    expected = set(RPG_FD + RPG_RF + ["grpo", "grpo-corrected", "dapo", "reinforce++",
                                       "reinforce++-baseline"])
    assert expected == set(L.LOSSES)
    with pytest.raises(ValueError, match="rpg-urkl"):
        L.get_loss("rpg-nope")
    assert (
        not L.SPECS["dapo"].has_kl
        and L.SPECS["grpo"].has_kl
        and L.SPECS["reinforce++"].kl_in_reward
    )
    assert L.SPECS["grpo"].divergence is None and L.SPECS["grpo-corrected"].divergence == "urkl"
    for name, fn in L.LOSSES.items():
        assert fn.spec.name == name and L.SPECS[name] is fn.spec
        assert fn.__doc__ and "Returns" in fn.__doc__


def test_kl_statistics_are_unbiased_estimates():
    """stats['kl'] of each rpg loss, averaged exactly over pi_old, equals D(pi_theta, pi_ref);
    stats['kl_old'] equals KL(pi_theta || pi_old)."""
    theta, logp_old, logp_ref, R = _policy(12)
    lp = torch.log_softmax(theta, 0)
    for name in RPG_FD + RPG_RF:
        fn = L.get_loss(name)
        kl, kl_old = 0.0, 0.0
        for x in range(len(theta)):
            _, st = fn(lp[x].view(1, 1), logp_old[x].view(1, 1), R[x].view(1), torch.ones(1, 1),
                       beta=0.1, ref_logp=logp_ref[x].view(1, 1))
            kl += logp_old[x].exp() * st["kl"]
            kl_old += logp_old[x].exp() * st["kl_old"]
        want = divergence(DIV_OF[name], lp, logp_ref)
        assert abs(kl - want).item() < TOL, (name, kl, want)
        assert abs(kl_old - divergence("rkl", lp, logp_old)).item() < TOL


def test_clipped_values_keep_float64_precision():
    """Flat-segment loss values are computed in the input dtype (Python-float bounds in
    torch.where would round w_high = 1.28 to float32)."""
    logp = torch.log(torch.tensor([[0.4]]))
    loss, _ = L.get_loss("rpg-reinforce-fkl")(logp, logp - math.log(1.5), torch.tensor([1.0]),
                                              torch.ones(1, 1), clip=(0.2, 0.28, 3.0))
    assert abs(loss.item() - 1.28 * -math.log(0.4)) < 1e-15


def test_second_derivative_is_autograds_through_the_formula():
    """The gradient is autograd's through the formula, so higher derivatives exist too: the second
    derivative of rpg-rkl (pi_ref = pi_old) is d^2/dlogp^2 (-w A + beta w log w) =
    w (beta (log w + 2) - A)."""
    logp = torch.tensor([[-1.0]], requires_grad=True)
    loss, _ = L.get_loss("rpg-rkl")(logp, torch.tensor([[-1.3]]), torch.tensor([0.7]),
                                    torch.ones(1, 1), beta=0.5)
    (g,) = torch.autograd.grad(loss, logp, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), logp)
    assert abs(h.item() - math.exp(0.3) * (0.5 * 2.3 - 0.7)) < 1e-12
