"""The paper's mathematics: what a loss is and what it optimizes. Imports nothing else of rpg_ref.

    losses              every surrogate loss as the paper writes it, registered under its name
                        (what trains: autograd through the formula); its options resolved once
    divergences         the KL terms, one row each: the per-unit estimate d
    loss_spec           a loss's family, KL term and defaults; the checks of a clip and a beta
    loss_checks         the losses' input checks
    kl                  k1/k2/k3, exact KL and UKL
    advantages          group mean, GRPO's, REINFORCE++
    exact               exact expectations and gradients by enumerating a small outcome space
"""
