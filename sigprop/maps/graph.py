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

import math
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
    scaled_parts,
    shared_draws,
    shared_keys,
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
    keys = shared_keys(nodes)
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


@dataclass
class LnFold:
    """``fold_ln``'s result: per node the ln of its state's and its gradient's second moment per
    element (None: no state, or a gradient that does not reach it) and its shared moment over its
    second moment (None likewise)."""

    ln_q: list[float | None]
    ln_r: list[float | None]
    cosine: list[float | None]
    #: per (reader, input) the ln of the gradient's second moment per element the reader gave
    #: the input (a residual block's branch and skip at its fork: their ratio is the block's
    #: backward gain)
    ln_given: dict = field(default_factory=dict)


def fold_ln(
    nodes: Sequence[GraphNode],
    q_input: float,
    shared_input: float | None = None,
    weight_factor: float = 1.0,
) -> LnFold:
    """The fold of a graph whose every op says how it scales (``OpMap.degree``: one input, no
    shared weight), each node's state and gradient carried as moments of order one times the
    exponential of a logarithm of their own -- so that a net that halves its power a layer is
    folded at any depth, where ``fold_graph``'s floats underflow past 2^-1074.  Forward, a node's
    inputs are brought to their largest scale L (a smaller one's moments multiplied by e^(l - L),
    which may underflow only where it is negligible beside the other), its ``scale_fields``
    (a weight layer's bias variance) join the max and are divided by e^L, and its map runs on
    them: the result is at scale L for a map of degree 1 and at scale 0 for one of degree 0 (a
    batch norm); then it is divided by its second moment, whose ln joins the scale.  Backward,
    the gradient a map gives is at its node's scale for a degree-1 map (its Jacobian does not
    depend on the input's scale) and at the node's less its input's forward scale for a degree-0
    one (a batch norm divides by its input's variance, read at the stored scale);
    contributions from several readers are summed at their largest scale.  Raises ValueError
    where an op has no degree (its map depends on the input's scale: GELU, a traced model's
    activations; a per-sample norm) or the graph reads a weight twice."""
    if weight_factor != 1.0:
        nodes = _scaled(nodes, weight_factor)
    n = len(nodes)
    if shared_keys(nodes) or sum(1 for nd in nodes if nd.op == "input") != 1:
        raise ValueError("fold_ln: one input and no shared weight")
    maps = []
    for nd in nodes:
        op = MAPS.get(nd.op) if nd.op != "input" else None
        if nd.op != "input" and (op is None or op.degree is None or op.degree(nd) is None):
            raise ValueError(f"fold_ln: {nd.name} ({nd.op}) does not say how it scales")
        maps.append(op)
    fold = Fold(nodes, [None] * n, weight_factor, grads=[None] * n, poisoned=[False] * n)
    k_in = 0.0 if shared_input is None else shared_input / q_input
    ln = [0.0] * n
    for i, nd in enumerate(nodes):
        if nd.op == "input":
            fold.states[i], ln[i] = [Part(1.0, 1.0, 0.0, k_in)], math.log(q_input)
            continue
        if any(fold.states[j] is None for j in nd.inputs):
            continue
        op = maps[i]
        L = max(ln[j] for j in nd.inputs)
        fields = {f: getattr(nd, f) for f in op.scale_fields}
        L = max([L] + [math.log(v) for v in fields.values() if v > 0])
        for j in set(nd.inputs):
            if ln[j] != L:
                fold.states[j], ln[j] = scaled_parts(fold.states[j], math.exp(ln[j] - L)), L
        fields = {f: math.exp(math.log(v) - L) if v > 0 else v for f, v in fields.items()}  # <= 1
        op.forward(replace(nd, **fields), i, fold)
        if fold.states[i] is None:
            continue
        base = L if op.degree(nd) == 1 else 0.0
        c = sum(x.share * x.q for x in fold.states[i])
        if c > 0.0:
            fold.states[i] = scaled_parts(fold.states[i], 1.0 / c)
        ln[i] = base + (math.log(c) if c > 0.0 else -math.inf)
    ln_given: dict = {}
    ln_r = _fold_ln_back(fold, maps, ln, ln_given)
    q: list = [None] * n
    cos: list = [None] * n
    for i, s in enumerate(fold.states):  # a state brought to a reader's scale is not of moment 1
        c = None if s is None else sum(x.share * x.q for x in s)
        if c is not None and c > 0.0 and ln[i] > -math.inf:
            q[i], cos[i] = ln[i] + math.log(c), sum(x.share * x.shared for x in s) / c
    return LnFold(q, ln_r, cos, ln_given)


def _fold_ln_back(fold: Fold, maps: list, ln: list, ln_given: dict) -> list:
    """``fold_ln``'s backward: per node the ln of its gradient's second moment per element (and
    into ``ln_given`` what each reader gave each input)."""
    nodes, n = fold.nodes, len(fold.nodes)
    ln_r: list = [None] * n
    for i, nd in enumerate(nodes):
        if nd.op == "output" and fold.states[i] is not None:
            fold.grads[i], ln_r[i] = [[1.0, 0.0, []] for _ in fold.states[i]], 0.0
    for i in range(n - 1, -1, -1):
        nd, op = nodes[i], maps[i]
        if fold.grads[i] is None or op is None or op.backward is None or fold.states[i] is None:
            continue
        c = sum(x.share * g[0] for x, g in zip(fold.states[i], fold.grads[i]))
        if c <= 0.0:
            ln_r[i] = -math.inf
            continue
        fold.grads[i], ln_r[i] = _scaled_grads(fold.grads[i], 1.0 / c), ln_r[i] + math.log(c)
        if i in fold.through:  # what passed through an activation: at its gradient's scale
            fold.through[i] = _scaled_through(fold.through[i], 1.0 / c)
        before = {j: (fold.grads[j], fold.through.pop(j, None), ln_r[j]) for j in set(nd.inputs)}
        for j in before:
            fold.grads[j] = None
        op.backward(nd, i, [(r, rk, blend(parts)) for r, rk, parts in fold.grads[i]], fold)
        for j, (old, old_through, l_old) in before.items():
            given = ln_r[i] - (ln[j] if op.degree(nd) == 0 else 0.0)
            new, new_through = fold.grads[j], fold.through.pop(j, None)
            if new is not None and fold.states[j] is not None:
                c = sum(x.share * g[0] for x, g in zip(fold.states[j], new))
                ln_given[i, j] = given + math.log(c) if c > 0.0 else -math.inf
            if new is None or old is None:  # one of them only
                fold.grads[j] = new if old is None else old
                through = new_through if old is None else old_through
                ln_r[j] = given if old is None and new is not None else l_old
            else:  # summed at the larger scale
                M = max(l_old, given)
                a, b = _scaled_grads(old, math.exp(l_old - M)), _scaled_grads(new, math.exp(given - M))
                fold.grads[j] = [[x[0] + y[0], x[1] + y[1], x[2] + y[2]] for x, y in zip(a, b)]
                ta = _scaled_through(old_through or [], math.exp(l_old - M))
                tb = _scaled_through(new_through or [], math.exp(given - M))
                through = (
                    [[x[0] + y[0], x[1] + y[1]] for x, y in zip(ta, tb)] if ta and tb else ta or tb or None
                )
                ln_r[j] = M
            if through is not None:
                fold.through[j] = through
    for i, g in enumerate(fold.grads):  # a node no map read back from (the input): its own scale
        if g is not None and fold.states[i] is not None and ln_r[i] is not None and ln_r[i] > -math.inf:
            c = sum(x.share * gi[0] for x, gi in zip(fold.states[i], g))
            ln_r[i] = ln_r[i] + math.log(c) if c > 0.0 else -math.inf
    return ln_r


def _scaled_grads(g: list, c: float) -> list:
    """A node's gradient parts (r, rk, [(r, profile), ...]) times ``c``."""
    return [[r * c, rk * c, [(x * c, p) for x, p in parts]] for r, rk, parts in g]


def _scaled_through(t: list, c: float) -> list:
    """What passed through an activation ((r, rk) per part) times ``c``."""
    return [[a * c, b * c] for a, b in t]


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
        shared_draws(fold.nodes) if fold.cross is not None else {},
    )


def _pair_cosine(parts: list[Part], shape: tuple) -> float | None:
    """The mean cosine between two tokens of one sample: t/q, over the groups of two or more
    tokens where a state is kept as groups (a ViT's patches beside its class token, whose one
    token has no pair of its own: its pairs with the patches are read as theirs)."""
    if token_groups(parts) and len(shape) == 2:
        parts = [s for s in parts if s.share * shape[0] >= 1.5] or parts
    q = sum(s.share * s.q for s in parts)
    return sum(s.share * s.tok for s in parts) / q if q > 0 else None
