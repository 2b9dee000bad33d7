"""The paper's mathematics: what a loss is and what it optimizes. Imports nothing else of rpg_ref.

    losses              every surrogate loss as the paper writes it, registered under its name
    losses_fused        the same losses with closed-form gradients, fused (tested against losses)
    divergences         the KL terms, one row each: estimate and closed-form pieces, read by both
    loss_spec           a loss's family and KL term; its options resolved and checked once
    loss_checks         the input checks both implementations share
    kl                  k1/k2/k3, exact KL and UKL
    advantages          group mean, GRPO's, REINFORCE++
    exact               exact expectations and gradients by enumerating a small outcome space
"""
