"""What rpg-audit must find for every built-in adapter, derived by hand (not read off the tool).

Per-sample gradients of the KL parts, x = y_t ~ pi_old(.|h) at prefix h, r = pi_ref/pi_theta,
rho = pi_theta/pi_ref, w = pi_theta/pi_old, all per token unless "sequence":

  rpg-* token       w h(rho) grad log pi  ->  E_old = grad KL_t(.) of the loss's own direction at
                    every prefix h ~ pi_old: sum_t KL(pi||ref) (rkl, urkl) or sum_t KL(ref||pi)
                    (fkl, ufkl)
  rpg-* sequence    the same with whole-response ratios: the sequence divergence itself
  k3(r), no weight  (1 - r) grad log pi   -> on-policy sum_h (pi - pi_ref) grad log pi
                    = grad KL_t(ref||pi); off-policy sum pi_old (1 - r) grad log pi: no candidate
  w k3(r)           w log rho grad log pi -> sum pi log rho grad log pi = grad KL_t(pi||ref),
                    any theta
  k1 = log rho      grad log pi           -> sum pi_old grad log pi = -grad KL_t(pi_old||pi):
                    0 on-policy; off-policy it RAISES the forward KL to pi_old
                    (= "-tok-fkl" when pi_ref = pi_old)
  k2 = (log rho)^2/2  log rho grad log pi -> on-policy grad KL_t(pi||ref); off-policy none
  abs = |log rho|   sign(log rho) grad log pi: none (0 only where rho = 1)
  k1+, k3+          value of k1/k3, gradient of k2: as k2
  reinforce++       -w_t A_t, A_t = -beta sum_{s>=t} log(pi_old/pi_ref)(y_s): on-policy
                    (w = 1, no clip) E[sum_t grad log pi(y_t) sum_{s>=t} log rho_s]
                    = grad KL(pi||ref) of whole responses; off-policy with pi_ref = pi_old the
                    penalty is 0; otherwise clipped and per-token: none

  k * exp(log pi - sg log pi)   (NeMo-RL twin) grad k + k grad log pi:
                    k1 -> (1 + log rho), k3 -> log rho: on-policy sum_t KL(pi||ref);
                    k2 -> (log rho + log^2 rho / 2): none; off-policy none
  k * w, w differentiable  (slime twin; DeepSeek-V3.2 for k3):
                    k1, k3 -> E_old[w log rho grad log pi] = sum_t KL(pi||ref) for every theta;
                    k2 -> none
  k1 in reward, A_t = R - beta k1_t(old) (no future terms): on-policy E[k1_t grad log pi_t]
                    = grad sum_t KL(pi||ref) (= k2 as a loss); off-policy: 0 when
                    pi_ref = pi_old, else none
  no_grad KL (SkyRL 0.3.1): gradient 0 everywhere ("0 (no KL)")
  KL unbiased_gradient (OpenRLHF): w k2 with w = pi/pi_old detached -> w log rho grad log pi:
                    sum_t KL(pi||ref) for every theta (the clamp w <= 10 does not bind at the
                    default steps)
  k3 of (old, ref) in the reward with return-to-go (AReaL): on-policy
                    E[sum_t grad log pi(y_t) sum_{s>=t} k3_s] = grad E_pi[sum k3] with k3 frozen
                    = grad KL(pi||ref) - grad sum_t KL(ref||pi): a COMBINATION
                    (seq-rkl - tok-fkl; at H = 1 tok-fkl ties seq-fkl)
  TRL sequence-level ratio w = exp(mean_t log(pi/pi_old)) times k3, on-policy:
                    grad k3_t + k3_t grad w, grad w = (1/H) sum_s grad log pi_s:
                    (1/H) grad KL(pi||ref) + (1 - 1/H) grad sum_t KL(ref||pi)

At theta = theta_old with pi_ref = pi_old every KL gradient above and every candidate's vanish.
Reward part: whole-response ratios are exact; per-token ratios without clipping are exact on-policy
or at H = 1; PPO clipping binds off-policy (ratios up to e^{+-0.3} at H = 1 here), so PPO-based
losses are exact on-policy only.
"""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "audit.md"
PPO_BASED = (
    "grpo",
    "grpo-corrected",
    "dapo",
    "reinforce++",
    "GRPO (published)",
    "TRL",
    "verl",
    "NeMo-RL",
    "slime",
    "DeepSeek-V3.2",
    "OpenRLHF",
    "SkyRL",
    "AReaL",
    "Oat",
)


def _div(name: str) -> str:
    return "rkl" if name.endswith("rkl") else "fkl"


def kl_primary(name: str, level: str, on: bool, ref_old: bool) -> str | None:
    """The candidate the KL part follows (None: no candidate), outside the all-zero setting."""
    if name.startswith("rpg-"):
        div = name.rsplit("-", 1)[1]
        return f"seq-{div}" if level == "sequence" else f"tok-{_div(div)}"
    if name in ("grpo", "GRPO (published)", "TRL GRPO use_bias_correction_kl=False",
                "verl kl_loss_type=low_var_kl"):
        return "tok-fkl" if on else None
    if name in ("grpo-corrected", "TRL GRPO use_bias_correction_kl=True"):
        return "tok-rkl"
    if name == "dapo":
        return "no-kl"
    if name == "reinforce++":
        return "seq-rkl" if on else ("no-kl" if ref_old else None)
    if name == "verl kl_loss_type=kl":
        return "no-kl" if on else ("-tok-fkl" if ref_old else None)
    if name in ("verl kl_loss_type=mse", "verl kl_loss_type=k1+", "verl kl_loss_type=k3+"):
        return "tok-rkl" if on else None
    if name == "verl kl_loss_type=abs":
        return None
    est = _estimator(name)
    if "unbiased_gradient=True" in name:
        # every estimator: w k2's gradient
        return "tok-rkl"
    if name.startswith(("DeepSeek-V3.2", "slime")) or (
            name.startswith("TRL") and "level=token use_bias_correction_kl=True" in name):
        return None if est == "k2" else "tok-rkl"
    if name.startswith("NeMo-RL"):
        return "tok-rkl" if on and est != "k2" else None
    if name.startswith("SkyRL (skyrl-train)"):
        return "no-kl"  # computed under no_grad
    if name.startswith(("OpenRLHF", "SkyRL (skyrl)")) or (
        name.startswith("TRL") and "=False" in name
    ):
        return {"k1": kl_primary("verl kl_loss_type=kl", level, on, ref_old),
                "k2": "tok-rkl" if on else None, "k3": "tok-fkl" if on else None}[est]
    if name.startswith(("k1 in reward", "AReaL", "Oat kl_penalty")):
        if not on:
            # the KL reward uses pi_old
            return "no-kl" if ref_old else None
        return {
            "k1": "tok-rkl" if name.startswith("k1 in reward") else "seq-rkl",
            "k2": None,
            "k3": None,
        }[est]
    if name == "Oat beta (k3 loss)":
        return "tok-fkl" if on else None
    if name.startswith("TRL GRPO importance_sampling_level=sequence use_bias_correction_kl=True"):
        # see predicted_combination
        return None
    raise KeyError(f"no expectation written for adapter {name!r}")


def _estimator(name: str) -> str:
    """k1 / k2 / k3 named in an adapter's name (k3 where it names none: k3-only code)."""
    for est, words in (("k1", ("k1", "kl_penalty")), ("k2", ("k2",)), ("k3", ("k3",))):
        if any(f"{w} " in name + " " or f"={w}" in name for w in words):
            return est
    return "k3"


def predicted_combination(name: str, on: bool, ref_old: bool, horizon: int) -> dict | None:
    """The combination the fit must find where no single candidate matches (None: none)."""
    if on and not ref_old and name.startswith("AReaL") and _estimator(name) == "k3":
        return {"seq-rkl": 1.0, ("seq-fkl" if horizon == 1 else "tok-fkl"): -1.0}
    if on and not ref_old and horizon >= 2 and name.startswith(
            "TRL GRPO importance_sampling_level=sequence use_bias_correction_kl=True"):
        return {"seq-rkl": 1 / horizon, "tok-fkl": 1 - 1 / horizon}
    return None


ALL_KEYS = sorted(
    [
        f"{s}{k}"
        for s in ("", "-")
        for k in ("seq-rkl", "seq-urkl", "seq-fkl", "seq-ufkl", "tok-rkl", "tok-fkl")
    ]
    + ["no-kl"]
)


def tie_class(key: str, ref_old: bool, horizon: int) -> set[str]:
    """Candidates whose gradients equal key's for normalized policies: UKL = KL always; the
    per-position sum = the sequence divergence at H = 1, and for the forward direction whenever
    pi_ref = pi_old (then prefixes ~ pi_old are prefixes ~ pi_ref)."""
    sign, base = ("-", key[1:]) if key.startswith("-") else ("", key)
    if base == "no-kl":
        return {"no-kl"}
    d = "rkl" if base.endswith("rkl") else "fkl"
    seq = {f"seq-{d}", f"seq-u{d}"}
    tok_joins = horizon == 1 or (d == "fkl" and ref_old)
    cls = (seq | {f"tok-{d}"}) if tok_joins else (seq if base.startswith("seq") else {f"tok-{d}"})
    return {sign + k for k in cls}


def predicted_matches(name: str, level: str, on: bool, ref_old: bool, horizon: int) -> list[str]:
    if on and ref_old:
        return ALL_KEYS
    if (
        name.startswith("TRL GRPO importance_sampling_level=sequence use_bias_correction_kl=True")
        and horizon == 1
    ):
        # one token: the token-level ratio
        return sorted(tie_class("tok-rkl", ref_old, 1))
    if predicted_combination(name, on, ref_old, horizon):
        return []
    key = kl_primary(name, level, on, ref_old)
    return [] if key is None else sorted(tie_class(key, ref_old, horizon))


def predicted_reward_exact(name: str, level: str, on: bool, horizon: int) -> bool:
    if name.startswith(PPO_BASED):
        return on
    return level == "sequence" or on or horizon == 1


def assert_verdicts(rows: list, ad, n_cases: int) -> None:
    """Adapter ``ad``'s rows (one per setting and horizon, ``n_cases`` of them) carry exactly the
    KL candidates and the reward-part exactness derived by hand above."""
    got = [
        r for r in rows if r["loss"] == ad.name and r["code"] == ad.code and r["level"] == ad.level
    ]
    assert len(got) == n_cases, (ad.name, len(got))
    for r in got:
        where = f"{ad.name}: theta=old:{r['on_policy']} ref=old:{r['ref_is_old']} H={r['horizon']}"
        assert r["kl_matches"] == predicted_matches(
            ad.name, ad.level, r["on_policy"], r["ref_is_old"], r["horizon"]
        ), where
        assert r["reward_exact"] == predicted_reward_exact(ad.name, ad.level, r["on_policy"],
                                                           r["horizon"]), where
        want = predicted_combination(ad.name, r["on_policy"], r["ref_is_old"], r["horizon"])
        got_combo = r["kl_combination"] and r["kl_combination"]["terms"]
        if want is None:
            assert not got_combo, (where, got_combo)
        else:
            assert got_combo and set(got_combo) == set(want), (where, got_combo)
            assert all(abs(got_combo[k] - want[k]) < 1e3 * r["tolerance"] + 1e-9 for k in want), (
                where,
                got_combo,
            )


def committed_table() -> str:
    """The generated block of docs/audit.md (between its audit-table markers)."""
    doc = DOC.read_text(encoding="utf-8")
    m = re.search(r"<!-- audit-table:start -->\n(.*?)<!-- audit-table:end -->", doc, re.DOTALL)
    assert m, "docs/audit.md lost its <!-- audit-table:start/end --> markers"
    return m.group(1)


def table_lines(text: str) -> dict[tuple, str]:
    """Markdown table body lines keyed by their first five cells (loss, level, code, theta,
    pi_ref)."""
    lines = [x for x in text.splitlines() if x.startswith("| ") and not x.startswith("| loss |")]
    return {tuple(x.strip("| ").split(" | ")[:5]): x for x in lines}
