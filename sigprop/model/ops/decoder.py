"""The ops of the decoders trained today (Llama, Qwen2/3, Mistral, Gemma: docs/theory.md §16) that
the older transformers lack: rotary position embeddings, read whole from their pattern
``x * cos + rotate_half(x) * sin`` (a state times a constant table, its halves swapped with a
sign, a sum of two summands that share x: no op-by-op map follows it, the whole is a rotation per
token), and the keys and values of grouped-query attention broadcast over the query heads they
serve (``expand``: each copy's gradient comes back, summed).  The gated MLP's product of two
states is ops/structure.py's ``product``."""

from __future__ import annotations

import math
import operator

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F

from sigprop.maps.state import GraphNode
from sigprop.model.ops import attention as att
from sigprop.model.ops import structure
from sigprop.model.ops.registry import TracedOp, register

aten = torch.ops.aten
CATS = (torch.cat, aten.cat.default)
NEGS = (operator.neg, torch.neg, aten.neg.default)
EXPANDS = (aten.expand.default,)


def _call(n, targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def _last_slice(n) -> tuple[fx.Node, int, int] | None:
    """``x[..., a:b]`` (ATen's ``slice`` on the last axis, or a getitem): (x, a, b); None else."""
    if _call(n, (aten.slice.Tensor,)):
        x, dim = n.args[0], n.args[1] if len(n.args) > 1 else 0
        rank = len(x.meta["tensor_meta"].shape) if "tensor_meta" in x.meta else None
        if rank is None or dim not in (-1, rank - 1):
            return None
        start = n.args[2] if len(n.args) > 2 else 0
        end = n.args[3] if len(n.args) > 3 else None
        return x, start or 0, end
    if _call(n, (operator.getitem,)) and isinstance(n.args[1], tuple) and n.args[1][:1] == (Ellipsis,):
        rest = n.args[1][1:]
        if len(rest) == 1 and isinstance(rest[0], slice) and rest[0].step in (None, 1):
            return n.args[0], rest[0].start or 0, rest[0].stop
    return None


def rotary_parts(n: fx.Node):
    """Of ``x * cos + cat(-x[..., h:], x[..., :h]) * sin`` (either order of every sum and
    product): (x, cos, sin, x[..., :h], -x[..., h:]); None for any other sum."""
    if not _call(n, structure.ADD_FUNCTIONS) or len(n.args) != 2 or n.kwargs:
        return None
    muls = n.args
    if not all(_call(m, structure.MUL_FUNCTIONS) and len(m.args) == 2 for m in muls):
        return None
    for plain, turned in (muls, muls[::-1]):
        cats = [a for a in turned.args if _call(a, CATS)]
        if len(cats) != 1:
            continue
        sin = turned.args[1] if turned.args[0] is cats[0] else turned.args[0]
        halves = cats[0].args[0]
        if not isinstance(halves, (list, tuple)) or len(halves) != 2 or not _call(halves[0], NEGS):
            continue
        hi, lo = _last_slice(halves[0].args[0]), _last_slice(halves[1])
        if hi is None or lo is None or hi[0] is not lo[0] or lo[1] != 0:
            continue
        known = not isinstance(lo[2], fx.Node) and not isinstance(hi[1], fx.Node)
        if known and lo[2] != hi[1]:  # sizes torch.fx left symbolic: checked by their shapes
            continue
        x = hi[0]
        if x not in plain.args:
            continue
        cos = plain.args[1] if plain.args[0] is x else plain.args[0]
        return x, cos, sin, halves[1], halves[0]
    return None


def _table(t, c, shape) -> np.ndarray | None:
    """A constant table broadcast to a sample's ``shape`` (its first sample's where it has the
    batch axis)."""
    v = t.value(c)
    if v is None or not shape:
        return None
    v = v.detach().double()
    if v.dim() == len(shape) + 1:
        v = v[0]
    try:
        return v.expand(*shape).cpu().numpy()  # a CUDA model's table: read on the host
    except RuntimeError:
        return None


def _pairs_mean(a: np.ndarray, b: np.ndarray) -> float:
    """The mean over two tokens t != s (axis -2) and everything else of a_t b_s."""
    T = a.shape[-2]
    if T < 2:
        return 0.0
    total = (a.sum(-2) * b.sum(-2) - (a * b).sum(-2)).mean()
    return float(total / (T * (T - 1)))


def _pair_matrix(c: np.ndarray, s: np.ndarray) -> np.ndarray:
    """[T, T]: the mean over units (and leading axes) of c_t c_s + s_t s_s, tables [..., T, u]."""
    T, u = c.shape[-2], c.shape[-1]
    cc, ss = c.reshape(-1, T, u), s.reshape(-1, T, u)
    both = ([0, 2], [0, 2])  # the sums over leading axes and units, by BLAS (einsum's loop: 5x)
    return (np.tensordot(cc, cc, both) + np.tensordot(ss, ss, both)) / (cc.shape[0] * u)


def rotary(t, n: fx.Node) -> GraphNode:
    """The node of a rotary embedding (``rotary_parts``); a sum of another form is a sum."""
    found = rotary_parts(n)
    x = found[0] if found else None
    if found is None or x not in t.index or t.nodes[t.index[x]].op == "const":
        return structure._add_node(t, n)
    shape, lo, hi = t.shape(x), t.shape(found[3]), t.shape(found[4])
    c, s = _table(t, found[1], shape), _table(t, found[2], shape)
    h = lo[-1] if lo else 0
    if c is None or s is None or len(shape) < 2 or not hi or hi[-1] != h or shape[-1] != 2 * h:
        return structure._add_node(t, n)
    sign = np.concatenate([-np.ones(h), np.ones(h)])  # rotate_half's: -x[h:] first, then x[:h]
    # the partner of unit i is i + h (i < h) or i - h: the sin table read at the partner's place
    s_p = np.concatenate([s[..., h:], s[..., :h]], axis=-1)
    params = {
        "gain": float((c * c + s * s).mean()),  # 1 for cos and sin of one angle
        "cross": float(2.0 * (sign * c * s).mean()),  # times m^2: the unit and its partner
        "mean": float(c.mean() + (sign * s).mean()),
        "tokens": _pairs_mean(c, c) + _pairs_mean(s, s),  # mean of cos((t - s) theta)
        "tokens_cross": _pairs_mean(sign * c, s) + _pairs_mean(sign * s, c),
        "grad_tokens": _pairs_mean(c, c) + _pairs_mean(s_p, s_p),
        # per pair of positions: the mean over units of c_t c_s + s_t s_s (the Gram's factor)
        "pair": _pair_matrix(c, s),
    }
    return GraphNode(t.label(n), "rotary", (t.index[x],), params=params)


def _expand(t, n: fx.Node) -> GraphNode:
    """``expand``: a state's elements copied.  Along an axis before a sample's last two (the
    query heads a grouped-query attention's key and value serve: Llama's ``repeat_kv``) the
    copies' gradients come back summed from independent heads: ``broadcast``, k copies; any
    other expand keeps each element's moments (``identity``)."""
    ins = t.inputs(n)
    src, out = (t.shape(n.args[0]) if ins else None), t.shape(n)
    if not ins or not src or not out or len(src) != len(out) or len(out) < 3:
        return GraphNode(t.label(n), "identity", ins[:1])
    grown = [k for k, (a, b) in enumerate(zip(src, out)) if a != b]
    copies = math.prod(out) // max(math.prod(src), 1)
    if not grown or copies <= 1 or max(grown) >= len(out) - 2:
        return GraphNode(t.label(n), "identity", ins[:1])
    return GraphNode(t.label(n), "broadcast", ins[:1], forward=float(copies))


register(TracedOp("add", lambda gm, n: rotary_parts(n) is not None, rotary), first=True)
register(
    TracedOp(
        "identity",
        lambda gm, n: _call(n, EXPANDS) or (n.op == "call_method" and n.target == "expand"),
        _expand,
    ),
    first=True,
)


# -- attention written out: softmax(q k^T scale [soft-capped] + mask) v ------------------------

MATMULS = (torch.matmul, operator.matmul, aten.matmul.default)
SOFTMAXES = (torch.softmax, F.softmax, aten.softmax.int, aten._softmax.default)
#: what may sit between the softmax and the product with the values (a probe runs dropout off)
AFTER_SOFTMAX = (aten.to.dtype, aten.dropout.default, aten.clone.default, aten.alias.default, F.dropout)
TRANSPOSES = (aten.transpose.int, torch.transpose)


EINSUMS = (torch.einsum, torch.functional.einsum, aten.einsum.default)


def _einsum(n) -> tuple[str, fx.Node, fx.Node] | None:
    """An einsum of two states as a batched product (lucidrains' ``einsum('b h i d, b h j d -> b h
    i j', q, k)``): ("qk", a, b) where it contracts both operands' last index (a b^T), ("ab", a,
    b) where the first's last with the second's second-to-last (a b); None for any other."""
    if not _call(n, EINSUMS) or not n.args or not isinstance(n.args[0], str):
        return None
    ops = list(n.args[1]) if len(n.args) == 2 and isinstance(n.args[1], (list, tuple)) else list(n.args[1:])
    eq = n.args[0].replace(" ", "")
    if len(ops) != 2 or "->" not in eq or eq.count(",") != 1:
        return None
    (a, b), out = eq.split("->")[0].split(","), eq.split("->")[1]
    if len(a) < 2 or not (len(a) == len(b) == len(out)) or a[:-2] != b[:-2] or a[:-2] != out[:-2]:
        return None
    (i, j), (k, l) = a[-2:], b[-2:]
    if l == j and k not in (i, j) and out[-2:] == i + k:  # ...ij,...kj->...ik
        return "qk", ops[0], ops[1]
    if k == j and l not in (i, j) and out[-2:] == i + l:  # ...ij,...jl->...il
        return "ab", ops[0], ops[1]
    return None


def _scaled_by(n):
    """n = x * c, c * x or x / c: (x, c as a factor) with c a number (``structure._constant_factor``)
    or a number the graph computes from the shapes (``/ math.sqrt(C // H)`` under torch.fx: a node
    with no tensor, read as ``("node", c_node, divides)`` and resolved from its recorded value by
    ``eager``); else (n, None)."""
    if _call(n, structure.MUL_FUNCTIONS + structure.DIV_FUNCTIONS):
        c = structure._constant_factor(n)
        x = next((a for a in n.args if isinstance(a, fx.Node)), None)
        if c is not None and x is not None:
            return x, c
        if len(n.args) == 2 and not n.kwargs and all(isinstance(a, fx.Node) for a in n.args):
            tensors = [a for a in n.args if "tensor_meta" in a.meta]
            if len(tensors) == 1:
                other = n.args[1] if tensors[0] is n.args[0] else n.args[0]
                divides = _call(n, structure.DIV_FUNCTIONS)
                if not (divides and other is n.args[0]):  # c / x is no scaling
                    return tensors[0], ("node", other, divides)
    return n, None


def eager_parts(n: fx.Node) -> dict | None:
    """Of attention written out -- ``softmax(q k^T scale [+ mask], -1) v`` (``@``, ``matmul`` or an
    ``einsum`` of the same products) or nanoGPT's
    ``softmax((q k^T scale).masked_fill(cond, -inf), -1) v``, its logits optionally soft-capped
    ``c tanh(z / c)`` (Gemma 2), the softmax's result through a cast or dropout (a function or an
    ``nn.Dropout``) --: {q, k, v, scale, cap, mask (an fx node or None), fill (the mask is
    masked_fill's condition)}; None for any other product."""
    product = _einsum(n)
    if product is not None and product[0] == "ab":
        w, v = product[1:]
    elif _call(n, MATMULS) and len(n.args) == 2:
        w, v = n.args
    else:
        return None
    while _call(w, AFTER_SOFTMAX) or _method_or_dropout(w):
        w = w.args[0]
    method = isinstance(w, fx.Node) and w.op == "call_method" and w.target == "softmax"  # att.softmax(-1)
    if not (_call(w, SOFTMAXES) or method):
        return None
    dim = w.args[1] if len(w.args) > 1 else w.kwargs.get("dim")
    z, mask = w.args[0], None
    if dim not in (-1, 3):
        return None
    filled = _filled(z)
    if filled is not None:  # nanoGPT's att.masked_fill(bias[..., :T, :T] == 0, -inf)
        z, cond = filled
        found = _logits_of(z, None)
        return None if found is None else {**found, "v": v, "mask": cond, "fill": True}
    if _call(z, structure.ADD_FUNCTIONS) and len(z.args) == 2:  # the mask, added
        z, mask = z.args  # which side is the state: read by ``eager`` (the constant is the mask)
    found = _logits_of(z, mask)
    return None if found is None else {**found, "v": v}


def _method_or_dropout(w) -> bool:
    """``w.to(...)``, or an ``nn.Dropout`` module called on it (torch.fx keeps the module)."""
    if not isinstance(w, fx.Node) or not w.args:
        return False
    if w.op == "call_method":
        return w.target == "to"
    owner = w.graph.owning_module
    return (
        w.op == "call_module"
        and owner is not None
        and isinstance(owner.get_submodule(w.target), torch.nn.Dropout)
    )


def _filled(z) -> tuple | None:
    """z = logits.masked_fill(cond, -inf) (a method, ``torch.masked_fill`` or ATen's): (logits,
    cond); else None."""
    is_method = isinstance(z, fx.Node) and z.op == "call_method" and z.target == "masked_fill"
    if not (is_method or _call(z, (torch.masked_fill, aten.masked_fill.Scalar))) or len(z.args) != 3:
        return None
    logits, cond, value = z.args
    return (logits, cond) if isinstance(value, float) and value == float("-inf") else None


def _logits_of(z, mask) -> dict | None:
    """{q, k, scale, cap, mask} of the logits ``z`` (or of ``mask``, whichever side of an added
    mask is q k^T scaled): q k^T [times numbers] [soft-capped c tanh(z / c)]; None otherwise."""
    cap = None
    for logits, other in ((z, mask), (mask, z)) if mask is not None else ((z, None),):
        inner, c = _scaled_by(logits)
        if isinstance(c, float) and _call(inner, (aten.tanh.default, torch.tanh)):
            tanh_in, c_in = _scaled_by(inner.args[0])
            if isinstance(c_in, float) and abs(c * c_in - 1.0) < 1e-9:  # c tanh(z / c)
                cap, logits = c, tanh_in
        scale: list = []
        while True:  # the scalings of the logits (q k^T * scale, / sqrt(d))
            logits, c = _scaled_by(logits)
            if c is None:
                break
            scale.append(c)
        product = _einsum(logits)
        if product is not None and product[0] == "qk":  # q k^T as an einsum
            return {"q": product[1], "k": product[2], "scale": scale, "cap": cap, "mask": other}
        if _call(logits, MATMULS) and len(logits.args) == 2:
            q, kt = logits.args
            turned = _call(kt, TRANSPOSES) or (
                isinstance(kt, fx.Node) and kt.op == "call_method" and kt.target == "transpose"
            )
            if turned and sorted(a % 4 if isinstance(a, int) else -1 for a in kt.args[1:3]) == [2, 3]:
                return {"q": q, "k": kt.args[0], "scale": scale, "cap": cap, "mask": other}
    return None


def eager(t, n: fx.Node) -> GraphNode:
    """The written-out attention's node: ``sdpa``'s maps with its scale, its cap and its mask (none
    or causal, ``attention.mask_kind``); a product of another form is ``unknown``, named."""
    found = eager_parts(n)
    label = t.label(n)
    states = [found[k] for k in ("q", "k", "v")] if found else []
    if not found or not all(isinstance(x, fx.Node) and x in t.index for x in states):
        return GraphNode(label, "unknown", t.inputs(n), why=f"{label}: a product of two states")
    causal = False
    if found["mask"] is not None:
        value = t.value(found["mask"])
        if found.get("fill") and value is not None:  # masked_fill's condition: the keys left out
            value = ~value.bool()
        kind = att.mask_kind(value)
        if kind is None:
            return GraphNode(
                label, "unknown", t.inputs(n), why=f"{label}: attention with a mask it cannot read"
            )
        causal = kind == "causal"
    sq, sk = t.shape(found["q"]), t.shape(found["k"])
    if not sq or not sk or len(sq) < 2:
        return GraphNode(label, "unknown", t.inputs(n), why=f"{label}: shapes not recorded")
    scale = _scale_value(t, found["scale"])
    if scale is None:
        return GraphNode(label, "unknown", t.inputs(n), why=f"{label}: a logits' scale it cannot read")
    one = att.Projection()
    params = att.Attention(
        one, one, one, one, sq[-1], scale, sq[-2], sk[-2], causal, weighted=False, cap=found["cap"]
    )
    return GraphNode(label, "sdpa", tuple(t.index[x] for x in states), params=params)


def _scale_value(t, factors: list) -> float | None:
    """The logits' scale: the product of its factors, a number each or a node's recorded value (a
    divisor inverted); None where one has no value."""
    scale = 1.0
    for c in factors:
        if isinstance(c, tuple):
            v = structure.number(t.value(c[1]))
            if v is None or (c[2] and v == 0):
                return None
            c = 1.0 / v if c[2] else v
        scale *= c
    return scale


register(TracedOp("attention", lambda gm, n: eager_parts(n) is not None, eager), first=True)
