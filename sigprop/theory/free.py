"""The input-output Jacobian's spectrum (docs/theory.md §14): the S-transform coefficients of the
layers, the variance of the eigenvalues of J J^T composed over the layers (Pennington, Schoenholz
& Ganguli 2018), and the large-width density by the S-equation."""

from __future__ import annotations

import cmath
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

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
