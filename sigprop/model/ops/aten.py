"""The ATen ops of torch.export's graph as traced ops (docs/theory.md §15): what a model torch.fx
cannot trace (a Hugging Face transformer) is read by ``torch.export`` (sigprop/model/trace.py),
whose graph calls ATen ops on parameters it reads as constants.  Weight layers (``linear``,
``addmm`` -- GPT-2's Conv1D, x W + b), ``layer_norm``, the activations, the token embedding
(``embedding`` of the input ids: its table's moments over uniform ids), reshapes, dropout (off in a
probe) and splits map as their module counterparts do; ``scaled_dot_product_attention``, sums and
scalings are ops/attention.py's and ops/structure.py's.  A GELU module written out as its formula
(Hugging Face's ``NewGELUActivation``) is exported as the one op it computes
(``exact_activations``)."""

from __future__ import annotations

import contextlib
import operator

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from sigprop.maps.state import GraphNode
from sigprop.model.ops import activation as act
from sigprop.model.ops import attention as att
from sigprop.model.ops.linear import _dense_node, weight_node
from sigprop.model.ops.norm import norm_node, rms_node
from sigprop.model.ops.registry import TracedOp, register

aten = torch.ops.aten

#: ATen ops that leave every element's moments as they are (a probe runs dropout off)
IDENTITY = (
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.transpose.int,
    aten.permute.default,
    aten.contiguous.default,
    aten.clone.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.default,
    aten.dropout.default,
    aten.alias.default,
    aten.to.dtype_layout,
    aten.to.dtype,
    aten.detach.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.chunk.default,
    aten.expand.default,
    aten.flatten.using_ints,
)

#: Hugging Face's GELU modules that write a GELU out as its formula -> the ``approximate`` it is
TANH_GELUS = ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh", "FastGELUActivation", "GELUPytorchTanh")


@contextlib.contextmanager
def exact_activations(model: nn.Module):
    """While exporting: each of the model's GELU modules that computes a GELU by its formula
    (``TANH_GELUS``; 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))), the tanh approximation
    exactly) calls ``F.gelu(x, approximate="tanh")`` instead, and an RMSNorm written out (a class
    named ``*RMSNorm`` with a gain: Hugging Face's Llama) ``F.rms_norm``, so the graph holds one op."""
    changed = []
    for m in model.modules():
        if type(m).__name__ in TANH_GELUS:
            changed.append(m)
            m.forward = lambda x: F.gelu(x, approximate="tanh")
        elif type(m).__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor):
            # x rsqrt(mean x^2 + eps) g, written out (Llama's g = weight; Gemma's g = 1 + weight):
            # the one op it computes, with the gain it is seen to apply (else left as written)
            eps = getattr(m, "variance_epsilon", getattr(m, "eps", 1e-6))
            gain = _rms_gain(m, eps)
            if gain is not None:
                changed.append(m)
                m.forward = lambda x, m=m, eps=eps, gain=gain: F.rms_norm(
                    x, (m.weight.shape[-1],), gain(m), eps
                )
    try:
        yield
    finally:
        for m in changed:
            del m.forward


def _rms_gain(m: nn.Module, eps: float):
    """The gain an RMSNorm module applies, as a function of it -- its weight (Llama) or one plus it
    (Gemma, whose weight starts at 0) -- told apart by calling it on a random input; None where it
    is neither."""
    d = m.weight.shape[-1]
    w = m.weight.detach()
    with torch.no_grad():
        x = torch.randn(3, d, generator=torch.Generator().manual_seed(0)).to(w)
        try:
            y = m(x)
        except Exception:  # a module that takes other arguments: traced as written
            return None
        for gain in (lambda m: m.weight, lambda m: 1.0 + m.weight):
            if isinstance(y, torch.Tensor) and torch.allclose(
                y, F.rms_norm(x, (d,), gain(m).detach(), eps), atol=1e-5
            ):
                return gain
    return None


def _is(*targets):
    return lambda gm, n: n.op == "call_function" and n.target in targets


def _weight(t, n: fx.Node, w, b, transposed: bool) -> GraphNode:
    """A weight layer y = x W^T + b (``transposed``: x W + b, GPT-2's Conv1D): the dense map of
    ops/linear.py (``weight_node``); its tokens share the weights."""
    name, inputs = t.label(n), t.inputs(n)
    if w is None:
        return GraphNode(name, "unknown", inputs, why=f"{name} with a weight that is not a parameter")
    x = n.args[1] if transposed else n.args[0]
    shape_in = t.shape(x)
    first = next((a for a in t.gm.graph.nodes if a.op == "placeholder"), None)
    if shape_in is not None and len(shape_in) == 1 and _rows(x) != _rows(first):
        shape_in = (_rows(x), *shape_in)  # the tokens flattened into the rows (GPT-2's Conv1D): they share W
    return weight_node(name, inputs, w.T if transposed else w, b, shape_in, t.shape(n))


def _rows(n) -> int | None:
    """The leading size of a node's value (the samples of the model's first input)."""
    meta = n.meta.get("tensor_meta") if isinstance(n, fx.Node) else None
    return int(meta.shape[0]) if meta is not None and hasattr(meta, "shape") and len(meta.shape) else None


def _linear(t, n: fx.Node) -> GraphNode:
    w = n.args[1]
    b = n.args[2] if len(n.args) > 2 else None
    return _weight(t, n, t.value(w), t.value(b), transposed=False)


def _addmm(t, n: fx.Node) -> GraphNode:
    b, w = n.args[0], n.args[2]
    if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1:
        return t.unknown(n)
    return _weight(t, n, t.value(w), t.value(b), transposed=True)


#: a state times a matrix: a weight layer where the matrix is the model's constant
MATMULS = (aten.matmul.default, aten.mm.default, torch.matmul, operator.matmul)


def _matmul(t, n: fx.Node) -> GraphNode:
    """``x @ M`` with M a constant matrix [c_in, c_out] of the model's (Falcon's ``FalconLinear``:
    ``x @ self.weight.T``): the dense map of M^T; a product of two states is no weight layer."""
    m = t.value(n.args[1]) if len(n.args) == 2 else None
    if len(t.inputs(n)) != 1 or m is None or m.dim() != 2 or t.value(n.args[0]) is not None:
        return GraphNode(t.label(n), "unknown", t.inputs(n), why=f"{t.label(n)} of two states")
    return _weight(t, n, m.T, None, transposed=False)


def _conv(t, n: fx.Node) -> GraphNode:
    """``conv{1,2,3}d(x, weight, bias, stride, padding, dilation, groups)``: the module's map
    (ops/linear.py), read from a conv module rebuilt on the same weights and arguments."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    a = {**dict(zip(names, n.args)), **n.kwargs}
    w, b = t.value(a.get("weight")), t.value(a.get("bias"))
    shape_in, shape_out = t.shape(a["input"]), t.shape(n)
    if w is None or not shape_in or not shape_out or isinstance(a.get("padding"), str):
        return t.unknown(n)
    d = w.dim() - 2
    cls = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[d]
    groups = int(a.get("groups", 1))
    m = cls(
        w.shape[1] * groups,
        w.shape[0],
        tuple(w.shape[2:]),
        stride=a.get("stride", 1),
        padding=a.get("padding", 0),
        dilation=a.get("dilation", 1),
        groups=groups,
        bias=b is not None,
        device="meta",
    )
    m.weight = nn.Parameter(w.detach(), requires_grad=False)
    if b is not None:
        m.bias = nn.Parameter(b.detach(), requires_grad=False)
    return _dense_node(m, shape_in, shape_out, t.label(n), t.inputs(n)[:1])


def _layer_norm(t, n: fx.Node) -> GraphNode:
    """``layer_norm(x, shape, weight, bias)``: ops/norm.py's layer norm over the last dims."""
    shape = n.args[1]
    w = t.value(n.args[2]) if len(n.args) > 2 else None
    b = t.value(n.args[3]) if len(n.args) > 3 else None
    return norm_node(t.label(n), t.inputs(n), w, b, int(np.prod(shape)), int(shape[0]))


def _activation(t, n: fx.Node) -> GraphNode:
    if n.target is aten.gelu.default:
        approx = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
        module = nn.GELU(approximate=approx)
    else:
        module = {aten.relu.default: nn.ReLU(), aten.tanh.default: nn.Tanh(), aten.silu.default: nn.SiLU()}[
            n.target
        ]
    return act.act_node(module, t.label(n), t.inputs(n))


def _embedding(t, n: fx.Node) -> GraphNode:
    if n.op == "call_module":
        m = t.module(n)
        return embedding_node(m.weight, n.target, t.inputs(n), m.padding_idx)
    pad = n.args[2] if len(n.args) > 2 else n.kwargs.get("padding_idx", -1)
    return embedding_node(t.value(n.args[0]), t.label(n), t.inputs(n), pad)


def embedding_node(table, name: str, inputs: tuple, padding_idx=None) -> GraphNode:
    """The token embedding of ids uniform over its table less its padding row (``padding_idx``;
    aten's -1: none), as sigprop draws them (``build.uniform_ids``): per element q = mean
    ||E_i||^2 / d, the mean m of its entries, and two tokens' (and two samples') shared moment
    ||E-bar||^2 / d, the mean row's (exactly: two ids drawn independently, equal or not).  Its
    gradient stops here (ids have none)."""
    if table is None:
        return GraphNode(name, "unknown", inputs, why=f"{name} with a table that is not a parameter")
    e = table.detach().double()
    if padding_idx is not None and padding_idx >= 0 and e.shape[0] > 1:
        e = torch.cat((e[:padding_idx], e[padding_idx + 1 :]))
    q = float(e.pow(2).mean())
    shared = float(e.mean(0).pow(2).mean())
    return GraphNode(
        name, "embedding", inputs, forward=q, bias=float(e.mean()), params=shared, width=e.shape[1]
    )


register(
    TracedOp("identity", _is(*IDENTITY), lambda t, n: GraphNode(t.label(n), "identity", t.inputs(n)[:1]))
)
register(
    TracedOp(
        "identity",
        _is(aten.select.int, aten.slice.Tensor, aten.narrow.default),
        lambda t, n: att.slice_node(t, n, t.inputs(n)[0], n.args[0]) if t.inputs(n) else t.unknown(n),
    )
)
register(TracedOp("dense", _is(aten.linear.default), _linear))
register(TracedOp("dense", _is(aten.addmm.default), _addmm))
register(TracedOp("dense", _is(*MATMULS), _matmul))
register(TracedOp("norm", _is(aten.layer_norm.default), _layer_norm))
register(
    TracedOp(
        "norm",
        _is(aten.rms_norm.default),
        lambda t, n: rms_node(
            t.label(n),
            t.inputs(n)[:1],
            t.value(n.args[2]) if len(n.args) > 2 else None,
            n.args[1],
            n.args[3] if len(n.args) > 3 else n.kwargs.get("eps"),
        ),
    )
)
register(TracedOp("dense", _is(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default), _conv))
register(
    TracedOp(
        "act", _is(aten.gelu.default, aten.relu.default, aten.tanh.default, aten.silu.default), _activation
    )
)
register(TracedOp("embedding", _is(aten.embedding.default), _embedding))
register(
    TracedOp(
        "embedding",
        lambda gm, n: (
            n.op == "call_module"
            and type(gm.get_submodule(n.target)) is nn.Embedding
            and gm.get_submodule(n.target).max_norm is None
        ),
        _embedding,
    )
)
