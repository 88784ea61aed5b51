"""``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` as traced ops (docs/theory.md §15):
torch.fx keeps torch's own modules whole, and their forward (its fast-path checks) does not trace,
so a call of one is expanded here into the nodes its forward computes -- per layer, pre-LN
(``norm_first``): x + SA(LN1(x)), then + FF(LN2(.)); post-LN: LN1(x + SA(x)), then LN2(. +
FF(.)); FF = linear2(act(linear1(.))); dropout off -- each node named by its module's path, so
that a site ``encoder.layers.3`` reads its layer's last node.  Batch first; no mask, or a causal
one with ``is_causal=True``."""

from __future__ import annotations

from dataclasses import replace

import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from sigprop.maps.state import GraphNode
from sigprop.model.ops.activation import act_node
from sigprop.model.ops.attention import attention_params
from sigprop.model.ops.linear import _dense_node
from sigprop.model.ops.norm import _norm_node
from sigprop.model.ops.registry import TracedOp, register


class _Nodes:
    """The nodes of an expansion, their indices absolute (from ``base``, the graph's length)."""

    def __init__(self, base: int) -> None:
        self.base, self.nodes = base, []

    def add(self, node: GraphNode) -> int:
        self.nodes.append(node)
        return self.base + len(self.nodes) - 1


def _layer(
    out: _Nodes, m: nn.TransformerEncoderLayer, path: str, x: int, shape, causal: bool, draw: str = ""
) -> int | str:
    """One layer's nodes after node x (its input, per-sample shape [T, d]); the index of its
    output node, or why it cannot be expanded.  Its attention and weight layers are tagged with
    their draw (``GraphNode.weight``): ``draw`` (the layer it is a copy of; default its own path)
    and the module's name -- a layer called again, or a copy, reads the same draws
    (sigprop/maps/cross.py)."""
    draw = draw or path
    if not m.self_attn.batch_first:
        return f"{path}: batch_first=False (the tokens are not the first axis after the batch)"
    act = m.activation
    fn = act if isinstance(act, nn.Module) else {F.relu: nn.ReLU(), F.gelu: nn.GELU()}.get(act)
    if fn is None:
        return f"{path}: its activation {getattr(act, '__name__', act)!r}"
    T, d = shape
    hidden = (T, m.linear1.out_features)
    params = attention_params(m.self_attn, T, T, causal)

    def attn(h: int) -> int:
        return out.add(
            GraphNode(
                f"{path}.self_attn",
                "attention",
                (h, h, h),
                width=d,
                params=params,
                shape=shape,
                weight=f"{draw}.self_attn",
            )
        )

    def dense(mod, name: str, h: int, s_in, s_out) -> int:
        nd = _dense_node(mod, s_in, s_out, f"{path}.{name}", (h,))
        return out.add(replace(nd, shape=tuple(s_out), weight=f"{draw}.{name}"))

    def ff(h: int) -> int:
        a = dense(m.linear1, "linear1", h, shape, hidden)
        b = out.add(act_node(fn, f"{path}.activation", (a,), hidden))
        return dense(m.linear2, "linear2", b, hidden, shape)

    def norm(mod: nn.Module, name: str, h: int) -> int:
        return out.add(_with_shape(_norm_node(mod, f"{path}.{name}", (h,), shape), shape))

    def add(a: int, b: int, name: str) -> int:
        return out.add(GraphNode(name, "add", (a, b), shape=shape))

    if m.norm_first:
        h = add(x, attn(norm(m.norm1, "norm1", x)), f"{path}.add1")
        return add(h, ff(norm(m.norm2, "norm2", h)), f"{path}.add2")
    h = norm(m.norm1, "norm1", add(x, attn(x), f"{path}.add1"))
    return norm(m.norm2, "norm2", add(h, ff(h), f"{path}.add2"))


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    """Two layers whose parameters are equal, every one (a deep copy not yet re-drawn)."""
    pa, pb = list(a.parameters()), list(b.parameters())
    return len(pa) == len(pb) and all(x.shape == y.shape and bool((x == y).all()) for x, y in zip(pa, pb))


def _with_shape(node: GraphNode, shape) -> GraphNode:
    return replace(node, shape=tuple(shape))


def _expand(t, n: fx.Node):
    """The call's nodes (a list, the last its output's), or an ``unknown`` node naming why."""
    m = t.module(n)
    names = ("src", "mask", "src_key_padding_mask", "is_causal")
    a = {**dict(zip(names, n.args)), **n.kwargs}
    src = a.get("src")
    causal = bool(a.get("is_causal") or False)
    why = ""
    if a.get("src_key_padding_mask") is not None:
        why = f"{n.target} with a key padding mask"
    elif (a.get("mask") is not None or a.get("src_mask") is not None) and not causal:
        why = f"{n.target} with an attention mask (is_causal=True reads a causal one)"
    shape = t.shape(src) if isinstance(src, fx.Node) else None
    if not why and (src not in t.index or not shape or len(shape) != 2):
        why = f"{n.target}: input not [batch, tokens, features]"
    if why:
        return GraphNode(n.target, "unknown", t.inputs(n), why=why)
    out = _Nodes(len(t.nodes))
    x = t.index[src]
    layers = (
        [(n.target, m)]
        if isinstance(m, nn.TransformerEncoderLayer)
        else list((f"{n.target}.layers.{k}", layer) for k, layer in enumerate(m.layers))
    )
    for k, (path, layer) in enumerate(layers):
        # nn.TransformerEncoder deep-copies its layer: a copy reads its twin's draws
        twin = next((p for p, other in layers[:k] if _same_weights(layer, other)), None)
        x = _layer(out, layer, path, x, shape, causal, twin or "")
        if isinstance(x, str):
            return GraphNode(n.target, "unknown", t.inputs(n), why=x)
    if isinstance(m, nn.TransformerEncoder) and m.norm is not None:
        out.add(_with_shape(_norm_node(m.norm, f"{n.target}.norm", (x,), shape), shape))
    return out.nodes


register(
    TracedOp(
        "transformer",
        lambda gm, n: (
            n.op == "call_module"
            and isinstance(gm.get_submodule(n.target), (nn.TransformerEncoderLayer, nn.TransformerEncoder))
        ),
        _expand,
    )
)
