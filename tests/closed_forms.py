"""Closed forms of whole nets, the references the composed theory must equal (issue 28, item 3).

sigprop predicts any net by composing its steps' maps (sigprop/plans/).  The recursions below
are the per-net formulas of the papers and of docs/theory.md, written out net by net as sigprop
0.7 computed them: Theorem 1-2's MLP recursion (Arpit et al. 2019, eq. 1-5), Theorems 3-4's
ResNet recursion (eq. 6), the data-dependent init's standardized layers (Salimans & Kingma 2016,
section 3), the BN ResNet's kernel (De & Smith 2020, appendix C), the conv energy recursion
(docs/theory.md §11), the MLP's finite-width spread law (§4), and the spread of the CNN, the
ResNet and the WRN as their kinds computed them until 0.17 (``plans.spread`` composes them now).
Tests only: the product never walks a net here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sigprop import theory
from sigprop.theory import (
    ConvMoments,
    LayerMoments,
    ResNetPrediction,
    conv_bias_energy,
    conv_layer_energy,
    logaddexp,  # noqa: F401
    relu_cosine_map,
    relu_layer_log_cumulants,
    spread_c,
)


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
    """Data-dependent init (Salimans & Kingma 2016, section 3, eq. 5-6): every pre-activation is standardised
    over the
    probe batch, so E_batch[a_i^2] = 1 and, if its distribution is symmetric, E||h^l||^2 = n_l/2;
    with E[1/||x||^2] = 1/(n_0 - 2): ln rms ratio = 1/2 ln(n_l / (2 (n_0 - 2))).

    The symmetry is an approximation (exact only at layer 1); docs/theory.md shows the check.
    """
    n0 = widths[0]
    if n0 <= 2:
        return None
    return [0.5 * math.log(w / (2.0 * (n0 - 2))) for w in widths[1:]]


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
    fwd_steps = np.array(
        [spread_c(widths[j], widths[j - 1], orthogonal) / (4.0 * widths[j]) for j in range(1, L + 1)]
    )
    fwd = np.cumsum(fwd_steps)
    # backward step j (delta^{j+1} -> delta^j): mask of width n_j, W^{j+1} of shape n_{j+1} x n_j
    bwd_steps = np.array(
        [spread_c(widths[j], widths[j + 1], orthogonal) / (4.0 * widths[j]) for j in range(1, L)] + [0.0]
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


def resnet_log_ratio_variance(orthogonal: bool, plan, gains) -> tuple[np.ndarray, np.ndarray, list, list]:
    """The ResNet's spread as 0.16 computed it, block by block (docs/theory.md §7): per block
    ``theory.resnet_step_variance`` at its branch-to-skip ``gains`` [(forward, backward)], the
    branch's power by ``theory.branch_variance`` of its widths, a projection's by 2/d_out; the BN
    net's stem its ReLU's 3/d and its W's 2/d, a quarter in ln, and its blocks' branch power the
    batch norm's ReLU's 3/d besides the linear layer's 2/d (0.16 gave the stem (5 + 2)/(4d), a
    ReLU layer's c = 5 where no row projection precedes the ReLU, and left the blocks' 3/d out:
    docs/theory.md §7).  Per entry forward and backward, and per block its steps."""
    f_steps, b_steps = [], []
    norm = theory.SPREAD_C_HALF_GAUSSIAN / plan.dim if plan.stem else 0.0
    for blk, (g_f, g_b) in zip(plan.blocks, gains):
        v_f = theory.branch_variance(blk.widths, orthogonal) + norm
        v_b = theory.branch_variance(blk.widths[::-1], orthogonal) + norm
        v_s = 2.0 / blk.d_out if blk.projection else 0.0
        f_steps.append(theory.resnet_step_variance(g_f, v_f, v_s, blk.d_out))
        b_steps.append(theory.resnet_step_variance(g_b, v_b, v_s, blk.d_in))
    if plan.stem:
        stem = (theory.SPREAD_C_HALF_GAUSSIAN + 2.0) / (4.0 * plan.dim)
        f_steps.insert(0, stem)
        b_steps.insert(0, stem)
    var_f = np.concatenate([[0.0], np.cumsum(f_steps)])
    var_b = np.concatenate([np.cumsum(np.array(b_steps)[::-1])[::-1], [0.0]])
    return var_f, var_b, f_steps, b_steps


def wrn_log_ratio_variance(steps, gains) -> tuple[np.ndarray, np.ndarray, list]:
    """The WRN's spread as 0.16 computed it: conv1 the conv law (c = 5 over its channels), each
    block the ResNet's step law with its channels as the branch's widths and its units as the
    dimension, at ``gains`` (None: 1/B_k both ways); per state forward and backward, and per
    block the branch ratio's variance (a quarter of the branch's)."""
    from sigprop import plans

    stem = plans.layers(steps)[0]
    v_stem = theory.SPREAD_C_GAUSSIAN / (4.0 * stem.role.fan_out)
    f_steps, b_steps, branch = [v_stem], [v_stem], []
    items = [it for it in plans.nest(steps) if isinstance(it, tuple)]
    for k, (inner, close) in enumerate(items):
        chans = [inner[0].shape_in[0]] + [c.role.fan_out for c in inner]
        v_s = 2.0 / chans[-1] if close.projection is not None else 0.0
        g_f, g_b = (1.0 / close.blocks_in_stage,) * 2 if gains is None else gains[k]
        v_f = theory.branch_variance(chans, False)
        f_steps.append(theory.resnet_step_variance(g_f, v_f, v_s, math.prod(inner[-1].shape_out)))
        b_steps.append(
            theory.resnet_step_variance(
                g_b, theory.branch_variance(chans[::-1], False), v_s, math.prod(inner[0].shape_in)
            )
        )
        branch.append(v_f / 4.0)
    var_f = np.concatenate([[0.0], np.cumsum(f_steps)])
    var_b = np.concatenate([np.cumsum(np.array(b_steps)[::-1])[::-1], [0.0]])
    return var_f, var_b, branch


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


def _affine(a: float, c: float, m: LinearMoments, relu: bool) -> tuple[float, float]:
    """E||out||^2 = a s + c given E||in||^2 = (a, c) applied to s: a WN (or plain) layer with
    row second moment r and bias variance beta gives n_out (r s / n_in + beta); a ReLU halves
    it (the pre-activation is symmetric).  Arpit et al. 2019, eq. 13-17 with K_n = 1."""
    k = m.n_out * m.row_sq / m.n_in
    a, c = k * a, k * c + m.n_out * m.bias_var
    return (0.5 * a, 0.5 * c) if relu else (a, c)


def resnet_rms_prediction(dim: int, blocks: Sequence[BlockMoments]) -> ResNetPrediction:
    """Closed-form RMS ratios of a ResNet h^b = S_b h^{b-1} + alpha F_b(h^{b-1}) (Arpit et al. 2019, eq. 6).

    Forward (Arpit et al. 2019, Theorem 3 / eq. 43-53 without its assumption ||F(h)|| = ||h||): the branch's
    last
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
        ln_s = theory.logaddexp(log_a + math.log(dim), log_c)
        ln_branch_pow = theory.safe_log(blk.alpha_sq) + theory.logaddexp(
            theory.safe_log(a_f) + ln_s, theory.safe_log(c_f)
        )
        ln_skip_pow = theory.logaddexp(theory.safe_log(a_s) + ln_s, theory.safe_log(c_s))
        g_fwd.append(math.exp(min(ln_branch_pow - ln_skip_pow, 700.0)))
        branch.append(0.5 * math.log(blk.alpha_sq * a_f) if (c_f == 0.0 and blk.alpha_sq > 0) else None)
        log_a += math.log(k)
        log_c = theory.logaddexp(log_c + math.log(k), theory.safe_log(c_new))
        fwd.append(0.5 * theory.logaddexp(log_a, log_c + log_inv_x2) if log_c > -math.inf else 0.5 * log_a)
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


def datadep_resnet_ln_forward(
    dim: int, d_out: Sequence[int], projection: Sequence[bool], start: float | None = None
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
    # E||h||^2 = a ||x||^2 + c: the input's part (a = 1 until a projection replaces the skip) and
    # the standardised outputs' part c (each branch adds d_out); E[ratio^2] = a + c/(d - 2).
    # sigprop 0.7 tracked a d + c over d - 2, i.e. (1 + b) d/(d - 2) for 1 + b d/(d - 2): a
    # relative error 2/(d - 2) in the skip's share (docs/theory.md §7, "datadep").
    a, c = (1.0, 0.0) if start is None else (0.0, float(start))
    out, gains = [0.5 * math.log(a + c / (dim - 2))], []
    for n, proj in zip(d_out, projection):
        skip = float(n) if proj else a * dim + c  # the skip's power in units where ||x||^2 ~ d
        gains.append(n / skip)
        a, c = (0.0, float(n)) if proj else (a, c)
        c += n
        out.append(0.5 * math.log(a + c / (dim - 2)))
    return out, gains


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
        br = tuple(2.0 * v for v in theory.standardized(k, batch, relu=True))
        k = br if l == 0 else tuple(a + b for a, b in zip(k, br))
        out.append(k[1] / k[0])
    return out


def datadep_mlp_correlation(c0: float, layers: int, batch: int) -> list[float]:
    """Cosine of a pair after each layer of an MLP whose every pre-activation is standardized
    over the batch (the data-dependent init, Salimans & Kingma 2016, section 3.1): layer l maps
    the triple by ``_standardized`` with a ReLU."""
    k, out = (1.0, c0, 0.0), []
    for _ in range(layers):
        k = theory.standardized(k, batch, relu=True)
        out.append(k[1] / k[0])
    return out


def datadep_resnet_correlation(
    c0: float, blocks: Sequence[tuple[int, bool, float]], batch: int
) -> list[float]:
    """Cosine of a pair at h^0 .. h^B of a ResNet with data-dependent init: per block (branch
    layer count, projection, alpha^2) the branch's layers standardized (a ReLU after all but the
    last), the skip the identity or a standardized projection; kernels add (independent
    directions: no cross term)."""
    k, out = (1.0, c0, 0.0), [c0]
    for layers, projection, alpha_sq in blocks:
        f = k
        for j in range(layers):
            f = theory.standardized(f, batch, relu=j < layers - 1)
        s = theory.standardized(k, batch, relu=False) if projection else k
        k = tuple(a + alpha_sq * b for a, b in zip(s, f))
        out.append(k[1] / k[0])
    return out


def _conv_forward(
    a_map: np.ndarray, layers: Sequence[ConvMoments]
) -> tuple[list[tuple[float, float]], list[tuple[int, int]]]:
    """Per layer (ln of the input-driven energy sum, in units of the input map's sum; ln of the
    bias-driven energy sum, absolute), from an input map ``a_map`` summing to 1, and the map
    shapes.  Both maps are carried normalised with their log scale (10,000 layers stay finite)."""
    a_ln, b_map, b_ln = 0.0, np.zeros(a_map.shape), -math.inf
    out, shapes = [], [a_map.shape]
    for m in layers:
        a_new = conv_layer_energy(a_map, m, relu=True)
        sa = float(a_new.sum())
        a_ln += theory.safe_log(sa)
        a_map = a_new / sa if sa > 0 else a_new
        b_lin = conv_layer_energy(b_map, m, relu=True)  # times exp(b_ln)
        bias = conv_bias_energy(m, relu=True)  # per position, absolute
        b_tot = theory.logaddexp(
            b_ln + theory.safe_log(float(b_lin.sum())), theory.safe_log(bias * b_lin.size)
        )
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
        new = 0.5 * per_tap * theory.conv_box_adjoint(d_map, m, shapes[l - 1])
        s = float(new.sum())
        d_ln += theory.safe_log(s)
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
    fwd = [0.5 * (a if b == -math.inf else theory.logaddexp(a, b + log_inv_x2)) for a, b in parts]
    bwd = [0.5 * v for v in _conv_backward(np.full(shapes[-1], 1.0 / math.prod(shapes[-1])), layers, shapes)]
    if any(not math.isfinite(v) for v in fwd):
        return MLPPrediction(None, bwd)
    return MLPPrediction(fwd, bwd)


def cnn_conditional_prediction(
    x_energy: np.ndarray, e_energy: np.ndarray, layers: Sequence[ConvMoments]
) -> MLPPrediction:
    """The same ratios for one given input and error vector, averaged over the weights only:
    ``x_energy`` = sum_c x_{c,p}^2 [H, W], ``e_energy`` the top error's [H_L, W_L].  E_W of the
    squared ratios is then exactly A_l[x_energy]/||x||^2 + B_l/||x||^2 (and the backward map of
    e): what a probe whose inputs are shared by every draw averages to over many draws."""
    total = float(x_energy.sum())
    parts, shapes = _conv_forward(x_energy / total, layers)
    fwd = [0.5 * (a if b == -math.inf else theory.logaddexp(a, b - math.log(total))) for a, b in parts]
    bwd = [0.5 * v for v in _conv_backward(e_energy / float(e_energy.sum()), layers, shapes)]
    return MLPPrediction(fwd, bwd)


# --------------------------------------------------------------------------------------------
# the references of a scheme on a net (what sigprop 0.7's InitScheme.predict_mlp/predict_resnet
# computed, net by net)
# --------------------------------------------------------------------------------------------
def mlp_prediction(scheme, widths) -> MLPPrediction:
    """The MLP's closed form under ``scheme``: Theorems 1-2 generalised (``mlp_rms_prediction``)
    with its moments; the data-dependent init's forward approximation; else none."""
    from sigprop.inits import LayerRole

    if scheme.moments is not None:
        roles = [LayerRole(widths[i - 1], widths[i]) for i in range(1, len(widths))]
        return mlp_rms_prediction(widths, [scheme.moments(r) for r in roles])
    return MLPPrediction(
        ln_forward=datadep_ln_forward(widths) if scheme.standardizes else None, ln_backward=None
    )


def block_moments(scheme, block) -> BlockMoments:
    """The theory's view of one residual block (``kinds.resnet.Block``) under ``scheme``."""
    lin = lambda r: LinearMoments(r.fan_in, r.fan_out, scheme.moments(r).row_sq, scheme.moments(r).bias_var)
    proj = block.projection_role()
    return BlockMoments(
        branch=tuple(lin(r) for r in block.branch_roles()),
        skip=None if proj is None else lin(proj),
        alpha_sq=scheme.alpha(block.blocks_in_stage) ** 2,
    )


def resnet_prediction(scheme, plan) -> ResNetPrediction:
    """A WN / unnormalized ResNet's closed form under ``scheme`` (``resnet_rms_prediction``); the
    data-dependent init's forward approximation; else none."""
    if scheme.moments is not None:
        return resnet_rms_prediction(plan.dim, [block_moments(scheme, b) for b in plan.blocks])
    if scheme.standardizes:
        fwd, gains = datadep_resnet_ln_forward(
            plan.dim, [b.d_out for b in plan.blocks], [b.projection for b in plan.blocks]
        )
        return ResNetPrediction(fwd, None, None, gains, gains)
    n = len(plan.blocks)
    return ResNetPrediction(None, None, None, [1.0] * n, [1.0] * n)
