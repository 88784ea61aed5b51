"""Residual nets: the band [sqrt 2, sqrt e] of Arpit, Campos & Bengio 2019 (Theorems 3-4, eq. 7-8,
proofs eq. 43-64), the closed forms beside the composed prediction (eq. 6 generalised; the spread
per block and the stage band, docs/theory.md §7), and the batch-normalized ReLU ResNet of De &
Smith 2020, appendix C."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from sigprop.errors import SigpropError
from sigprop.results import KnRow, ResnetRow, TheoryResult
from sigprop.theory.kn import kn_closed_form, kn_quadrature
from sigprop.theory.spread import spread_c

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
