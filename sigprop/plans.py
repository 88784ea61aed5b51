"""Networks as plans: sequences of steps, and their theory by composition.  No torch here.

A plan is a flat tuple of steps -- ``Linear`` (a WN or plain dense layer with its role, a ReLU
after it or not), ``Conv`` (a k x k convolution with zero padding and stride), ``Open`` and
``Close`` around a residual block (the skip: identity or a projection step; the branch
multiplier alpha^2), ``BatchNorm`` (training-mode BN and a ReLU) and ``Record`` where a state
is measured -- built by a net kind (sigprop/kinds/).  The walker runs the steps (torch: each
weighted step's op in sigprop/kernels/ops.py); the theory composes them: every step carries its
moment maps and ``predict`` / ``predict_correlation`` fold them over any plan, in the manner of
neural-tangents' ``serial`` (a layer's kernel_fn composed with the next's).

The moment maps are those of a conv net's per-position energy (docs/theory.md §11): a dense
layer is a 1 x 1 convolution on a 1 x 1 map, so one fold serves the MLP, the ResNet, the CNN
and the WRN, and the closed forms of the papers -- the MLP's product formula (Arpit et al. 2019,
Theorems 1-2), the ResNet's (1 + 1/B)^{B/2} (Theorems 3-4), the conv energy map -- are checks the
fold must equal (tests/theory/).  A layer whose scheme standardises its pre-activations over the
batch (the data-dependent init; a conv followed by batch norm) has the standardised map: its
output energy is its units (halved by a ReLU) whatever its input, and it has no backward map.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Sequence, Union

import numpy as np

from sigprop import theory
from sigprop.inits import InitScheme, LayerRole


# --------------------------------------------------------------------------------------------
# the steps
# --------------------------------------------------------------------------------------------
class _Layer:
    """What a weighted step (``Linear``, ``Conv``) owns of the theory: its energy maps forward
    (``energy``: the input- and bias-driven maps through the layer, or its units where it
    standardises) and backward (``energy_back``), read by ``predict``; a subclass gives
    ``moments``, ``out_hw``, ``in_hw``, ``units_out``, ``relu`` and ``bn``."""

    def scaled_moments(self, scheme: InitScheme, weight_factor: float = 1.0) -> theory.ConvMoments:
        """The layer as the energy map reads it, its rows' second moment times ``weight_factor``."""
        m = self.moments(scheme)
        return m if weight_factor == 1.0 else replace(m, row_sq=m.row_sq * weight_factor)

    def energy(self, state, scheme: InitScheme, weight_factor: float, relu: bool):
        """(A, B) -> the layer's (A, B): the input-driven map through ``theory.conv_layer_energy``
        (halved by its ReLU), the bias-driven map likewise plus the bias energy; a layer that
        standardises (the data-dependent init, batch norm) resets them to A = 0, B = its units
        (halved by a ReLU) per sample, whatever came in (docs/theory.md §3, §11)."""
        shape = self.out_hw()
        flat = lambda total_ln: _Energy.of(np.full(shape, 1.0 / math.prod(shape)), total_ln)
        if scheme.standardizes or self.bn:
            scale = 1.0 if self.bn else weight_factor  # a batch norm's output does not see its layer's scale
            return _Energy(np.zeros(shape), -math.inf), flat(
                theory.safe_log(self.units_out * (0.5 if relu else 1.0) * scale)
            )
        m = self.scaled_moments(scheme, weight_factor)
        a, b = state
        a = _Energy.of(theory.conv_layer_energy(a.m, m, relu), a.ln)
        bias = theory.conv_bias_energy(m, relu)
        # no bias-driven energy yet: its map is zero whatever the layer does (not computed)
        b = (
            _Energy(np.zeros(shape), -math.inf)
            if b.ln == -math.inf
            else _Energy.of(theory.conv_layer_energy(b.m, m, relu), b.ln)
        )
        b = b.plus(flat(0.0), theory.safe_log(bias * math.prod(shape)))
        return a, b

    def energy_back(self, d, scheme: InitScheme, weight_factor: float):
        """The gradient's energy map scattered back through the layer's transposed window, times
        row_sq / k^2 (row_sq with the centre tap only)."""
        m = self.scaled_moments(scheme, weight_factor)
        per_tap = m.row_sq / (1 if m.taps == "centre" else m.kernel**2)
        return _Energy.of(theory.conv_box_adjoint(d.m, m, self.in_hw()), d.ln + theory.safe_log(per_tap))

    def jacobian_moments(self, scheme: InitScheme) -> tuple[float, float] | str:
        """(mean squared row norm, S-transform coefficient of its directions) of a dense layer for
        ``predict_jacobian``, or why its spectrum is not derived (a conv's, a batch-normed one's)."""
        if self.bn:
            return "batch norm"
        s1 = theory.S1_OF_DIRECTION.get(scheme.direction)
        if s1 is None:
            return f"{scheme.direction} directions"
        return scheme.moments(self.role).row_sq, s1

    def pair_kernels(self, k, scheme: InitScheme, batch: int, relu: bool | None = None):
        """The three kernels (K_aa, K_ab, K_perp per position, and their ln scale) through the
        layer (``relu`` None: its own ReLU): pre-activation second moments r/(c_in k^2) times the
        window sums plus the bias variance, the arc-cosine law per position after a ReLU, c_out
        channels summed; a standardised layer centres and scales each unit over the batch
        (docs/theory.md §10, §11 "Correlations")."""
        relu = self.relu if relu is None else relu
        if scheme.standardizes or self.bn:
            if isinstance(self, Conv):
                raise ValueError(
                    "standardised convs have no correlation map (their centring mixes the positions)"
                )
            return _standardised_kernel(k, relu, self.role.fan_out, batch)
        m = self.moments(scheme)
        per_tap = m.row_sq / (m.c_in * (1 if m.taps == "centre" else m.kernel**2))
        aa, ab, perp, ln_s = k
        b = m.bias_var * math.exp(-ln_s) if m.bias_var else 0.0
        s = [per_tap * theory.conv_box(v, m) + b for v in (aa, ab, perp)]
        if relu:
            live = np.where(s[0] > 0, s[0], 1.0)
            j = lambda x: theory.relu_cosine_maps(np.where(s[0] > 0, x / live, 0.0))
            s = [0.5 * s[0], 0.5 * s[0] * j(s[1]), 0.5 * s[0] * j(s[2])]
        return _rescaled(tuple(m.c_out * v for v in s) + (ln_s,))


@dataclass(frozen=True)
class Linear(_Layer):
    """A (weight-normalized) dense layer with its role; ``relu``: a ReLU follows it."""

    role: LayerRole
    relu: bool = True
    #: a dense layer is never followed by a batch norm here (a conv may be: ``Conv.bn``)
    bn: ClassVar[bool] = False

    @property
    def units_out(self) -> int:
        return self.role.fan_out

    def out_hw(self) -> tuple[int, int]:
        return (1, 1)

    def in_hw(self) -> tuple[int, int]:
        return (1, 1)

    def moments(self, scheme: InitScheme) -> theory.ConvMoments:
        """The layer as the energy map reads it: a 1 x 1 convolution of n_in channels."""
        m = scheme.moments(self.role)
        return theory.ConvMoments(
            self.role.fan_in, self.role.fan_out, 1, 1, 0, m.row_sq, m.bias_var, scheme.taps
        )


@dataclass(frozen=True)
class Conv(_Layer):
    """A (weight-normalized) k x k convolution with zero padding and a ReLU after it (or not):
    ``role`` has fan_in = c_in k^2, fan_out = c_out, taps = k^2; ``shape_in`` = (c_in, H, W)."""

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

    def in_hw(self) -> tuple[int, int]:
        return tuple(self.shape_in[1:])

    def jacobian_moments(self, scheme: InitScheme) -> str:
        return "convolutions"

    @property
    def shape_out(self) -> tuple[int, int, int]:
        return (self.role.fan_out, *self.out_hw())

    @property
    def units_out(self) -> int:
        return math.prod(self.shape_out)

    def moments(self, scheme: InitScheme) -> theory.ConvMoments:
        m = scheme.moments(self.role)
        return theory.ConvMoments(
            self.shape_in[0],
            self.role.fan_out,
            self.kernel,
            self.stride,
            self.padding,
            m.row_sq,
            m.bias_var,
            scheme.taps,
        )


@dataclass(frozen=True)
class Open:
    """A residual block begins: its input is kept for the skip path."""

    stage: int = 1
    blocks_in_stage: int = 1


@dataclass(frozen=True)
class Close:
    """A residual block ends: h' = S h + alpha F(h), S the identity or the ``projection`` step
    (a ``Linear`` or a 1 x 1 strided ``Conv``, without a ReLU)."""

    blocks_in_stage: int
    projection: "Linear | Conv | None" = None


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
    over the batch (De & Smith 2020, appendix A).  Its energy map is not a per-sample one -- a
    sample's output depends on the whole batch -- so ``predict`` refuses it (the BN net's norms
    are De & Smith's mean-field recursion, ``theory.bn_resnet_prediction``); its correlation
    map is the standardised one (docs/theory.md §10)."""

    eps: float
    #: the channels (units) it normalises
    channels: int

    def pair_kernels(self, k, scheme: InitScheme, batch: int):
        """The kernels standardised over the batch, then the ReLU (``predict_correlation``)."""
        return _standardised_kernel(k, True, self.channels, batch)


Step = Union[Linear, Conv, Open, Close, Record, BatchNorm]
WEIGHTED = (Linear, Conv)


def nest(steps: Sequence[Step]) -> list:
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


def layers(steps: Sequence[Step]) -> list:
    """The weighted steps of a plan, in order (projections included, before their block's Close)."""
    out: list = []
    for s in steps:
        if isinstance(s, WEIGHTED):
            out.append(s)
        elif isinstance(s, Close) and s.projection is not None:
            out.append(s.projection)
    return out


def batch_dependent(steps: Sequence[Step]) -> bool:
    """Whether a sample's state depends on the rest of the batch: a batch norm anywhere (a
    ``BatchNorm`` step, or a layer normalised over the batch, projections included)."""
    return any(isinstance(st, BatchNorm) for st in steps) or any(st.bn for st in layers(steps))


def with_bn(steps: Sequence[Step], bn: bool) -> tuple[Step, ...]:
    """The same plan with batch norm after every weighted step, projections included (``bn``
    True), or with none (False: e.g. the BN net's lossless reference is the WN net's)."""

    def set_bn(s):
        if isinstance(s, WEIGHTED):
            return replace(s, bn=bn)
        if isinstance(s, Close) and s.projection is not None:
            return replace(s, projection=replace(s.projection, bn=bn))
        return s

    return tuple(set_bn(s) for s in steps)


def input_shape(steps: Sequence[Step]) -> tuple[int, int, int]:
    """(C, H, W) of the plan's input; a dense plan's is (n_0, 1, 1)."""
    first = layers(steps)[0]
    return tuple(first.shape_in) if isinstance(first, Conv) else (first.role.fan_in, 1, 1)


def _standardises(st, scheme: InitScheme) -> bool:
    return scheme.standardizes or st.bn


# --------------------------------------------------------------------------------------------
# the fold: RMS ratios, branch ratios and branch-to-skip gains at every Record
# --------------------------------------------------------------------------------------------
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


@dataclass
class Prediction:
    """ln RMS ratios at every Record -- forward ||h||/||x|| (None: no closed form, e.g. d <= 2
    with a bias), backward relative to the top Record (None where a step has no backward map) --
    the ln RMS branch ratio ||alpha F(h)||/||h|| of every residual block (None likewise), and per
    block the branch-to-skip power ratios (forward, backward) that the finite-width spread reads
    (the backward one is the forward's where there is no backward map)."""

    ln_forward: list[float] | None
    ln_backward: list[float] | None
    ln_branch: list[float] | None
    gains: list[tuple[float, float]]


def predict(
    steps: Sequence[Step],
    scheme: InitScheme,
    x_energy=None,
    e_energy=None,
    gains_at_d: bool = False,
    weight_factor: float = 1.0,
) -> Prediction:
    """The composition of the steps' energy maps (docs/theory.md §3, §7, §11).

    Forward the state is (A, B): the input-driven map A[x] (linear in x's energy map) and the
    bias-driven map B; a weighted step maps both (``theory.conv_layer_energy``, halved by its
    ReLU) and adds its bias energy to B; a standardised step (``scheme.standardizes`` or batch
    norm) resets them to A = 0, B = its units (halved by a ReLU); a block sums the skip's maps
    (the identity, or the projection) and alpha^2 times the branch's -- the cross term vanishes
    in expectation, the branch's last layer being sign-symmetric.  E||h||^2/||x||^2 = sum A +
    sum B E[1/||x||^2], with 1/(d - 2) for x ~ N(0, I_d).  Backward (walking the steps in
    reverse) the gradient map is scattered back through each layer's transposed window (times
    row_sq / k^2), halved where the walk passes a ReLU, and a block sums the skip's and alpha^2
    times the branch's maps; a pre-activation Record (the MLP's dl/da^l) is read behind its
    layer's mask.  ``x_energy`` [H, W] / ``e_energy``: the prediction conditional on one given
    input / top error (a probe shares them across draws); by default the inputs and errors are
    N(0, I).  The forward branch-to-skip gains compare the two paths' energies as the ratios
    read them (the bias-driven parts weighted by E[1/||x||^2]); ``gains_at_d``: at the state's
    power with ||x||^2 = d instead (the dense ResNet's spread model, docs/theory.md §7; the two
    differ only with biases, by O(1/d)).  ``weight_factor``: the same net with every weight
    layer's output variance times that factor -- its rows' second moment, or a layer the init
    standardises, its output's; a batch norm after a layer undoes it -- the alternative the
    ``theory`` verdict must tell apart (``separation``, docs/theory.md §4)."""
    if any(isinstance(s, BatchNorm) for s in steps):
        raise ValueError(
            "a BatchNorm step has no per-sample energy map (theory.bn_resnet_prediction predicts the BN net)"
        )
    tree = nest(steps)
    C, H, W = input_shape(steps)
    if x_energy is None:
        x_energy = np.full((H, W), 1.0 / (H * W))
        log_inv_x2 = -math.log(C * H * W - 2) if C * H * W > 2 else math.inf
    else:
        log_inv_x2 = -math.log(float(x_energy.sum()))
    fold = _ForwardFold(scheme, weight_factor, log_inv_x2, C * H * W if gains_at_d else None)
    fold.run(tree, (_Energy.of(x_energy / float(x_energy.sum())), _Energy(np.zeros((H, W)), -math.inf)))
    out_fwd = None if any(not math.isfinite(v) for v in fold.fwd) else fold.fwd
    if any(_standardises(st, scheme) for st in layers(steps)):
        # no backward map: the forward gains stand for both (docs/theory.md §7)
        return Prediction(out_fwd, None, None, [(g, g) for g in fold.gains])
    top = layers(steps)[-1].out_hw()
    d = _Energy.of(np.full(top, 1.0) if e_energy is None else np.asarray(e_energy, dtype=float))
    bwd, bwd_gains = _backward_fold(tree, d, scheme, weight_factor)
    return Prediction(out_fwd, bwd, fold.branch, list(zip(fold.gains, reversed(bwd_gains))))


class _ForwardFold:
    """``predict``'s forward fold: the state (A, B) through the tree (``nest``), each Record's ln
    RMS ratio (``fwd``), each block's ln branch ratio (``branch``) and forward branch-to-skip
    gain (``gains``).  E||h||^2/||x||^2 = sum A + sum B E[1/||x||^2] (``total``: the bias-driven
    part over ||x||^2; none: no E[1/||x||^2] needed -- it diverges for d <= 2, where only a
    bias-free net has a prediction); the gains at the state's power with ||x||^2 = d where
    ``d`` is given (``power``)."""

    def __init__(self, scheme: InitScheme, weight_factor: float, log_inv_x2: float, d: int | None) -> None:
        self.scheme, self.weight_factor, self.log_inv_x2, self.d = scheme, weight_factor, log_inv_x2, d
        self.fwd: list[float] = []
        self.branch: list[float] = []
        self.gains: list[float] = []

    def total(self, s) -> float:
        return s[0].ln if s[1].ln == -math.inf else theory.logaddexp(s[0].ln, s[1].ln + self.log_inv_x2)

    def power(self, s) -> float:
        return self.total(s) if self.d is None else theory.logaddexp(s[0].ln + math.log(self.d), s[1].ln)

    def run(self, items, state):
        for it in items:
            if isinstance(it, Record):
                self.fwd.append(0.5 * self.total(state))
            elif isinstance(it, tuple):
                state = self.block(*it, state)
            else:
                state = it.energy(state, self.scheme, self.weight_factor, it.relu)
        return state

    def block(self, inner, close: Close, state):
        """The skip's maps (the identity, or the projection) plus alpha^2 times the branch's: the
        cross term vanishes in expectation, the branch's last layer being sign-symmetric."""
        f = self.run(inner, state)
        s = state
        if close.projection is not None:
            s = close.projection.energy(state, self.scheme, self.weight_factor, relu=False)
        a2 = theory.safe_log(self.scheme.alpha(close.blocks_in_stage) ** 2)
        self.branch.append(0.5 * (a2 + self.total(f) - self.total(state)))
        self.gains.append(math.exp(min(a2 + self.power(f) - self.power(s), 700.0)))
        return (s[0].plus(f[0], a2), s[1].plus(f[1], a2))


def _backward_fold(tree, d: "_Energy", scheme: InitScheme, weight_factor: float):
    """``predict``'s backward fold: the gradient's energy map ``d`` from the top through the tree
    in reverse, halved where the walk passes a ReLU, a block the skip's plus alpha^2 times the
    branch's; a pre-activation Record (the MLP's dl/da^l) read behind its layer's mask.  The ln
    RMS ratios at the Records relative to the top one, and each block's backward gain (top
    first)."""
    half = theory.safe_log(0.5)
    bwd: list[float] = []
    gains: list[float] = []
    top, mask_done = True, False
    for it in reversed(tree):
        if isinstance(it, Record):
            if it.pre_activation:
                if not top:
                    d = _Energy(d.m, d.ln + half)  # the mask of the ReLU this Record stands behind
                mask_done = True
            bwd.append(0.5 * d.ln)
            top = False
        elif isinstance(it, tuple):
            inner, close = it
            s = d if close.projection is None else close.projection.energy_back(d, scheme, weight_factor)
            f = d
            for st in reversed(inner):
                if st.relu:
                    f = _Energy(f.m, f.ln + half)
                f = st.energy_back(f, scheme, weight_factor)
            a2 = theory.safe_log(scheme.alpha(close.blocks_in_stage) ** 2)
            gains.append(math.exp(min(a2 + f.ln - s.ln, 700.0)))
            d, mask_done = s.plus(f, a2), False
        else:
            if it.relu and not mask_done:
                d = _Energy(d.m, d.ln + half)
            d, mask_done = it.energy_back(d, scheme, weight_factor), False
    bwd.reverse()
    top_ln = bwd and bwd[-1]
    return [v - top_ln for v in bwd], gains


#: the alternative a ``theory`` band must tell apart: every weight layer's variance off by this
#: factor, down and up (He's g = 1 against the proposed g = sqrt 2 in a ReLU net; docs/theory.md §4)
SEPARATION_FACTOR = 2.0


@dataclass
class Separation:
    """Per Record the ln shifts (down, up) of the predicted forward and backward ratios with every
    weight layer's variance divided and multiplied by ``SEPARATION_FACTOR`` (None where the
    prediction has none)."""

    forward: list[tuple[float, float]] | None
    backward: list[tuple[float, float]] | None

    @staticmethod
    def of(base: list | None, down: list | None, up: list | None) -> list[tuple[float, float]] | None:
        if not base or not down or not up:
            return None
        return [(d - b, u - b) for b, d, u in zip(base, down, up)]

    def span(self, direction: str, a: int, b: int) -> tuple[float, float] | None:
        """The shifts of the ratio of Record a to Record b (a stage ratio)."""
        rows = self.forward if direction == "forward" else self.backward
        if rows is None:
            return None
        return (rows[a][0] - rows[b][0], rows[a][1] - rows[b][1])


def separation(steps: Sequence[Step], scheme: InitScheme, pred: Prediction, **kw) -> Separation:
    """``pred``'s shifts with every weight layer's variance halved and doubled (``predict`` with
    ``weight_factor``; ``kw``: the keywords ``pred`` was made with)."""
    lo = predict(steps, scheme, weight_factor=1.0 / SEPARATION_FACTOR, **kw)
    hi = predict(steps, scheme, weight_factor=SEPARATION_FACTOR, **kw)
    return Separation(
        Separation.of(pred.ln_forward, lo.ln_forward, hi.ln_forward),
        Separation.of(pred.ln_backward, lo.ln_backward, hi.ln_backward),
    )


def _rescaled(k):
    """Kernels divided by their largest entry, its ln added to the running scale."""
    aa, ab, perp, ln_s = k
    top = float(aa.max())
    scale = top if top > 0 else 1.0
    return aa / scale, ab / scale, perp / scale, ln_s + math.log(scale)


def _standardised_kernel(k, relu: bool, units_per_position: int, batch: int):
    """The kernels after a layer that centres and scales each unit over the batch of ``batch``
    inputs made of pairs (``theory.standardized``), a ReLU after it or not."""
    aa, ab, perp, _ = k
    out = [np.empty_like(aa) for _ in range(3)]
    for idx in np.ndindex(aa.shape):
        t = theory.standardized((float(aa[idx]), float(ab[idx]), float(perp[idx])), batch, relu)
        for j in range(3):
            out[j][idx] = units_per_position * t[j]
    return _rescaled((*out, 0.0))


def predict_correlation(steps: Sequence[Step], scheme: InitScheme, c0: float, batch: int) -> list[float]:
    """The infinite-width cosine of two inputs' states at every Record, for inputs x_a, x_b ~
    N(0, I) of cosine c0 and equal norms (docs/theory.md §10, §11 "Correlations").

    The state is three per-position kernels: K_aa(p) = E sum_c h^a_{c,p} h^a_{c,p} (= K_bb), K_ab
    (the pair) and K_perp (two inputs of different pairs: what centring over a batch reads).  A
    weighted step gives each output channel pre-activations with second moments r/(c_in k^2)
    times the window sums of the kernels plus the bias variance; at infinite width they are
    jointly Gaussian, so a ReLU maps them by the arc-cosine law per position
    (``theory.relu_cosine_map``, Cho & Saul 2009); c_out channels sum.  A standardised step --
    a data-dependent layer, batch norm (``BatchNorm`` and a ReLU, or a conv's) -- centres and
    scales each unit over the batch of ``batch`` inputs made of pairs (``theory.standardized``).
    A block adds the skip's kernels and alpha^2 times the branch's (the cross terms vanish).
    The cosine at a Record is sum_p K_ab / sum_p K_aa."""
    C, H, W = input_shape(steps)
    ones = np.ones((H, W)) * C
    out: list[float] = []

    def cosine(k) -> float:
        aa = float(k[0].sum())
        return float(k[1].sum()) / aa if aa > 0 else math.nan

    def forward(items, k):
        for it in items:
            if isinstance(it, Record):
                out.append(cosine(k))
            elif isinstance(it, tuple):
                inner, close = it
                f = forward(inner, k)
                s = (
                    k
                    if close.projection is None
                    else close.projection.pair_kernels(k, scheme, batch, relu=False)
                )
                a2 = scheme.alpha(close.blocks_in_stage) ** 2
                M = max(s[3], f[3] if a2 > 0 else -math.inf)
                ws, wf = math.exp(s[3] - M), (a2 * math.exp(f[3] - M) if a2 > 0 else 0.0)
                k = tuple(ws * x + wf * y for x, y in zip(s[:3], f[:3])) + (M,)
            else:
                k = it.pair_kernels(k, scheme, batch)
        return k

    forward(nest(steps), (ones, c0 * ones, 0.0 * ones, 0.0))
    return out


# --------------------------------------------------------------------------------------------
# the input-output Jacobian's spectrum (sigprop/spectra.py; docs/theory.md §14)
# --------------------------------------------------------------------------------------------
def upto(steps: Sequence[Step], units: int) -> tuple:
    """The plan of its first ``units`` recorded states (a leading input Record kept): the steps
    up to the (units)-th Record after it."""
    lead = 1 if steps and isinstance(steps[0], Record) else 0
    seen = 0
    for i, st in enumerate(steps[lead:], start=lead):
        if isinstance(st, Record):
            seen += 1
            if seen == units:
                return tuple(steps[: i + 1])
    return tuple(steps)


def predict_jacobian(steps: Sequence[Step], scheme: InitScheme) -> theory.SpectrumPrediction:
    """The large-width mean and variance of the eigenvalues of J J^T (J the Jacobian of the
    plan's last state in its input; docs/theory.md §14).  Dense layers compose by
    ``theory.chain_variance`` (any widths: each one's mean squared row norm, the scheme's, its
    ReLU's derivative moments and its directions' S-transform coefficient); a residual block with
    a dense branch multiplies the mean by g2 + a (g2 = 1 for an identity skip, else the
    projection's mean squared row norm) and adds ``theory.block_variance`` (a = alpha^2 times
    the branch's mean) as a layer of ratio d_out/d_in.  Other plans (convolutions, batch norm)
    take the mean from the backward map of
    ``predict`` where the input and the last state are recorded states (mean sigma^2 = the
    squared RMS backward ratio); their variance is not derived (``why`` says which step)."""

    def dense(st) -> tuple[float, float] | str:
        return st.jacobian_moments(scheme) if isinstance(st, _Layer) else "batch norm"

    def chain(items, mean: float, v: float) -> tuple[float, float] | str:
        for it in items:
            if isinstance(it, Record):
                continue
            if isinstance(it, tuple):
                inner, close = it
                branch = chain(inner, 1.0, 0.0)
                if isinstance(branch, str):
                    return branch
                a = scheme.alpha(close.blocks_in_stage) ** 2 * branch[0]
                if close.projection is None:
                    mean, v = mean * (1.0 + a), v + theory.block_variance(a, branch[1])
                    continue
                skip = dense(close.projection)
                if isinstance(skip, str):
                    return skip
                g2, s1 = skip
                r = close.projection.role.fan_out / close.projection.role.fan_in
                # S^T S in the input space: the Gram of S^T (ratio 1/r)
                v_skip = theory.gram_variance(1.0 / r, s1)
                mean *= g2 + a
                v = r * v + theory.block_variance(a, branch[1], g2, r, v_skip)
                continue
            if isinstance(it, BatchNorm):
                return "batch norm"
            layer = dense(it)
            if isinstance(layer, str):
                return layer
            g2, s1 = layer
            mu1, mu2 = theory.RELU_MU if it.relu else (1.0, 1.0)
            mean *= g2 * mu1
            v = theory.chain_variance(v, it.role.fan_out / it.role.fan_in, mu1, mu2, s1)
        return mean, v

    if scheme.moments is None or scheme.standardizes:
        got: tuple[float, float] | str = f"init {scheme.name}"
    else:
        got = chain(nest(steps), 1.0, 0.0)
    if not isinstance(got, str):
        mean, v = got
        return theory.SpectrumPrediction(mean, v * mean * mean)
    mean = math.nan
    states = isinstance(steps[0], Record) and isinstance(steps[-1], Record) and not steps[-1].pre_activation
    if states and not scheme.standardizes and not any(isinstance(st, BatchNorm) for st in steps):
        back = predict(steps, scheme).ln_backward
        if back and back[0] is not None:
            mean = math.exp(2.0 * back[0])
    return theory.SpectrumPrediction(mean, None, f"the variance is not derived for {got} yet")


def predict_density(steps: Sequence[Step], scheme: InitScheme) -> theory.SpectralDensity | None:
    """The large-width eigenvalue density of J J^T for a chain of dense layers of any widths
    (``theory.free_density``: orthogonal or iid directions, ReLU or none); None for other plans
    (residual blocks, convolutions: their S-transforms are not composed here) or where the fixed
    point cannot be followed (a spectrum of atoms: one layer)."""
    if scheme.moments is None or scheme.standardizes:
        return None
    s1 = theory.S1_OF_DIRECTION.get(scheme.direction)
    layers = []
    for st in steps:
        if isinstance(st, Record):
            continue
        if not isinstance(st, Linear) or st.bn or s1 is None:
            return None
        layers.append((scheme.moments(st.role).row_sq, st.relu, s1, st.role.fan_in, st.role.fan_out))
    return theory.free_density(layers) if len(layers) > 1 else None
