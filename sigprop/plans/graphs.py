"""A plan as a graph of the nodes a traced model gives (sigprop/maps/: ``dense``, ``act``,
``norm``, ``standardized``, ``scale``, ``add``), each with its maps -- issue 51's "a plan step is a
node with its maps".  ``as_graph`` builds the nodes of a plan at the init's expected moments (a
layer's ||W||^2/c_out its rows' second moment, its bias variance, a conv's window over the
positions; a ReLU that says it is positively homogeneous); ``graph_prediction`` folds them with
the graph fold that carries each node's scale as a logarithm (``maps.graph.fold_ln``) and reads
the plan's ratios off the nodes its Records name, ``graph_predict`` the whole ``Prediction``
(branch ratios and gains beside), ``graph_jacobian`` and ``graph_density`` the Jacobian's
spectrum (the nodes' ``OpMap.jacobian`` laws), ``graph_spread`` the finite-width spread (each
node's law, ``_SpreadLaws``), ``graph_pair_kernels`` the pair kernels (``_PairLaws``).  These
are the engine's theory of sigprop's own nets; the plan folds (sigprop/plans/folds.py) are their
oracle (tests/theory/test_plan_graphs.py; docs/architecture.md, "Two folds, one set of layer
maps").  No torch here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Sequence

import numpy as np

from sigprop import inits, theory
from sigprop.inits import InitScheme
from sigprop.maps import GraphNode, free, layers
from sigprop.maps.graph import fold_ln
from sigprop.plans.folds import Prediction, Spread, _plus
from sigprop.plans.steps import (
    STANDARDISED_CONV,
    BatchNorm,
    Close,
    Conv,
    Linear,
    Open,
    Record,
    Step,
    _rescaled,
    _standardised_kernel,
    input_shape,
    relu_kernels,
)

#: a ReLU's node says it is positively homogeneous (``maps.graph.fold_ln`` carries its scale)
HOMOGENEOUS = {"homogeneous": True}
#: a ReLU and its derivative as the maps read an activation (numpy, float64)
RELU = layers.pair(layers.relu)


class GraphBlock(NamedTuple):
    """A residual block among a plan's nodes: its input (``fork``), the first node of its branch
    (``first``) and of its skip path reading the fork (``skip_first``: the sum itself for an
    identity skip), its branch times alpha (``scale``), its skip's last node (``skip``: the fork
    for an identity skip), its sum (``add``) and the blocks of its stage."""

    fork: int
    first: int
    skip_first: int
    scale: int
    skip: int
    add: int
    blocks_in_stage: int


@dataclass(frozen=True)
class PlanGraph:
    """A plan's nodes, and per Record the node whose state it measures forward (``forward``) and
    the node whose gradient it measures backward (``backward``: the layer's, before its ReLU, for
    a pre-activation Record), with the units there (``units``)."""

    nodes: tuple
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    units: tuple[int, ...]
    #: the residual blocks, in the plan's order
    blocks: tuple[GraphBlock, ...] = ()
    #: per node its units per sample
    sizes: tuple[int, ...] = ()
    #: per node the nodes that read it
    readers: tuple[tuple[int, ...], ...] = ()
    #: the graph's folds so far, by (input energy, weight factor)
    folds: dict = field(default_factory=dict, compare=False, repr=False)


def _layer(st, scheme: InitScheme, inputs: tuple[int, ...], name: str) -> list[GraphNode]:
    """A weighted step's nodes: its weight layer (``dense`` at the init's expected row moment and
    bias variance, a conv with its window per spatial axis -- ``standardized`` where the init
    calibrates it), a training-mode batch norm where it has one, its ReLU."""
    if scheme.standardizes:  # calibrated on the batch: each unit mean 0, sd 1 (no moments)
        out = [
            GraphNode(
                name, "standardized", inputs, width=st.role.fan_out, params={"conv": isinstance(st, Conv)}
            )
        ]
    else:
        m = st.moments(scheme)
        mats = ()
        if isinstance(st, Conv):  # the row's second moment over its taps: k per axis, or the centre's
            centre = scheme.taps == "centre"
            mats = tuple(
                theory.conv_window(n_in, n_out, st.kernel, st.stride, st.padding, 1, centre)
                / (1 if centre else st.kernel)
                for n_in, n_out in zip(st.in_hw(), st.out_hw())
            )
        out = [
            GraphNode(
                name,
                "dense",
                inputs,
                forward=m.row_sq,
                backward=m.row_sq * m.c_out / m.c_in,  # ||W||^2 / c_in in expectation
                bias=m.bias_var,
                width=m.c_out,
                positions=isinstance(st, Conv),
                mats=mats,
                params={"s1": theory.S1_OF_DIRECTION.get(scheme.direction), "direction": scheme.direction},
            )
        ]
    if st.bn:
        out.append(GraphNode(f"{name}.bn", "norm", (-1,), forward=1.0, units=0, group=0))
    if st.relu:
        out.append(GraphNode(f"{name}.relu", "act", (-1,), fn=RELU, params=HOMOGENEOUS))
    return out


def as_graph(steps: Sequence[Step], scheme: InitScheme) -> PlanGraph:
    """The plan's nodes (``PlanGraph``): an ``input``, each weighted step's nodes (``_layer``), a
    residual block as its skip (the fork itself, or its projection's ``dense`` node) and its
    branch times alpha (``scale``, alpha^2) summed (``add``), a ``BatchNorm`` step a batch norm
    and its ReLU, and an ``output`` after the last.  A conv whose rows sit on their centre tap
    (delta-orthogonal) reads the centre tap's window alone."""
    C, H, W = input_shape(steps)
    nodes: list[GraphNode] = [GraphNode("x", "input", (), shape=(C, H, W) if H * W > 1 else (C,))]
    fwd: list[int] = []
    bwd: list[int] = []
    units: list[int] = []
    forks: list[tuple[int, int]] = []
    blocks: list[GraphBlock] = []
    cur, pre, width = 0, 0, C * H * W
    sizes = [width]  # per node, the units it carries
    for k, st in enumerate(steps):
        if isinstance(st, (Linear, Conv)):
            pre, cur, width = len(nodes), _place(nodes, _layer(st, scheme, (cur,), f"layer{k}")), st.units_out
            sizes += [width] * (len(nodes) - len(sizes))
        elif isinstance(st, BatchNorm):
            # its channels (``width``): the spread of its ReLU's share of the power (``_SpreadLaws``)
            nodes.append(
                GraphNode(f"bn{k}", "norm", (cur,), forward=1.0, units=0, group=0, width=st.channels)
            )
            nodes.append(GraphNode(f"bn{k}.relu", "act", (len(nodes) - 1,), fn=RELU, params=HOMOGENEOUS))
            sizes += [sizes[cur]] * 2
            pre = cur = len(nodes) - 1
        elif isinstance(st, Open):
            forks.append((cur, len(nodes)))
        elif isinstance(st, Close):
            fork, first = forks.pop()
            alpha = scheme.alpha(st.blocks_in_stage)
            nodes.append(GraphNode(f"alpha{k}", "scale", (cur,), forward=alpha * alpha))
            branch = len(nodes) - 1
            skip = fork
            sizes.append(sizes[cur])
            if st.projection is not None:  # its weight layer (and batch norm), no ReLU
                skip = _place(nodes, _layer(st.projection, scheme, (fork,), f"projection{k}"))
                sizes += [st.projection.units_out] * (len(nodes) - len(sizes))
            nodes.append(GraphNode(f"add{k}", "add", (skip, branch)))
            sizes.append(sizes[branch])
            pre = cur = len(nodes) - 1
            skip_first = branch + 1 if skip != fork else cur
            blocks.append(GraphBlock(fork, first, skip_first, branch, skip, cur, st.blocks_in_stage))
        elif isinstance(st, Record):
            fwd.append(cur)
            bwd.append(pre if st.pre_activation else cur)
            units.append(width)
    nodes.append(GraphNode("out", "output", (cur,)))
    sizes.append(sizes[cur])
    readers: list[list[int]] = [[] for _ in nodes]
    for i, nd in enumerate(nodes):
        for j in nd.inputs:
            readers[j].append(i)
    return PlanGraph(
        tuple(nodes),
        tuple(fwd),
        tuple(bwd),
        tuple(units),
        tuple(blocks),
        tuple(sizes),
        tuple(tuple(r) for r in readers),
    )


def _place(nodes: list, made: list) -> int:
    """Append a step's nodes, each after the one before (the first keeps its input); the last's
    index."""
    for j, nd in enumerate(made):
        nodes.append(nd if j == 0 else replace(nd, inputs=(len(nodes) - 1,)))
    return len(nodes) - 1


def _fold(g: PlanGraph, q_in: float, weight_factor: float):
    """The graph's ``fold_ln`` at input energy ``q_in`` per element, kept per graph (a
    prediction's ratios, its gains and the spectrum's mean read the same fold)."""
    key = (q_in, weight_factor)
    got = g.folds.get(key)
    if got is None:
        got = g.folds[key] = fold_ln(g.nodes, q_in, weight_factor=weight_factor)
    return got


def graph_prediction(
    steps: Sequence[Step], scheme: InitScheme, weight_factor: float = 1.0, graph: PlanGraph | None = None
):
    """(ln forward, ln backward) RMS ratios at the plan's Records by the graph fold, as
    ``plans.predict`` reads them: forward E||h||^2/||x||^2 for x ~ N(0, I_d) -- the fold run at
    ||x||^2 = d - 2 per input (its maps are affine in the input's energy, so E[1/||x||^2] =
    1/(d - 2) multiplies the bias-driven part as the plan fold's does) --, backward relative to
    the top Record for errors N(0, I) there; None where the fold gives no state (or an energy it
    cannot hold: 0)."""
    g = as_graph(steps, scheme) if graph is None else graph
    d = math.prod(input_shape(steps))
    q_in = (d - 2) / d if d > 2 else 1.0
    p = _fold(g, q_in, weight_factor)
    ln = lambda v, n, ref: None if v is None or v == -math.inf else 0.5 * (v + math.log(n) - ref)
    fwd = [ln(p.ln_q[i], n, math.log(q_in * d)) for i, n in zip(g.forward, g.units)]
    top = p.ln_r[g.backward[-1]]
    # a calibrated layer, a batch norm: no backward map (the graph has one for a batch norm, read
    # 0.005-0.052 decades above the probe on a BN WRN: measured, not shown; docs/theory.md §13)
    batch = any(getattr(st, "bn", False) or isinstance(st, BatchNorm) for st in steps)
    if scheme.standardizes or batch or top is None or top == -math.inf:
        return fwd, None
    ref = top + math.log(g.units[-1])
    return fwd, [ln(p.ln_r[i], n, ref) for i, n in zip(g.backward, g.units)]


def graph_predict(
    steps: Sequence[Step], scheme: InitScheme, weight_factor: float = 1.0, gains_at_d: bool = False
) -> Prediction:
    """``plans.predict``'s ``Prediction`` by the graph fold: the ratios at the Records
    (``graph_prediction``), each block's ln branch ratio ||alpha F(h)||/||h|| (its ``scale`` node's
    energy over its fork's), its forward branch-to-skip gain (the ``scale`` node's energy over the
    skip's last node's: at ||x||^2 = d - 2 as the ratios read them, or at ||x||^2 = d with
    ``gains_at_d``, a second fold) and its backward gain (what the branch gave the fork over what
    the skip path gave it, ``LnFold.ln_given``); where there is no backward map the forward gains
    stand for both (docs/theory.md §7)."""
    g = as_graph(steps, scheme)
    fwd, bwd = graph_prediction(steps, scheme, weight_factor, graph=g)
    d = math.prod(input_shape(steps))
    p = _fold(g, (d - 2) / d if d > 2 else 1.0, weight_factor)
    at = _fold(g, 1.0, weight_factor) if gains_at_d else p
    # an energy that is 0 (a branch times alpha = 0: SkipInit) has ln -inf
    energy = lambda f, i: -math.inf if f.ln_q[i] is None else f.ln_q[i] + math.log(g.sizes[i])
    given = lambda reader, fork: p.ln_given.get((reader, fork), -math.inf)
    branch, gains = [], []
    for b in g.blocks:
        branch.append(0.5 * (energy(p, b.scale) - energy(p, b.fork)))
        forward = math.exp(min(energy(at, b.scale) - energy(at, b.skip), 700.0))
        back = forward
        if bwd is not None:
            back = math.exp(min(given(b.first, b.fork) - given(b.skip_first, b.fork), 700.0))
        gains.append((forward, back))
    if fwd is not None and any(v is None for v in fwd):
        fwd = None
    return Prediction(fwd, bwd, branch if bwd is not None else None, gains)


def graph_density(steps: Sequence[Step], scheme: InitScheme) -> theory.SpectralDensity | None:
    """``plans.predict_density`` by the plan's graph: the large-width eigenvalue density of J J^T
    (``theory.free_density``) for a chain of weight layers, each read off its node -- its rows'
    mean squared norm, whether a ReLU reads it, its directions' S-transform coefficient, its
    units in and out; None where the graph is not such a chain (a residual sum, a conv, a batch
    norm, directions without a coefficient), for an init without moments or calibrated on the
    batch, or for one layer (a spectrum of atoms)."""
    if scheme.moments is None or scheme.standardizes:
        return None
    g = as_graph(steps, scheme)
    out = []
    for i, nd in enumerate(g.nodes):
        if nd.op == "dense" and not nd.mats:
            s1 = free.directions(nd)
            if isinstance(s1, str):
                return None
            relu = i + 1 < len(g.nodes) and g.nodes[i + 1].op == "act"
            out.append((nd.forward, relu, s1, g.sizes[nd.inputs[0]], nd.width))
        elif nd.op not in ("input", "act", "output"):
            return None
    return theory.free_density(out) if len(out) > 1 else None


def graph_spread(steps: Sequence[Step], orthogonal: bool, gains=None) -> Spread:
    """``plans.spread``'s ``Spread`` by a fold over the plan's graph: per node the cumulants of
    the per-sample ln ratio's spread, forward from the input and backward from the top Record's
    node, each node adding its law to what its input (forward) or its reader (backward) had
    (``_SpreadLaws``: a weight layer's power fluctuation, a ReLU layer's exact cumulants, a conv's
    envelope, a batch norm's ReLU share, a residual block's step law at its sum from its
    branch's widths and its gains), read at the Records' nodes.  ``orthogonal`` and ``gains`` as
    ``plans.spread`` takes them (the scheme's rows; each block's branch-to-skip power ratios,
    None for 1/B_k).  The scheme does not enter otherwise: the graph is built at He's moments."""
    g = as_graph(steps, inits.INITS["he"])  # any init with moments: the laws read widths
    laws = _SpreadLaws(g, orthogonal, gains)
    n = len(g.nodes)
    fwd: list = [None] * n
    for i, nd in enumerate(g.nodes):
        fwd[i] = (0.0, 0.0, 0.0) if nd.op == "input" else laws.forward(i, fwd)
    top = g.backward[-1]
    bwd: list = [None] * n
    bwd[top] = (0.0, 0.0, 0.0)
    for i in range(top, 0, -1):
        if bwd[i] is not None:
            for j, law in laws.backward(i):
                bwd[j] = _plus(bwd[i], law) if bwd[j] is None else bwd[j]
    return Spread(
        np.array([fwd[i] for i in g.forward]).reshape(-1, 3),
        np.array([bwd[i] for i in g.backward]).reshape(-1, 3),
        [v[0] for v in laws.variances],
        [v[1] for v in laws.variances],
        [v[2] for v in laws.variances],
    )


ZERO = (0.0, 0.0, 0.0)


class _SpreadLaws:
    """The finite-width laws of a plan's nodes (docs/theory.md §4, §7, §11), each the law of the
    step the node belongs to: a weight layer without a ReLU its power fluctuation 2/n_out (a
    quarter in ln of the norm), with one the exact cumulants of W then the mask
    (``theory.relu_layer_log_cumulants``: n the layer's units, the other side's width its fan-in
    forward, the fan-out of the layer reading its ReLU backward -- or, below a block, the units
    the block reads; its own at the top), a conv the i.i.d. rows' envelope 5/(4 c_out) once, a
    batch norm step its ReLU share's 3/(4 channels), a residual block at its sum
    ``theory.resnet_step_variance`` with its branch's power variance (``theory.branch_variance``
    over its widths, plus its batch norms'); the nodes inside a block add nothing to the
    block's input and output (its sum carries the block)."""

    def __init__(self, g: PlanGraph, orthogonal: bool, gains) -> None:
        self.g, self.orthogonal, self.gains = g, orthogonal, gains
        self.readers = g.readers
        #: per block's sum, the block's index
        self.at_sum = {b.add: k for k, b in enumerate(g.blocks)}
        self.forks = {b.fork for b in g.blocks}
        #: per block, the (forward, backward, branch ratio) variances it adds
        self.variances = [self._block(k, b) for k, b in enumerate(g.blocks)]

    def conv(self, nd) -> bool:
        return bool(nd.mats) or bool(isinstance(nd.params, dict) and nd.params.get("conv"))

    def layer(self, nd) -> bool:
        return nd.op in ("dense", "standardized")

    def envelope(self, nd) -> tuple:
        return (0.0, theory.SPREAD_C_GAUSSIAN / (4.0 * nd.width), 0.0)

    def mask(self, d, other: int) -> tuple:
        return tuple(theory.relu_layer_log_cumulants(d.width, other, self.orthogonal))

    def forward(self, i: int, fwd: list) -> tuple:
        nd, nodes = self.g.nodes[i], self.g.nodes
        if i in self.at_sum:  # a block: its step law on its input's
            k = self.at_sum[i]
            return _plus(fwd[self.g.blocks[k].fork], (0.0, self.variances[k][0], 0.0))
        src = nd.inputs[0]
        if self.layer(nd):
            if self.conv(nd):
                return _plus(fwd[src], self.envelope(nd))
            relu = any(nodes[r].op == "act" for r in self.readers[i])
            return fwd[src] if relu else _plus(fwd[src], (0.0, 2.0 / (4.0 * nd.width), 0.0))
        if nd.op == "act" and self.layer(nodes[src]) and not self.conv(nodes[src]):
            d = nodes[src]
            return _plus(fwd[d.inputs[0]], self.mask(d, self.g.sizes[d.inputs[0]]))
        if nd.op == "norm" and nd.width:  # a batch norm step (a conv's own adds nothing)
            return _plus(fwd[src], (0.0, theory.SPREAD_C_HALF_GAUSSIAN / nd.width / 4.0, 0.0))
        return fwd[src]

    def backward(self, i: int) -> list[tuple[int, tuple]]:
        """(input, the law its gradient adds passing node i to it) per input of node i."""
        nd, nodes = self.g.nodes[i], self.g.nodes
        if i in self.at_sum:  # a block: its step law, to its fork
            k = self.at_sum[i]
            return [(self.g.blocks[k].fork, (0.0, self.variances[k][1], 0.0))]
        src = nd.inputs[0] if nd.inputs else None
        if src is None:
            return []
        if nd.op == "act":  # the mask of the layer it follows (a conv's envelope there)
            own_bn = nodes[src].op == "norm" and not nodes[src].width
            layer = nodes[src] if self.layer(nodes[src]) else nodes[nodes[src].inputs[0]] if own_bn else None
            if layer is not None and self.conv(layer):
                return [(src, self.envelope(layer))]
            if layer is None or not self.layer(nodes[src]):  # a batch norm step's ReLU: its norm's law
                return [(src, ZERO)]
            return [(src, self.mask(layer, self._above(i, layer)))]
        if self.layer(nd):
            if self.conv(nd):
                return [(src, ZERO if self._relu_after(i) else self.envelope(nd))]
            return [(src, ZERO if self._relu_after(i) else (0.0, 2.0 / (4.0 * self.g.sizes[src]), 0.0))]
        if nd.op == "norm" and nd.width:
            return [(src, (0.0, theory.SPREAD_C_HALF_GAUSSIAN / nd.width / 4.0, 0.0))]
        return [(src, ZERO)]

    def _relu_after(self, i: int) -> bool:
        """Whether a ReLU follows the layer at node i (through its own batch norm: one of no
        ``width``, where a batch norm step's has its channels)."""
        nodes = self.g.nodes
        for r in self.readers[i]:
            own_bn = nodes[r].op == "norm" and not nodes[r].width
            if nodes[r].op == "act" or own_bn and any(nodes[q].op == "act" for q in self.readers[r]):
                return True
        return False

    def _above(self, i: int, layer) -> int:
        """The width on the weights' other side of the mask at ReLU node i, backward: the
        units a block reads where i is a block's input, else the fan-out of the layer reading
        it, else (the top) the layer's own."""
        if i in self.forks:
            return self.g.sizes[i]
        readers = [r for r in self.readers[i] if self.layer(self.g.nodes[r])]
        return self.g.nodes[readers[0]].width if readers else layer.width

    def _block(self, k: int, b: GraphBlock) -> tuple[float, float, float]:
        """(forward, backward, branch ratio) variances a block adds (``plans.spread``'s block
        law): its branch's widths from its first layer's input to its last layer."""
        fork, first, scale, skip, blocks_in_stage = b.fork, b.first, b.scale, b.skip, b.blocks_in_stage
        nodes, sizes = self.g.nodes, self.g.sizes
        chain = list(range(first, scale))
        inner = [nodes[j] for j in chain if self.layer(nodes[j])]
        c_in = sizes[fork]
        if self.conv(inner[0]) and inner[0].mats:
            c_in = sizes[fork] // math.prod(m.shape[1] for m in inner[0].mats)
        chans = [c_in] + [nd.width for nd in inner]
        o = self.orthogonal and not self.conv(inner[0])
        v_s = 2.0 / chans[-1] if skip != fork else 0.0
        g_f, g_b = (1.0 / blocks_in_stage,) * 2 if self.gains is None else self.gains[k]
        norms = sum(
            theory.SPREAD_C_HALF_GAUSSIAN / nodes[j].width
            for j in chain
            if nodes[j].op == "norm" and nodes[j].width
        )
        v_f = theory.branch_variance(chans, o) + norms
        v_b = theory.branch_variance(chans[::-1], o) + norms
        f = theory.resnet_step_variance(g_f, v_f, v_s, sizes[scale])
        back = theory.resnet_step_variance(g_b, v_b, v_s, sizes[fork])
        return f, back, v_f / 4.0


def graph_pair_kernels(steps: Sequence[Step], scheme: InitScheme, c0: float, batch: int) -> list[float]:
    """``plans.predict_correlation`` by a fold over the plan's graph: the cosine of two inputs'
    states at every Record, for inputs of cosine ``c0`` and equal norms, in batches of ``batch``
    inputs made of pairs.  Each node maps the three per-position kernels (K_aa, K_ab, and K_perp
    between inputs of different pairs, each summed over the channels, with their ln scale) as
    its step does (``_PairLaws``: a weight layer's window sums times its rows' second moment over
    its fan-in plus the bias variance, times its channels; a ReLU's arc-cosine law per position;
    a layer standardised over the batch, ``theory.standardized``; a block's skip plus alpha^2
    times its branch), docs/theory.md §10, §11.  Raises ValueError for a standardised conv (its
    centring mixes the positions), as the plan fold."""
    g = as_graph(steps, scheme)
    laws = _PairLaws(g, batch)
    C, H, W = input_shape(steps)
    ones = np.ones((H, W)) * C
    k: list = [None] * len(g.nodes)
    k[0] = (ones, c0 * ones, 0.0 * ones, 0.0)
    for i in range(1, len(g.nodes)):
        k[i] = laws.node(i, k)
    out = []
    for i in g.forward:
        aa = float(k[i][0].sum())
        out.append(float(k[i][1].sum()) / aa if aa > 0 else math.nan)
    return out


class _PairLaws:
    """The pair kernels through each node of a plan's graph (``graph_pair_kernels``), each node's
    law its step's (``plans.steps``' ``pair_kernels``, ``_standardised_kernel``)."""

    def __init__(self, g: PlanGraph, batch: int) -> None:
        self.g, self.batch = g, batch

    def node(self, i: int, k: list):
        nd, nodes = self.g.nodes[i], self.g.nodes
        if nd.op == "add":
            return _summed(k[nd.inputs[0]], k[nd.inputs[1]])
        x = k[nd.inputs[0]]
        if nd.op == "scale":
            if nd.forward <= 0.0:  # a branch multiplied by 0 (SkipInit): no kernel
                return (x[0] * 0.0, x[1] * 0.0, x[2] * 0.0, -math.inf)
            return (*x[:3], x[3] + math.log(nd.forward))
        if nd.op == "act":
            return _rescaled((*relu_kernels(*x[:3]), x[3]))
        if nd.op == "standardized" or nd.op == "norm":
            conv = nd.op == "norm" and not nd.width or nd.op == "standardized" and nd.params.get("conv")
            if conv:
                raise ValueError(STANDARDISED_CONV)
            # no ReLU inside: its ``act`` node follows
            return _standardised_kernel(x, False, self.g.sizes[i] // x[0].size, self.batch)
        if nd.op == "dense":
            if any(nodes[r].op == "norm" and not nodes[r].width for r in self.g.readers[i]):
                raise ValueError(STANDARDISED_CONV)
            c_in = self.g.sizes[nd.inputs[0]]
            if nd.mats:
                c_in //= math.prod(m.shape[1] for m in nd.mats)
            aa, ab, perp, ln_s = x
            b = nd.bias * math.exp(-ln_s) if nd.bias else 0.0
            f = nd.forward / c_in
            mapped = [nd.width * (f * theory.window_map(v, nd.mats) + b) for v in (aa, ab, perp)]
            return _rescaled((*mapped, ln_s))
        return x  # output


def _summed(s, f):
    """A block's sum: the skip's kernels plus the (alpha^2-scaled) branch's, at the larger scale."""
    if f[3] == -math.inf:
        return s
    M = max(s[3], f[3])
    ws, wf = math.exp(s[3] - M), math.exp(f[3] - M)
    return tuple(ws * a + wf * b for a, b in zip(s[:3], f[:3])) + (M,)


def graph_jacobian(steps: Sequence[Step], scheme: InitScheme) -> theory.SpectrumPrediction:
    """The large-width mean and normalised variance of the eigenvalues of J J^T, J the Jacobian of
    the plan's last state in its input, by the graph's Jacobian fold (``maps.free.fold_jacobian``:
    each node's law, docs/theory.md §14), as ``plans.predict_jacobian`` reads them: where a node's
    law does not hold (a conv, a batch norm, directions without an S-transform coefficient), the
    mean from the backward map (the squared RMS backward ratio from the last Record to the input
    Record) and no variance, with why."""
    if scheme.moments is None or scheme.standardizes:
        why = f"init {scheme.name}"
    else:
        g = as_graph(steps, scheme)
        states, why = free.fold_jacobian(g.nodes)
        if not why:
            mean, v = states[g.nodes[-1].inputs[0]]
            return theory.SpectrumPrediction(mean, v * mean * mean)
    mean = math.nan
    states = isinstance(steps[0], Record) and isinstance(steps[-1], Record) and not steps[-1].pre_activation
    if states and not scheme.standardizes and not any(isinstance(st, BatchNorm) for st in steps):
        back = graph_prediction(steps, scheme)[1]
        if back and back[0] is not None:
            mean = math.exp(2.0 * back[0])
    return theory.SpectrumPrediction(mean, None, f"the variance is not derived for {why} yet")


__all__ = [
    "GraphBlock",
    "PlanGraph",
    "RELU",
    "as_graph",
    "graph_density",
    "graph_jacobian",
    "graph_pair_kernels",
    "graph_predict",
    "graph_prediction",
    "graph_spread",
]
