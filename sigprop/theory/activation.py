"""Any elementwise activation (a traced model's, docs/theory.md §13): its Gaussian moments by
Gauss-Legendre quadrature split at the kink, and the shared moments of two samples."""

from __future__ import annotations

import functools
import math

import numpy as np

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


@functools.lru_cache(maxsize=QUADRATURE_CACHE)
def bivariate_moment(phi, psi, mean_a: float, second_a: float, mean_b: float, second_b: float, cross: float):
    """E[phi(a) psi(b)] for (a, b) jointly Gaussian with means ``mean_a``, ``mean_b``, second
    moments ``second_a``, ``second_b`` and E[a b] = ``cross`` -- the two-input map of two
    activations at inputs of different scales (the states two calls of one shared layer read:
    docs/theory.md §16, "Depth that reuses its weights").  b = mean_b + sd_b (rho u + sqrt(1 -
    rho^2) w), a = mean_a + sd_a u, u, w independent standard normals: Gauss-Legendre on
    +-``QUAD_SPAN`` in each (``QUAD_NODES`` nodes per side of 0), the correlation clipped to [-1, 1]."""
    sa = math.sqrt(max(second_a - mean_a * mean_a, 0.0))
    sb = math.sqrt(max(second_b - mean_b * mean_b, 0.0))
    cov = cross - mean_a * mean_b
    rho = min(max(cov / (sa * sb), -1.0), 1.0) if sa > 0.0 and sb > 0.0 else 0.0
    t, w = _legendre(QUAD_NODES)
    x = np.concatenate([0.5 * QUAD_SPAN * (t - 1.0), 0.5 * QUAD_SPAN * (t + 1.0)])
    wt = (
        np.concatenate([0.5 * QUAD_SPAN * w, 0.5 * QUAD_SPAN * w])
        * np.exp(-0.5 * x * x)
        / math.sqrt(2.0 * math.pi)
    )
    u, v = x[:, None], x[None, :]
    a = mean_a + sa * u
    b = mean_b + sb * (rho * u + math.sqrt(max(1.0 - rho * rho, 0.0)) * v)
    fa = phi(a.ravel()).reshape(a.shape) * np.ones_like(b)
    fb = psi(b.ravel()).reshape(b.shape)
    return float(wt @ (fa * fb) @ wt)


def derivative_mean(dphi, mean: float, second: float) -> float:
    """E[phi'(z)] for z ~ N(mean, second - mean^2): Stein's factor, E[phi(z) g] = E[phi'(z)] cov(z,
    g) + E[phi(z)] E[g] for g jointly Gaussian with z."""
    return activation_moments(dphi, dphi, mean, second)[0]
