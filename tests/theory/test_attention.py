"""The softmax weights' moments (sigprop/theory/attention.py) against a Monte Carlo of the
softmax itself."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sigprop import theory


@pytest.mark.parametrize("s2", [0.01, 0.25, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 1024.0])
@pytest.mark.parametrize("n", [2, 8, 32, 256])
def test_collision_probability_equals_a_monte_carlo_of_the_softmax(s2, n):
    """E[sum w^2] by 20,000 draws of n logits: the quadrature within 4 standard errors of the
    Monte Carlo plus 0.2% (the quadratures' own errors: below 2e-5 where they agree, s^2 <= 1;
    the grid's beyond, converged in its step to 1e-6).  The Gauss quadrature alone read 42% low
    at s^2 = 16, n = 2 (0.18.x: the map stopped at s^2 = 2); ``MAX_LOGIT_VARIANCE`` is 1024."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((20000, n)) * math.sqrt(s2)
    w = np.exp(z - z.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    p = (w**2).sum(1)
    mc, se = p.mean(), p.std() / math.sqrt(p.size)
    assert abs(theory.collision(s2, n) - mc) <= 4 * se + 0.002 * mc


@pytest.mark.parametrize("n", [2, 5, 64, 1024])
def test_the_two_quadratures_agree_where_both_hold(n):
    """At the switch (s^2 = 1) and below it the grid and the Gauss quadrature are one function:
    the switch moves no prediction."""
    from sigprop.theory.attention import _collision_grid

    for s2 in (0.25, 0.5, theory.GRID_LOGIT_VARIANCE):
        assert _collision_grid(s2, n) == pytest.approx(theory.collision(s2, n), rel=5e-5)


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


@pytest.mark.parametrize("s2", [0.05, 0.5, 1.0, 2.0, 4.0])
def test_entropy_of_two_keys_equals_the_one_dimensional_integral(s2):
    """Two keys: w = sigmoid(d), d = z1 - z2 ~ N(0, 2 s^2), H = binary entropy of w -- a
    Gauss-Hermite integral of 200 nodes, independent of the Monte Carlo.  Measured within 0.007
    (s^2 = 4); bound 4 standard errors of the 4096-draw mean (0.0052 at s^2 = 4: 0.02)."""
    x, w = np.polynomial.hermite_e.hermegauss(200)
    d = math.sqrt(2 * s2) * x
    p = 1.0 / (1.0 + np.exp(-d))
    h = p * np.logaddexp(0.0, -d) + (1 - p) * np.logaddexp(0.0, d)  # -p ln p - (1 - p) ln(1 - p)
    exact = float((w * h).sum() / w.sum() / math.log(2))
    assert theory.attention.entropy(s2, 2) == pytest.approx(exact, abs=0.02)


@pytest.mark.parametrize("n", [4, 16, 128])
def test_entropy_near_uniform_follows_its_expansion(n):
    """s^2 -> 0: E[H]/ln n = 1 - s^2 (n - 1)/(2 n ln n) + O(s^4) (the second-order expansion of
    ln Z - sum w z about equal logits); at s^2 = 0.01 the O(s^4) term is below 1e-4."""
    s2 = 0.01
    expansion = 1 - s2 * (n - 1) / (2 * n * math.log(n))
    assert theory.attention.entropy(s2, n) == pytest.approx(expansion, abs=3e-4)
    assert theory.attention.entropy(0.0, n) == 1.0
    assert math.isnan(theory.attention.entropy(1.0, 1))


def test_a_causal_masks_entropy_averages_the_queries_that_read_two_keys_or_more():
    s2, T = 0.8, 8
    want = np.mean([theory.attention.entropy(s2, k) for k in range(2, T + 1)])
    assert theory.attention_entropy(s2, T, causal=True) == pytest.approx(want, rel=1e-12)
    assert theory.attention_entropy(s2, T, causal=False) == theory.attention.entropy(s2, T)


def test_a_keys_weight_is_the_collision_less_its_square_at_uniform_weights():
    """``key_weight`` at s^2 = 0: the mean over queries of c (1 - c), c = 1/n_t -- against the
    direct sum over the weights of w^2 (1 - 2 w + sum w^2) for rows of equal weights."""
    for T, causal in ((16, True), (16, False), (5, True)):
        counts = range(1, T + 1) if causal else [T] * T
        direct = np.mean([sum((1 / n) ** 2 * (1 - 2 / n + 1 / n) for _ in range(n)) for n in counts])
        assert theory.key_weight(0.0, T, causal) == pytest.approx(direct, rel=1e-12)
    assert theory.key_weight(0.0, 16, True) / theory.attention_weights(0.0, 16, True)[0] == pytest.approx(
        0.53, abs=0.01
    )
