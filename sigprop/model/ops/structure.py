"""The ops that move no weights, as traced ops (docs/theory.md §13): identities (reshapes, flatten,
dropout -- off during a probe --, ``nn.Identity``), concatenation (each input's parts side by side
with its share of the units), sums of two states (independent summands; ``h + c h`` exactly a
scaling; summands that share a node with no weight layer between them named), a constant added
(``offset``), scaling by a constant (``c * h``, ``h / c``), and the graph's output."""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from sigprop.maps.state import MAPS, GraphNode
from sigprop.model.ops import parts
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
ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add, _aten.add.Tensor, _aten.add_.Tensor)
MUL_FUNCTIONS = (operator.mul, operator.imul, torch.mul, _aten.mul.Tensor, _aten.mul_.Tensor)
DIV_FUNCTIONS = (operator.truediv, operator.itruediv, torch.div, _aten.div.Tensor, _aten.div_.Tensor)
#: an exported graph's in-place calls (Falcon's ``mlp_output += attention_output``)
IN_PLACE = (_aten.add_.Tensor, _aten.mul_.Tensor, _aten.div_.Tensor)
_IN_PLACE_WHY = "{} in place, its input read again after"


def _read_again(n: fx.Node) -> bool:
    """Whether an in-place call's first argument is read after it (by its old node: the graph
    would read the value before the update, which the maps cannot tell)."""
    if n.target not in IN_PLACE or not isinstance(n.args[0], fx.Node):
        return False
    after, seen = set(), False
    for m in n.graph.nodes:
        seen = seen or m is n
        if seen and m is not n:
            after.add(m)
    return any(u in after for u in n.args[0].users)


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
    """c of ``h * c`` or ``h / c`` where c is a constant tensor of one element, or a number the
    graph computed from the input's shape (``1 / math.sqrt(k.size(-1))``, recorded as a value),
    else None."""
    consts = [a for a in _parts_of(t, n)[1] if isinstance(a, fx.Node)]
    if len(consts) != 1 or (kind == "div" and n.args[-1] is not consts[0]):
        return None
    c = number(t.value(consts[0]))
    if c is None:
        return None
    return (1.0 / c if c != 0 else None) if kind == "div" else c


def number(v) -> float | None:
    """A recorded value as a number: a Python number (one the graph computed from a shape) or a
    tensor of one element; None else."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.detach().double().reshape(()))
    return None


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
    upstream (docs/theory.md §13), and at a piece of one (``parts.Piece``: its own rows)."""
    seen, stack = set(), [j]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        op = MAPS.get(nodes[i].op)
        if (op is None or not op.weighted) and not isinstance(nodes[i].params, parts.Piece):
            stack += list(nodes[i].inputs)
    return seen


def _common(a: int, b: int, nodes: list) -> str | None:
    """What two states share with no weight layer between them -- a node's name, or a weight
    layer two of their pieces both read rows of --, None where nothing (independent)."""
    near_a, near_b = _near(a, nodes), _near(b, nodes)
    shared = near_a & near_b
    if shared:
        return nodes[max(shared)].name
    if not parts.independent(near_a, near_b, nodes):
        return "rows of one weight layer"
    return None


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
    if _read_again(n):
        return GraphNode(label, "unknown", t.inputs(n), why=_IN_PLACE_WHY.format(label))
    states, consts = _parts_of(t, n)
    ins = tuple(index[a] for a in states)
    if len(states) == 2:
        (ra, ca), (rb, cb) = (_root(j, nodes, fx_of) for j in ins)
        if ra == rb:
            return GraphNode(label, "scale", (ra,), forward=(ca + cb) ** 2)
        via = _common(ins[0], ins[1], nodes)
        if via is not None:
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
        if _read_again(n):
            return GraphNode(t.label(n), "unknown", t.inputs(n), why=_IN_PLACE_WHY.format(t.label(n)))
        c, ins = _constant_factor(n), t.inputs(n)
        if c is None and len(ins) == 1:  # a one-element tensor the model holds (Gemma's sqrt(d))
            c = _one_element(t, n, kind)
        if len(ins) == 1 and c is not None:
            return GraphNode(t.label(n), "scale", ins, forward=c**2, params=c)
        if kind == "mul" and len(ins) == 2 and ins[0] != ins[1]:
            via = _common(ins[0], ins[1], t.nodes)
            if via is None:  # a gated MLP's silu(x W1) * (x W3), or two pieces of x W: independent rows
                return GraphNode(t.label(n), "product", ins)
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
