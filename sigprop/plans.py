"""Networks as plans: sequences of steps, and their theory by composition (issue 17, first part).
No torch here.

A plan is a flat tuple of steps -- ``Linear`` (a WN or plain layer with its role, a ReLU after
it or not), ``Open`` and ``Close`` around a residual block (the skip: identity or a projection
layer; the branch multiplier alpha^2), ``Record`` where a state is measured -- built from a
spec's widths or a ``nets.ResNetPlan``.  Each step kind carries its moment map (the same affine
second-moment recursion ``theory.py`` writes per architecture), so a plan's prediction is the
composition of its steps: ``predict`` gives the ln RMS forward and backward ratios at every
``Record``.  tests/theory/test_plans.py checks the composition against ``theory.mlp_rms_prediction``
and ``theory.resnet_rms_prediction`` for every init and shape.  The engine does not run plans
yet: one walker over them is the rest of issue 17.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence, Union


from sigprop import theory
from sigprop.inits import LayerRole


@dataclass(frozen=True)
class Linear:
    """A (weight-normalized) linear layer with its role; ``relu``: a ReLU follows it."""

    role: LayerRole
    relu: bool


@dataclass(frozen=True)
class Open:
    """A residual block begins: its input is kept for the skip path."""

    stage: int = 1
    blocks_in_stage: int = 1


@dataclass(frozen=True)
class Close:
    """A residual block ends: h' = S h + alpha F(h), S the identity or the ``projection`` layer
    (a ``LayerRole``; in a conv net a ``Conv`` step, 1 x 1 and strided)."""

    blocks_in_stage: int
    projection: "LayerRole | Conv | None" = None


@dataclass(frozen=True)
class Record:
    """The state here is measured (a row of the probe's table): forward, the state the step
    before produced (after its ReLU, if any: the MLP's h^l = ReLU(a^l), Arpit et al. 2019, eq.
    1-3; a ResNet's h^b).  ``pre_activation``: the backward quantity is the gradient at the
    pre-activation of the ReLU layer just before (the MLP's dl/da^l, Arpit et al. 2019, eq. 5),
    not at its output (a ResNet's dl/dh^b)."""

    pre_activation: bool = False


@dataclass(frozen=True)
class BatchNorm:
    """Training-mode batch normalization (gamma = 1, beta = 0) followed by a ReLU, per channel
    over the batch (De & Smith 2020, appendix A).  Its moment map is not a per-sample one -- a
    sample's output depends on the whole batch -- so ``predict`` does not compose it: the BN
    net's predictions are De & Smith's mean-field recursion (``theory.bn_resnet_prediction``)."""

    eps: float


@dataclass(frozen=True)
class Conv:
    """A (weight-normalized) k x k convolution with zero padding and a ReLU after it (or not):
    ``role`` has fan_in = c_in k^2, fan_out = c_out, taps = k^2; ``shape_in`` = (c_in, H, W).
    Its moment map is spatial (the energy map, ``theory.cnn_rms_prediction``), not the
    per-sample (A, C) one: ``predict`` refuses it."""

    role: LayerRole
    shape_in: tuple[int, int, int]
    kernel: int
    stride: int = 1
    padding: int = 0
    relu: bool = True
    #: training-mode batch norm (gamma = 1, beta = 0) per channel over the batch and the positions
    #: on its output, before the ReLU (the WRN with ``--norm bn``)
    bn: bool = False

    def out_hw(self) -> tuple[int, int]:
        k, s, p = self.kernel, self.stride, self.padding
        return tuple((n + 2 * p - k) // s + 1 for n in self.shape_in[1:])

    @property
    def shape_out(self) -> tuple[int, int, int]:
        return (self.role.fan_out, *self.out_hw())


Step = Union[Linear, Open, Close, Record, BatchNorm, Conv]


def mlp_steps(widths: Sequence[int]) -> tuple[Step, ...]:
    """Layer l: Linear(n_{l-1} -> n_l) + ReLU, recorded after each (Arpit et al. 2019, eq. 1-2)."""
    steps: list[Step] = []
    for l in range(1, len(widths)):
        steps += [Linear(LayerRole(widths[l - 1], widths[l]), relu=True), Record(pre_activation=True)]
    return tuple(steps)


def resnet_steps(plan) -> tuple[Step, ...]:
    """h^0 recorded, then per block: Open, the branch's layers (a ReLU after all but the last),
    Close (with the projection of a stage's first block), Record (Arpit et al. 2019, eq. 6)."""
    steps: list[Step] = [Record()]
    for blk in plan.blocks:
        roles = blk.branch_roles()
        steps.append(Open(blk.stage, blk.blocks_in_stage))
        steps += [Linear(r, relu=j < len(roles) - 1) for j, r in enumerate(roles)]
        steps += [Close(blk.blocks_in_stage, blk.projection_role()), Record()]
    return tuple(steps)


def bn_resnet_steps(plan, eps: float) -> tuple[Step, ...]:
    """The BN ResNet of De & Smith 2020, appendix C: x^0 recorded; the stem x^1 = W^0 BN(x^0)^+;
    blocks x^{l+1} = x^l + W^l BN(x^l)^+ (identity skip, alpha = 1); each state recorded."""
    d, B = plan.dim, len(plan.blocks)
    steps: list[Step] = [Record(), BatchNorm(eps), Linear(LayerRole(d, d, "relu", B, 0), relu=False), Record()]
    for l in range(1, B + 1):
        steps += [Open(1, B), BatchNorm(eps), Linear(LayerRole(d, d, "block_last", B, l - 1), relu=False), Close(B), Record()]
    return tuple(steps)


def cnn_steps(image: tuple[int, int, int], channels: int, depth: int, strided: int = 2, kernel: int = 3) -> tuple[Step, ...]:
    """The plain CNN of Arpit et al. 2019, section 5.1 (after Xiao et al. 2018): ``depth`` k x k
    convolutions of ``channels`` channels, padding (k - 1)/2, the first ``strided`` with stride 2,
    a ReLU after each, each recorded as the MLP's layers: forward after its ReLU, backward at
    its pre-activation."""
    steps: list[Step] = []
    shape = tuple(image)
    for l in range(depth):
        role = LayerRole(shape[0] * kernel * kernel, channels, taps=kernel * kernel)
        conv = Conv(role, shape, kernel, 2 if l < strided else 1, (kernel - 1) // 2)
        steps += [conv, Record(pre_activation=True)]
        shape = conv.shape_out
    return tuple(steps)


#: Figure 5 of Arpit et al. 2019 (supplementary): conv1's channels before the widening factor k
WRN_BASE = 16
#: a bottleneck block's output channels over its inner ones (He et al. 2016, ResNet-164)
BOTTLENECK_EXPANSION = 4


def wrn_steps(image: tuple[int, int, int], blocks: int, widen: int = 1, bottleneck: bool = False, groups: int = 3,
              bn: bool = False) -> tuple[Step, ...]:
    """The wide residual network of Arpit et al. 2019, supplementary Figure 5: conv1, a 3 x 3 WN
    conv to 16 k channels (no ReLU after it: the blocks carry none after their sum and their
    branch opens with a conv), then ``groups`` groups of ``blocks`` residual blocks at 16 k, 32 k,
    64 k channels, each block h' = S h + F(h) with F = [WN conv 3 x 3 -> ReLU -> WN conv 3 x 3]
    and no non-linearity after the sum.  The first conv of groups 2 and 3 has stride 2, and
    their first block's skip S is a WN 1 x 1 stride-2 projection (the identity elsewhere).
    ``bottleneck``: ResNet-164's blocks [1 x 1 -> ReLU -> 3 x 3 -> ReLU -> 1 x 1] at 16, 32, 64
    inner channels (times k) and ``BOTTLENECK_EXPANSION`` times as many out, the stride on the
    3 x 3 conv, a projection wherever the channels or the size change (also the first block).
    Recorded: the input, conv1's output, every block's output (the residual stream).
    ``bn``: every conv (conv1, the branches', the projections) is followed by training-mode batch
    norm, before its ReLU -- the post-activation placement of He et al. 2016 in the paper's
    block, no ReLU after the sum (``Conv.bn``)."""
    if bn:
        return with_bn(wrn_steps(image, blocks, widen, bottleneck, groups), True)
    C = image[0]
    stem_out = WRN_BASE * widen
    stem = Conv(LayerRole(C * 9, stem_out, "linear", taps=9), tuple(image), 3, 1, 1, relu=False)
    steps: list[Step] = [Record(), stem, Record()]
    shape = stem.shape_out
    for g in range(groups):
        inner = WRN_BASE * widen * 2**g
        c_out = inner * (BOTTLENECK_EXPANSION if bottleneck else 1)
        for j in range(blocks):
            stride = 2 if (g > 0 and j == 0) else 1
            role = lambda fan_in, fan_out, kind, taps: LayerRole(fan_in * taps, fan_out, kind, blocks, j, taps)
            if bottleneck:
                c1 = Conv(role(shape[0], inner, "relu", 1), shape, 1, 1, 0)
                c2 = Conv(role(inner, inner, "relu", 9), c1.shape_out, 3, stride, 1)
                branch = [c1, c2, Conv(role(inner, c_out, "block_last", 1), c2.shape_out, 1, 1, 0, relu=False)]
            else:
                c1 = Conv(role(shape[0], c_out, "relu", 9), shape, 3, stride, 1)
                branch = [c1, Conv(role(c_out, c_out, "block_last", 9), c1.shape_out, 3, 1, 1, relu=False)]
            proj = None
            if stride != 1 or shape[0] != c_out:
                proj = Conv(role(shape[0], c_out, "projection", 1), shape, 1, stride, 0, relu=False)
            steps += [Open(g + 1, blocks), *branch, Close(blocks, proj), Record()]
            shape = branch[-1].shape_out
    return tuple(steps)


def with_bn(steps: Sequence[Step], bn: bool) -> tuple[Step, ...]:
    """The same plan with batch norm after every conv, projections included (``bn`` True), or
    with none (False: e.g. the BN net's lossless reference is the WN net's)."""
    from dataclasses import replace

    def set_bn(s):
        if isinstance(s, Conv):
            return replace(s, bn=bn)
        if isinstance(s, Close) and isinstance(s.projection, Conv):
            return replace(s, projection=replace(s.projection, bn=bn))
        return s

    return tuple(set_bn(s) for s in steps)


def convs(steps: Sequence[Step]) -> list[Conv]:
    """The conv steps of a plan, in order (projections included, before their block's Close)."""
    out: list[Conv] = []
    for s in steps:
        if isinstance(s, Conv):
            out.append(s)
        elif isinstance(s, Close) and isinstance(s.projection, Conv):
            out.append(s.projection)
    return out


def _blocks(steps: Sequence[Step]) -> list:
    """Nest the flat steps: each Open..Close becomes (inner steps, Close)."""
    out: list = []
    stack: list[list] = [out]
    for s in steps:
        if isinstance(s, Open):
            stack.append([])
        elif isinstance(s, Close):
            inner = stack.pop()
            stack[-1].append((inner, s))
        else:
            stack[-1].append(s)
    if len(stack) != 1:
        raise ValueError("an Open without its Close")
    return out


Moments = Callable[[LayerRole], theory.LayerMoments]


def predict(steps: Sequence[Step], moments: Moments, alpha: Callable[[int], float], dim: int
            ) -> tuple[list[float] | None, list[float]]:
    """ln RMS ratios at every Record: forward ||h||/||x||, backward ||dl/d(state)|| relative to
    the last Record's, by composing the steps' moment maps.

    Forward: the state is (A, C) with E||h||^2 = A ||x||^2 + C (``theory._affine`` per Linear;
    a Close adds the skip's and alpha^2 times the branch's second moments: the cross term
    vanishes in expectation), read as E[||h||^2/||x||^2] = A + C/(d - 2) for x ~ N(0, I_d).
    Backward (walking the steps in reverse): a Linear multiplies E||d||^2 by its row second
    moment r, a ReLU's mask by 1/2 -- applied where the walk passes the ReLU; a block by
    r_S + alpha^2 (its branch's factor; the two paths' cross term vanishes).  A pre-activation
    Record (the MLP's dl/da^l) is read behind its layer's mask; the top Record is the
    reference (the error vector is given there).
    Forward is None where C/(d - 2) diverges (d <= 2 with a bias)."""
    if any(isinstance(s, BatchNorm) for s in steps):
        raise ValueError("a BatchNorm step has no per-sample moment map (theory.bn_resnet_prediction predicts the BN net)")
    if any(isinstance(s, Conv) for s in steps):
        raise ValueError("a Conv step's moment map is spatial (theory.cnn_rms_prediction predicts conv nets)")
    tree = _blocks(steps)
    log_inv_x2 = -math.log(dim - 2) if dim > 2 else math.inf
    lae, ln = theory._lae, theory._ln

    def layer(la: float, lc: float, role: LayerRole, relu: bool) -> tuple[float, float]:
        """A layer's moment map (``theory._affine``) on (log A, log C): A' = k A, C' = k C + bias."""
        m = moments(role)
        k, bias = theory._affine(1.0, 0.0, theory.LinearMoments(role.fan_in, role.fan_out, m.row_sq, m.bias_var), relu)
        return la + ln(k), lae(lc + ln(k), ln(bias))

    # forward, in logs: (log A, log C)
    fwd: list[float] = []

    def forward(items, la: float, lc: float) -> tuple[float, float]:
        for it in items:
            if isinstance(it, Linear):
                la, lc = layer(la, lc, it.role, it.relu)
            elif isinstance(it, Record):
                fwd.append(0.5 * (la if lc == -math.inf else lae(la, lc + log_inv_x2)))
            else:
                inner, close = it
                fa, fc = forward(inner, la, lc)  # the branch (its Records, if any, are not block outputs)
                sa, sc = (la, lc) if close.projection is None else layer(la, lc, close.projection, relu=False)
                a2 = ln(alpha(close.blocks_in_stage) ** 2)
                la, lc = lae(sa, fa + a2), lae(sc, fc + a2)
        return la, lc

    forward(tree, 0.0, -math.inf)
    # backward, walking in reverse: ln E||d||^2 relative to the top Record
    def branch_factor(items) -> float:
        """ln of E||J^T d||^2 / E||d||^2 through a branch's layers (no Records inside)."""
        lf = 0.0
        for it in reversed(items):
            if isinstance(it, Linear):
                lf += (ln(0.5) if it.relu else 0.0) + ln(moments(it.role).row_sq)
        return lf

    bwd: list[float] = []
    lb, top, mask_done = 0.0, True, False
    for it in reversed(tree):
        if isinstance(it, Record):
            if it.pre_activation:
                if not top:
                    lb += ln(0.5)  # the mask of the ReLU this Record stands behind
                mask_done = True
            bwd.append(0.5 * lb)
            top = False
        elif isinstance(it, Linear):
            if it.relu and not mask_done:
                lb += ln(0.5)
            lb += ln(moments(it.role).row_sq)
            mask_done = False
        else:
            inner, close = it
            r_s = 1.0 if close.projection is None else moments(close.projection).row_sq
            lb += lae(ln(r_s), ln(alpha(close.blocks_in_stage) ** 2) + branch_factor(inner))
            mask_done = False
    bwd.reverse()
    out_fwd = None if any(not math.isfinite(v) for v in fwd) else fwd
    return out_fwd, bwd



class _Energy:
    """An energy map (E sum_c h_{c,p}^2 per position) carried as its map normalised to sum 1
    and the ln of its sum, so that 10,000 layers stay finite (docs/theory.md §11)."""

    def __init__(self, m, ln: float) -> None:
        self.m, self.ln = m, ln

    @classmethod
    def of(cls, arr, ln: float = 0.0) -> "_Energy":
        """exp(ln) * arr, normalised."""
        s = float(arr.sum())
        return cls(arr / s, ln + math.log(s)) if s > 0 and ln > -math.inf else cls(arr * 0.0, -math.inf)

    def plus(self, other: "_Energy", w_ln: float = 0.0) -> "_Energy":
        """self + exp(w_ln) other (maps of one shape)."""
        b = other.ln + w_ln
        if b == -math.inf:
            return self
        if self.ln == -math.inf:
            return _Energy(other.m, b)
        M = max(self.ln, b)
        return _Energy.of(self.m * math.exp(self.ln - M) + other.m * math.exp(b - M), M)


ConvMomentsOf = Callable[[Conv], theory.ConvMoments]


def predict_conv(steps: Sequence[Step], moments: ConvMomentsOf, alpha: Callable[[int], float], x_energy=None, e_energy=None,
                 gains: list | None = None) -> tuple[list[float] | None, list[float], list[float]]:
    """ln RMS ratios of a conv net (plain or residual) at every Record -- forward ||h||/||x||,
    backward relative to the top Record -- and the ln RMS branch ratio ||alpha F(h)||/||h|| of
    every residual block, by composing the per-position energy maps of docs/theory.md §11 (the
    conv net's ``predict``).

    Forward the state is (A, B): the input-driven map A[x] (linear in x's energy map) and the
    bias-driven map B; a conv maps both (``theory.conv_layer_energy``, halved by its ReLU) and
    adds its bias energy to B; a block sums the skip's maps (the identity, or the 1 x 1 strided
    projection, which samples e(s q)) and alpha^2 times the branch's -- the cross term vanishes
    in expectation, the branch's last conv being sign-symmetric.  E||h||^2/||x||^2 = sum A +
    sum B E[1/||x||^2], with 1/(d - 2) for x ~ N(0, I_d).  Backward the gradient map is
    scattered back through each conv's transposed window (times row_sq / k^2), halved where the
    walk passes a ReLU, and a block sums the skip's and alpha^2 times the branch's maps.
    ``x_energy`` [H, W] / ``e_energy``: the prediction conditional on one given input / top
    error (the probe shares them across draws); by default the inputs and errors are N(0, I).
    ``gains``: a list to receive, per block, (forward, backward) branch-to-skip power ratios --
    alpha^2 E||F||^2 / E||S h||^2 and the same of the gradients through the two paths -- the input
    of the finite-width spread (``stats.wrn_variances``)."""
    import numpy as np

    if any(isinstance(s, (BatchNorm, Linear)) or getattr(s, "bn", False) for s in steps):
        raise ValueError("predict_conv composes conv steps without batch norm only")
    tree = _blocks(steps)
    first = convs(steps)[0]
    C, H, W = first.shape_in
    if x_energy is None:
        x_energy = np.full((H, W), 1.0 / (H * W))
        log_inv_x2 = -math.log(C * H * W - 2) if C * H * W > 2 else math.inf
    else:
        log_inv_x2 = -math.log(float(x_energy.sum()))
    lae, ln = theory._lae, theory._ln

    def conv(state, st: Conv, relu: bool):
        m = moments(st)
        a, b = state
        a = _Energy.of(theory.conv_layer_energy(a.m, m, relu), a.ln)
        bias = theory.conv_bias_energy(m, relu)
        shape = st.out_hw()
        b = _Energy.of(theory.conv_layer_energy(b.m, m, relu), b.ln).plus(_Energy.of(np.full(shape, 1.0 / math.prod(shape))),
                                                                         ln(bias * math.prod(shape)))
        return a, b

    total = lambda s: lae(s[0].ln, s[1].ln + log_inv_x2)
    fwd: list[float] = []
    branch: list[float] = []
    fwd_gains: list[float] = []
    bwd_gains: list[float] = []

    def forward(items, state):
        for it in items:
            if isinstance(it, Conv):
                state = conv(state, it, it.relu)
            elif isinstance(it, Record):
                fwd.append(0.5 * total(state))
            else:
                inner, close = it
                f = forward(inner, state)
                s = state if close.projection is None else conv(state, close.projection, relu=False)
                a2 = ln(alpha(close.blocks_in_stage) ** 2)
                branch.append(0.5 * (a2 + total(f) - total(state)))
                fwd_gains.append(math.exp(min(a2 + total(f) - total(s), 700.0)))
                state = (s[0].plus(f[0], a2), s[1].plus(f[1], a2))
        return state

    forward(tree, (_Energy.of(x_energy / float(x_energy.sum())), _Energy(np.zeros((H, W)), -math.inf)))

    def back(d: _Energy, st: Conv) -> _Energy:
        m = moments(st)
        per_tap = m.row_sq / (1 if m.taps == "centre" else m.kernel**2)
        return _Energy.of(theory._box_adjoint(d.m, m, st.shape_in[1:]), d.ln + ln(per_tap))

    top_shape = convs(steps)[-1].out_hw()
    d = _Energy.of(np.full(top_shape, 1.0) if e_energy is None else np.asarray(e_energy, dtype=float))
    bwd: list[float] = []
    top, mask_done = True, False
    for it in reversed(tree):
        if isinstance(it, Record):
            if it.pre_activation:
                if not top:
                    d = _Energy(d.m, d.ln + ln(0.5))  # the mask of the ReLU this Record stands behind
                mask_done = True
            bwd.append(0.5 * d.ln)
            top = False
        elif isinstance(it, Conv):
            if it.relu and not mask_done:
                d = _Energy(d.m, d.ln + ln(0.5))
            d, mask_done = back(d, it), False
        else:
            inner, close = it
            s = d if close.projection is None else back(d, close.projection)
            f = d
            for st in reversed(inner):
                if st.relu:
                    f = _Energy(f.m, f.ln + ln(0.5))
                f = back(f, st)
            a2 = ln(alpha(close.blocks_in_stage) ** 2)
            bwd_gains.append(math.exp(min(a2 + f.ln - s.ln, 700.0)))
            d, mask_done = s.plus(f, a2), False
    bwd.reverse()
    if gains is not None:
        gains[:] = list(zip(fwd_gains, reversed(bwd_gains)))
    top_ln = bwd and bwd[-1]
    bwd = [v - top_ln for v in bwd]
    out_fwd = None if any(not math.isfinite(v) for v in fwd) else fwd
    return out_fwd, bwd, branch


def predict_conv_correlation(steps: Sequence[Step], moments: ConvMomentsOf, alpha: Callable[[int], float], c0: float) -> list[float]:
    """The infinite-width cosine of two inputs' states at every Record of a conv net, for inputs
    x_a, x_b ~ N(0, I) of cosine c0 (docs/theory.md §11, "Correlations"): the per-position
    kernels K_aa(p), K_bb(p), K_ab(p) (E sum_c h_{c,p}^a h_{c,p}^b) go through a conv as the
    energy map does (each channel's pre-activations have second moments r/(c_in k^2) times the
    window sums, plus the bias variance), through a ReLU by the arc-cosine map per position
    (``theory._kernel_layer``'s law, Cho & Saul 2009), and a block adds the skip's kernels and
    alpha^2 times the branch's.  The cosine at a Record is sum_p K_ab / sqrt(sum_p K_aa sum_p K_bb)."""
    import numpy as np

    C, H, W = convs(steps)[0].shape_in
    ones = np.ones((H, W)) * C

    def conv(k, st: Conv, relu: bool):
        m = moments(st)
        per_tap = m.row_sq / (m.c_in * (1 if m.taps == "centre" else m.kernel**2))
        kaa, kbb, kab, ln_s = k
        b = m.bias_var * math.exp(-ln_s) if m.bias_var else 0.0
        s = [per_tap * theory._box(v, m) + b for v in (kaa, kbb, kab)]
        if relu:
            root = np.sqrt(s[0] * s[1])
            rho = np.clip(np.where(root > 0, s[2] / np.where(root > 0, root, 1.0), 0.0), -1.0, 1.0)
            j = (np.sqrt(1.0 - rho * rho) + (np.pi - np.arccos(rho)) * rho) / np.pi
            s = [0.5 * s[0], 0.5 * s[1], 0.5 * root * j]
        s = [m.c_out * v for v in s]
        top = float(max(s[0].max(), s[1].max()))
        scale = top if top > 0 else 1.0
        return s[0] / scale, s[1] / scale, s[2] / scale, ln_s + math.log(scale)

    out: list[float] = []

    def cosine(k) -> float:
        aa, bb = float(k[0].sum()), float(k[1].sum())
        return float(k[2].sum()) / math.sqrt(aa * bb) if aa > 0 and bb > 0 else math.nan

    def forward(items, k):
        for it in items:
            if isinstance(it, Conv):
                k = conv(k, it, it.relu)
            elif isinstance(it, Record):
                out.append(cosine(k))
            else:
                inner, close = it
                f = forward(inner, k)
                s = k if close.projection is None else conv(k, close.projection, relu=False)
                a2 = alpha(close.blocks_in_stage) ** 2
                M = max(s[3], f[3] if a2 > 0 else -math.inf)
                ws, wf = math.exp(s[3] - M), (a2 * math.exp(f[3] - M) if a2 > 0 else 0.0)
                k = tuple(ws * x + wf * y for x, y in zip(s[:3], f[:3])) + (M,)
        return k

    forward(_blocks(steps), (ones, ones, c0 * ones, 0.0))
    return out
