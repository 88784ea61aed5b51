"""A traced model as a graph of moment maps, and their fold (``predict_graph``).  No torch here:
the nodes are built by the traced ops (sigprop/model/ops/: each one matches its calls in
torch.fx's graph, builds its node and registers its maps with ``map_op``), and this module
composes whatever maps the nodes name, in the manner of neural-tangents' ``serial`` (docs/
theory.md §13).

The state of a node is kept per *part* (sigprop/maps/state.py ``Part``): its share of the
units, the per-element second moment q, mean m and shared moment k -- E[x(a) x(b)] for one unit
at two different samples (or two positions of one channel of a conv map), so that k - m^2 is
the variance of the units' offsets -- and, over a conv map, its profile over the positions (mean
1).  The gradient's state per part is (r, rk, profile): its second moment, its shared moment
between two positions of one channel of one sample, and its profile.  The parts' arithmetic, the
fold's context (``Fold``) and the maps' registry (``MAPS``, ``map_op``) are state.py's, below the
ops; their names are re-exported here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Sequence

from sigprop.maps import cross, gram
from sigprop.maps.state import (
    MAPS,
    Fold,
    GraphNode,
    Part,
    blend,
    merged,
    token_groups,
)


@dataclass
class GraphPrediction:
    """Per node the predicted second moment of its output per element (``q``), its mean
    (``mean``), its shared moment (``shared``) and the gradient's second moment at it (``r``,
    the output's error at r = 1); None where an unmapped op lies on the way (``unmapped``: the
    first such op's name)."""

    q: list[float | None]
    mean: list[float | None]
    r: list[float | None]
    unmapped: str
    shared: list[float | None] = field(default_factory=list)
    #: per node the shared moment of two tokens of one sample (``Part.tok``): tokens / q is the
    #: mean cosine between the tokens of one sample at infinite width (docs/theory.md §15)
    tokens: list[float | None] = field(default_factory=list)
    #: the attention maps' logit variances across keys (``Fold.regimes``)
    regimes: list[float] = field(default_factory=list)
    #: per node the mean cosine between two tokens of one sample (``_pair_cosine``)
    cosine: list[float | None] = field(default_factory=list)
    #: per attention node its weights' predicted normalised entropy (``Fold.entropy``)
    entropy: dict = field(default_factory=dict)
    #: why the gradients stop where they do ("": where the forward maps reach)
    backward_why: str = ""
    #: the weight draws read at several nodes, each with its readers' count
    shared_draws: dict = field(default_factory=dict)


def _scaled(nodes: Sequence[GraphNode], weight_factor: float) -> list[GraphNode]:
    """The nodes with every weight layer's ``forward`` and ``backward`` times ``weight_factor``."""
    weighted = {name for name, m in MAPS.items() if m.weighted}
    return [
        replace(nd, forward=nd.forward * weight_factor, backward=nd.backward * weight_factor)
        if nd.op in weighted
        else nd
        for nd in nodes
    ]


def _reaching_output(nodes: Sequence[GraphNode]) -> set[int]:
    """The nodes with a path to an output node."""
    live = {i for i, nd in enumerate(nodes) if nd.op == "output"}
    for i in range(len(nodes) - 1, -1, -1):
        if i in live:
            live.update(nodes[i].inputs)
    return live


def predict_graph(
    nodes: Sequence[GraphNode],
    q_input: float | Sequence[float],
    mean_input: float | Sequence[float] = 0.0,
    shared_input: float | Sequence[float] | None = None,
    weight_factor: float = 1.0,
) -> GraphPrediction:
    """``fold_graph``'s per-node moments (``GraphPrediction``)."""
    return _prediction(*fold_graph(nodes, q_input, mean_input, shared_input, weight_factor))


def fold_graph(
    nodes: Sequence[GraphNode],
    q_input: float | Sequence[float],
    mean_input: float | Sequence[float] = 0.0,
    shared_input: float | Sequence[float] | None = None,
    weight_factor: float = 1.0,
) -> tuple[Fold, str, str]:
    """Compose a traced model's moment maps: forward in graph order from the input's
    per-element second moment, mean and shared moment (default mean^2: independent samples and
    positions), each node's op's ``forward``; then the gradients back from the output (r = 1),
    each node's op's ``backward``, a node's r the sum over the nodes that read it (independent
    paths, as a residual stream's skip and branch).  A state is kept in parts where its units
    differ -- the inputs of a concatenation, until a layer mixes them -- since a later batch norm
    scales each channel's gradient by its own variance; and over a conv map each part carries its
    profile over the positions (mean 1): a padded conv's window sums fewer taps at the border,
    and that loss compounds layer after layer as the box filter of §11 does (docs/theory.md
    §13).  The ratios a probe measures are then sqrt(q/q_input) and sqrt(r), q and r the means
    over the units.  A forward of several tensors: ``q_input`` (and the mean, the shared moment)
    one per input node, in order.  ``weight_factor``: the same model with every weight layer's
    output variance times that factor (a layer's ||W||^2, both ways; a standardised layer's
    output), as ``plans.predict``'s.  Weights read at several nodes (``GraphNode.weight``): their
    states' and gradients' cross moments added at sums and forks (sigprop/maps/cross.py).
    Returns the fold, the first unmapped node's why and why the gradients stop ("": they do
    not)."""
    if weight_factor != 1.0:
        nodes = _scaled(nodes, weight_factor)
    n = len(nodes)
    n_in = sum(1 for nd in nodes if nd.op == "input")

    def per_input(v) -> list:
        return list(v) if isinstance(v, (list, tuple)) else [v] * n_in

    q_ins, m_ins = per_input(q_input), per_input(mean_input)
    k_ins = [m * m for m in m_ins] if shared_input is None else per_input(shared_input)
    if not len(q_ins) == len(m_ins) == len(k_ins) == n_in:
        raise ValueError(f"{n_in} input nodes, {len(q_ins)} input moments")
    fold = Fold(nodes, [None] * n, weight_factor, grads=[None] * n, poisoned=[False] * n)
    keys = cross.shared_keys(nodes)
    if keys:
        fold.cross = cross.Cross(fold, keys, merged)
        # the cross moments recurse along the graph (a 24-layer ALBERT: ~1000 nodes deep)
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 20 * n + 1000))
    seen = 0
    unmapped = ""
    live = _reaching_output(nodes)  # an op whose result nothing reads (discarded weights) is no gap
    for i, nd in enumerate(nodes):
        if nd.op == "input":
            fold.states[i] = [Part(1.0, q_ins[seen], m_ins[seen], k_ins[seen])]
            seen += 1
            continue
        if nd.op == "const" or not nd.inputs or any(fold.states[j] is None for j in nd.inputs):
            if nd.op == "unknown" and not unmapped and i in live:
                unmapped = nd.why or nd.name
            continue
        op = MAPS.get(nd.op)
        if op is not None:
            op.forward(nd, i, fold)
            gram.step(nd, i, fold, merged)  # a causal attention's position profile, downstream
        if (
            fold.states[i] is None and not unmapped and i in live
        ):  # no map, or one that could not read its inputs
            unmapped = fold.why.get(i) or nd.why or nd.name
    return fold, unmapped, _fold_back(fold)


def _fold_back(fold: Fold) -> str:
    """The gradients back from the output (r = 1), each node's op's ``backward`` once all its
    readers gave theirs -- with their shares' cross moments where a shared weight correlates them
    (``cross.BackCross``); why they stop where they do ("": they do not)."""
    nodes = fold.nodes
    back = fold.back = cross.BackCross(fold, fold.cross) if fold.cross is not None else None
    why = ""
    for i in (i for i, nd in enumerate(nodes) if nd.op == "output"):
        fold.grads[i] = [[1.0, 0.0, []] for _ in fold.states[i]] if fold.states[i] is not None else None
    for i in range(len(nodes) - 1, -1, -1):
        nd = nodes[i]
        if fold.grads[i] is None and not fold.poisoned[i]:
            continue
        if back is not None and not fold.poisoned[i] and back.forks(i):
            try:  # its readers' shares correlate through a shared weight (docs/theory.md §16)
                S, K = back.fork(i)
                fold.grads[i][0][0] += S
                fold.grads[i][0][1] += K
            except cross.Unsupported as exc:
                fold.poisoned[i] = True
                why = why or f"{SHARED_BACKWARD} ({nd.name}: through {exc})"
        op = MAPS.get(nd.op)
        if fold.poisoned[i] or op is None or op.backward is None or fold.states[i] is None:
            for j in nd.inputs:
                fold.poisoned[j] = True
            continue
        if not fold.gram:  # no causal attention: no profile to carry back
            op.backward(nd, i, [(r, rk, blend(parts)) for r, rk, parts in fold.grads[i]], fold)
            continue
        gram.finish(i, fold)  # its readers have all given: its gradient's Gram
        before = {j: _totals(fold, j) for j in nd.inputs}
        op.backward(nd, i, [(r, rk, blend(parts)) for r, rk, parts in fold.grads[i]], fold)
        given = {j: tuple(a - b for a, b in zip(_totals(fold, j), before[j])) for j in set(nd.inputs)}
        gram.back_step(nd, i, given, fold, merged)
    return why


def _totals(fold: Fold, j: int) -> tuple[float, float]:
    """Node j's gradient so far, (r, rk) of its one part ((0, 0): none yet, or several parts)."""
    g = fold.grads[j]
    return (g[0][0], g[0][1]) if g is not None and len(g) == 1 else (0.0, 0.0)


#: why a fold through shared weights stops its gradients where it does
SHARED_BACKWARD = (
    "no backward map for the gradients' cross moments through shared weights: measured only from there on"
)


def _prediction(fold: Fold, unmapped: str, backward_why: str = "") -> GraphPrediction:
    """A fold's per-node moments, each part's share-weighted (``GraphPrediction``)."""
    st, grads = fold.states, fold.grads

    def mean(f) -> list:
        return [None if s is None else sum(x.share * f(x) for x in s) for s in st]

    return GraphPrediction(
        mean(lambda x: x.q),
        mean(lambda x: x.mean),
        [
            None
            if fold.poisoned[i] or grads[i] is None
            else sum(x.share * g[0] for x, g in zip(st[i], grads[i]))
            for i in range(len(st))
        ],
        unmapped,
        mean(lambda x: x.shared),
        mean(lambda x: x.tok),
        list(fold.regimes),
        [
            None
            if s is None
            else (gram.cosine(fold.gram[i]) if i in fold.gram else _pair_cosine(s, nd.shape))
            for i, (s, nd) in enumerate(zip(st, fold.nodes))
        ],
        dict(fold.entropy),
        backward_why,
        cross.shared_draws(fold.nodes) if fold.cross is not None else {},
    )


def _pair_cosine(parts: list[Part], shape: tuple) -> float | None:
    """The mean cosine between two tokens of one sample: t/q, over the groups of two or more
    tokens where a state is kept as groups (a ViT's patches beside its class token, whose one
    token has no pair of its own: its pairs with the patches are read as theirs)."""
    if token_groups(parts) and len(shape) == 2:
        parts = [s for s in parts if s.share * shape[0] >= 1.5] or parts
    q = sum(s.share * s.q for s in parts)
    return sum(s.share * s.tok for s in parts) / q if q > 0 else None
