"""The ops that move no weights, as traced ops (docs/theory.md §13): identities (reshapes, flatten,
dropout -- off during a probe --, ``nn.Identity``), concatenation (each input's parts side by side
with its share of the units), sums of two states (independent summands; ``h + c h`` exactly a
scaling; summands that share a node with no weight layer between them named), a constant added
(``offset``), scaling by a constant (``c * h``, ``h / c``), and the graph's output."""

from __future__ import annotations

import math
import operator
from dataclasses import replace

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from sigprop.model.cross import Unsupported, tangent
from sigprop.model.graph import (
    MAPS,
    GraphNode,
    Part,
    blend,
    centre_of,
    map_op,
    merged,
    token_groups,
    tokens_of,
)
from sigprop.model.ops.registry import TracedOp, register

#: modules and calls that leave every element as it is at init (the per-element moments pass)
IDENTITY_MODULES = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.Flatten)
IDENTITY_FUNCTIONS = (torch.flatten, torch.reshape, F.dropout)
IDENTITY_METHODS = (
    "view",
    "reshape",
    "flatten",
    "contiguous",
    "permute",
    "transpose",
    "squeeze",
    "unsqueeze",
)
_aten = torch.ops.aten
ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add, _aten.add.Tensor)
MUL_FUNCTIONS = (operator.mul, operator.imul, torch.mul, _aten.mul.Tensor)
DIV_FUNCTIONS = (operator.truediv, operator.itruediv, torch.div, _aten.div.Tensor)


def _constant_factor(n: fx.Node) -> float | None:
    """c of ``c * h``, ``h * c`` or ``h / c`` (c a Python number), else None."""
    a = n.args
    if len(a) != 2 or n.kwargs:
        return None
    if n.target in DIV_FUNCTIONS or n.target in ("div", "div_", "truediv"):
        return 1.0 / float(a[1]) if isinstance(a[1], (int, float)) and a[1] != 0 else None
    consts = [v for v in a if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return float(consts[0]) if len(consts) == 1 and any(isinstance(v, fx.Node) for v in a) else None


def _parts_of(t, n: fx.Node) -> tuple[list, list]:
    """A call's arguments split into states (nodes of the graph that are not constants) and the
    rest (numbers, constant tensors)."""
    states = [
        a for a in n.args if isinstance(a, fx.Node) and a in t.index and t.nodes[t.index[a]].op != "const"
    ]
    return states, [a for a in n.args if not any(a is s for s in states)]


def _one_element(t, n: fx.Node, kind: str) -> float | None:
    """c of ``h * c`` or ``h / c`` where c is a constant tensor of one element, else None."""
    consts = [a for a in _parts_of(t, n)[1] if isinstance(a, fx.Node)]
    if len(consts) != 1 or (kind == "div" and n.args[-1] is not consts[0]):
        return None
    v = t.value(consts[0])
    if v is None or v.numel() != 1:
        return None
    c = float(v.detach().double().reshape(()))
    return (1.0 / c if c != 0 else None) if kind == "div" else c


def _root(j: int, nodes: list, fx_of: list) -> tuple[int, float]:
    """A node as c times an earlier node whose elements it keeps in place: through constant
    scalings and element-preserving identities (nn.Identity, dropout -- off in a probe --,
    ``contiguous``, ``clone``), not through reshapes that move elements (a transpose)."""
    c = 1.0
    while True:
        n = fx_of[j]
        ins = nodes[j].inputs
        if nodes[j].op == "scale" and len(ins) == 1:
            c *= nodes[j].params if nodes[j].params is not None else _constant_factor(n)
        elif nodes[j].op == "identity" and len(ins) == 1 and _keeps_elements(n, nodes[j], nodes[ins[0]]):
            pass
        else:
            return j, c
        j = ins[0]


def _keeps_elements(n: fx.Node, node, source) -> bool:
    same_shape = node.shape == source.shape
    if n.op == "call_module":
        return same_shape and n.target is not None and "flatten" not in type(n).__name__.lower()
    return same_shape and (n.target in ("contiguous", "clone") or n.target is F.dropout)


def _near(j: int, nodes: list) -> set[int]:
    """The nodes a state depends on without a random weight layer between: back from node j
    through every op, stopping at (and keeping) weight layers (``OpMap.weighted``: dense layers,
    an attention module), whose zero-mean weights make their output uncorrelated with anything
    upstream (docs/theory.md §13)."""
    seen, stack = set(), [j]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        op = MAPS.get(nodes[i].op)
        if op is None or not op.weighted:  # a weight layer's output: uncorrelated with its inputs
            stack += list(nodes[i].inputs)
    return seen


def _add_node(t, n: fx.Node) -> GraphNode:
    """A sum's node.  Of two states: ``add`` (independent summands, the cross term zero), unless
    both are one node times constants -- ``h + h``, ``h + 2 h``: exactly (c1 + c2) h, a
    ``scale`` --, or they share a node with no random weight layer between it and either
    summand (``h + relu(h)``): a cross term no map follows, named.  Of a state and a constant
    (a number, or a tensor of the model's such as a learned positional embedding): ``offset``.
    """
    label, index, nodes, fx_of = t.label(n), t.index, t.nodes, t.fx_of
    if n.kwargs:  # torch.add(..., alpha=...)
        return GraphNode(label, "unknown", (), why=f"{label} with alpha")
    states, consts = _parts_of(t, n)
    ins = tuple(index[a] for a in states)
    if len(states) == 2:
        (ra, ca), (rb, cb) = (_root(j, nodes, fx_of) for j in ins)
        if ra == rb:
            return GraphNode(label, "scale", (ra,), forward=(ca + cb) ** 2)
        shared = _near(ins[0], nodes) & _near(ins[1], nodes)
        if shared:
            via = nodes[max(shared)].name
            why = f"{label} of two summands that share {via} with no weight layer between (their cross term)"
            return GraphNode(label, "unknown", ins, why=why)
        return GraphNode(label, "add", ins)
    if len(states) == 1 and len(consts) == 1:
        c = consts[0]
        tokens = None
        if isinstance(c, fx.Node):  # a tensor the model holds (get_attr), or one computed from none
            value = t.value(c)
            if value is None:
                return GraphNode(label, "unknown", ins, why=f"{label} with a constant")
            v = value.detach().double()
            mean, square = float(v.mean()), float(v.pow(2).mean())
            shape = nodes[ins[0]].shape or t.shape(states[0])
            if v.dim() >= 2 and shape and len(shape) == 2 and tuple(v.shape[-2:]) == tuple(shape):
                tokens = _token_moment(v.reshape(-1, *shape)[0])  # per position: a positional embedding
        elif isinstance(c, (int, float)) and not isinstance(c, bool):
            mean, square = float(c), float(c) ** 2
        else:
            return GraphNode(label, "unknown", ins, why=f"{label} with a constant")
        if square == 0.0:
            return GraphNode(label, "identity", ins)
        return GraphNode(label, "offset", ins, forward=square, bias=mean, params=tokens)
    return GraphNode(label, "unknown", ins, why=f"{label} of {len(states)} states")


def _token_moment(c: torch.Tensor) -> float:
    """Of a constant [T, d] added to every sample: the mean over positions t != s of c_t . c_s / d
    (what two tokens of one sample share through it)."""
    T, d = c.shape
    if T < 2:
        return float(c.pow(2).mean())
    total = c.sum(0)
    return float((total.dot(total) - c.pow(2).sum()) / (T * (T - 1) * d))


def _calls(functions, methods):
    def match(gm: fx.GraphModule, n: fx.Node) -> bool:
        return (n.op == "call_function" and n.target in functions) or (
            n.op == "call_method" and n.target in methods
        )

    return match


def _identity_matches(gm: fx.GraphModule, n: fx.Node) -> bool:
    if n.op == "call_module":
        return isinstance(gm.get_submodule(n.target), IDENTITY_MODULES)
    return _calls(IDENTITY_FUNCTIONS, IDENTITY_METHODS)(gm, n)


def _cat(t, n) -> GraphNode | list:
    """Each input's elements, unchanged: q the units-weighted mean, each gradient its part.  An
    input that is a constant (ViT's class token, expanded over the batch) becomes a node of its
    own first, a state of its values' moments (``constant``), the same for every sample."""
    ins, shape = t.inputs(n), t.shape
    parts = list(n.args[0]) if n.args and isinstance(n.args[0], (list, tuple)) else list(n.all_input_nodes)
    if not shape(n) or not all(isinstance(a, fx.Node) and shape(a) for a in parts):
        return t.unknown(n)
    sizes = [math.prod(shape(a)) for a in parts]
    shares = tuple(z / sum(sizes) for z in sizes)
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
    # along the tokens of [batch, T, d]: groups of tokens (``Part.axis``)
    along = "tokens" if len(shape(n)) == 2 and dim in (1, -2) else None
    if len(ins) == len(parts):
        return GraphNode(t.label(n), "cat", ins, shares=shares, params=along)
    out, inputs = [], []
    for a in parts:
        if a in t.index and t.nodes[t.index[a]].op != "const":
            inputs.append(t.index[a])
            continue
        v = t.value(a)
        if v is None or not ins:
            return t.unknown(n)
        c = v.detach().double()
        q = float(c.pow(2).mean())
        out.append(GraphNode(f"{t.label(n)}.constant", "constant", ins[:1], forward=q, bias=float(c.mean())))
        inputs.append(len(t.nodes) + len(out) - 1)
    return out + [GraphNode(t.label(n), "cat", tuple(inputs), shares=shares, params=along)]


def _scale(kind: str):
    def node(t, n) -> GraphNode:
        c, ins = _constant_factor(n), t.inputs(n)
        if c is None and len(ins) == 1:  # a one-element tensor the model holds (Gemma's sqrt(d))
            c = _one_element(t, n, kind)
        if len(ins) == 1 and c is not None:
            return GraphNode(t.label(n), "scale", ins, forward=c**2, params=c)
        if kind == "mul" and len(ins) == 2 and ins[0] != ins[1]:
            shared = _near(ins[0], t.nodes) & _near(ins[1], t.nodes)
            if not shared:  # a gated MLP's silu(x W1) * (x W3): independent weights
                return GraphNode(t.label(n), "product", ins)
            via = t.nodes[max(shared)].name
            why = f"a product of two states that share {via} with no weight layer between"
        elif len(ins) == 1 and len(_parts_of(t, n)[0]) == 1:
            why = "a state times a constant table" if kind == "mul" else "a state divided by a constant table"
        else:
            why = "a product of a state with itself" if kind == "mul" else "a division by a state"
        return GraphNode(t.label(n), "unknown", ins, why=why)

    return node


register(TracedOp("identity", _identity_matches, lambda t, n: GraphNode(t.label(n), "identity", t.inputs(n))))
register(
    TracedOp(
        "cat",
        lambda gm, n: n.op == "call_function" and n.target in (torch.cat, torch.ops.aten.cat.default),
        _cat,
    )
)
register(TracedOp("add", _calls(ADD_FUNCTIONS, ("add", "add_")), _add_node))
register(TracedOp("mul", _calls(MUL_FUNCTIONS, ("mul", "mul_")), _scale("mul")))
register(TracedOp("div", _calls(DIV_FUNCTIONS, ("div", "div_")), _scale("div")))


def _constant(nd: GraphNode, i: int, fold) -> None:
    """A constant part of a state (its input only orders it): second moment, mean, and -- the
    same values in every sample -- shared moments equal to its second moment."""
    fold.states[i] = [Part(1.0, nd.forward, nd.bias, nd.forward)]


def _passes(nd: GraphNode, i: int, fold) -> None:
    """identity, output: unchanged (a reshape drops the profile)."""
    ins = nd.inputs
    same = nd.shape == fold.nodes[ins[0]].shape
    fold.states[i] = [
        s if same else Part(s.share, s.q, s.mean, s.shared, None, s.tokens, s.axis)
        for s in fold.states[ins[0]]
    ]


def _gives_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """offset, identity, output: each input element's gradient is the output's (where the shape
    is kept, so is the gradient's alignment with a token's mean and state, ``Fold.alignment``)."""
    for j in nd.inputs:
        same = nd.shape == fold.nodes[j].shape
        keeps = same and nd.op != "offset" and len(g) == len(fold.states[j])
        align = [fold.weights(i, k) for k in range(len(g))] if keeps else None
        fold.give(j, [(r, rk, p if same else None) for r, rk, p in g], i, align)


def _add_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """a + b: each summand's gradient is the sum's, its token mean too; its component along the
    summand a is q_a/Q of the one along the sum plus q_b/Q of a generic one (the sum's gradient
    seen from a holds b's share of directions it is independent of; docs/theory.md §15, "The
    centred residual stream"), and a fork loses the cross term of its two gradients
    (``_fork_cross``)."""
    ins = nd.inputs
    states = [fold.states[j] for j in ins]
    if len(ins) != 2 or not all(len(st) == len(g) for st in states) or nd.shape != fold.nodes[ins[0]].shape:
        return _gives_back(nd, i, g, fold)
    along = [fold.weights(i, k)[1] for k in range(len(g))]
    fork, cross = _fork_cross(nd, i, fold) if min(along) < 1.0 else (None, 0.0)
    for j, mine, other in ((ins[0], states[0], states[1]), (ins[1], states[1], states[0])):
        same = nd.shape == fold.nodes[j].shape
        align = []
        for k, (a, b) in enumerate(zip(mine, other)):
            wc, wa = fold.weights(i, k)
            total = a.q + b.q
            share = a.q / total if total > 0 else 0.5
            align.append((wc, share * wa + (1.0 - share)))
        # the fork's two gradients, the sum's and the branch's, are correlated (``_fork_cross``)
        less = [cross * (1.0 - wa) if j == fork else 0.0 for wa in along]
        fold.give(
            j,
            [(r * (1.0 - c), rk, p if same else None) for (r, rk, p), c in zip(g, less)],
            i,
            align if same else None,
        )


def _fork_cross(nd: GraphNode, i: int, fold) -> tuple[int | None, float]:
    """x + B(x), x a fork: its gradient g + J_B^T g has the cross term 2 g^T J_B g, which for a g
    with no part along the sum y (a LayerNorm read y: w_a = 0) is -2 r (y^T J_B y)/(|y|^2 u) per
    element = -2 r e_B/(q_y u), e_B the branch's moment with its own response to x
    (``cross.tangent``: q_B for weight layers and homogeneous activations, 0 behind a norm);
    (1 - w_a) of it in general (docs/theory.md §15, "The centred residual stream").  The fork,
    and that share of the sum's r it loses."""
    a, b = sorted(nd.inputs)
    shape = nd.shape
    if a == b or not shape or shape[-1] < 2:
        return None, 0.0
    e = tangent(fold, a, b)
    y = merged(fold.states[i])
    if e is None or y.q <= 0.0:
        return None, 0.0
    return a, 2.0 * e / (y.q * shape[-1])


def _add(nd: GraphNode, i: int, fold) -> None:
    """a + b, independent summands: q' = q_a + q_b + 2 m_a m_b, k' alike; summands that read a
    shared weight (``Fold.cross``): q' = q_a + q_b + 2 S, t' = t_a + t_b + 2 K, their cross
    moments (sigprop/model/cross.py)."""
    ins = nd.inputs
    if len(ins) != 2:
        return
    c = fold.cross
    if c is not None and c.ancestors[ins[0]] & c.ancestors[ins[1]]:
        return _correlated_add(nd, i, fold)
    a, b = fold.states[ins[0]], fold.states[ins[1]]
    if [s.share for s in a] != [s.share for s in b]:
        if token_groups(a) and len(b) == 1:  # the same moments for every token: one per group
            b = [replace(b[0], share=s.share, axis="tokens") for s in a]
        elif token_groups(b) and len(a) == 1:
            a = [replace(a[0], share=s.share, axis="tokens") for s in b]
        else:
            a, b = [merged(a)], [merged(b)]
    fold.states[i] = [
        Part(
            x.share,
            x.q + y.q + 2 * x.mean * y.mean,
            x.mean + y.mean,
            x.shared + y.shared + 2 * x.mean * y.mean,
            blend([(x.q, x.profile), (y.q, y.profile)]),
            None if x.tokens is None and y.tokens is None else x.tok + y.tok + 2 * x.mean * y.mean,
            x.axis,
            _summed_centre(x, y),
        )
        for x, y in zip(a, b)
    ]


def _correlated_add(nd: GraphNode, i: int, fold) -> None:
    """a + b, both downstream of a weight read at several nodes: their cross moments added (the
    parts merged; the two-sample moment as for independent summands)."""
    a, b = (merged(fold.states[j]) for j in nd.inputs)
    try:
        S, K = fold.cross.pair(*nd.inputs)
    except Unsupported as exc:
        fold.why[i] = (
            f"{nd.name}: a sum of states that share weights, through {exc}, which the shared-depth "
            "maps do not read"
        )
        return
    fold.states[i] = [
        Part(
            1.0,
            a.q + b.q + 2 * S,
            a.mean + b.mean,
            a.shared + b.shared + 2 * a.mean * b.mean,
            None,
            a.tok + b.tok + 2 * K,
            a.axis,
        )
    ]


def _summed_centre(x: Part, y: Part) -> tuple | None:
    """A sum's token-mean moments where a summand has its own (a layer norm's output beside a
    branch): the summands' (``centre_of``) plus their means' cross term."""
    known = x.centre or y.centre
    if known is None:
        return None
    u, cross = known[0], 2 * x.mean * y.mean
    (*cx, vx), (*cy, vy) = centre_of(x, u), centre_of(y, u)
    # a token's variance: the summands' own and their cross term's 4 var_x var_y / u
    v = vx + vy + 4.0 * (x.q - cx[0]) * (y.q - cy[0]) / u
    return (u, *(p + q + cross for p, q in zip(cx, cy)), v)


def _scaled(nd: GraphNode, i: int, fold) -> None:
    c2 = nd.forward
    fold.states[i] = [
        Part(
            s.share,
            c2 * s.q,
            math.sqrt(c2) * s.mean,
            c2 * s.shared,
            s.profile,
            tokens_of([s], lambda t: c2 * t.tok, sum),
            s.axis,
            None
            if s.centre is None
            else (s.centre[0], *(c2 * c for c in s.centre[1:4]), c2 * c2 * s.centre[4]),
        )
        for s in fold.states[nd.inputs[0]]
    ]


def _scaled_back(nd: GraphNode, i: int, g: list, fold) -> None:
    for j in nd.inputs:
        keeps = nd.shape == fold.nodes[j].shape and len(g) == len(fold.states[j])
        align = [fold.weights(i, k) for k in range(len(g))] if keeps else None
        fold.give(j, [(nd.forward * r, nd.forward * rk, p) for r, rk, p in g], i, align)


def _offset(nd: GraphNode, i: int, fold) -> None:
    """h + c, c a constant (mean c-bar = ``bias``, mean square = ``forward``); a constant that
    differs between the positions of a sample (a positional embedding: ``params``, its moment
    between two positions) adds that moment, not its square, to the shared ones."""
    c, c2 = nd.bias, nd.forward
    cross = c2 if nd.params is None else nd.params
    fold.states[i] = [
        Part(
            s.share,
            s.q + 2 * s.mean * c + c2,
            s.mean + c,
            s.shared + 2 * s.mean * c + cross,
            None,
            s.tok + 2 * s.mean * c + cross
            if nd.params is not None
            else tokens_of([s], lambda t: t.tok + 2 * t.mean * c + c2, sum),
            s.axis,
        )
        for s in fold.states[nd.inputs[0]]
    ]


def _concatenated(nd: GraphNode, i: int, fold) -> None:
    ins = nd.inputs
    axis = "tokens" if nd.params == "tokens" else "units"  # along the tokens: groups of tokens
    if len(nd.shares) == len(ins):
        fold.states[i] = [
            Part(share * s.share, s.q, s.mean, s.shared, s.profile, s.tokens, axis)
            for share, j in zip(nd.shares, ins)
            for s in fold.states[j]
        ]


def _concatenated_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """Each input its own parts' gradients."""
    at = 0
    for j in nd.inputs:
        size = len(fold.states[j])
        fold.give(j, g[at : at + size], i)
        at += size


def _sliced_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """A part of the source's elements: its gradient weighs ``forward`` (its share) of the source's
    (the other parts' readers give theirs)."""
    for j in nd.inputs:
        fold.give(j, [(nd.forward * r, nd.forward * rk, None) for r, rk, _ in g], i)


def _same(nd, i, e, fold):
    return e[0]


def _summed(nd, i, e, fold):
    return sum(x for x in e if x is not None)


def _cat_tangent(nd, i, e, fold):
    return sum(w * x for w, x in zip(nd.shares, e) if x is not None)


map_op("identity", _passes, _gives_back, tangent=_same)
map_op("slice", _passes, _sliced_back, tangent=_same)
map_op("output", _passes, _gives_back, tangent=_same)
map_op("add", _add, _add_back, tangent=_summed)
map_op("offset", _offset, _gives_back, tangent=_same)
map_op("scale", _scaled, _scaled_back, tangent=lambda nd, i, e, fold: nd.forward * e[0])
map_op("cat", _concatenated, _concatenated_back, tangent=_cat_tangent)
map_op("constant", _constant, lambda nd, i, g, fold: None)


def _product(nd: GraphNode, i: int, fold) -> None:
    """a * b, independent states (each behind weights of its own: a gated MLP's silu(x W1) and
    x W3): every moment the product of the two's -- q' = q_a q_b, m' = m_a m_b, and the shared
    moments between two samples and between two tokens alike (docs/theory.md §16, "Gated MLPs")."""
    a, b = (merged(fold.states[j]) for j in nd.inputs)
    profile = None  # over the positions: the two's product where both have one
    if a.profile is not None and b.profile is not None and a.profile.shape == b.profile.shape:
        profile = a.profile * b.profile / float((a.profile * b.profile).mean())
    tokens = None if a.tokens is None and b.tokens is None else a.tok * b.tok
    fold.states[i] = [Part(1.0, a.q * b.q, a.mean * b.mean, a.shared * b.shared, profile, tokens)]


def _product_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """The gradient g at a * b reaches a as g * b: r q_b, its moment between two positions r_k
    k_b (g independent of b: it comes from the weights above), and b as g * a."""
    r, rk, p = g[0]  # the product is one part (``_product``)
    a, b = (merged(fold.states[j]) for j in nd.inputs)
    for j, other in zip(nd.inputs, (b, a)):
        fold.give(j, [(r * other.q, rk * other.tok, p)], i)


def _product_tangent(nd, i, e, fold):
    """d(a b) = b da + a db: E[a b (b J_a x + a J_b x)] = q_b e_a + q_a e_b (independent a, b)."""
    a, b = (merged(fold.states[j]).q for j in nd.inputs)
    return (b * e[0] if e[0] is not None else 0.0) + (a * e[1] if e[1] is not None else 0.0)


map_op("product", _product, _product_back, tangent=_product_tangent)
