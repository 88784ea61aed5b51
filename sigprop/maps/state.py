"""What every moment map of a traced model reads and writes (sigprop/model/ops/): its node
(``GraphNode``: what its op's maps read), a node's state kept per *part* (``Part``: its share of
the units, the per-element second moment q, mean m and shared moment k -- E[x(a) x(b)] for one
unit at two different samples, or two positions of one channel of a conv map -- and, over a
conv map, its profile over the positions, mean 1), the arithmetic of parts (``merged``,
``blend``, ``centre_of``, ...), the fold's context the maps write into (``Fold``: the states,
the gradients per part (r, rk, profile), the attention's regimes) and the maps' registry
(``MAPS``, ``map_op``).  No torch here.  Below the ops' maps and the fold that drives them
(sigprop/maps/graph.py): a map reaching for its input's state does not call back into the
fold's module."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from sigprop.registry import Registry


@dataclass(frozen=True)
class Piece:
    """A ``slice`` node's part of a weight layer's output (sigprop/model/ops/parts.py, docs/theory.md
    §16): the layer's node ``weight``, the output units (rows of W) the piece reads, and
    ``sigma``, their mean squared norm over all rows' (1: drawn alike).  Pieces on disjoint rows
    are as independent as two layers."""

    weight: int
    units: frozenset
    sigma: float

    def overlaps(self, other: Piece) -> bool:
        return self.weight == other.weight and not self.units.isdisjoint(other.units)


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
    #: ``dense`` of a matrix [c_out, c_in] (a Linear's): each output unit's squared row norm, which
    #: a piece of its output reads its own of (``Piece``, sigprop/model/ops/parts.py)
    rows: object = field(default=None, compare=False, repr=False)
    #: what an op's maps read that the fields above do not hold (``attention``: its projections'
    #: factors, heads, tokens and mask; sigprop/model/ops/attention.py)
    params: object = field(default=None, compare=False, repr=False)
    #: the draw of its weights where another node reads the same one (a module called again, a
    #: copy not re-drawn): nodes of one ``weight`` share it (sigprop/maps/cross.py); "" else
    weight: str = ""


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


def scaled_parts(parts: list[Part], c: float) -> list[Part]:
    """A state's parts with every moment of the units times ``c`` (second moments, the mean's
    square, the token means' moments; the variance of a token's variance times c^2)."""
    r = math.sqrt(c)
    return [
        replace(
            s,
            q=c * s.q,
            mean=r * s.mean,
            shared=c * s.shared,
            tokens=None if s.tokens is None else c * s.tokens,
            centre=None
            if s.centre is None
            else (s.centre[0], *(c * x for x in s.centre[1:4]), c * c * s.centre[4]),
        )
        for s in parts
    ]


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
    (``cross.tangent``), from its inputs' (``e``: None for an input that does not move with it);
    ``degree(nd)``, where given: how its forward map scales with its inputs' moments -- 1 (times
    c when they and the node's ``scale_fields`` are times c: a weight layer with its bias, a
    positively homogeneous activation, a sum, a scaling), 0 (the same whatever their scale: a
    batch norm, a calibrated layer), None (neither) -- which ``graph.fold_ln`` reads to carry
    each node's scale as a logarithm; ``jacobian(nd, i, fold)``, where given: the (mean,
    normalised variance) of J J^T's eigenvalues at node i from its inputs' (``free.fold_jacobian``),
    or why its law does not hold there (its words).

    Its part in the cross moments of a weight read at several nodes (sigprop/maps/cross.py,
    docs/theory.md §16, "Depth that reuses its weights"): ``cross``, its role -- "fresh" (a draw of
    its own, independent of every earlier node: an embedding), "linear" (per token a multiple of
    its one input: ``factor(nd, x)``, x its input's merged state, 1 where not given, None where it
    has none: a batch norm), "sum", "offset", "gaussian" (a weight's output: ``draw(nd, other,
    S, K, backward)`` its cross moment with another reader of the same draw from their inputs'
    (S, K) -- or their gradients' --), "act", "mix" (a mean over keys of its values); None: not
    read there (the fold stops at a shared draw).  ``values``: the input an attention mixes (its
    query and key paths independent of every other share: their weights enter through the
    logits); ``reads``: the input a weight layer's draw reads.

    Its part in a causal attention's position profile (sigprop/maps/gram.py, docs/theory.md §16):
    ``gram(nd, i, fold, merged)``, the T x T shape of its output's Gram from its inputs' (and
    where it reads the pairs nonlinearly, its state's token moment corrected), and
    ``gram_back(nd, k, pos, j, R, fold, merged)``, the share of its gradient's Gram R it gives
    input ``pos`` (node j) with its levels' corrections; None: the profile dropped there."""

    forward: Callable
    backward: Callable | None = None
    receive: Callable | None = None
    weighted: bool = False
    tangent: Callable | None = None
    degree: Callable | None = None
    scale_fields: tuple[str, ...] = ()
    jacobian: Callable | None = None
    cross: str | None = None
    factor: Callable | None = None
    draw: Callable | None = None
    values: int | None = None
    reads: int = 0
    gram: Callable | None = None
    gram_back: Callable | None = None


def shared_draws(nodes) -> dict:
    """The weight draws read at two or more nodes (``GraphNode.weight``: a module called again, a
    copy not re-drawn; the moments they correlate are sigprop/maps/cross.py's), each with its
    readers' count."""
    count = Counter(nd.weight for nd in nodes if nd.weight)
    return {k: c for k, c in count.items() if c > 1}


def shared_keys(nodes) -> frozenset:
    """The weight draws read at two or more nodes."""
    return frozenset(shared_draws(nodes))


#: the maps of every node op, registered by the traced ops' files (``map_op``)
MAPS: Registry[OpMap] = Registry("moment map", skip=(__name__,))


def law_of(nd, name: str):
    """Node ``nd``'s op's law or field ``name`` from its record (``OpMap``); None where the op has
    no record or the record none."""
    op = MAPS.get(nd.op)
    return None if op is None else getattr(op, name)


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

    def weights(self, j: int, k: int) -> tuple[float, float]:
        """The (w_c, w_a) of node j's part k's whole gradient (``alignment``'s, over its readers)."""
        readers = self.aligned.get(j, [[]] * (k + 1))[k]
        r = sum(x[0] for x in readers)
        if r <= 0:
            return 1.0, 1.0
        return sum(c * x for x, _, c, _ in readers) / r, sum(a * x for x, _, _, a in readers) / r
