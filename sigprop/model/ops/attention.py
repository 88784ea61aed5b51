"""Softmax attention as traced ops (docs/theory.md §15): ``nn.MultiheadAttention`` (a module torch.fx
keeps whole; batch first, no mask or a causal one) and ``F.scaled_dot_product_attention`` (no
mask, or ``is_causal``), and the ``getitem`` that takes its output from a tuple (or a query, key
or value from a split tensor: each element's moments unchanged).

The state grows by the shared moment of two tokens of one sample (``graph.Part.tokens``): attention
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
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from sigprop import theory
from sigprop.model.graph import GraphNode, Part, map_op, merged
from sigprop.model.ops.registry import TracedOp, register

#: the largest logit variance across keys the attention map is applied at: measured on pre-LN
#: encoders (d = 128, T = 32, 4 draws; docs/theory.md §15) the forward ratios hold within 1% up to
#: s^2 = 3.3 and the backward within 4% up to s^2 = 1.6, 11% at 3.3 (the softmax's gradient to the
#: queries and keys, taken at independent keys, grows too fast); ``theory.collision`` is exact
#: further (to ``theory.MAX_LOGIT_VARIANCE``)
MAP_LOGIT_VARIANCE = 2.0


@dataclass(frozen=True)
class Projection:
    """A dense map per element: q' = forward q + bias (forward = ||W||^2/rows), r = backward r'."""

    forward: float = 1.0
    bias: float = 0.0
    backward: float = 1.0

    def scaled(self, factor: float) -> "Projection":
        return Projection(self.forward * factor, self.bias, self.backward * factor)


@dataclass(frozen=True)
class Attention:
    """What an attention node's maps read: the query, key, value and output projections (identity
    for ``scaled_dot_product_attention``), the head dimension, the logit scale, the tokens of a
    sample (queries and keys) and whether the mask is causal."""

    q: Projection
    k: Projection
    v: Projection
    o: Projection
    head_dim: int
    scale: float
    tokens: int
    keys: int
    causal: bool
    #: the projections are weight layers (a module's): a prediction with every weight layer's
    #: variance scaled scales them
    weighted: bool = True
    #: logits soft-capped to c tanh(z/c) (Gemma 2), None: not capped
    cap: float | None = None

    def projection(self, name: str, factor: float) -> Projection:
        pr = getattr(self, name)
        return pr.scaled(factor) if self.weighted else pr


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
    return slice_node(t, n, j, src)


def slice_node(t, n: fx.Node, j: int, src: fx.Node) -> GraphNode:
    """A part of a tensor's elements (a query, key or value of a split, one token): each element's
    moments as they were, and its gradient a ``share`` of the source's elements -- the readers of
    a split read disjoint parts, so the source's gradient per element is their share-weighted sum
    (``structure._sliced_back``)."""
    splits = ("split", "chunk", "unbind", "split_with_sizes")
    name = src.target if isinstance(src.target, str) else getattr(src.target, "__name__", str(src.target))
    base = src.args[0] if any(k in str(name) for k in splits) and src.args else src
    out, whole = t.shape(n), t.shape(base) if isinstance(base, fx.Node) else None
    share = math.prod(out) / math.prod(whole) if out and whole and math.prod(whole) else 1.0
    return GraphNode(t.label(n), "slice", (j,), forward=min(1.0, share))


def _is_mha(gm: fx.GraphModule, n: fx.Node) -> bool:
    return n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.MultiheadAttention)


def _is_size(gm: fx.GraphModule, n: fx.Node) -> bool:
    """``x.shape`` (getattr) or ``x.size()``: sizes, no state."""
    return (n.op == "call_function" and n.target is getattr and n.args[1:] == ("shape",)) or (
        n.op == "call_method" and n.target == "size"
    )


register(TracedOp("size", _is_size, lambda t, n: GraphNode(t.label(n), "const", ())))
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


def _moments(nd: GraphNode, fold):
    """The projected queries, keys and values ((q, tokens, shared) per element), the weights'
    (P, C), the logits' variance s^2 (soft-capped where they are) and, before the cap, their
    variance and the cap's slope E[sech^4] (``theory.capped``; (s^2, 1) without one)."""
    p: Attention = nd.params
    proj = [p.projection(k, fold.weight_factor) for k in "qkv"]
    xs = [merged(fold.states[j]) for j in nd.inputs]
    mom = [
        (pr.forward * x.q + pr.bias, pr.forward * x.tok + pr.bias, pr.forward * x.shared + pr.bias)
        for pr, x in zip(proj, xs)
    ]
    raw = theory.logit_variance(p.scale, p.head_dim, mom[0][0], mom[1][0], mom[1][1])
    s2, slope = theory.capped(raw, p.cap)
    P, C = theory.attention_weights(s2, p.tokens, p.causal, p.keys)
    return mom, P, C, s2, (raw, slope)


def _forward(nd: GraphNode, i: int, fold) -> None:
    p: Attention = nd.params
    mom, P, C, s2, _ = _moments(nd, fold)
    if s2 > MAP_LOGIT_VARIANCE:  # beyond the map's range: no state, said why
        fold.why[i] = (
            f"{nd.name} at logits of variance {s2:.3g} across keys (the attention map covers up to "
            f"{MAP_LOGIT_VARIANCE:g}, docs/theory.md §15)"
        )
        return
    fold.regimes.append(s2)
    fold.logit_variance[i] = s2
    fold.entropy[i] = theory.attention_entropy(s2, p.tokens, p.causal, p.keys)
    qv, tv, kv = mom[2]
    o = p.projection("o", fold.weight_factor)
    q_out, t_out = tv + (qv - tv) * P, tv + (qv - tv) * C
    fold.states[i] = [
        Part(1.0, o.forward * q_out + o.bias, 0.0, o.forward * kv + o.bias, None, o.forward * t_out + o.bias)
    ]


def _backward(nd: GraphNode, i: int, g: list, fold) -> None:
    p: Attention = nd.params
    mom, P, C, s2, (raw, slope) = _moments(nd, fold)
    mine = fold.states[i]
    o = p.projection("o", fold.weight_factor)
    r = o.backward * sum(s.share * x[0] for s, x in zip(mine, g))
    rk = o.backward * sum(s.share * x[1] for s, x in zip(mine, g))
    (qq, tq, _), _, (qv, tv, _) = mom
    T = p.tokens
    spread_v = max(qv - tv, 0.0)
    r_v = P * r + (T - 1) * C * rk
    rk_v = (1 - P) * r / max(T - 1, 1) + (1 - C) * rk
    # a query's and a key's gradients sum their keys' and queries' parts weighted by K, the
    # weights' squares less what the softmax's centring takes (``theory.key_weight``; P-bar in
    # 0.15.0: 2x high under a causal mask, whose first query sends nothing back), and the
    # gradient's part shared by the tokens adds up the queries' shared part coherently, (1 - P) t_q
    K = theory.key_weight(s2, T, p.causal, p.keys)
    # a cap passes E[sech^4] of a logit's gradient (``slope``); the uncapped variance is the keys'
    # spread
    r_q = slope * K * r * spread_v * raw / qq if qq > 0 else 0.0
    r_k = slope * (K * r * qq + (1 - P) * rk * max(tq, 0.0)) * spread_v * p.scale**2 * p.head_dim
    for j, name, (rr, kk) in zip(nd.inputs, "qkv", ((r_q, 0.0), (r_k, 0.0), (r_v, rk_v))):
        b = p.projection(name, fold.weight_factor).backward
        fold.give(j, [(b * rr, b * kk, None)], i)


# a module's projections are weight layers (its output uncorrelated with its input; a scaled
# prediction scales them, ``Attention.projection``); the function's queries, keys and values are
# the layers before it
def _tangent(nd: GraphNode, i: int, e: list, fold) -> float | None:
    """The value path is linear in the values for fixed weights: the output moves with the values'
    response as much as the values do, (e_v/q_v) of the attended values' q_o, through the output
    projection; the softmax's own response (through the queries and keys) is left out."""
    p: Attention = nd.params
    if e[2] is None:
        return 0.0
    mom, P, _, _, _ = _moments(nd, fold)
    qv, tv, _ = mom[2]
    v, o = (p.projection(k, fold.weight_factor) for k in "vo")
    if qv <= 0.0:
        return None
    return o.forward * v.forward * e[2] / qv * (tv + (qv - tv) * P)


map_op("attention", _forward, _backward, weighted=True, tangent=_tangent)
map_op("sdpa", _forward, _backward, tangent=_tangent)
