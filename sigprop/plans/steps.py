"""A plan's steps (``Linear``, ``Conv``, ``Open``, ``Close``, ``Record``, ``BatchNorm``), each
owning its moment maps beside what the walker runs, and the plan utilities (``nest`` into
``Block``s, ``layers``, ``with_bn``, ``input_shape``, ``memory``: a walk's memory from the
steps).  No torch here; the folds that compose
the maps are sigprop/plans/folds.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, NamedTuple, Sequence, Union

import numpy as np

from sigprop import theory
from sigprop.inits import InitScheme, LayerRole


# --------------------------------------------------------------------------------------------
# the steps
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


#: why a conv standardised over the batch has no pair kernels (``pair_kernels``; the graph's too)
STANDARDISED_CONV = "standardised convs have no correlation map (their centring mixes the positions)"


class _Layer:
    """What a weighted step (``Linear``, ``Conv``) owns of the theory: its energy maps forward
    (``energy``: the input- and bias-driven maps through the layer, or its units where it
    standardises) and backward (``energy_back``), read by ``predict``; a subclass gives
    ``moments``, ``out_hw``, ``in_hw``, ``units_out``, ``relu`` and ``bn``."""

    #: the visit a fold pays it (sigprop/plans/folds.py: ``fold`` calls ``f.layer(step, state)``)
    visit = "layer"

    # the finite-width spread (``plans.spread``; docs/theory.md §4, §7, §11): cumulants (drift
    # below ln RMS, variance, third) of the per-sample ln ratio a step adds
    def spread(self, orthogonal: bool) -> tuple[float, float, float]:
        """Forward through the layer: with a ReLU, ``spread_mask`` with its fan-in on the other
        side; without one, a linear layer's power fluctuation 2/n_out, a quarter of it in ln of
        the norm."""
        if not self.relu:
            return (0.0, 2.0 / (4.0 * self.role.fan_out), 0.0)
        return self.spread_mask(orthogonal, self.role.fan_in)

    def spread_back(self) -> tuple[float, float, float]:
        """Backward through a layer without a ReLU (its W^T alone): 2/n_in, a quarter in ln."""
        return (0.0, 2.0 / (4.0 * self.role.fan_in), 0.0)

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
                raise ValueError(STANDARDISED_CONV)
            return _standardised_kernel(k, relu, self.role.fan_out, batch)
        m = self.moments(scheme)
        per_tap = m.row_sq / (m.c_in * (1 if m.taps == "centre" else m.kernel**2))
        aa, ab, perp, ln_s = k
        b = m.bias_var * math.exp(-ln_s) if m.bias_var else 0.0
        s = [per_tap * theory.conv_box(v, m) + b for v in (aa, ab, perp)]
        if relu:
            s = relu_kernels(*s)
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

    def spread_mask(self, orthogonal: bool, other: int) -> tuple[float, float, float]:
        """Through the ReLU of n = fan_out units with ``other`` the width on the weights' other
        side (forward: the fan-in; backward: the fan-out of the layer above): the exact per-layer
        cumulants (``theory.relu_layer_log_cumulants``, docs/theory.md §4)."""
        return tuple(theory.relu_layer_log_cumulants(self.role.fan_out, other, orthogonal))

    def law_orthogonal(self, orthogonal: bool) -> bool:
        """Whether the orthogonal rows' law applies (a dense layer: as the init draws them)."""
        return orthogonal

    @property
    def channels_in(self) -> int:
        return self.role.fan_in

    @property
    def units_in(self) -> int:
        return self.role.fan_in

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

    def spread_mask(self, orthogonal: bool, other: int) -> tuple[float, float, float]:
        """Through the layer, either way, with its ReLU or without: the i.i.d. rows' law
        c/(4 c_out), c = 5, whatever the directions and positions -- its c_out kernels are c_out
        random rows shared by every position, so its power fluctuates at most as a dense ReLU
        layer of c_out units does (an upper envelope, not a derivation: benchmarks/conv_spread.py;
        docs/theory.md §11; a conv without a ReLU, the WRN's conv1, is given the same envelope)."""
        return (0.0, theory.SPREAD_C_GAUSSIAN / (4.0 * self.role.fan_out), 0.0)

    def spread(self, orthogonal: bool) -> tuple[float, float, float]:
        return self.spread_mask(orthogonal, self.role.fan_in)

    def spread_back(self) -> tuple[float, float, float]:
        return self.spread_mask(False, self.role.fan_in)

    def law_orthogonal(self, orthogonal: bool) -> bool:
        return False

    @property
    def channels_in(self) -> int:
        return self.shape_in[0]

    @property
    def units_in(self) -> int:
        return math.prod(self.shape_in)

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

    #: the visit a fold pays it (``fold``)
    visit = "record"


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

    #: the visit a fold pays it (``fold``)
    visit = "batch_norm"

    def power_variance(self) -> float:
        """Standardised per channel and a ReLU after it: the positive part's share of the power,
        which fluctuates by c/channels with c = 3 (a half-Gaussian's fourth moment; a ReLU
        layer's 5 less the 2 of its row projection, which a batch norm does not have), either
        way (docs/theory.md §7: 5/(4d) for the BN net's stem with its W, measured 4% below)."""
        return theory.SPREAD_C_HALF_GAUSSIAN / self.channels

    def spread(self, orthogonal: bool = False) -> tuple[float, float, float]:
        """The same in ln of the norm: a quarter (De & Smith 2020's stem)."""
        return (0.0, self.power_variance() / 4.0, 0.0)


Step = Union[Linear, Conv, Open, Close, Record, BatchNorm]
WEIGHTED = (Linear, Conv)


class Block(NamedTuple):
    """A residual block of a nested plan (``nest``): its branch's steps and its ``Close``."""

    inner: list
    close: Close

    #: the visit a fold pays it (``fold``)
    visit = "block"


def nest(steps: Sequence[Step]) -> list:
    """Nest the flat steps: each Open..Close becomes a ``Block`` (inner steps, Close)."""
    out: list = []
    stack: list[list] = [out]
    for s in steps:
        if isinstance(s, Open):
            stack.append([])
        elif isinstance(s, Close):
            inner = stack.pop()
            stack[-1].append(Block(inner, s))
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


def relu_kernels(aa, ab, perp) -> list:
    """Per position the three kernels after a ReLU of jointly Gaussian pre-activations: half the
    second moment, and each cross kernel half of it times the arc-cosine law of its cosine
    (``theory.relu_cosine_maps``); zero where the second moment is."""
    live = np.where(aa > 0, aa, 1.0)
    j = lambda x: theory.relu_cosine_maps(np.where(aa > 0, x / live, 0.0))
    return [0.5 * aa, 0.5 * aa * j(ab), 0.5 * aa * j(perp)]


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


# --------------------------------------------------------------------------------------------
# a plan's memory, estimated from its steps (``memory``)
# --------------------------------------------------------------------------------------------
#: peak temporaries of drawing one layer, in units of its weight matrix: the Gaussian draw G and
#: the Haar transform's four (sigprop/kernels/sampling.HAAR_TEMPORARIES); a proposed layer's draw
#: measured 5.01 units at 512 x 128 and 128 x 512 (tests/kinds/test_memory.py)
DRAW_TEMPORARIES = 5
#: activation buffers of the widest state a walk holds at once
ACTIVATION_BUFFERS = 8
#: float64 ln-norm buffers per recorded row and sample
LN_BUFFERS = 4


class PlanMemory(NamedTuple):
    """The bytes of one draw (``need``), the stored weights' bytes (``weights``), and what a
    captured step keeps: the largest weighted step's entries (``biggest``), the widest state's
    units (``widest``) and the weighted steps of the largest block (``block_layers``; 1 outside
    a block)."""

    need: int
    weights: int
    biggest: int
    widest: int
    block_layers: int


def _entries(step) -> int:
    return step.role.fan_in * step.role.fan_out


def memory(steps: Sequence[Step], samples: int, itemsize: int, stream: bool = False) -> PlanMemory:
    """The memory of one draw of the plan ``steps`` before anything is drawn (issue 51, item 2;
    until 0.17 each net kind wrote its own estimate, and the ResNet's streamed one left out the
    block it re-draws), for ``samples`` inputs in a dtype of ``itemsize`` bytes:

    * the stored weights, every weighted step's fan_in x fan_out entries (projections
      included), unless the walk streams them (``stream``: each layer re-drawn for the backward
      pass, a block's layers together; two blocks' worth are then held, the one walked and the
      one drawn);
    * one layer's draw temporaries, ``DRAW_TEMPORARIES`` of the largest weighted step (until
      0.17 the kinds counted four: a Haar-orthogonal MLP of random widths peaked 0.6% above);
    * the bit-packed ReLU masks of every unit a ReLU follows (a weighted step with ``relu``, a
      batch norm's), kept for the backward pass;
    * ``ACTIVATION_BUFFERS`` buffers of the widest state (a layer's input and output and their
      gradients, a block's skip and branch);
    * ``LN_BUFFERS`` float64 ln-norm buffers per recorded row (the forward and backward ratios);
    * a batch-normalised unit's normalised output, kept for its backward pass.

    Held against the storages a probe's ops create on the CPU (benchmarks/memory.py: a
    TorchDispatchMode counting live bytes; tests/kinds/test_memory.py), the estimate is at least
    the peak for every kind, stored and streamed, and at most 2.3x it on the benchmark's nets,
    2.7x on the test's small ones (the conv nets' eight activation buffers of the widest map and
    a small MLP's buffers and draw sized for its widest layer are the loosest terms;
    docs/benchmarks.md, "Memory from the steps")."""
    weighted = layers(steps)
    entries = [_entries(s) for s in weighted]
    blocks = [b for b in nest(steps) if isinstance(b, Block)]
    in_block = [layers([*b.inner, b.close]) for b in blocks]
    held = max([sum(_entries(s) for s in group) for group in in_block] + entries)
    norms = [s for s in steps if isinstance(s, BatchNorm)]
    widest = max([s.units_in for s in weighted] + [s.units_out for s in weighted])
    masks = sum((s.units_out + 7) // 8 for s in weighted if s.relu) + sum(
        (b.channels + 7) // 8 for b in norms
    )
    saved = sum(s.units_out for s in weighted if s.bn) + sum(b.channels for b in norms)
    rows = sum(isinstance(s, Record) for s in steps)
    weights = sum(entries) * itemsize
    need = (
        (2 * held * itemsize if stream else weights)
        + DRAW_TEMPORARIES * max(entries) * itemsize
        + samples * masks
        + ACTIVATION_BUFFERS * samples * widest * itemsize
        + LN_BUFFERS * rows * samples * 8
        + samples * saved * itemsize
    )
    return PlanMemory(need, weights, max(entries), widest, max([len(g) for g in in_block] + [1]))
