"""Closed-form theory of signal propagation at initialization.  numpy/scipy only: no torch.

Every function cites the paper it implements (files in ``../shared/papers``):

* ``001_5ebcd69c068d8a69.txt`` -- Arpit, Campos, Bengio (2019), "How to initialize your network?
  Robust initialization for WeightNorm & ResNets".  Theorem 1 (eq. 3) / Theorem 5 (eq. 9),
  Theorem 2 / 6, Theorems 3-4 / 7-8 (eq. 6-8, 43-64).
* ``003_b3c6644f8b180c42.txt`` -- Salimans & Kingma (2016), weight normalization, section 3.

The derivations of the per-init predictions and of the finite-width spread model are written
out in ``docs/theory.md``; the functions below are those formulas, nothing more.
"""

from __future__ import annotations

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

    These are the products of 001 eq. 23-28: (2/3)(4/5)...((k-1)/k) for odd k and
    (1/2)(3/4)...((k-1)/k) * pi/2 for even k.
    """
    return 0.5 * math.log(math.pi) - math.log(2.0) - log_gamma_half_ratio(0.5 * (k + 1))


def _check_n(n: int) -> int:
    if int(n) != n or n < 2:
        from sigprop.errors import SigpropError

        raise SigpropError(f"K_n needs an integer n >= 2, got {n}", option="--n")
    return int(n)


def kn_closed_form(n: int) -> float:
    """K_n of Theorem 1 (001 eq. 3 / appendix eq. 9), closed form in log space.

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

    K_n = m * (2n/m) * E[max(0, cos theta)^2] (001 eq. 13-17, 33) with theta the angle between a
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
# ResNet band, Theorems 3-4 (001 eq. 7-8, proofs eq. 43-64)
# --------------------------------------------------------------------------------------------
RESNET_LOWER = math.sqrt(2.0)
RESNET_UPPER = math.sqrt(math.e)


def resnet_ratio(blocks: int) -> float:
    """(1 + 1/B)^{B/2}: the forward/backward norm ratio of a B-block ResNet with alpha = 1/sqrt(B)
    (001 eq. 53, 63).  Lies in [sqrt 2, sqrt e) for every integer B >= 1."""
    if int(blocks) != blocks or blocks < 1:
        from sigprop.errors import SigpropError

        raise SigpropError(f"needs an integer >= 1, got {blocks}", option="--blocks")
    b = int(blocks)
    return math.exp(0.5 * b * math.log1p(1.0 / b))


def in_resnet_band(ratio: float, rel: float = 1e-12) -> bool:
    """Whether ``ratio`` lies in [sqrt 2, sqrt e], up to floating-point rounding (B = 1 gives
    exactly sqrt 2, which exp/log1p may round one ulp below)."""
    return RESNET_LOWER * (1 - rel) <= ratio <= RESNET_UPPER * (1 + rel)


# --------------------------------------------------------------------------------------------
# Per-init predictions for the WN MLP (001 eq. 1-5)
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

    Forward (001 Theorem 1 generalised; docs/theory.md eq. F): conditioned on h^{l-1}, a_i is
    symmetric with E[a_i^2] = r_l ||h^{l-1}||^2 / n_{l-1} + beta_l, so
        E||h^l||^2 = n_l / 2 * (r_l ||h^{l-1}||^2 / n_{l-1} + beta_l).
    The recursion is affine, E||h^l||^2 = A_l ||x||^2 + B_l, and with x ~ N(0, I_{n_0}),
    E[1/||x||^2] = 1/(n_0 - 2), so E[||h^l||^2/||x||^2] = A_l + B_l / (n_0 - 2).
    A_l is kept as a log (it vanishes geometrically for g = 1); B_l stays bounded.

    Backward (001 Theorem 2 / eq. 5 generalised; docs/theory.md eq. B): each step multiplies
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
    """Data-dependent init (003 section 3, eq. 5-6): every pre-activation is standardised over the
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
    (001 ref. [10]).  The mean of ln ratio drifts by minus the same amount (lognormal with
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
