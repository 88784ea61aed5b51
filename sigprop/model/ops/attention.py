"""Softmax attention as traced ops (docs/theory.md §15): ``nn.MultiheadAttention`` (a module torch.fx
keeps whole; batch first, no mask or a causal one) and ``F.scaled_dot_product_attention`` (no
mask, or ``is_causal``), and the ``getitem`` that takes its output from a tuple (or a query, key
or value from a split tensor: each element's moments unchanged).

The state grows by the shared moment of two tokens of one sample (``maps.Part.tokens``): attention
mixes the tokens of a sample and nothing across samples.  With the logits' variance across keys
s^2 = scale^2 d_h q_q (q_k - t_k) (``theory.logit_variance``), the weights' collision
probability P and the overlap C of two queries' weights (``theory.attention_weights``), and the
values' second moment q_v, token moment t_v and cross-sample moment k_v:

    forward:  q_o = t_v + (q_v - t_v) P,   t_o = t_v + (q_v - t_v) C,   k_o = k_v;
    backward: r_v = P r + (T - 1) C r_k,   rk_v = (1 - P) r / (T - 1) + (1 - C) r_k,
              r_q = K r (q_v - t_v) s^2 / q_q,   r_k = K r (q_v - t_v) scale^2 d_h q_q + ...,

(r, r_k the gradient's second moment and its shared moment between two tokens at the output;
the softmax's gradient to the queries and keys taken at independent keys; K the mean of w^2
(1 - 2 w + sum w^2) over the weights, ``theory.key_weight``) -- uniform attention
(s^2 -> 0) keeps t_v + (q_v - t_v)/T of the values and maps every token to the same vector.  A
module's projections are dense maps around it (q' = f q + b per element, r = g r')."""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from sigprop.maps.layers import Attention, Projection
from sigprop.maps.state import GraphNode
from sigprop.model.ops import parts
from sigprop.model.ops.registry import TracedOp, register


def _projection(w, b) -> Projection:
    w = w.detach().double()
    rows, cols = w.shape
    sq = float(w.pow(2).sum())
    bias = 0.0 if b is None else float(b.detach().double().pow(2).sum()) / rows
    return Projection(sq / rows, bias, sq / cols)


def attention_params(m: nn.MultiheadAttention, tokens: int, keys: int, causal: bool) -> Attention:
    """An ``nn.MultiheadAttention``'s maps' parameters: its projections (one in-projection split
    in three, or three), heads of embed_dim/num_heads, the scale 1/sqrt(d_h)."""
    if m._qkv_same_embed_dim:
        wq, wk, wv = m.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    bq, bk, bv = (None, None, None) if m.in_proj_bias is None else m.in_proj_bias.chunk(3)
    hd = m.embed_dim // m.num_heads
    return Attention(
        _projection(wq, bq),
        _projection(wk, bk),
        _projection(wv, bv),
        _projection(m.out_proj.weight, m.out_proj.bias),
        hd,
        1.0 / math.sqrt(hd),
        tokens,
        keys,
        causal,
    )


def _mha_node(t, n: fx.Node) -> GraphNode:
    """``nn.MultiheadAttention(query, key, value, ...)``: batch first, its in- and out-projections,
    no key padding mask, no attention mask unless ``is_causal`` says it is the causal one."""
    m = t.module(n)
    label = n.target
    args = list(n.args) + [None] * 3
    query, key, value = (n.kwargs.get(k, a) for k, a in zip(("query", "key", "value"), args[:3]))
    causal = bool(n.kwargs.get("is_causal", False))
    why = ""
    if not m.batch_first:
        why = (
            "nn.MultiheadAttention with batch_first=False (the tokens are not the first axis after the batch)"
        )
    elif m.bias_k is not None or m.add_zero_attn:
        why = "nn.MultiheadAttention with add_bias_kv or add_zero_attn"
    elif n.kwargs.get("key_padding_mask") is not None:
        why = "nn.MultiheadAttention with a key padding mask"
    elif n.kwargs.get("attn_mask", args[5] if len(n.args) > 5 else None) is not None and not causal:
        why = "nn.MultiheadAttention with an attention mask (is_causal=True reads a causal one)"
    if why or not all(isinstance(a, fx.Node) and a in t.index for a in (query, key, value)):
        return GraphNode(label, "unknown", t.inputs(n), why=why or f"{label} with inputs it cannot read")
    shape_q, shape_k = t.shape(query), t.shape(key)
    if not shape_q or not shape_k or len(shape_q) != 2:
        return GraphNode(label, "unknown", t.inputs(n), why=f"{label}: inputs not [batch, tokens, features]")
    params = attention_params(m, shape_q[0], shape_k[0], causal)
    ins = tuple(t.index[a] for a in (query, key, value))
    return GraphNode(label, "attention", ins, width=m.embed_dim, params=params)


def _sdpa_node(t, n: fx.Node) -> GraphNode:
    """``F.scaled_dot_product_attention(q, k, v)`` on [batch, heads, tokens, d_h]: no mask, or
    ``is_causal``."""
    label = t.label(n)
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    a = {**dict(zip(names, n.args)), **n.kwargs}
    causal = bool(a.get("is_causal", False))
    if a.get("attn_mask") is not None:
        kind = mask_kind(t.value(a["attn_mask"]))
        if kind is None:
            why = f"{label} with an attention mask (no mask, a causal one or is_causal are read)"
            return GraphNode(label, "unknown", t.inputs(n), why=why)
        causal = causal or kind == "causal"
    if a.get("enable_gqa"):
        return GraphNode(label, "unknown", t.inputs(n), why=f"{label} with grouped queries")
    nodes = [a.get(k) for k in ("query", "key", "value")]
    if not all(isinstance(x, fx.Node) and x in t.index for x in nodes):
        return t.unknown(n)
    sq, sk = t.shape(nodes[0]), t.shape(nodes[1])
    if not sq or not sk or len(sq) < 2:
        return GraphNode(label, "unknown", t.inputs(n), why=f"{label}: shapes not recorded")
    hd = sq[-1]
    scale = a.get("scale") or 1.0 / math.sqrt(hd)
    one = Projection()
    params = Attention(one, one, one, one, hd, float(scale), sq[-2], sk[-2], causal, weighted=False)
    return GraphNode(label, "sdpa", tuple(t.index[x] for x in nodes), params=params)


def mask_kind(mask) -> str | None:
    """What a constant attention mask is: "none" (every key read: all True, or all 0 added),
    "causal" (key s read by query t when s <= t, for every batch row and head), or None (a mask
    the maps do not read, or no value recorded)."""
    if mask is None:
        return None
    m = mask.detach()
    if m.dtype == torch.bool:
        allowed = m
    elif m.is_floating_point():
        allowed = m > -1e30
        if bool((m[allowed] != 0).any()):
            return None  # an additive bias that is not 0 / -inf
    else:
        return None
    if bool(allowed.all()):
        return "none"
    Tq, Tk = allowed.shape[-2:]
    tril = torch.ones(Tq, Tk, dtype=torch.bool, device=m.device).tril()
    return "causal" if bool((allowed == tril).all()) else None


def _getitem_node(t, n: fx.Node) -> GraphNode:
    """x[i] of a tensor (a query, key or value of a split), or [0] of an attention's output
    tuple: each element's moments unchanged."""
    src = n.args[0]
    if not isinstance(src, fx.Node) or src not in t.index:
        return t.unknown(n)
    j = t.index[src]
    if t.nodes[j].op == "const":  # a size from a shape
        return GraphNode(t.label(n), "const", ())
    if t.nodes[j].op in ("attention", "unknown"):  # a module's (output, weights)
        if t.nodes[j].op == "attention" and n.args[1] != 0:
            return GraphNode(t.label(n), "unknown", (j,), why="the attention's weights (need_weights)")
        return GraphNode(t.label(n), "identity", (j,))
    if n.op == "call_method":  # x.split(...) itself: the tuple of every part, each read by its getitem
        return GraphNode(t.label(n), "identity", (j,))
    return slice_node(t, n, j, src)


def slice_node(t, n: fx.Node, j: int, src: fx.Node) -> GraphNode:
    """A part of a tensor's elements (a query, key or value of a split, one token): each element's
    moments as they were, and its gradient a ``share`` of the source's elements -- the readers of
    a split read disjoint parts, so the source's gradient per element is their share-weighted sum
    (``structure._sliced_back``).  A piece of a dense layer's output (``parts.Piece``, in
    ``params``) reads its own rows of W: its moments times their ``sigma`` (``backward``)."""
    splits = ("split", "chunk", "unbind", "split_with_sizes")
    name = src.target if isinstance(src.target, str) else getattr(src.target, "__name__", str(src.target))
    base = src.args[0] if any(k in str(name) for k in splits) and src.args else src
    out, whole = t.shape(n), t.shape(base) if isinstance(base, fx.Node) else None
    share = math.prod(out) / math.prod(whole) if out and whole and math.prod(whole) else 1.0
    piece = parts.piece_of(t, n)  # a piece of a fused projection: its own rows (ops/parts.py)
    sigma = 1.0 if piece is None else piece.sigma
    return GraphNode(t.label(n), "slice", (j,), forward=min(1.0, share), backward=sigma, params=piece)


def _is_mha(gm: fx.GraphModule, n: fx.Node) -> bool:
    return n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.MultiheadAttention)


#: a tensor's attributes that are its metadata, not its values: ``x.shape``, and ``x.device`` and
#: ``x.dtype`` where a constant is made beside it (nanoGPT's ``torch.arange(t, device=idx.device)``)
METADATA = ("shape", "device", "dtype")


def is_metadata(n: fx.Node) -> bool:
    """``x.shape``, ``x.device``, ``x.dtype`` (getattr) or ``x.size()``: metadata, no state."""
    return (
        n.op == "call_function" and n.target is getattr and len(n.args) == 2 and n.args[1] in METADATA
    ) or (n.op == "call_method" and n.target == "size")


register(TracedOp("size", lambda gm, n: is_metadata(n), lambda t, n: GraphNode(t.label(n), "const", ())))
register(TracedOp("attention", _is_mha, _mha_node))
register(
    TracedOp(
        "attention",
        lambda gm, n: (
            n.op == "call_function"
            and n.target
            in (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)
        ),
        _sdpa_node,
    )
)
register(
    TracedOp(
        "identity",
        lambda gm, n: (
            (n.op == "call_function" and n.target is operator.getitem)
            or (n.op == "call_method" and n.target in ("unbind", "chunk", "split"))
        ),
        _getitem_node,
    )
)
