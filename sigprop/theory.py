"""Closed-form theory of signal propagation at initialization.  numpy/scipy only: no torch.

Every function cites the paper it implements, author-year:

* Arpit, Campos & Bengio (2019), "How to Initialize your Network? Robust Initialization for
  WeightNorm & ResNets", NeurIPS.  Theorem 1 (eq. 3) / Theorem 5 (eq. 9), Theorem 2 / 6,
  Theorems 3-4 / 7-8 (eq. 6-8, 43-64).
* Salimans & Kingma (2016), "Weight Normalization", NIPS, section 3.
* De & Smith (2020), "Batch Normalization Biases Residual Blocks Towards the Identity Function
  in Deep Networks", NeurIPS, appendices B-C.

The derivations of the per-init predictions and of the finite-width spread model are written
out in ``docs/theory.md``; the functions below are those formulas, nothing more.  No net is
walked here: a net's prediction is the composition of its steps' maps (sigprop/plans.py:
``predict``, ``predict_correlation``), and the closed forms the papers give for whole nets
(Theorems 1-4, the conv energy recursion) are references the composition must equal
(tests/theory/closed_forms.py).
"""

from __future__ import annotations

import cmath
import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sigprop.errors import SigpropError
from sigprop.results import KnRow, ResnetRow, TheoryResult

LN10 = math.log(10.0)

# --------------------------------------------------------------------------------------------
# Tolerances: the one table every comparison of measurement with theory uses (STYLE habit 9).
# --------------------------------------------------------------------------------------------
#: how many finite-width standard deviations a measured value may sit from its prediction
#: before a layer's status mark turns red (docs/theory.md, "finite-width spread").
Z_AGREEMENT = 3.0
#: the same for the ``--check`` gate.  3 sigma of the *per-sample* spread, which bounds the
#: spread of the sample mean across weight draws (docs/theory.md explains why).
Z_CHECK = 3.0
#: per-layer constant c in Var[ln(||h^l||^2/||h^{l-1}||^2)] ~= c / n_l for i.i.d. isotropic rows
#: (Gaussian, He, uniform): 3 from the fourth moment of a half-Gaussian + 2 from the chi-square
#: spread of the row projection (docs/theory.md).
SPREAD_C_GAUSSIAN = 5.0
#: for orthogonal rows the projection spread is reduced to 2*(1 - n_out/n_in)^+ .
SPREAD_C_ORTHOGONAL_BASE = 3.0


# --------------------------------------------------------------------------------------------
# K_n, Theorem 1
# --------------------------------------------------------------------------------------------
def log_gamma_half_ratio(x: float) -> float:
    """ln(Gamma(x + 1/2) / Gamma(x)), accurate for large x.

    A difference of two ``gammaln`` values loses ~eps * x ln x (7e-9 relative at x = 5e6);
    scipy's Pochhammer symbol evaluates the ratio directly.
    """
    from scipy.special import poch  # scipy.special and .integrate cost ~0.5 s of import: only K_n needs them

    return math.log(float(poch(x, 0.5)))


def log_sphere_area_ratio(n: int) -> float:
    """ln(S_{n-1}/S_n), S_n = 2 pi^{n/2}/Gamma(n/2) the area of the unit sphere in R^n."""
    return log_gamma_half_ratio(0.5 * (n - 1)) - 0.5 * math.log(math.pi)


def log_wallis(k: int) -> float:
    """ln W_k, W_k = int_0^{pi/2} sin^k(t) dt = sqrt(pi)/2 * Gamma((k+1)/2) / Gamma(k/2 + 1).

    These are the products of Arpit et al. 2019, eq. 23-28: (2/3)(4/5)...((k-1)/k) for odd k and
    (1/2)(3/4)...((k-1)/k) * pi/2 for even k.
    """
    return 0.5 * math.log(math.pi) - math.log(2.0) - log_gamma_half_ratio(0.5 * (k + 1))


def _check_n(n: int) -> int:
    if int(n) != n or n < 2:
        raise SigpropError(f"K_n needs an integer n >= 2, got {n}", field="n")
    return int(n)


def kn_closed_form(n: int) -> float:
    """K_n of Theorem 1 (Arpit et al. 2019, eq. 3 / appendix eq. 9), closed form in log space.

    Reading used (docs/theory.md, "K_n"): appendix eq. 9 with S_n the area of the unit sphere in
    R^n and the product equal to the Wallis integral W_{n-2} = int_0^{pi/2} sin^{n-2}, i.e. the
    angle density S_{n-1}/S_n sin^{n-2}(theta) of a uniform direction in R^n (eq. 18 prints the
    exponent as n-1, an off-by-one).  Then

        K_n = 2 * S_{n-1}/S_n * W_{n-2}

    computed in log space from ratios of Gamma functions (never the overflowing products
    themselves), accurate to ~1e-15 for n up to 10^7 and beyond.
    """
    n = _check_n(n)
    log_k = math.log(2.0) + log_sphere_area_ratio(n) + log_wallis(n - 2)
    return math.exp(log_k)


def kn_main_text_reading(n: int) -> float:
    """K_n with eq. 3's parity assignment (product W_{n-1}) and S_n taken as the area of the
    n-sphere in R^{n+1}.  Also identically 1 (docs/theory.md shows both)."""
    n = _check_n(n)
    log_k = math.log(2.0) + log_sphere_area_ratio(n + 1) + log_wallis(n - 1)
    return math.exp(log_k)


def kn_mixed_reading(n: int) -> float:
    """The inconsistent reading: eq. 3's product W_{n-1} with S_n the area of the sphere in R^n.

    Gamma(n/2)^2 / (Gamma((n-1)/2) Gamma((n+1)/2)): 2/pi at n = 2, tending to 1 only as n grows.
    Kept to document (docs/theory.md) why the paper's notation is ambiguous.
    """
    n = _check_n(n)
    log_k = math.log(2.0) + log_sphere_area_ratio(n) + log_wallis(n - 1)
    return math.exp(log_k)


def kn_quadrature(n: int) -> float:
    """K_n by numerical integration (scipy.integrate.quad), independent of the Wallis products.

    K_n = m * (2n/m) * E[max(0, cos theta)^2] (Arpit et al. 2019, eq. 13-17, 33) with theta the angle between
    a
    uniform direction in R^n and u, whose density is S_{n-1}/S_n sin^{n-2}(theta).  With
    theta = pi/2 - s/sqrt(n) the integrand is a bump of unit width, which quad resolves for any n:

        K_n = 2 (S_{n-1}/S_n) / sqrt(n) * int_0^{pi sqrt(n)/2} cos(s/sqrt n)^{n-2} n sin(s/sqrt n)^2 ds
    """
    from scipy.integrate import quad  # as poch above: loaded by the one command that integrates

    n = _check_n(n)
    rn = math.sqrt(n)

    def integrand(s: float) -> float:
        t = s / rn
        h = math.sin(0.5 * t)
        if h * h >= 0.5:  # cos(t) <= 0
            return 0.0
        # ln cos t = ln(1 - 2 sin^2(t/2)) keeps full precision for tiny t
        return math.exp((n - 2) * math.log1p(-2.0 * h * h)) * n * math.sin(t) ** 2

    upper = min(math.pi * rn / 2.0, 60.0)  # exp(-s^2/2) s^2 is below 1e-700 beyond s = 60
    val, _err = quad(integrand, 0.0, upper, epsabs=0.0, epsrel=1e-11, limit=500)
    log_pref = math.log(2.0) + log_sphere_area_ratio(n) - 0.5 * math.log(n)
    return math.exp(log_pref) * val


def kn_product_literal(n: int) -> float:
    """K_n with the Wallis product multiplied out factor by factor (eq. 25/28 for k = n-2).

    Only for small n (the factors overflow nothing, but the loop is O(n)); used as a golden
    cross-check of the log-gamma closed form in the tests.
    """
    n = _check_n(n)
    k = n - 2
    prod = math.pi / 2.0 if k % 2 == 0 else 1.0
    for j in range(k, 1, -2):
        prod *= (j - 1) / j
    area_ratio = math.exp(log_sphere_area_ratio(n))
    return 2.0 * area_ratio * prod


# --------------------------------------------------------------------------------------------
# ResNet band, Theorems 3-4 (Arpit et al. 2019, eq. 7-8, proofs eq. 43-64)
# --------------------------------------------------------------------------------------------
RESNET_LOWER = math.sqrt(2.0)
RESNET_UPPER = math.sqrt(math.e)


def resnet_ratio(blocks: int) -> float:
    """(1 + 1/B)^{B/2}: the forward/backward norm ratio of a B-block ResNet with alpha = 1/sqrt(B)
    (Arpit et al. 2019, eq. 53, 63).  Lies in [sqrt 2, sqrt e) for every integer B >= 1."""
    if int(blocks) != blocks or blocks < 1:
        raise SigpropError(f"needs an integer >= 1, got {blocks}", field="blocks")
    b = int(blocks)
    return math.exp(0.5 * b * math.log1p(1.0 / b))


#: ``sigprop theory``'s default n of K_n and blocks B
TABLE_N = (2, 3, 10, 100, 1000, 10**6, 10**7)
TABLE_BLOCKS = (1, 2, 10, 40, 100, 1000)


def table(n=None, blocks=None) -> TheoryResult:
    """``sigprop theory``: K_n of Theorem 1 (closed form beside quadrature) for each n, and the
    ResNet ratio (1 + 1/B)^{B/2} beside the band [sqrt 2, sqrt e] for each B (Arpit et al. 2019,
    eq. 3 / 9 and Theorems 3-4)."""
    return TheoryResult(
        kn=[KnRow(k, kn_closed_form(k), kn_quadrature(k)) for k in (n or TABLE_N)],
        resnet=[
            ResnetRow(b, r, RESNET_LOWER, RESNET_UPPER, in_resnet_band(r))
            for b in (blocks or TABLE_BLOCKS)
            for r in [resnet_ratio(b)]
        ],
    )


def in_resnet_band(ratio: float, rel: float = 1e-12) -> bool:
    """Whether ``ratio`` lies in [sqrt 2, sqrt e], up to floating-point rounding (B = 1 gives
    exactly sqrt 2, which exp/log1p may round one ulp below)."""
    return RESNET_LOWER * (1 - rel) <= ratio <= RESNET_UPPER * (1 + rel)


# --------------------------------------------------------------------------------------------
# Layer moments: what an init tells the theory of one layer (sigprop/plans.py composes the
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


# --------------------------------------------------------------------------------------------
# Residual nets: the closed forms beside the composed prediction (Arpit et al. 2019, eq. 6,
# Theorems 3-4 generalised; docs/theory.md §7) -- the spread per block and the stage band
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResNetPrediction:
    """ln RMS ratios per entry h^0..h^E (forward ||h^b||/||x||, backward
    ||dl/dh^b||/||dl/dh^E||), ln RMS branch ratio per block, and the branch-to-skip power ratios
    forward/backward per block (the input of the spread model).  ``None``: no closed form."""

    ln_forward: list[float] | None
    ln_backward: list[float] | None
    ln_branch: list[float | None] | None
    gain_forward: list[float]
    gain_backward: list[float]


def safe_log(x: float) -> float:
    """ln x, -inf for x <= 0 (a zero energy: an all-dead layer)."""
    return math.log(x) if x > 0 else -math.inf


def logaddexp(a: float, b: float) -> float:
    """ln(e^a + e^b) of two ln energies."""
    return float(np.logaddexp(a, b))


def resnet_step_variance(gain: float, v_branch: float, v_skip: float, dim: int) -> float:
    """Per-sample variance of ln(||h^b||/||h^{b-1}||) added by one block (docs/theory.md §7).

    ||h^b||^2/||h^{b-1}||^2 = (P_S + 2 <S h, alpha F> + P_F)/||h^{b-1}||^2 with branch-to-skip
    power ratio g = P_F/P_S: the cross term has relative variance 4 g/dim (alpha F is a random
    direction in R^dim relative to S h), the branch power fluctuates by v_branch (the MLP law
    sum c_j/n_j of its ReLU layers + 2/d_out of the last), the skip by v_skip; ln of a norm is
    half the ln of its square.  The same form serves the backward pass with the backward g.
    """
    g = max(gain, 0.0)
    return (4.0 * g / dim + g * g * v_branch + v_skip) / (4.0 * (1.0 + g) ** 2)


def branch_variance(widths: Sequence[int], orthogonal: bool) -> float:
    """Relative variance of a branch's output power: sum_j c_j/n_j over its ReLU layers
    (``spread_c``: the MLP law's per-layer constants) plus 2/d_out for the last, linear layer."""
    v = sum(spread_c(widths[j], widths[j - 1], orthogonal) / widths[j] for j in range(1, len(widths) - 1))
    return v + 2.0 / widths[-1]


def stage_band_ln(d_in: int, d_out: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """``--check`` band of one stage in ln units, forward and backward (docs/theory.md §7).

    Theorems 3-4 put both stage ratios in [sqrt 2, sqrt e].  A stage that opens with a projection
    d_in -> d_out cannot preserve both the forward and the backward norm (the MLP's argument,
    §4): the proposed init preserves the forward norm and scales the backward one by
    sqrt(d_in/d_out); preserving the per-unit scale does the converse.  As for the MLP, the band
    is the hull of the two: forward [sqrt 2, sqrt e sqrt(d_out/d_in)], backward
    [sqrt 2 sqrt(d_in/d_out), sqrt e].  Equal widths: exactly [sqrt 2, sqrt e].
    """
    lo, hi = math.log(RESNET_LOWER), math.log(RESNET_UPPER)
    r = 0.5 * math.log(d_out / d_in)
    return (lo + min(r, 0.0), hi + max(r, 0.0)), (lo + min(-r, 0.0), hi + max(-r, 0.0))


# --------------------------------------------------------------------------------------------
# The batch-normalized ReLU ResNet of De & Smith 2020, appendix C
# --------------------------------------------------------------------------------------------
BN_EPS = 1e-5  # torch.nn.BatchNorm1d's default


def bn_statistics_prediction(l: int, batch: int) -> tuple[float, float, float]:
    """(skip variance, mean moving variance, mean squared moving mean) of x^l (De & Smith 2020, appendix C).

    For l >= 1, Cov(X^l_ij, X^l_lm) ~= l delta_il (1 + (pi - 1) delta_jm)/pi, so the variance over
    channels and examples is l, E[mu_c^2] = l (1/pi + (pi - 1)/(pi b)) -> l/pi and
    E[sigma_c^2] = l - E[mu_c^2] -> l (1 - 1/pi) (the finite-batch forms are the paper's own
    intermediate expressions).  l = 0 is the raw input x ~ N(0, I): 1, 1 - 1/b, 1/b.
    """
    if l == 0:
        return 1.0, 1.0 - 1.0 / batch, 1.0 / batch
    mean_sq = l * (1.0 / math.pi + (math.pi - 1.0) / (math.pi * batch))
    return float(l), l - mean_sq, mean_sq


def bn_resnet_prediction(dim: int, blocks: int) -> ResNetPrediction:
    """Forward, backward and branch predictions of the BN ResNet x^{l+1} = x^l + W^l BN(x^l)^+
    with stem x^1 = W^0 BN(x^0)^+ and He W (De & Smith 2020, appendix C, mean field: width and batch large).

    Forward: E||x^l||^2 = l d; x^1 is a function of x^0 alone (ratio ~ 1) and each block adds an
    independent branch of power d, so E[||x^l||^2/||x^0||^2] ~= 1 + (l - 1) d/(d - 2).
    Backward: BN's Jacobian is (1/sigma_c)(I - 11^T/b - y y^T/b); W^T (He) doubles E||d||^2, the
    mask halves it, 1/sigma_c^2 = 1/(l (1 - 1/pi)) (the moving variance above), so block l
    multiplies E||d||^2 by 1 + 1/(l (1 - 1/pi)); the stem (sigma = 1) by 1.
    Branch: ||W BN(x^l)^+||^2 ~ d against ||x^l||^2 ~ l d: ratio 1/sqrt(l).
    """
    E = blocks + 2  # entries x^0 .. x^{B+1}
    fwd = [0.0] + [0.5 * math.log(1.0 + (l - 1) * dim / (dim - 2)) if dim > 2 else None for l in range(1, E)]
    if any(v is None for v in fwd):
        fwd = None
    c = 1.0 - 1.0 / math.pi
    bwd = [0.0] * E
    for l in range(E - 2, 0, -1):  # block l maps x^l -> x^{l+1}
        bwd[l] = bwd[l + 1] + 0.5 * math.log1p(1.0 / (l * c))
    bwd[0] = bwd[1]
    branch = [-0.5 * math.log(l) for l in range(1, blocks + 1)]
    g_fwd = [1.0 / l for l in range(1, blocks + 1)]
    g_bwd = [1.0 / (l * c) for l in range(1, blocks + 1)]
    return ResNetPrediction(fwd, bwd, branch, g_fwd, g_bwd)


# --------------------------------------------------------------------------------------------
# Correlation propagation at infinite width (the kernel recursion; docs/theory.md §10)
# --------------------------------------------------------------------------------------------
def relu_cosine_map(rho: float) -> float:
    """The cosine of ReLU(u) and ReLU(u') for jointly Gaussian pre-activations of correlation
    rho: J(rho) / pi with J(rho) = sqrt(1 - rho^2) + (pi - arccos rho) rho, the normalized
    degree-1 arc-cosine kernel (Cho & Saul 2009, eq. 6 with n = 1).  f(1) = 1, f(0) = 1/pi,
    f(-1) = 0; f(rho) > rho for rho < 1: a deep ReLU net maps every pair towards cosine 1."""
    rho = min(1.0, max(-1.0, float(rho)))
    return (math.sqrt(max(0.0, 1.0 - rho * rho)) + (math.pi - math.acos(rho)) * rho) / math.pi


def relu_cosine_maps(rho: np.ndarray) -> np.ndarray:
    """``relu_cosine_map`` elementwise over an array of correlations (clipped to [-1, 1])."""
    rho = np.clip(rho, -1.0, 1.0)
    return (np.sqrt(1.0 - rho * rho) + (np.pi - np.arccos(rho)) * rho) / np.pi


#: fitted (docs/theory.md §10, "Finite-width band"): across weight draws, the sd of
#: ln((1 - c_mean)/(1 - c_pred)) of a deep ReLU MLP grows as K sqrt(sum_i 1/n_i) over the layers
#: so far -- measured 0.5-1.4 x sqrt(l/n) at n = 64, 256, l = 5..60 (24 seeds each), so K = 1.25
CORR_COLLAPSE_K = 1.25


def correlation_collapse_sd(widths: Sequence[int]) -> list[float]:
    """Per entry, the fitted sd of ln(1 - c) across draws: CORR_COLLAPSE_K sqrt(sum 1/n_i) over
    the entries' widths so far."""
    acc, out = 0.0, []
    for n in widths:
        acc += 1.0 / n
        out.append(CORR_COLLAPSE_K * math.sqrt(acc))
    return out


def correlation_depth_scale(c0: float, cosines: Sequence[float]) -> int | None:
    """Layers (or blocks) until 1 - c has fallen by a factor e from 1 - c0; None if it never
    does within ``cosines`` (or c0 = 1).  For ReLU nets 1 - c decays like a power of depth, not
    exponentially (near c = 1, f(c) = c + (2 sqrt 2 / (3 pi)) (1 - c)^{3/2} + ...), so this is
    a count, not a rate."""
    if c0 >= 1.0:
        return None
    target = (1.0 - c0) / math.e
    for i, c in enumerate(cosines, 1):
        if 1.0 - c <= target:
            return i
    return None


# Batch-coupled layers (BN, data-dependent init): a kernel triple (K_aa, K_ab, K_perp) -- the
# per-unit second moment of one input, the cross moment of a pair, and the cross moment of two
# inputs of *different* pairs (the rest of the batch) -- because centring over the batch
# subtracts the batch's mean kernel (docs/theory.md §10, "Batch-coupled layers").
def centred(k: tuple[float, float, float], batch: int) -> tuple[float, float]:
    """Cosines (pair, unrelated) of the per-unit pre-activations after subtracting the batch
    mean and dividing by the batch sd, for a batch of ``batch`` = 2P inputs made of P pairs:
    the mean kernel of a row with the batch is m = (K_aa + K_ab + (batch - 2) K_perp)/batch, and
    centring gives K - m for every entry (diagonal included)."""
    kaa, kab, kp = k
    m = (kaa + kab + (batch - 2) * kp) / batch
    var = kaa - m
    if var <= 0.0:
        return float("nan"), float("nan")
    return (kab - m) / var, (kp - m) / var


def standardized(k: tuple[float, float, float], batch: int, relu: bool) -> tuple[float, float, float]:
    """A linear layer (isotropic random rows: its pre-activation kernel is proportional to the
    input's) standardized per unit over the batch, then a ReLU or not: the output triple per
    unit (unit variance; after a ReLU 1/2 and (1/2) relu_cosine_map of each cosine)."""
    c, cp = centred(k, batch)
    if not relu:
        return 1.0, c, cp
    return 0.5, 0.5 * relu_cosine_map(c), 0.5 * relu_cosine_map(cp)


# --------------------------------------------------------------------------------------------
# Convolutions: the per-position energy map (docs/theory.md §11; issue 18)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvMoments:
    """One conv layer as the theory sees it: c_in -> c_out channels, a k x k kernel, stride,
    zero padding, the row second moment E||w_c||^2 (g^2 for WN rows, over the c_in k^2 entries
    of an output channel's kernel), the bias variance, and how a row's energy sits on the taps:
    ``"isotropic"`` (every tap alike: Gaussian, orthogonal rows of the [c_out, c_in k^2] kernel
    matrix, PyTorch's uniform) or ``"centre"`` (delta-orthogonal, Xiao et al. 2018: all of it on
    the centre tap)."""

    c_in: int
    c_out: int
    kernel: int
    stride: int = 1
    padding: int = 0
    row_sq: float = 1.0
    bias_var: float = 0.0
    taps: str = "isotropic"

    def out_size(self, h: int) -> int:
        return (h + 2 * self.padding - self.kernel) // self.stride + 1


def conv_box(e: np.ndarray, m: ConvMoments) -> np.ndarray:
    """sum over the taps t of e(s q + t - pad), zeros outside the image (isotropic taps), or the
    centre tap alone: [H, W] -> [H', W']."""
    k, s, p = m.kernel, m.stride, m.padding
    ho, wo = m.out_size(e.shape[0]), m.out_size(e.shape[1])
    padded = np.zeros((e.shape[0] + 2 * p, e.shape[1] + 2 * p))  # np.pad's own overhead was most of the cost
    padded[p : p + e.shape[0], p : p + e.shape[1]] = e
    if m.taps == "centre":
        c = (k - 1) // 2
        return padded[c : c + s * (ho - 1) + 1 : s, c : c + s * (wo - 1) + 1 : s].copy()
    out = np.zeros((ho, wo))
    for i in range(k):
        for j in range(k):
            out += padded[i : i + s * (ho - 1) + 1 : s, j : j + s * (wo - 1) + 1 : s]
    return out


def conv_box_adjoint(d: np.ndarray, m: ConvMoments, shape: tuple[int, int]) -> np.ndarray:
    """The transpose of ``conv_box``: scatter d(q) onto the input positions its taps read."""
    k, s, p = m.kernel, m.stride, m.padding
    ho, wo = d.shape
    padded = np.zeros((shape[0] + 2 * p, shape[1] + 2 * p))
    taps = (
        [((k - 1) // 2, (k - 1) // 2)] if m.taps == "centre" else [(i, j) for i in range(k) for j in range(k)]
    )
    for i, j in taps:
        padded[i : i + s * (ho - 1) + 1 : s, j : j + s * (wo - 1) + 1 : s] += d
    return padded[p : p + shape[0], p : p + shape[1]]


def conv_layer_energy(e: np.ndarray, m: ConvMoments, relu: bool) -> np.ndarray:
    """The input-driven part of E sum_c a_{c,q}^2 per output position, from the input's
    E sum_c h_{c,p}^2 = e(p).

    Conditioned on the input, a_{c,q} = w_c . patch_q + b_c with w_c isotropic over its c_in k^2
    entries: E a^2 = row_sq ||patch_q||^2 / (c_in k^2) + beta, and ||patch_q||^2 sums e over
    the k x k window (zero padding reads nothing); summed over c_out channels:
        e'(q) = (c_out row_sq / (c_in k^2)) box(e)(q) + c_out beta
    (the bias term: ``conv_bias_energy``).  With all of the row on the centre tap
    (delta-orthogonal) E a^2 = row_sq ||h_q||^2 / c_in and e'(q) = (c_out row_sq / c_in) e(s q).
    A ReLU halves it (the pre-activation is symmetric)."""
    per_tap = m.c_out * m.row_sq / (m.c_in * (1 if m.taps == "centre" else m.kernel**2))
    out = per_tap * conv_box(e, m)
    return 0.5 * out if relu else out


def conv_bias_energy(m: ConvMoments, relu: bool) -> float:
    """The bias part of e'(q): c_out beta per position (halved by a ReLU)."""
    return (0.5 if relu else 1.0) * m.c_out * m.bias_var


# --------------------------------------------------------------------------------------------
# any elementwise activation (a traced model, sigprop/kinds/module.py; docs/theory.md §13)
# --------------------------------------------------------------------------------------------
#: the quadrature of an activation's moments: Gauss-Legendre on [-T, k] and [k, T] standard
#: deviations, split at the kink k where z = 0 (ReLU, leaky ReLU, ELU, hardtanh's centre), so a
#: piecewise-smooth phi is integrated at full order on each side (plain Gauss-Hermite converges
#: only as a power of the node count across a kink: 5e-3 relative for ReLU's mean at 80 nodes);
#: the Gaussian mass beyond T = 12 sd is 4e-33
QUAD_NODES, QUAD_SPAN = 128, 12.0


@functools.lru_cache(maxsize=None)
def _legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(n)


#: the quadratures' cache: a model's three predictions (as traced, every layer's variance halved
#: and doubled) meet the same activation inputs after every normalisation, and a draw's repeated
#: blocks the same ones; the functions are kept alive by the cache, so their ids are never reused
QUADRATURE_CACHE = 4096


@functools.lru_cache(maxsize=QUADRATURE_CACHE)
def activation_moments(phi, dphi, mean: float, second: float) -> tuple[float, float, float]:
    """For z ~ N(mean, second - mean^2): (E[phi(z)], E[phi(z)^2], E[phi'(z)^2]), the mean-field
    map of an elementwise activation (Poole et al. 2016, eq. 3; for ReLU at mean 0: E[phi^2] =
    q/2, E[phi'^2] = 1/2).  ``phi``, ``dphi``: float64 numpy functions.  Gauss-Legendre in the
    standardised variable on both sides of the kink (``QUAD_NODES``, ``QUAD_SPAN``)."""
    var = max(second - mean * mean, 0.0)
    sd = math.sqrt(var)
    if sd == 0.0:
        x = np.array([mean])
        f, d = phi(x), dphi(x)
        return float(f[0]), float(f[0] ** 2), float(d[0] ** 2)
    kink = min(max(-mean / sd, -QUAD_SPAN), QUAD_SPAN)
    t, w = _legendre(QUAD_NODES)
    xs, ws = [], []
    for lo, hi in ((-QUAD_SPAN, kink), (kink, QUAD_SPAN)):
        if hi > lo:
            xs.append(0.5 * (hi - lo) * t + 0.5 * (hi + lo))
            ws.append(0.5 * (hi - lo) * w)
    xi, wi = np.concatenate(xs), np.concatenate(ws)
    wi = wi * np.exp(-0.5 * xi * xi) / math.sqrt(2.0 * math.pi)
    x = mean + sd * xi
    f, d = phi(x), dphi(x)
    return float(wi @ f), float(wi @ (f * f)), float(wi @ (d * d))


def _split_nodes(kink) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on [-QUAD_SPAN, QUAD_SPAN] split at ``kink`` (an array:
    one row of nodes per kink), the standard normal density not yet applied."""
    k = np.clip(np.asarray(kink, dtype=np.float64), -QUAD_SPAN, QUAD_SPAN)[..., None]
    t, w = _legendre(QUAD_NODES)
    lo_x = 0.5 * (k + QUAD_SPAN) * t + 0.5 * (k - QUAD_SPAN)
    hi_x = 0.5 * (QUAD_SPAN - k) * t + 0.5 * (QUAD_SPAN + k)
    x = np.concatenate([lo_x, hi_x], axis=-1)
    wt = np.concatenate([0.5 * (k + QUAD_SPAN) * w, 0.5 * (QUAD_SPAN - k) * w], axis=-1)
    return x, wt


@functools.lru_cache(maxsize=QUADRATURE_CACHE)
def shared_moments(phi, dphi, mean: float, second: float, shared: float, pool: int = 1):
    """The mean-field moments of y = phi(max of ``pool`` pre-activations) of one unit, where the
    pre-activations z_j = mu + eps_j share the unit's offset mu ~ N(mean, shared - mean^2) (what
    the unit's weights make common to every sample and position: ``shared`` = E[z(a) z(b)] for
    two different samples or positions) and have independent fluctuations eps_j ~ N(0, second -
    shared).  Returns (E[y], E[y^2], E[y(a) y(b)] -- two independent draws of the fluctuations,
    the same mu --, E[phi'(z*)^2] at the maximising z*) with E[phi'(z*(a)) phi'(z*(b))] beside
    them (``SharedMoments.derivative_cross``).  ``pool`` = 1 is the activation's own
    map with the cross moment added (for ReLU at mean 0 the arc-cosine kernel, Cho & Saul 2009);
    ``pool`` = P > 1 is a P-element max pooling after a nondecreasing phi (max phi(z_j) =
    phi(max z_j)), the maximum of P standard normals having density P phi(u) Phi(u)^(P-1).
    Nested Gauss-Legendre (``QUAD_NODES`` per side of each kink, on +-``QUAD_SPAN``), docs/theory.md
    §13."""
    tau = math.sqrt(max(shared - mean * mean, 0.0))
    s = math.sqrt(max(second - max(shared, mean * mean), 0.0))
    if tau > 0.0:
        t, wo = _split_nodes(-mean / tau)
        wo = wo * np.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
        mu = mean + tau * t
    else:
        mu, wo = np.array([mean]), np.array([1.0])
    if s > 0.0:
        u, wi = _split_nodes(-mu / s)
        dens = np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
        if pool > 1:
            from scipy.special import ndtr  # as poch above: loaded only when a max pooling is mapped

            dens = pool * dens * ndtr(u) ** (pool - 1)
        wi = wi * dens
        z = mu[:, None] + s * u
    else:
        wi, z = np.ones((mu.size, 1)), mu[:, None]
    f = phi(z.ravel()).reshape(z.shape)
    d = dphi(z.ravel()).reshape(z.shape)
    inner_f, inner_f2, inner_d, inner_d2 = (
        (wi * f).sum(1),
        (wi * f * f).sum(1),
        (wi * d).sum(1),
        (wi * d * d).sum(1),
    )
    return SharedMoments(
        float(wo @ inner_f),
        float(wo @ inner_f2),
        float(wo @ (inner_f * inner_f)),
        float(wo @ inner_d2),
        float(wo @ (inner_d * inner_d)),
    )


class SharedMoments(tuple):
    """``shared_moments``' values: (E[y], E[y^2], E[y(a) y(b)], E[phi'^2]) as a 4-tuple, and
    ``derivative_cross``, E[phi'(a) phi'(b)] (the gradient's shared moment through the
    activation), read off the same nested grid -- one quadrature where two were."""

    def __new__(cls, mean, second, cross, derivative_second, derivative_cross):
        self = super().__new__(cls, (mean, second, cross, derivative_second))
        self.derivative_cross = derivative_cross
        return self


# --------------------------------------------------------------------------------------------
# The input-output Jacobian's spectrum (issue 30; docs/theory.md §14)
# --------------------------------------------------------------------------------------------
#: the first S-transform coefficient s1 of W W^T for a layer's directions (Pennington, Schoenholz
#: & Ganguli 2018): 0 for orthogonal rows (W W^T = g^2 I), -1 for Gaussian or iid
#: entries (Marchenko-Pastur at aspect ratio 1; rows normalised to a fixed norm change it by
#: O(1/n) only: the Gram matrix's off-diagonal entries keep their variance 1/n)
S1_OF_DIRECTION = {"orthogonal": 0.0, "gaussian": -1.0, "uniform": -1.0}
#: E[phi'(z)^2] and E[phi'(z)^4] of ReLU at zero-mean pre-activations: its derivative is 0 or 1,
#: each with probability 1/2
RELU_MU = (0.5, 0.5)


@dataclass(frozen=True)
class SpectrumPrediction:
    """The eigenvalues lambda = sigma^2 of J J^T predicted at large width: their mean, and their
    variance (None where not derived: ``why`` says what is missing)."""

    mean: float
    variance: float | None
    why: str = ""


def gram_variance(ratio: float, s1: float) -> float:
    """The normalised variance var/mean^2 of the eigenvalues of W W^T (n_out x n_out) for a layer
    W of n_out/n_in = ``ratio`` with directions of S-transform coefficient ``s1`` at aspect 1:
    iid entries (s1 = -1) give Marchenko-Pastur's ``ratio``; orthogonal rows (s1 = 0, ratio <= 1)
    give 0, and orthonormal columns of a tall W (ratio > 1) a projection of rank 1/ratio:
    ratio - 1.  Both in one: max(ratio - 1, 0) - s1 min(ratio, 1) (docs/theory.md §14)."""
    return max(ratio - 1.0, 0.0) - s1 * min(ratio, 1.0)


def chain_variance(v: float, ratio: float, mu1: float, mu2: float, s1: float) -> float:
    """One layer h -> phi(W h) appended to a Jacobian J whose J J^T has normalised variance ``v``
    (in its n_in-space): the new J' = D W J has, in n_out-space, ratio * v + (mu2/mu1^2 - 1) +
    ``gram_variance(ratio, s1)``.  Free multiplicative convolution at large width: J' J'^T has the
    moments of (J J^T)(W^T D^2 W) in n_in-space, where normalised variances of free elements add;
    moving between the spaces of B B^T and B^T B keeps (1 + v)/n (their traces' nonzero parts
    agree) (docs/theory.md §14)."""
    return ratio * v + mu2 / (mu1 * mu1) - 1.0 + gram_variance(ratio, s1)


def block_variance(
    a: float, v_branch: float, g2: float = 1.0, ratio: float = 1.0, v_skip: float = 0.0
) -> float:
    """The normalised variance, in the block's output space, of (S + A)(S + A)^T for a residual
    branch A whose A A^T has mean ``a`` and normalised variance ``v_branch`` (both in the output
    space) and a skip S: the identity (defaults), or a projection of d_out/d_in = ``ratio``, mean
    squared row norm ``g2`` and S^T S of normalised variance ``v_skip`` (in the input space).  A is
    R-diagonal (a Haar rotation times the rest) and free of S, so the words with unequal numbers of
    A and A^T, or an odd number of S, have trace 0; in the input space, with c = ratio g2 =
    tr(S^T S)/d_in, tr M/d_in = ratio (g2 + a) and tr M^2/d_in = c^2 (1 + v_skip) + 2 c ratio a +
    2 ratio g2 a + ratio a^2 (1 + v_branch).  Moved to the output space (1 + v scales by ratio):
    [ratio g2^2 (1 + v_skip) + 2 ratio g2 a + 2 g2 a + a^2 (1 + v_branch)]/(g2 + a)^2 - 1; for the
    identity (2a + a^2 v_branch)/(1 + a)^2 (docs/theory.md §14)."""
    num = ratio * g2 * g2 * (1.0 + v_skip) + 2.0 * ratio * g2 * a + 2.0 * g2 * a + a * a * (1.0 + v_branch)
    return num / ((g2 + a) ** 2) - 1.0


@dataclass(frozen=True)
class SpectralDensity:
    """The large-width density of the eigenvalues lambda of J J^T: ``log10_lambda`` a grid,
    ``per_log10`` the density per unit log10 lambda there (lambda rho(lambda) ln 10), ``zeros``
    the mass at lambda = 0 (the ReLUs' inactive units), ``continuous`` the grid's integral of
    the rest (1 - zeros, up to the grid's reach), ``near_one`` its mass within [1/2, 2]."""

    log10_lambda: list[float]
    per_log10: list[float]
    zeros: float
    continuous: float
    near_one: float


def _log_s(w: complex, factors) -> tuple[complex, complex]:
    """log S(w) and its derivative for S(w) = prod_l f_l(rho_l w), each factor (rho, log_g2,
    relu, s1, ratio) the out-space S-transform of one layer's D^2 W W^T (``free_density``)."""
    val, der = 0j, 0j
    for rho, log_g2, relu, s1, r in factors:
        u = rho * w
        val -= log_g2
        if relu:  # S_D(u) = (1 + u)/(1/2 + u)
            val += cmath.log(1 + u) - cmath.log(0.5 + u)
            der += rho * (1 / (1 + u) - 1 / (0.5 + u))
        if s1 == -1.0 or r > 1.0:  # iid: 1/(1 + r u); orthonormal columns: (1 + u)/(1 + r u)
            val -= cmath.log(1 + r * u)
            der -= rho * r / (1 + r * u)
        if s1 == 0.0 and r > 1.0:
            val += cmath.log(1 + u)
            der += rho / (1 + u)
    return val, der


def _s_equation_root(z: complex, factors, w: complex) -> complex | None:
    """Newton on exp(F(w)) = 1, F = log z + log S(w) + log w - log(1 + w) (branch-free: the
    exponential), from ``w``: the root, or None when it does not converge (the caller takes a
    shorter step)."""
    for _ in range(60):
        if w == 0 or w == -1:
            return None
        try:
            ls, dls = _log_s(w, factors)
        except (ValueError, ZeroDivisionError):  # a factor's log at its pole
            return None
        F = cmath.log(z) + ls + cmath.log(w) - cmath.log(1 + w)
        if F.real > 700:
            return None
        e = cmath.exp(F)
        dF = dls + 1 / w - 1 / (1 + w)
        if e == 0 or dF == 0:
            return None
        step = (e - 1) / (e * dF)
        w -= step
        if not cmath.isfinite(w):
            return None
        if abs(step) <= 1e-13 * max(1.0, abs(w)):
            return w
    return None


def free_density(
    layers: Sequence[tuple[float, bool, float, int, int]], per_decade: int = 60, imag: float = 1e-8
) -> SpectralDensity | None:
    """The eigenvalue density of J J^T for a chain of dense layers (g2, relu, s1, n_in, n_out) at
    large width by the free multiplicative convolution (Pennington, Schoenholz & Ganguli 2018).
    In each layer's out-space S-transforms multiply: S_D(w) = (1 + w)/(1/2 + w) for a ReLU's D^2
    (0 or 1, each with probability 1/2); for W W^T (r = n_out/n_in) 1/(g2 (1 + r w)) with iid
    rows (s1 = -1, Marchenko-Pastur), 1/g2 with orthonormal rows (s1 = 0, r <= 1) and (1 + w)/(g2
    (1 + r w)) with orthonormal columns (r > 1: a projection of rank 1/r).  Moving a spectrum
    between the spaces of B B^T and B^T B scales its moment series by the dimensions' ratio, and
    composed through the chain this leaves S(w) = prod_l S_l(rho_l w) with rho_l = n_L/n_l.  The
    moment series psi = z G(z) - 1 solves chi(psi) = 1/z with chi(w) = S(w) w/(1 + w), followed
    by Newton's method from large z (psi ~ mean/z) down a log grid at z = lambda (1 + ``imag``
    i), keeping the root with Im G < 0, and rho = -Im G/pi.  The mass at zero is 1 - rank/n_L,
    the rank min(n_0, n_l/2 at a ReLU, n_l).  None for other S-transforms (``s1`` neither 0 nor
    -1) or where the root cannot be followed (a spectrum of atoms)."""
    if not layers or any(s1 not in (0.0, -1.0) for _, _, s1, _, _ in layers):
        return None
    n_last = layers[-1][4]
    factors = [(n_last / n_out, math.log(g2), relu, s1, n_out / n_in) for g2, relu, s1, n_in, n_out in layers]
    mean = math.exp(sum(math.log(g2) for g2, _, _, _, _ in layers)) * 0.5 ** sum(
        1 for _, relu, _, _, _ in layers if relu
    )
    rank = min([layers[0][3]] + [n_out * (0.5 if relu else 1.0) for _, relu, _, _, n_out in layers])
    spread = sum(
        rho * ((1.0 if relu else 0.0) + gram_variance(r, s1)) for rho, _, relu, s1, r in factors
    )  # var/mean^2 (``chain_variance`` unrolled): where the grid starts
    top = math.log10(mean) + math.log10(10.0 * (spread + 2.0) ** 2)
    grid = np.linspace(
        top, math.log10(mean) - 8.0, int(round((top - math.log10(mean) + 8.0) * per_decade)) + 1
    )
    w = complex(mean / 10.0**top)
    dens = []
    prev = grid[0]
    for x in grid:
        # from the previous point to this one, in as many steps as Newton needs to follow the root
        todo, here = [x], prev
        while todo:
            target = todo[-1]
            z = 10.0**target * (1 + imag * 1j)
            # the physical root has Im G < 0 (G = (1 + w)/z, z in the upper half plane): where two
            # real roots meet at an edge and turn complex, Newton may land on the conjugate one
            got = _s_equation_root(z, factors, w)
            if got is not None and ((1 + got) / z).imag > 0:
                got = _s_equation_root(z, factors, got.conjugate())
                got = None if got is None or ((1 + got) / z).imag > 0 else got
            if got is None or abs(got - w) > 0.5 * max(abs(w), 1e-3):
                if abs(target - here) < 1e-9:
                    return None
                todo.append(0.5 * (here + target))
                continue
            w, here = got, todo.pop()
        prev = x
        z = 10.0**x * (1 + imag * 1j)
        rho = max(0.0, -((1 + w) / z).imag / math.pi)
        dens.append(10.0**x * rho * math.log(10.0))
    lam, per = grid[::-1], np.asarray(dens[::-1])
    continuous = float(np.trapezoid(per, lam))
    half = math.log10(2.0)
    inside = (lam >= -half) & (lam <= half)
    near = float(np.trapezoid(per[inside], lam[inside]))
    zeros = max(0.0, 1.0 - rank / n_last)
    return SpectralDensity([float(v) for v in lam], [float(v) for v in per], zeros, continuous, near)
