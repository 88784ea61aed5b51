"""Closed-form theory of signal propagation at initialization.  numpy/scipy only: no torch.

Every function cites the paper it implements, author-year:

* Arpit, Campos & Bengio (2019), "How to Initialize your Network? Robust Initialization for
  WeightNorm & ResNets", NeurIPS.  Theorem 1 (eq. 3) / Theorem 5 (eq. 9), Theorem 2 / 6,
  Theorems 3-4 / 7-8 (eq. 6-8, 43-64).
* Salimans & Kingma (2016), "Weight Normalization", NIPS, section 3.
* De & Smith (2020), "Batch Normalization Biases Residual Blocks Towards the Identity Function
  in Deep Networks", NeurIPS, appendices B-C.

The derivations of the per-init predictions and of the finite-width spread model are written
out in ``docs/theory.md``; the functions below are those formulas, nothing more.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

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
    from scipy.special import poch

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
        from sigprop.errors import SigpropError

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

    K_n = m * (2n/m) * E[max(0, cos theta)^2] (Arpit et al. 2019, eq. 13-17, 33) with theta the angle between a
    uniform direction in R^n and u, whose density is S_{n-1}/S_n sin^{n-2}(theta).  With
    theta = pi/2 - s/sqrt(n) the integrand is a bump of unit width, which quad resolves for any n:

        K_n = 2 (S_{n-1}/S_n) / sqrt(n) * int_0^{pi sqrt(n)/2} cos(s/sqrt n)^{n-2} n sin(s/sqrt n)^2 ds
    """
    from scipy.integrate import quad

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
        from sigprop.errors import SigpropError

        raise SigpropError(f"needs an integer >= 1, got {blocks}", field="blocks")
    b = int(blocks)
    return math.exp(0.5 * b * math.log1p(1.0 / b))


def in_resnet_band(ratio: float, rel: float = 1e-12) -> bool:
    """Whether ``ratio`` lies in [sqrt 2, sqrt e], up to floating-point rounding (B = 1 gives
    exactly sqrt 2, which exp/log1p may round one ulp below)."""
    return RESNET_LOWER * (1 - rel) <= ratio <= RESNET_UPPER * (1 + rel)


# --------------------------------------------------------------------------------------------
# Per-init predictions for the WN MLP (Arpit et al. 2019, eq. 1-5)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerMoments:
    """Second moments of one layer's parameters, the only thing the MLP predictions need.

    ``row_sq``: E||w_i||^2 of a row of the effective weight matrix (g_i^2 for WN rows);
    ``bias_var``: E[b_i^2].  Rows are assumed isotropic in direction (or orthogonal).
    """

    row_sq: float
    bias_var: float = 0.0


@dataclass(frozen=True)
class MLPPrediction:
    """Predicted ln of the root-mean-square ratios, index l-1 for layer l = 1..L.

    Natural logs so that a vanishing init at depth 3000 is -1000, not an underflowed 0.
    ``None`` where the init has no closed form.
    """

    ln_forward: list[float] | None
    ln_backward: list[float] | None


def mlp_rms_prediction(widths: Sequence[int], moments: Sequence[LayerMoments]) -> MLPPrediction:
    """ln RMS forward ratio ||h^l||/||x|| and backward ratio ||dl/da^l||/||e|| of a ReLU MLP.

    Forward (Arpit et al. 2019, Theorem 1 generalised; docs/theory.md eq. F): conditioned on h^{l-1}, a_i is
    symmetric with E[a_i^2] = r_l ||h^{l-1}||^2 / n_{l-1} + beta_l, so
        E||h^l||^2 = n_l / 2 * (r_l ||h^{l-1}||^2 / n_{l-1} + beta_l).
    The recursion is affine, E||h^l||^2 = A_l ||x||^2 + B_l, and with x ~ N(0, I_{n_0}),
    E[1/||x||^2] = 1/(n_0 - 2), so E[||h^l||^2/||x||^2] = A_l + B_l / (n_0 - 2).
    A_l is kept as a log (it vanishes geometrically for g = 1); B_l stays bounded.

    Backward (Arpit et al. 2019, Theorem 2 / eq. 5 generalised; docs/theory.md eq. B): each step multiplies
    E||delta||^2 by r_{l+1}/2 (the mask keeps half, W^T keeps r), and e/||e|| is a unit vector:
        E[||dl/da^l||^2/||e||^2] = prod_{j=l+1}^{L} r_j / 2.
    """
    widths = [int(w) for w in widths]
    L = len(widths) - 1
    if len(moments) != L:
        raise ValueError("one LayerMoments per layer")
    n0 = widths[0]
    log_inv_x2 = -math.log(n0 - 2) if n0 > 2 else math.inf
    log_a, b = 0.0, 0.0  # E||h^l||^2 = exp(log_a) ||x||^2 + b
    fwd: list[float] | None = []
    for l in range(1, L + 1):
        m = moments[l - 1]
        k = 0.5 * widths[l] * m.row_sq / widths[l - 1]
        log_a += math.log(k)
        b = k * b + 0.5 * widths[l] * m.bias_var
        log_ratio_sq = log_a if b == 0.0 else float(np.logaddexp(log_a, math.log(b) + log_inv_x2))
        fwd.append(0.5 * log_ratio_sq)
    if any(not math.isfinite(v) for v in fwd):
        fwd = None  # n_0 <= 2 with a bias: E[1/||x||^2] diverges
    bwd = [0.0] * L
    acc = 0.0
    for l in range(L, 0, -1):
        bwd[l - 1] = 0.5 * acc
        acc += math.log(0.5 * moments[l - 1].row_sq)
    return MLPPrediction(ln_forward=fwd, ln_backward=bwd)


def datadep_ln_forward(widths: Sequence[int]) -> list[float] | None:
    """Data-dependent init (Salimans & Kingma 2016, section 3, eq. 5-6): every pre-activation is standardised over the
    probe batch, so E_batch[a_i^2] = 1 and, if its distribution is symmetric, E||h^l||^2 = n_l/2;
    with E[1/||x||^2] = 1/(n_0 - 2): ln rms ratio = 1/2 ln(n_l / (2 (n_0 - 2))).

    The symmetry is an approximation (exact only at layer 1); docs/theory.md shows the check.
    """
    n0 = widths[0]
    if n0 <= 2:
        return None
    return [0.5 * math.log(w / (2.0 * (n0 - 2))) for w in widths[1:]]


# --------------------------------------------------------------------------------------------
# Finite-width spread (docs/theory.md, "finite-width spread")
# --------------------------------------------------------------------------------------------
def _step_c(n_out: int, n_other: int, orthogonal: bool) -> float:
    if not orthogonal:
        return SPREAD_C_GAUSSIAN
    return SPREAD_C_ORTHOGONAL_BASE + 2.0 * max(0.0, 1.0 - n_out / n_other)


def log_ratio_variance(widths: Sequence[int], orthogonal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample variance of ln(ratio) at each layer, forward and backward (index l-1).

    Each ReLU layer multiplies ||h||^2 by a factor of mean ~1 (after the deterministic gain) and
    variance c_l / n_l (c = 5 for isotropic i.i.d. rows, 3 + 2(1 - n_l/n_{l-1})^+ for orthogonal
    rows); the factors are nearly independent, so Var[ln ||h^l||^2] ~= sum_j c_j/n_j and
    Var[ln ratio] = sum_j c_j / (4 n_j).  This is the Sum_l 1/n_l law of Hanin & Rolnick
    (Arpit et al. 2019, ref. [10]).  The mean of ln ratio drifts by minus the same amount (lognormal with
    E[ratio^2] fixed).  Backward at layer l sums the masks of layers l..L-1.
    """
    widths = [int(w) for w in widths]
    L = len(widths) - 1
    fwd_steps = np.array([_step_c(widths[j], widths[j - 1], orthogonal) / (4.0 * widths[j]) for j in range(1, L + 1)])
    fwd = np.cumsum(fwd_steps)
    # backward step j (delta^{j+1} -> delta^j): mask of width n_j, W^{j+1} of shape n_{j+1} x n_j
    bwd_steps = np.array(
        [_step_c(widths[j], widths[j + 1], orthogonal) / (4.0 * widths[j]) for j in range(1, L)] + [0.0]
    )
    bwd = np.cumsum(bwd_steps[::-1])[::-1]
    return fwd, bwd


def conv_log_ratio_variance(channels: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample variance of ln(ratio) at each conv layer of a plain CNN, forward and backward
    (index l-1; ``channels`` = [C_in, c_1, ..., c_L]): the MLP's law (``log_ratio_variance``) with
    each conv's output channels as its width and the constant of i.i.d. rows, c = 5, whatever the
    directions.  A conv's c_out kernels are c_out random rows shared by every position, so its
    power fluctuates at most as an MLP layer of c_out units does (the positions average the
    input's side of the fluctuation, not the weights'); the constant is an upper envelope of the
    measured one, not a derivation: benchmarks/conv_spread.py measures 1.6-3.5 forward and
    0.3-1.8 backward for every init at 16-64 channels and 10-30 layers (128 draws; pytorch's
    biases pin its forward ratio: 0.1-0.5), and up to 4.8 and 3.7 for delta-orthogonal at 16
    channels and 100 layers (docs/theory.md §11, "Finite-width spread").  The band built on it
    errs wide, by about 2x in variance for the isotropic inits."""
    return log_ratio_variance(channels, orthogonal=False)


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
    exact.  K = 0 (every unit dead, probability 2^-n) is left out: the engine counts it.
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


def log_ratio_cumulants(widths: Sequence[int], orthogonal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative (drift below ln RMS, variance, third cumulant) of the per-sample ln(ratio) at
    each layer, forward [L, 3] and backward [L, 3] (index l-1), summing the independent layer
    factors of ``relu_layer_log_cumulants`` (forward layer j: n_j units, fan-in n_{j-1};
    backward step j: the mask of n_j units after W^{j+1}^T from R^{n_{j+1}})."""
    widths = [int(w) for w in widths]
    L = len(widths) - 1
    cache: dict = {}

    def step(n: int, m: int) -> tuple[float, float, float]:
        if (n, m) not in cache:
            cache[(n, m)] = relu_layer_log_cumulants(n, m, orthogonal)
        return cache[(n, m)]

    fwd = np.cumsum(np.array([step(widths[j], widths[j - 1]) for j in range(1, L + 1)]), axis=0)
    bsteps = np.array([step(widths[j], widths[j + 1]) for j in range(1, L)] + [(0.0, 0.0, 0.0)])
    bwd = np.cumsum(bsteps[::-1], axis=0)[::-1]
    return fwd, bwd


def cornish_fisher_band(lo_ln: float, hi_ln: float, cumulants: Sequence[float], z: float) -> tuple[float, float]:
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
# Per-init predictions for the ResNet (Arpit et al. 2019, eq. 6, Theorems 3-4 generalised; docs/theory.md §7)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinearMoments:
    """One linear layer: shape and the second moments of its parameters (see LayerMoments)."""

    n_in: int
    n_out: int
    row_sq: float
    bias_var: float = 0.0


@dataclass(frozen=True)
class BlockMoments:
    """One residual block h' = S h + alpha F(h): the branch's layers (a ReLU after every layer
    but the last), the skip (None: identity; else a linear projection without ReLU), alpha^2."""

    branch: tuple[LinearMoments, ...]
    skip: LinearMoments | None
    alpha_sq: float


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


def _ln(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def _lae(a: float, b: float) -> float:
    return float(np.logaddexp(a, b))


def _affine(a: float, c: float, m: LinearMoments, relu: bool) -> tuple[float, float]:
    """E||out||^2 = a s + c given E||in||^2 = (a, c) applied to s: a WN (or plain) layer with
    row second moment r and bias variance beta gives n_out (r s / n_in + beta); a ReLU halves
    it (the pre-activation is symmetric).  Arpit et al. 2019, eq. 13-17 with K_n = 1."""
    k = m.n_out * m.row_sq / m.n_in
    a, c = k * a, k * c + m.n_out * m.bias_var
    return (0.5 * a, 0.5 * c) if relu else (a, c)


def resnet_rms_prediction(dim: int, blocks: Sequence[BlockMoments]) -> ResNetPrediction:
    """Closed-form RMS ratios of a ResNet h^b = S_b h^{b-1} + alpha F_b(h^{b-1}) (Arpit et al. 2019, eq. 6).

    Forward (Arpit et al. 2019, Theorem 3 / eq. 43-53 without its assumption ||F(h)|| = ||h||): the branch's last
    layer is zero-mean and independent of the skip, so the cross term vanishes in expectation and
        E||h^b||^2 = E||S h||^2 + alpha^2 E||F(h)||^2 = k_b ||h^{b-1}||^2 + c_b
    with (k_b, c_b) from the layer moments (``_affine``).  The recursion is affine as in the MLP;
    with x ~ N(0, I_d), E[||h^b||^2/||x||^2] = A_b + C_b/(d - 2).  Proposed (gamma = 2, ..., 1/B_k):
    k_b = 1 + 1/B_k, so (1 + 1/B_k)^{b/2} within a stage (eq. 53); WN g = 1: k_b = 1 + 2^{-D}.

    Backward (Arpit et al. 2019, Theorem 4 / eq. 54-63): dl/dh^{b-1} = S^T d + alpha J_F^T d, and each branch
    layer multiplies E||d||^2 by its row second moment r, each ReLU mask by 1/2:
        f_b = r_S + alpha^2 (prod_j r_j) 2^{-D}    (r_S = 1 for the identity).
    Kept in logs: 3000 exploding blocks give ln ratios of ~600, never inf.
    """
    log_a, log_c = 0.0, -math.inf
    log_inv_x2 = -math.log(dim - 2) if dim > 2 else math.inf
    fwd: list[float] | None = [0.0]
    branch: list[float | None] = []
    g_fwd: list[float] = []
    factors: list[float] = []
    g_bwd: list[float] = []
    for blk in blocks:
        a_f, c_f = 1.0, 0.0
        for j, m in enumerate(blk.branch):
            a_f, c_f = _affine(a_f, c_f, m, relu=j < len(blk.branch) - 1)
        a_s, c_s = (1.0, 0.0) if blk.skip is None else _affine(1.0, 0.0, blk.skip, relu=False)
        k = a_s + blk.alpha_sq * a_f
        c_new = c_s + blk.alpha_sq * c_f
        # branch-to-skip power ratio at the predicted ||h^{b-1}||^2 (with ||x||^2 = d)
        ln_s = _lae(log_a + math.log(dim), log_c)
        ln_branch_pow = _ln(blk.alpha_sq) + _lae(_ln(a_f) + ln_s, _ln(c_f))
        ln_skip_pow = _lae(_ln(a_s) + ln_s, _ln(c_s))
        g_fwd.append(math.exp(min(ln_branch_pow - ln_skip_pow, 700.0)))
        branch.append(0.5 * math.log(blk.alpha_sq * a_f) if (c_f == 0.0 and blk.alpha_sq > 0) else None)
        log_a += math.log(k)
        log_c = _lae(log_c + math.log(k), _ln(c_new))
        fwd.append(0.5 * _lae(log_a, log_c + log_inv_x2) if log_c > -math.inf else 0.5 * log_a)
        r_s = 1.0 if blk.skip is None else blk.skip.row_sq
        through = math.prod(m.row_sq for m in blk.branch) * 0.5 ** (len(blk.branch) - 1)
        factors.append(r_s + blk.alpha_sq * through)
        g_bwd.append(blk.alpha_sq * through / r_s)
    if any(not math.isfinite(v) for v in fwd):
        fwd = None  # d <= 2 with a bias: E[1/||x||^2] diverges
    bwd = [0.0] * (len(blocks) + 1)
    for b in range(len(blocks), 0, -1):
        bwd[b - 1] = bwd[b] + 0.5 * math.log(factors[b - 1])
    return ResNetPrediction(fwd, bwd, branch, g_fwd, g_bwd)


def datadep_resnet_ln_forward(dim: int, d_out: Sequence[int], projection: Sequence[bool], start: float | None = None
                              ) -> tuple[list[float] | None, list[float]]:
    """Data-dependent init (Salimans & Kingma 2016, eq. 5-6) in a ResNet: every WN layer's pre-activation is
    standardised over the batch, so a branch output (and a projection's output) has
    E||.||^2 = d_out per sample on average, independent of its input.  Hence, with
    E[1/||x||^2] = 1/(d - 2): in stage 1, E[||h^b||^2/||x||^2] = 1 + b d/(d - 2); after a
    projection (stage k > 1), j blocks into the stage, (j + 1) d_k/(d - 2).  Approximate (it
    takes ||x|| independent of the standardised outputs); docs/theory.md §7 shows the check.
    ``start``: E||h^0||^2 when h^0 is not the input x itself but a standardised layer's output
    (the WRN's conv1: its units).  Convs standardise per channel over the batch and the
    positions, so the same holds with units (channels x positions) for widths.
    Returns the ln ratios per entry and the forward branch-to-skip power ratios per block."""
    if dim <= 2:
        return None, [1.0] * len(d_out)
    s = float(dim) if start is None else float(start)  # E||h||^2 in units where ||x||^2 ~ d
    out, gains = [0.0 if start is None else 0.5 * math.log(s / (dim - 2))], []
    for n, proj in zip(d_out, projection):
        skip = float(n) if proj else s
        gains.append(n / skip)
        s = skip + n
        out.append(0.5 * math.log(s / (dim - 2)))
    return out, gains


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
    (``log_ratio_variance``'s per-layer constants) plus 2/d_out for the last, linear layer."""
    v = sum(_step_c(widths[j], widths[j - 1], orthogonal) / widths[j] for j in range(1, len(widths) - 1))
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


def _kernel_layer(q: float, q_ab: float, m: LinearMoments, relu: bool) -> tuple[float, float]:
    """One layer on the per-unit kernel of two inputs of equal norm (q = ||h||^2/n_in,
    q_ab = <h_a, h_b>/n_in): pre-activations u = w.h + b with E[u_a u_b] = r q_ab + beta
    (r = row_sq, beta = bias_var: the moments ``_affine`` uses); a ReLU gives
    E[ReLU(u_a)^2] = S/2 and E[ReLU(u_a) ReLU(u_b)] = (S/2) relu_cosine_map(S_ab / S)."""
    s = m.row_sq * q + m.bias_var
    s_ab = m.row_sq * q_ab + m.bias_var
    if not relu:
        return s, s_ab
    if s <= 0.0:
        return 0.0, 0.0
    return 0.5 * s, 0.5 * s * relu_cosine_map(s_ab / s)


def mlp_correlation(c0: float, layers: Sequence[LinearMoments], q0: float = 1.0) -> list[float]:
    """Cosine of the two forward states after each layer (a ReLU after every layer, as in the
    MLP), for inputs of cosine c0 and per-unit second moment q0, at infinite width."""
    q, q_ab, out = q0, c0 * q0, []
    for m in layers:
        q, q_ab = _kernel_layer(q, q_ab, m, relu=True)
        out.append(q_ab / q if q > 0 else float("nan"))
    return out


def resnet_correlation(c0: float, blocks: Sequence[BlockMoments], q0: float = 1.0) -> list[float]:
    """Cosine of the two states h^b after each block h' = S h + alpha F(h) (Arpit et al. 2019,
    eq. 6), at infinite width: the branch's last layer is zero-mean and independent of the
    skip, so the cross terms vanish and the kernels add, K' = K_S + alpha^2 K_F, where K_S is the
    input kernel (identity skip) or a linear layer of it (projection) and K_F the branch's
    layers applied to it (``_kernel_layer``; a ReLU after every branch layer but the last).
    With identity skips and zero biases: c' = (c + beta f^D(c)) / (1 + beta), beta the
    branch-to-skip power ratio (1/B_k for the proposed init) -- docs/theory.md §10."""
    q, q_ab, out = q0, c0 * q0, []
    for blk in blocks:
        fq, fab = q, q_ab
        for j, m in enumerate(blk.branch):
            fq, fab = _kernel_layer(fq, fab, m, relu=j < len(blk.branch) - 1)
        sq, sab = (q, q_ab) if blk.skip is None else _kernel_layer(q, q_ab, blk.skip, relu=False)
        q, q_ab = sq + blk.alpha_sq * fq, sab + blk.alpha_sq * fab
        out.append(q_ab / q if q > 0 else float("nan"))
    return out


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
def _centred(k: tuple[float, float, float], batch: int) -> tuple[float, float]:
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


def _standardized(k: tuple[float, float, float], batch: int, relu: bool) -> tuple[float, float, float]:
    """A linear layer (isotropic random rows: its pre-activation kernel is proportional to the
    input's) standardized per unit over the batch, then a ReLU or not: the output triple per
    unit (unit variance; after a ReLU 1/2 and (1/2) relu_cosine_map of each cosine)."""
    c, cp = _centred(k, batch)
    if not relu:
        return 1.0, c, cp
    return 0.5, 0.5 * relu_cosine_map(c), 0.5 * relu_cosine_map(cp)


def bn_resnet_correlation(c0: float, blocks: int, batch: int) -> list[float]:
    """Cosine of a pair's states x^0 .. x^{B+1} in the BN ResNet (De & Smith 2020, appendix C):
    stem x^1 = W BN(x^0)^+, blocks x^{l+1} = x^l + W BN(x^l)^+, W ~ N(0, 2/d), at infinite width
    and the finite batch of 2P pair inputs.  BN(x)^+ is ``_standardized`` with a ReLU; W (row
    second moment 2) doubles it, so each branch adds (1, f(c_BN), f(c_perp,BN)) to the triple
    and the skip keeps the old one (the cross terms vanish: W is independent of x^l).  The
    input: K = (1, c0, 0).  BN's eps is neglected (var >> eps)."""
    k = (1.0, c0, 0.0)
    out = [c0]
    for l in range(blocks + 1):
        br = tuple(2.0 * v for v in _standardized(k, batch, relu=True))
        k = br if l == 0 else tuple(a + b for a, b in zip(k, br))
        out.append(k[1] / k[0])
    return out


def datadep_mlp_correlation(c0: float, layers: int, batch: int) -> list[float]:
    """Cosine of a pair after each layer of an MLP whose every pre-activation is standardized
    over the batch (the data-dependent init, Salimans & Kingma 2016, section 3.1): layer l maps
    the triple by ``_standardized`` with a ReLU."""
    k, out = (1.0, c0, 0.0), []
    for _ in range(layers):
        k = _standardized(k, batch, relu=True)
        out.append(k[1] / k[0])
    return out


def datadep_resnet_correlation(c0: float, blocks: Sequence[tuple[int, bool, float]], batch: int) -> list[float]:
    """Cosine of a pair at h^0 .. h^B of a ResNet with data-dependent init: per block (branch
    layer count, projection, alpha^2) the branch's layers standardized (a ReLU after all but the
    last), the skip the identity or a standardized projection; kernels add (independent
    directions: no cross term)."""
    k, out = (1.0, c0, 0.0), [c0]
    for layers, projection, alpha_sq in blocks:
        f = k
        for j in range(layers):
            f = _standardized(f, batch, relu=j < layers - 1)
        s = _standardized(k, batch, relu=False) if projection else k
        k = tuple(a + alpha_sq * b for a, b in zip(s, f))
        out.append(k[1] / k[0])
    return out


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


def _box(e: np.ndarray, m: ConvMoments) -> np.ndarray:
    """sum over the taps t of e(s q + t - pad), zeros outside the image (isotropic taps), or the
    centre tap alone: [H, W] -> [H', W']."""
    k, s, p = m.kernel, m.stride, m.padding
    ho, wo = m.out_size(e.shape[0]), m.out_size(e.shape[1])
    padded = np.pad(e, p)
    if m.taps == "centre":
        c = (k - 1) // 2
        return padded[c:c + s * (ho - 1) + 1:s, c:c + s * (wo - 1) + 1:s].copy()
    out = np.zeros((ho, wo))
    for i in range(k):
        for j in range(k):
            out += padded[i:i + s * (ho - 1) + 1:s, j:j + s * (wo - 1) + 1:s]
    return out


def _box_adjoint(d: np.ndarray, m: ConvMoments, shape: tuple[int, int]) -> np.ndarray:
    """The transpose of ``_box``: scatter d(q) onto the input positions its taps read."""
    k, s, p = m.kernel, m.stride, m.padding
    ho, wo = d.shape
    padded = np.zeros((shape[0] + 2 * p, shape[1] + 2 * p))
    taps = [((k - 1) // 2, (k - 1) // 2)] if m.taps == "centre" else [(i, j) for i in range(k) for j in range(k)]
    for i, j in taps:
        padded[i:i + s * (ho - 1) + 1:s, j:j + s * (wo - 1) + 1:s] += d
    return padded[p:p + shape[0], p:p + shape[1]]


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
    out = per_tap * _box(e, m)
    return 0.5 * out if relu else out


def conv_bias_energy(m: ConvMoments, relu: bool) -> float:
    """The bias part of e'(q): c_out beta per position (halved by a ReLU)."""
    return (0.5 if relu else 1.0) * m.c_out * m.bias_var


def _conv_forward(a_map: np.ndarray, layers: Sequence[ConvMoments]) -> tuple[list[tuple[float, float]], list[tuple[int, int]]]:
    """Per layer (ln of the input-driven energy sum, in units of the input map's sum; ln of the
    bias-driven energy sum, absolute), from an input map ``a_map`` summing to 1, and the map
    shapes.  Both maps are carried normalised with their log scale (10,000 layers stay finite)."""
    a_ln, b_map, b_ln = 0.0, np.zeros(a_map.shape), -math.inf
    out, shapes = [], [a_map.shape]
    for m in layers:
        a_new = conv_layer_energy(a_map, m, relu=True)
        sa = float(a_new.sum())
        a_ln += _ln(sa)
        a_map = a_new / sa if sa > 0 else a_new
        b_lin = conv_layer_energy(b_map, m, relu=True)  # times exp(b_ln)
        bias = conv_bias_energy(m, relu=True)  # per position, absolute
        b_tot = _lae(b_ln + _ln(float(b_lin.sum())), _ln(bias * b_lin.size))
        if b_tot > -math.inf:
            b_map = (math.exp(b_ln - b_tot) if b_ln > -math.inf else 0.0) * b_lin + bias * math.exp(-b_tot)
        else:
            b_map = np.zeros_like(b_lin)
        b_ln = b_tot
        shapes.append(a_map.shape)
        out.append((a_ln, b_ln))
    return out, shapes


def _conv_backward(d_map: np.ndarray, layers: Sequence[ConvMoments], shapes) -> list[float]:
    """ln of the gradient energy at every layer's pre-activation relative to the top map (summing
    to 1): through layer l the map is scattered back by the transposed window times row_sq / k^2
    (row_sq for the centre tap) and halved by the mask of the ReLU below."""
    L = len(layers)
    out, d_ln = [0.0] * L, 0.0
    for l in range(L, 1, -1):
        m = layers[l - 1]
        per_tap = m.row_sq / (1 if m.taps == "centre" else m.kernel**2)
        new = 0.5 * per_tap * _box_adjoint(d_map, m, shapes[l - 1])
        s = float(new.sum())
        d_ln += _ln(s)
        d_map = new / s if s > 0 else new
        out[l - 2] = d_ln
    return out


def cnn_rms_prediction(image: tuple[int, int, int], layers: Sequence[ConvMoments]) -> MLPPrediction:
    """ln RMS forward ||h^l||/||x|| and backward ||dl/da^l||/||e|| ratios of a plain ReLU CNN
    (a ReLU after every conv) on inputs x ~ N(0, I) of shape ``image`` (C, H, W), over all units
    (channels x positions).

    Forward: the energy map is affine in the input's, e_l = A_l[x] + B_l (A linear, B from the
    biases), so E||h^l||^2 = sum_p m_l(p) ||x_p||^2 + sum B_l, and by symmetry of the i.i.d.
    input E[||x_p||^2 / ||x||^2] = 1/(H W): E[||h^l||^2/||x||^2] = mean_p m_l(p) + sum B_l / (d - 2),
    d = C H W -- exact in expectation (no width limit), as for the MLP.
    Backward: the error at the top is e ~ N(0, I) (a uniform energy map); each layer scatters
    it back (``_conv_backward``)."""
    C, H, W = image
    d_in = C * H * W
    log_inv_x2 = -math.log(d_in - 2) if d_in > 2 else math.inf
    parts, shapes = _conv_forward(np.full((H, W), 1.0 / (H * W)), layers)
    fwd = [0.5 * (a if b == -math.inf else _lae(a, b + log_inv_x2)) for a, b in parts]
    bwd = [0.5 * v for v in _conv_backward(np.full(shapes[-1], 1.0 / math.prod(shapes[-1])), layers, shapes)]
    if any(not math.isfinite(v) for v in fwd):
        return MLPPrediction(None, bwd)
    return MLPPrediction(fwd, bwd)


def cnn_conditional_prediction(x_energy: np.ndarray, e_energy: np.ndarray, layers: Sequence[ConvMoments]) -> MLPPrediction:
    """The same ratios for one given input and error vector, averaged over the weights only:
    ``x_energy`` = sum_c x_{c,p}^2 [H, W], ``e_energy`` the top error's [H_L, W_L].  E_W of the
    squared ratios is then exactly A_l[x_energy]/||x||^2 + B_l/||x||^2 (and the backward map of
    e): what a probe whose inputs are shared by every draw averages to over many draws."""
    total = float(x_energy.sum())
    parts, shapes = _conv_forward(x_energy / total, layers)
    fwd = [0.5 * (a if b == -math.inf else _lae(a, b - math.log(total))) for a, b in parts]
    bwd = [0.5 * v for v in _conv_backward(e_energy / float(e_energy.sum()), layers, shapes)]
    return MLPPrediction(fwd, bwd)
