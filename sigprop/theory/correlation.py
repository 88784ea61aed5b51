"""Correlation propagation at infinite width: the ReLU kernel recursion, its collapse and depth
scale, and the batch-coupled layers' kernel triple (docs/theory.md §10)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from sigprop.theory.activation import SharedMoments


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


def relu_shared_moments(second: float, shared: float) -> SharedMoments:
    """``shared_moments`` of a ReLU at mean 0 in closed form: for (a, b) jointly Gaussian of
    second moment q and E[a b] = ``shared`` (cosine c = shared/q), E[y] = sqrt(q/(2 pi)), E[y^2] =
    q/2, E[y(a) y(b)] = (q/2) ``relu_cosine_map(c)`` (the degree-1 arc-cosine kernel), E[phi'^2]
    = 1/2 and E[phi'(a) phi'(b)] = (pi - arccos c)/(2 pi) (the degree-0 kernel, Cho & Saul 2009).
    What the graph fold reads for a ReLU that says it is positively homogeneous (a sigprop
    plan's, ``plans.graphs``): exact, where the quadrature errs by ~1e-14 a layer, and free of
    its cache, whose keys (each layer's normalised q, equal up to rounding) missed at every
    layer of a deep net (docs/theory.md §13)."""
    if second <= 0.0:
        return SharedMoments(0.0, 0.0, 0.0, 0.5, 0.5)
    c = min(max(shared / second, -1.0), 1.0)
    return SharedMoments(
        math.sqrt(second / (2.0 * math.pi)),
        0.5 * second,
        0.5 * second * relu_cosine_map(c),
        0.5,
        (math.pi - math.acos(c)) / (2.0 * math.pi),
    )


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
