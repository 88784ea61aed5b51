"""The softmax weights' moments (sigprop/theory/attention.py) against a Monte Carlo of the
softmax itself."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sigprop import theory


@pytest.mark.parametrize("s2", [0.01, 0.25, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("n", [2, 8, 32, 256])
def test_collision_probability_equals_a_monte_carlo_of_the_softmax(s2, n):
    """E[sum w^2] by 20,000 draws of n logits: the quadrature within 4 standard errors of the
    Monte Carlo plus 1% (the quadrature's own error up to s^2 = 4: 0.7% at n = 2)."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((20000, n)) * math.sqrt(s2)
    w = np.exp(z - z.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    p = (w**2).sum(1)
    mc, se = p.mean(), p.std() / math.sqrt(p.size)
    assert abs(theory.collision(s2, n) - mc) <= 4 * se + 0.01 * mc


def test_collision_limits():
    assert theory.collision(1.0, 1) == 1.0
    assert theory.collision(0.0, 10) == pytest.approx(0.1)
    # many keys: the lognormal law of large numbers, e^{s^2}/n
    assert theory.collision(0.5, 4096) * 4096 == pytest.approx(math.exp(0.5), rel=2e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_mean_overlap_of_two_queries_weights_by_enumeration(causal):
    """C = the mean over ordered pairs t != u of 1/max(n_t, n_u), enumerated."""
    T = 7
    n = [t + 1 if causal else T for t in range(T)]
    want = np.mean([1.0 / max(n[t], n[u]) for t in range(T) for u in range(T) if t != u])
    P, C = theory.attention_weights(0.0, T, causal)
    assert C == pytest.approx(want)
    assert P == pytest.approx(np.mean([1.0 / k for k in n]))


def test_logit_variance_is_the_keys_spread_times_the_queries_moment():
    assert theory.logit_variance(1 / math.sqrt(16), 16, 2.0, 3.0, 1.0) == pytest.approx(4.0)
    assert theory.logit_variance(0.25, 16, 2.0, 1.0, 1.5) == 0.0  # keys all alike
