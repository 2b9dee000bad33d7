"""A one-screen tour of rpg_ref.core.losses: every loss, its exact expected gradient vs -grad J.

    rpg-demo            (python -m rpg_ref.demo)

For a 6-outcome softmax policy with theta != theta_old and pi_ref != pi_old, each loss's
exact expectation under pi_old (a sum over outcomes, no sampling) is differentiated and
compared with -grad J, J = E_theta[R] - beta D(pi_theta, pi_ref) for the loss's divergence.
The rpg losses match to rounding error; GRPO's published KL term does not.
"""

from __future__ import annotations

import torch

from rpg_ref.core import exact, losses


def main() -> None:
    torch.manual_seed(0)
    dt = torch.float64
    K, beta = 6, 0.5
    theta = torch.randn(K, dtype=dt)
    logp_old = torch.log_softmax(theta + 0.5 * torch.randn(K, dtype=dt), 0)
    logp_ref = torch.log_softmax(theta + 0.7 * torch.randn(K, dtype=dt), 0)
    R = torch.randn(K, dtype=dt)
    print(f"K={K} outcomes, beta={beta}, theta != theta_old, pi_ref != pi_old (float64)\n")
    print(f"{'loss':22s} {'divergence D':26s} {'max |E[grad L] + grad J|':>26s}  label")
    names = {"fkl": "KL(ref||theta)", "rkl": "KL(theta||ref)", "ufkl": "UKL(ref||theta)",
             "urkl": "UKL(theta||ref)"}
    for name in sorted(losses.LOSSES, key=lambda n: (losses.SPECS[n].family, n)):
        spec = losses.SPECS[name]
        # published grpo has no exact divergence; compare it with the one it is meant to estimate
        div = spec.divergence or ("urkl" if name == "grpo" else None)
        if div is None:
            continue                                   # no KL in the loss: nothing to compare
        b = beta
        A = R if spec.family != "baseline" else torch.zeros(K, dtype=dt)   # baselines: KL term only
        want = -exact.objective_grad(div, theta, A, b, logp_ref)
        got = exact.expected_loss_grad(name, theta, logp_old, A, b, ref_logp=logp_ref)
        err = (got - want).abs().max().item()
        print(f"{name:22s} {names[div]:26s} {err:26.2e}  {spec.paper_label}")
    print("\nrpg-* match -grad J exactly; 'grpo' (k3 without the importance weight w) does not,")
    print("'grpo-corrected' (w * k3) does. Run `rpg-train` to train, `pytest` for the proofs.")


if __name__ == "__main__":
    main()
