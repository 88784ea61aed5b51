"""K_n, the forward norm ratio of one WN layer at init (Arpit, Campos & Bengio 2019, Theorem 1,
eq. 3 / Theorem 5, eq. 9): the closed form, the readings of the garbled printed forms, and a
quadrature (docs/theory.md §1-2)."""

from __future__ import annotations

import math

from sigprop.errors import SigpropError


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
