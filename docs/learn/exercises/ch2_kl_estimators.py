"""Chapter 2 solutions: k1, k2, k3 in expectation, and the unnormalized KL, exact by enumeration."""

from rpg_ref.core import kl


def estimator_means(logq, logp):
    """Exercise 2.1: E_{x~q}[k_i(p(x)/q(x))] for k1, k2, k3, and KL(q || p)."""
    q, log_ratio = logq.exp(), logp - logq
    means = {name: float((q * f(log_ratio)).sum()) for name, f in
             (("k1", kl.k1), ("k2", kl.k2), ("k3", kl.k3))}
    return means, float(kl.kl(logq, logp))


def k3_with_an_unnormalized_reference(logq, log_mu):
    """Exercise 2.2: E_{x~q}[k3(mu(x)/q(x))] for a measure mu of any mass, against UKL(q || mu) =
    sum q log(q/mu) + sum (mu - q), and against KL(q || mu) (not a KL when mu has mass != 1)."""
    q = logq.exp()
    e_k3 = float((q * kl.k3(log_mu - logq)).sum())
    return e_k3, float(kl.ukl(logq, log_mu)), float((q * (logq - log_mu)).sum())
