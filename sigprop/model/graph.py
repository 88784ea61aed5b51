"""A traced model as a graph of moment maps, and their fold (``predict_graph``).  No torch here:
the nodes are built by the traced ops (sigprop/model/ops/: each one matches its calls in
torch.fx's graph, builds its node and registers its maps with ``map_op``), and this module
composes whatever maps the nodes name, in the manner of neural-tangents' ``serial`` (docs/
theory.md §13).

The state of a node is kept per *part* (``Part``): its share of the units, the per-element
second moment q, mean m and shared moment k -- E[x(a) x(b)] for one unit at two different
samples (or two positions of one channel of a conv map), so that k - m^2 is the variance of the
units' offsets -- and, over a conv map, its profile over the positions (mean 1).  The gradient's
state per part is (r, rk, profile): its second moment, its shared moment between two positions
of one channel of one sample, and its profile.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from sigprop.model import cross, gram
from sigprop.registry import Registry


@dataclass(frozen=True)
class GraphNode:
    """One node of a traced model, with what its op's maps need (``MAPS[op]``; the formulas with
    their reasons in docs/theory.md §13).  Ops of the built-in traced ops: ``dense`` (Linear,
    ConvNd, ConvTransposeNd), ``standardized`` (a layer a data-dependent init calibrated),
    ``norm``, ``act``, ``mix`` (a fixed linear map per channel), ``maxpool``, ``add``, ``cat``,
    ``scale``, ``offset``, ``identity``, ``input``, ``output``, ``const``, and ``unknown`` (no
    map: ``why`` names the op; measured only from there on)."""

    name: str
    op: str
    inputs: tuple[int, ...]
    forward: float = 1.0
    backward: float = 1.0
    bias: float = 0.0
    width: int = 0
    fn: tuple | None = field(default=None, compare=False, repr=False)
    #: ``cat``: each input's share of the output's units
    shares: tuple[float, ...] = ()
    #: ``norm``: the elements one statistic is taken over, and how many offsets they hold (0:
    #: batch statistics)
    units: int = 0
    group: int = 0
    #: ``maxpool``: the elements of a window
    pool: int = 1
    #: ``dense`` (a conv), ``mix``, ``maxpool``: the map per channel over the positions, one
    #: matrix per spatial axis (n_out x n_in): a conv's taps inside the map over k (``theory.window_map``),
    #: a pooling's or interpolation's weights, a max pooling's window means
    mats: tuple = field(default=(), compare=False, repr=False)
    #: the output's shape per sample
    shape: tuple = ()
    #: ``mix`` backward: the mean of (A^T A) off its diagonal
    backward_cross: float = 0.0
    #: ``dense``: False for a Linear on a vector (its input's elements share no weights, so the
    #: gradient's shared moment does not pass)
    positions: bool = True
    why: str = ""
    #: what an op's maps read that the fields above do not hold (``attention``: its projections'
    #: factors, heads, tokens and mask; sigprop/model/ops/attention.py)
    params: object = field(default=None, compare=False, repr=False)
    #: the draw of its weights where another node reads the same one (a module called again, a
    #: copy not re-drawn): nodes of one ``weight`` share it (sigprop/model/cross.py); "" else
    weight: str = ""


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


@dataclass
class Part:
    """One part of a state whose units differ (a concatenation's inputs): its ``share`` of the
    units, its per-element second moment ``q``, ``mean`` and ``shared`` moment, and its
    ``profile`` over the positions (mean 1; None: uniform)."""

    share: float
    q: float
    mean: float
    shared: float
    profile: np.ndarray | None = None
    #: E[x_t x_s] for one unit at two tokens of one sample, where it differs from ``shared`` (two
    #: samples): after an op that mixes the tokens of a sample (attention); None: equal to it
    tokens: float | None = None
    #: "tokens": the part is a group of the tokens of a sample (a class token beside the patches:
    #: a concatenation along the tokens), which every op but attention maps on its own; "units":
    #: a group of the units (a concatenation of channels), which a weight layer mixes
    axis: str = "units"
    #: (u, c_q, c_k, c_t, v): the mean over groups of ``u`` last-axis units (a layer norm's), its
    #: second moment in one token, between two samples and between two tokens of one sample, and
    #: the variance of a token's variance over its units -- where an op made them other than a
    #: state of independent Gaussian units has them (``centre_of``): a layer norm's output is
    #: centred exactly, at one variance, and so is a sum's normalised summand
    centre: tuple | None = None

    @property
    def tok(self) -> float:
        """The shared moment of two tokens of one sample."""
        return self.shared if self.tokens is None else self.tokens


def profile_of(p: np.ndarray | None, mats: Sequence[np.ndarray], transpose: bool = False) -> np.ndarray:
    """A profile over the positions (mean 1), the uniform one where there is none or where its
    shape is not the one ``mats`` read."""
    shape = tuple(A.shape[0 if transpose else 1] for A in mats)
    return p if p is not None and p.shape == shape else np.ones(shape)


def blend(parts) -> np.ndarray | None:
    """The profile of a sum of fields w * p (None where the shapes differ or none has one)."""
    shapes = {p.shape for _, p in parts if p is not None}
    tot = sum(w for w, _ in parts)
    if len(shapes) != 1 or tot <= 0.0:
        return None
    shape = shapes.pop()
    return sum(w * (np.ones(shape) if p is None else p) for w, p in parts) / tot


def normalised(fld: np.ndarray) -> np.ndarray | None:
    mu = float(fld.mean())
    return fld / mu if mu > 0 and fld.ndim else None


def centre_of(s: Part, units: int) -> tuple[float, float, float, float]:
    """The second moments of the mean over ``units`` last-axis units of a token -- in one token,
    between two samples, between two tokens of a sample -- and the variance of the token's
    variance over them: the state's own (``Part.centre``) where an op set them for groups of that
    size, else those of independent Gaussian units about a common mean m: (x - m^2)/units + m^2,
    and 2 var^2/(units - 1), a chi-square's (docs/theory.md §15, "The centred residual stream")."""
    if s.centre is not None and s.centre[0] == units:
        return s.centre[1:5]
    m2, u = s.mean * s.mean, max(units, 1)
    cq, ck, ct = ((x - m2) / u + m2 for x in (s.q, s.shared, s.tok))
    return cq, ck, ct, 2.0 * (s.q - cq) ** 2 / max(u - 1, 1)


def inverse_mean(var: float, v: float) -> float:
    """E[1/X] for X > 0 of mean ``var`` and variance ``v``, X a scaled chi-square of the same two
    moments (2 var^2/v degrees of freedom): 1/(var (1 - v/var^2)) -- exact for a Gaussian token's
    variance, (u - 1)/(u - 3) over 1/var; v/var^2 held at 1/2 (a chi-square of 4 degrees), below
    which the mean would not exist."""
    return 1.0 / (var * (1.0 - min(v / (var * var), 0.5)))


def merged(parts: list[Part]) -> Part:
    """A state's parts as one (what a layer that mixes all units reads)."""
    if len(parts) == 1:
        return parts[0]
    q = sum(s.share * s.q for s in parts)
    return Part(
        1.0,
        q,
        sum(s.share * s.mean for s in parts),
        sum(s.share * s.shared for s in parts),
        blend([(s.share * s.q, s.profile) for s in parts]),
        tokens_of(parts, lambda s: s.share * s.tok, sum),
    )


def token_groups(parts) -> bool:
    """Whether a state is kept as groups of tokens (``Part.axis``): several parts, each some of
    the tokens, which per-token ops map one by one."""
    return len(parts) > 1 and all(s.axis == "tokens" for s in parts)


def tokens_of(parts, f, combine=None):
    """A map of the token moment: None where no part carries one of its own (``Part.tokens``),
    else ``f`` of each part (``combine``d when given)."""
    if all(s.tokens is None for s in parts):
        return None
    vals = [f(s) for s in parts]
    return combine(vals) if combine is not None else vals


@dataclass
class OpMap:
    """An op's maps: ``forward(nd, i, fold)`` sets ``fold.states[i]`` from its inputs' states;
    ``backward(nd, i, grads, fold)`` hands each input its share (``fold.give``) of the
    gradient at node i (``grads``: per part (r, rk, profile)); ``receive(j, parts, reader,
    fold)``, where given, is told of every gradient node j receives (an activation keeps what
    passes through it); ``weighted``: a weight layer, whose ``forward`` and ``backward`` a
    prediction with every weight layer's variance scaled multiplies; ``tangent(nd, i, e, fold)``,
    where given: the moment of node i's state with its response to the state of a node upstream
    (``Fold.tangent``), from its inputs' (``e``: None for an input that does not move with it)."""

    forward: Callable
    backward: Callable | None = None
    receive: Callable | None = None
    weighted: bool = False
    tangent: Callable | None = None


#: the maps of every node op, registered by the traced ops' files (``map_op``)
MAPS: Registry[OpMap] = Registry("moment map", skip=(__name__,))


def map_op(name: str, forward: Callable, backward: Callable | None = None, **kw) -> OpMap:
    """Register the maps of node op ``name`` (one call per op, in the op's own file; a name taken
    is refused, naming both)."""
    return MAPS.add(name, OpMap(forward, backward, **kw))


@dataclass
class Fold:
    """The fold's state as the ops' maps read and write it: the nodes, per node its parts
    (``states``), per activation or max pooling its derivative moments per part (``derivative``:
    E[phi'^2] and its cross moment), the gradients per node and part (``grads``: [r, rk, [(r,
    profile), ...]] summed over the readers), what passes through each activation
    (``through``), the nodes whose gradient an unmapped op cut (``poisoned``), and the weight
    factor of a prediction with every weight layer's variance scaled."""

    nodes: Sequence[GraphNode]
    states: list
    weight_factor: float = 1.0
    derivative: dict = field(default_factory=dict)
    grads: list = field(default_factory=list)
    through: dict = field(default_factory=dict)
    poisoned: list = field(default_factory=list)
    #: why a node's map gave no state where its op says (a regime it does not cover)
    why: dict = field(default_factory=dict)
    #: the attention maps' logit variances across keys, in graph order (their regime)
    regimes: list = field(default_factory=list)
    #: per attention node, its weights' normalised entropy (``theory.attention_entropy``)
    entropy: dict = field(default_factory=dict)
    #: the cross moments between the states of nodes whose weights are shared (sigprop/model/
    #: cross.py); None where every weight is read once
    cross: object = None
    #: per node downstream of a causal attention its tokens' Gram matrix (``gram``), T x T; its
    #: gradient's (``rgram``), and the shares of it its readers gave so far (``rshares``)
    gram: dict = field(default_factory=dict)
    rgram: dict = field(default_factory=dict)
    #: per attention node its logits' variance across keys (their regime)
    logit_variance: dict = field(default_factory=dict)
    rshares: dict = field(default_factory=dict)
    #: their gradients' cross moments (``cross.BackCross``), where ``cross`` is set
    back: object = None
    #: per node and part, each reader's (r, r_k, w_c, w_a): its gradient's second moments, and
    #: the share of the generic second moment of its mean over a token's units and of its
    #: component along the node's state that it holds (``alignment``; 1: a gradient independent
    #: of them, 0: one a layer norm projected them out of)
    aligned: dict = field(default_factory=dict)

    def give(
        self,
        j: int,
        parts: list[tuple[float, float, np.ndarray | None]],
        reader: int,
        align: list[tuple[float, float]] | None = None,
    ) -> None:
        """Add a reader's gradient at node j (one per part of j, or one for all its parts), and
        tell j's op (``OpMap.receive``); ``align``: per part its (w_c, w_a) where the reader
        knows them (a layer norm, a sum, a reshape of either), None where they are generic."""
        segs = self.states[j]
        if len(parts) != len(segs) and len(segs) == 1 and len(self.states[reader]) == len(parts):
            # one part reading several token parts (a sum's single side): their share-weighted sum
            shares = [s.share for s in self.states[reader]]
            parts = [
                (
                    sum(w * c for w, (c, _, _) in zip(shares, parts)),
                    sum(w * ck for w, (_, ck, _) in zip(shares, parts)),
                    None,
                )
            ]
            align = None
        elif len(parts) != len(segs):
            parts, align = parts[:1] * len(segs), None
        if self.grads[j] is None:
            self.grads[j] = [[0.0, 0.0, []] for _ in segs]
        readers = self.aligned.setdefault(j, [[] for _ in segs])
        for k, (g, (c, ck, p)) in enumerate(zip(self.grads[j], parts)):
            g[0] += c
            g[1] += ck
            g[2].append((c, p))
            readers[k].append((c, ck, *(align[k] if align is not None and k < len(align) else (1.0, 1.0))))
        op = MAPS.get(self.nodes[j].op)
        if op is not None and op.receive is not None:
            op.receive(j, parts, reader, self)

    def alignment(self, j: int, k: int, units: int) -> tuple[float, float]:
        """The gradient at node j's part k: the second moment of its mean over a token's
        ``units`` units (r_c) and of its component along the state, (x^T g)^2 / (units^2 q) (r_a):
        over its readers, w_c r/units and w_a r/units -- a gradient independent of the state has
        w = 1 (docs/theory.md §15, "The centred residual stream")."""
        u = max(units, 1)
        readers = self.aligned.get(j, [[]] * (k + 1))[k]
        return sum(c * r for r, _, c, _ in readers) / u, sum(a * r for r, _, _, a in readers) / u

    def tangent(self, fork: int, node: int) -> float | None:
        """E[x . (J x_fork)] per element: the moment of node ``node``'s state x with its response
        J x_fork to its upstream node ``fork``'s own state -- q of a branch made of weight layers
        and homogeneous activations, 0 through a normalisation (scale-invariant) -- by each op's
        ``OpMap.tangent`` along the nodes between them; None where an op on the way has none
        (docs/theory.md §15, "The centred residual stream")."""
        if node <= fork or self.states[fork] is None:
            return None
        on_way = {node}  # the nodes between them: upstream of ``node``, after ``fork``
        for i in range(node, fork, -1):
            if i in on_way:
                on_way.update(j for j in self.nodes[i].inputs if j >= fork)
        e: dict[int, float] = {fork: merged(self.states[fork]).q}
        for i in sorted(on_way - {fork}):
            nd = self.nodes[i]
            if not any(j in e for j in nd.inputs):
                continue  # does not move with the fork
            op = MAPS.get(nd.op)
            if op is None or op.tangent is None or self.states[i] is None:
                return None
            got = op.tangent(nd, i, [e.get(j) for j in nd.inputs], self)
            if got is None:
                return None
            e[i] = got
        return e.get(node)

    def weights(self, j: int, k: int) -> tuple[float, float]:
        """The (w_c, w_a) of node j's part k's whole gradient (``alignment``'s, over its readers)."""
        readers = self.aligned.get(j, [[]] * (k + 1))[k]
        r = sum(x[0] for x in readers)
        if r <= 0:
            return 1.0, 1.0
        return sum(c * x for x, _, c, _ in readers) / r, sum(a * x for x, _, _, a in readers) / r


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
    states' and gradients' cross moments added at sums and forks (sigprop/model/cross.py).
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
