"""The layer moments an init gives the theory (``LayerMoments``: what sigprop/plans/ composes, Arpit et
al. 2019, eq. 1-5 generalised) and the finite-width spread of a measured ratio about its
prediction: log-cumulants of a ReLU layer, the Cornish-Fisher band (docs/theory.md §4)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sigprop.theory.tolerances import SPREAD_C_GAUSSIAN, SPREAD_C_ORTHOGONAL_BASE


# --------------------------------------------------------------------------------------------
# Layer moments: what an init tells the theory of one layer (sigprop/plans/ composes the
# steps' maps built on them into a net's prediction, Arpit et al. 2019, eq. 1-5 generalised)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerMoments:
    """Second moments of one layer's parameters, the only thing a layer's energy map needs.

    ``row_sq``: E||w_i||^2 of a row of the effective weight matrix (g_i^2 for WN rows);
    ``bias_var``: E[b_i^2].  Rows are assumed isotropic in direction (or orthogonal).
    """

    row_sq: float
    bias_var: float = 0.0


# --------------------------------------------------------------------------------------------
# Finite-width spread (docs/theory.md, "finite-width spread")
# --------------------------------------------------------------------------------------------
def spread_c(n_out: int, n_other: int, orthogonal: bool) -> float:
    """The constant c of one ReLU layer's relative power fluctuation c/n_out (the Sum 1/n law
    of Hanin & Rolnick, Arpit et al. 2019 ref. [10]; docs/theory.md §4): 5 for isotropic i.i.d.
    rows, 3 + 2 (1 - n_out/n_other)^+ for orthogonal rows (n_other: the other side's width)."""
    if not orthogonal:
        return SPREAD_C_GAUSSIAN
    return SPREAD_C_ORTHOGONAL_BASE + 2.0 * max(0.0, 1.0 - n_out / n_other)


def relu_layer_log_cumulants(n: int, m: int, orthogonal: bool) -> tuple[float, float, float]:
    """Exact first three cumulants of X = ln(ratio step) - ln(RMS step) for one WN ReLU layer
    with n units and fan-in m: X = (1/2) [ln f - ln E f], f = ||ReLU(a)||^2 / ||h||^2 (any
    constant gain cancels).  docs/theory.md §4, "exact per-layer cumulants".

    Orthogonal directions (Haar): for a fixed unit input the pre-activation direction is uniform
    on the sphere of R^n, so with K ~ Bin(n, 1/2) positive units, the positive share of ||a||^2
    is S ~ Beta(K/2, (n-K)/2); when n < m the rows are orthonormal and ||a||^2 = ||W u||^2 ~
    Beta(n/2, (m-n)/2) (independent of S); when n >= m the map is an isometry.
    Gaussian (or uniform) rows, m large: f is proportional to a chi-square with K degrees.
    Cumulants of ln Beta(a, b) and ln chi^2_k are polygamma differences; the mixture over K is
    exact.  K = 0 (every unit dead, probability 2^-n) is left out: the walker counts it.
    """
    return _relu_layer_log_cumulants(int(n), int(m), bool(orthogonal))


#: Bernoulli numbers B_2, B_4, ..., B_14 for the asymptotic series of the polygamma functions.
_BERNOULLI_EVEN = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6)


def polygamma(m: int, x) -> np.ndarray:
    """psi^(m)(x) for m = 0, 1, 2, ... and x > 0, in plain numpy (scipy.special costs ~0.2 s of
    import per run, more than all the statistics of a 300-layer probe; tests/theory/test_theory.py
    checks this against scipy.special.polygamma to 1e-13 relative).

    Recurrence psi^(m)(x) = psi^(m)(x + 1) - (-1)^m m! / x^(m+1) until x >= 12, then the
    asymptotic series (Abramowitz & Stegun 6.3.18, 6.4.11):
    psi(x) ~ ln x - 1/(2x) - sum_j B_2j / (2j x^2j);
    psi^(m)(x) ~ (-1)^(m+1) [(m-1)!/x^m + m!/(2 x^(m+1)) + sum_j B_2j (2j+m-1)! / ((2j)! x^(2j+m))],
    j = 1..7; the first omitted term is below 1e-17 relative at x = 12.
    """
    x = np.array(x, dtype=np.float64, ndmin=1)
    acc = np.zeros_like(x)
    step = (-1.0) ** m * math.factorial(m)
    while True:
        small = x < 12.0
        if not small.any():
            break
        acc[small] -= step / x[small] ** (m + 1)
        x = np.where(small, x + 1.0, x)
    if m == 0:
        series = np.log(x) - 0.5 / x
        for j, b in enumerate(_BERNOULLI_EVEN, start=1):
            series -= b / (2 * j * x ** (2 * j))
    else:
        series = math.factorial(m - 1) / x**m + math.factorial(m) / (2.0 * x ** (m + 1))
        for j, b in enumerate(_BERNOULLI_EVEN, start=1):
            series += b * math.factorial(2 * j + m - 1) / (math.factorial(2 * j) * x ** (2 * j + m))
        series *= (-1.0) ** (m + 1)
    return acc + series


def log_gamma(x) -> np.ndarray:
    """ln Gamma(x), x > 0, in plain numpy: ln Gamma(x) = ln Gamma(x + 1) - ln x until x >= 12, then
    Stirling's series (x - 1/2) ln x - x + ln(2 pi)/2 + sum_j B_2j / (2j (2j-1) x^(2j-1))
    (Abramowitz & Stegun 6.1.40), j = 1..7."""
    x = np.array(x, dtype=np.float64, ndmin=1)
    acc = np.zeros_like(x)
    while True:
        small = x < 12.0
        if not small.any():
            break
        acc[small] -= np.log(x[small])
        x = np.where(small, x + 1.0, x)
    series = (x - 0.5) * np.log(x) - x + 0.5 * math.log(2.0 * math.pi)
    for j, b in enumerate(_BERNOULLI_EVEN, start=1):
        series += b / (2 * j * (2 * j - 1) * x ** (2 * j - 1))
    return acc + series


def _log_binomial_half(n: int) -> np.ndarray:
    """ln P(K = k), k = 1..n, for K ~ Bin(n, 1/2)."""
    K = np.arange(1, n + 1, dtype=np.float64)
    return log_gamma(n + 1.0)[0] - log_gamma(K + 1.0) - log_gamma(n - K + 1.0) - n * math.log(2.0)


@functools.lru_cache(maxsize=4096)
def _relu_layer_log_cumulants(n: int, m: int, orthogonal: bool) -> tuple[float, float, float]:
    K = np.arange(1, n + 1, dtype=np.float64)
    pk = np.exp(_log_binomial_half(n))  # Bin(n, 1/2)
    pk = pk / pk.sum()
    psi = lambda k, x: polygamma(k, x) if np.ndim(x) else float(polygamma(k, x)[0])
    if orthogonal:
        a, b = K / 2.0, (n - K) / 2.0
        full = b == 0  # K = n: S = 1 exactly
        bb = np.where(full, 1.0, b)
        mu = np.where(full, 0.0, psi(0, a) - psi(0, a + bb))
        var = np.where(full, 0.0, psi(1, a) - psi(1, a + bb))
        k3 = np.where(full, 0.0, psi(2, a) - psi(2, a + bb))
        mean_f = K / n
    else:
        mu = psi(0, K / 2.0) + math.log(2.0)
        var = psi(1, K / 2.0)
        k3 = psi(2, K / 2.0)
        mean_f = K
    mean = float(np.sum(pk * mu))
    d = mu - mean
    v = float(np.sum(pk * (var + d * d)))
    c3 = float(np.sum(pk * (k3 + 3.0 * var * d + d**3)))
    ln_e = math.log(float(np.sum(pk * mean_f)))
    if orthogonal and n < m:  # the norm of a projection onto n of m dimensions
        a, b = n / 2.0, (m - n) / 2.0
        mean += float(psi(0, a) - psi(0, a + b))
        v += float(psi(1, a) - psi(1, a + b))
        c3 += float(psi(2, a) - psi(2, a + b))
        ln_e += math.log(n / m)
    return 0.5 * (mean - ln_e), v / 4.0, c3 / 8.0


def cornish_fisher_band(
    lo_ln: float, hi_ln: float, cumulants: Sequence[float], z: float
) -> tuple[float, float]:
    """[lo + drift + q(-z) sd, hi + drift + q(z) sd] with the Cornish-Fisher quantile
    q(z) = z + (z^2 - 1) g / 6 of a distribution with skewness g = k3 / sd^3: the z-sd band of
    a normal, corrected for the left skew that a sum of ln Beta / ln chi-square factors keeps
    (docs/theory.md §4)."""
    drift, var, k3 = (float(c) for c in cumulants)
    sd = math.sqrt(max(var, 0.0))
    g = k3 / sd**3 if sd > 0 else 0.0
    q = lambda x: x + (x * x - 1.0) * g / 6.0
    return lo_ln + drift + q(-z) * sd, hi_ln + drift + q(z) * sd


def log_band(center_ln: float, variance: float, z: float) -> tuple[float, float]:
    """ln-space band [center - var - z sd, center - var + z sd] for a lognormal ratio whose
    second moment is fixed at exp(2 center): the typical (geometric-mean) value sits var below."""
    sd = math.sqrt(max(variance, 0.0))
    mid = center_ln - variance
    return mid - z * sd, mid + z * sd


def check_reference_ln(widths: Sequence[int]) -> tuple[tuple[float, float], tuple[float, float]]:
    """The norm-preserving references of ``--check`` in ln units, as (lo, hi) hulls.

    Forward at L: between 1 (norm preserved, Theorem 1) and sqrt(n_L/n_0) (per-unit scale
    preserved).  Backward at 1: between 1 (norm preserved, Theorem 2 with g = sqrt 2) and
    sqrt(n_1/n_L) (what any forward-preserving WN init gives).  With equal widths both are 1.
    docs/theory.md, "--check", explains why no init can make both forward and backward exactly 1
    when widths change.
    """
    n0, n1, nL = widths[0], widths[1], widths[-1]
    f = 0.5 * math.log(nL / n0)
    b = 0.5 * math.log(n1 / nL)
    return (min(0.0, f), max(0.0, f)), (min(0.0, b), max(0.0, b))
