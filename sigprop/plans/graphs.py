"""A plan as a graph of the nodes a traced model gives (sigprop/maps/: ``dense``, ``act``,
``norm``, ``standardized``, ``scale``, ``add``), each with its maps -- issue 51's "a plan step is a
node with its maps".  ``as_graph`` builds the nodes of a plan at the init's expected moments (a
layer's ||W||^2/c_out its rows' second moment, its bias variance, a conv's window over the
positions; a ReLU that says it is positively homogeneous); ``graph_prediction`` folds them with
the graph fold that carries each node's scale as a logarithm (``maps.graph.fold_ln``) and reads
the plan's ratios off the nodes its Records name; ``graph_correlation`` reads the pair kernels.
The plan fold (``plans.predict``) stays the engine's theory: the graph fold is checked against it
as its oracle (tests/theory/test_plan_graphs.py; docs/architecture.md, "Two folds, one set of
layer maps").  No torch here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from sigprop import theory
from sigprop.inits import InitScheme
from sigprop.maps import GraphNode, layers
from sigprop.maps.free import fold_jacobian
from sigprop.maps.graph import fold_ln
from sigprop.plans.folds import NotDerived, Prediction
from sigprop.plans.steps import BatchNorm, Close, Conv, Linear, Open, Record, Step, input_shape

#: a ReLU's node says it is positively homogeneous (``maps.graph.fold_ln`` carries its scale)
HOMOGENEOUS = {"homogeneous": True}
#: a ReLU and its derivative as the maps read an activation (numpy, float64)
RELU = layers.pair(layers.relu)


@dataclass(frozen=True)
class PlanGraph:
    """A plan's nodes, and per Record the node whose state it measures forward (``forward``) and
    the node whose gradient it measures backward (``backward``: the layer's, before its ReLU, for
    a pre-activation Record), with the units there (``units``)."""

    nodes: tuple
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    units: tuple[int, ...]
    #: per residual block, in the plan's order: its fork (the block's input), the first node of
    #: its branch and of its skip path reading the fork (the sum itself for an identity skip), its
    #: branch times alpha (``scale``) and its skip's last node
    blocks: tuple[tuple[int, int, int, int, int], ...] = ()
    #: per node its units per sample
    sizes: tuple[int, ...] = ()
    #: the graph's folds so far, by (input energy, weight factor)
    folds: dict = field(default_factory=dict, compare=False, repr=False)


def _layer(st, scheme: InitScheme, inputs: tuple[int, ...], name: str) -> list[GraphNode]:
    """A weighted step's nodes: its weight layer (``dense`` at the init's expected row moment and
    bias variance, a conv with its window per spatial axis -- ``standardized`` where the init
    calibrates it), a training-mode batch norm where it has one, its ReLU."""
    if scheme.standardizes:  # calibrated on the batch: each unit mean 0, sd 1 (no moments)
        out = [GraphNode(name, "standardized", inputs, width=st.role.fan_out)]
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
    blocks: list[tuple[int, int, int, int, int]] = []
    cur, pre, width = 0, 0, C * H * W
    sizes = [width]  # per node, the units it carries
    for k, st in enumerate(steps):
        if isinstance(st, (Linear, Conv)):
            pre, cur, width = len(nodes), _place(nodes, _layer(st, scheme, (cur,), f"layer{k}")), st.units_out
            sizes += [width] * (len(nodes) - len(sizes))
        elif isinstance(st, BatchNorm):
            nodes.append(GraphNode(f"bn{k}", "norm", (cur,), forward=1.0, units=0, group=0))
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
            blocks.append((fork, first, branch + 1 if skip != fork else cur, branch, skip))
        elif isinstance(st, Record):
            fwd.append(cur)
            bwd.append(pre if st.pre_activation else cur)
            units.append(width)
    nodes.append(GraphNode("out", "output", (cur,)))
    sizes.append(sizes[cur])
    return PlanGraph(tuple(nodes), tuple(fwd), tuple(bwd), tuple(units), tuple(blocks), tuple(sizes))


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
    for fork, first, skip_first, scale, skip in g.blocks:
        branch.append(0.5 * (energy(p, scale) - energy(p, fork)))
        forward = math.exp(min(energy(at, scale) - energy(at, skip), 700.0))
        back = forward
        if bwd is not None:
            back = math.exp(min(given(first, fork) - given(skip_first, fork), 700.0))
        gains.append((forward, back))
    if fwd is not None and any(v is None for v in fwd):
        fwd = None
    return Prediction(fwd, bwd, branch if bwd is not None else None, gains)


def graph_correlation(steps: Sequence[Step], scheme: InitScheme, c0: float) -> list[float]:
    """The cosine of two inputs' states at every Record by the graph fold -- a node's shared
    moment over its second moment, for inputs of cosine ``c0`` and equal norms: the pair kernel
    ``plans.predict_correlation`` folds (docs/theory.md §10), the arc-cosine law of a ReLU being
    the graph's two-input quadrature.  Raises ``NotDerived`` for a conv (the graph's shared
    moment of a conv map is that of two positions of one sample, not of two samples) and for a
    layer standardised over the batch (the graph's batch is of independent samples, the plan
    fold's of pairs)."""
    if scheme.standardizes or any(isinstance(st, (Conv, BatchNorm)) for st in steps):
        raise NotDerived("the graph's shared moment is a pair kernel of a dense net's unstandardised layers")
    g = as_graph(steps, scheme)
    cosine = fold_ln(g.nodes, 1.0, c0).cosine
    return [math.nan if cosine[i] is None else cosine[i] for i in g.forward]


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
        states, why = fold_jacobian(g.nodes)
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
    "PlanGraph",
    "RELU",
    "as_graph",
    "graph_correlation",
    "graph_jacobian",
    "graph_predict",
    "graph_prediction",
]
