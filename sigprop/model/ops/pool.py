"""Fixed per-channel linear maps and max pooling as traced ops (docs/theory.md §13): average and
adaptive average pooling, a mean over the positions, interpolation (a map A per channel, one
matrix per spatial axis built by torch's own 1-D op of the identity: fluctuations through A^2,
the shared part through A), and max pooling of P elements after a nondecreasing activation or
of a Gaussian state (the moments of the largest of P)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from sigprop.maps.state import GraphNode
from sigprop.model.ops.activation import _nondecreasing
from sigprop.model.ops.registry import TracedOp, register

#: fixed per-channel maps (``mix``) and max pooling, as modules; a call of the matching function
#: is turned into its module (``_as_module``) so that one reading serves both
MIX_MODULES = (
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.Upsample,
)
MAXPOOL_MODULES = (
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
)
POOL_FUNCTIONS = {
    F.avg_pool1d: nn.AvgPool1d,
    F.avg_pool2d: nn.AvgPool2d,
    F.avg_pool3d: nn.AvgPool3d,
    F.adaptive_avg_pool1d: nn.AdaptiveAvgPool1d,
    F.adaptive_avg_pool2d: nn.AdaptiveAvgPool2d,
    F.adaptive_avg_pool3d: nn.AdaptiveAvgPool3d,
    F.interpolate: nn.Upsample,
    F.max_pool1d: nn.MaxPool1d,
    F.max_pool2d: nn.MaxPool2d,
    F.max_pool3d: nn.MaxPool3d,
    F.adaptive_max_pool1d: nn.AdaptiveMaxPool1d,
    F.adaptive_max_pool2d: nn.AdaptiveMaxPool2d,
    F.adaptive_max_pool3d: nn.AdaptiveMaxPool3d,
}


def _as_module(gm: fx.GraphModule, n: fx.Node) -> nn.Module | None:
    """The module a pooling/interpolation node applies (a call of ``F.avg_pool2d`` and its kin
    made into the module with its arguments), or None where its arguments are not constants."""
    if n.op == "call_module":
        return gm.get_submodule(n.target)
    cls = POOL_FUNCTIONS.get(n.target) if n.op == "call_function" else None
    if cls is None:
        return None
    try:
        kw = dict(n.normalized_arguments(gm, normalize_to_only_use_kwargs=True).kwargs)
    except Exception:
        return None
    kw.pop("input", None)
    if cls is nn.Upsample and kw.pop("antialias", False):
        return None
    if any(isinstance(v, fx.Node) for v in kw.values()):
        return None
    try:
        return cls(**kw)
    except (TypeError, ValueError):
        return None


def _per_axis(v, d: int) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * d


def _axis_matrices(m, shape_in, shape_out) -> list[np.ndarray] | None:
    """The per-channel map of a separable pooling or interpolation module as one matrix per
    spatial axis (n_out x n_in), each the module's own 1-D operation applied to the identity (so
    borders, padding, ceil mode and align_corners are torch's); None where not separable here."""
    d = len(shape_in) - 1 if isinstance(m, nn.Upsample) else int(type(m).__name__[-2])
    if len(shape_in) != len(shape_out) or len(shape_in) < d + 1 or shape_in[:-d] != shape_out[:-d]:
        return None
    out = []
    for i in range(d):
        n_in, n_out = shape_in[len(shape_in) - d + i], shape_out[len(shape_out) - d + i]
        eye = torch.eye(n_in, dtype=torch.float64).reshape(n_in, 1, n_in)
        if isinstance(m, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)):
            if m.divisor_override:
                return None
            k, st, pad = (_per_axis(v, d)[i] for v in (m.kernel_size, m.stride or m.kernel_size, m.padding))
            a = F.avg_pool1d(eye, k, st, pad, m.ceil_mode, m.count_include_pad)
        elif isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)):
            a = F.adaptive_avg_pool1d(eye, n_out)
        else:  # nn.Upsample: separable per axis for these modes
            mode = {"nearest": "nearest", "nearest-exact": "nearest-exact"}.get(m.mode)
            if m.mode in ("linear", "bilinear", "trilinear"):
                mode = "linear"
            if mode is None:
                return None
            sf = None if m.scale_factor is None else _per_axis(m.scale_factor, d)[i]
            ac = m.align_corners if mode == "linear" else None
            kw = {"size": n_out}
            if sf is not None:
                kw = {"scale_factor": sf, "recompute_scale_factor": m.recompute_scale_factor}
            a = F.interpolate(eye, mode=mode, align_corners=ac, **kw)
        if a.shape[-1] != n_out:
            return None
        out.append(a.reshape(n_in, n_out).T.cpu().numpy())
    return out


def _mix_node(label, inputs, mats: list[np.ndarray]) -> GraphNode:
    """A fixed per-channel linear map A (the Kronecker product of ``mats``) as a ``mix`` node:
    for inputs whose fluctuations are independent across positions and whose offsets are
    shared, q' = A^2 (q - k) + (A 1)^2 k per output position, and back r = (A^2)^T (r' - rk') +
    (A^T 1)^2 rk' (``graph.predict_graph``); and o, the mean entry of A^T A off its diagonal,
    which every pair of inputs shares of the fluctuations' gradient (1/P^2 for a global mean of
    P positions: every position receives the same gradient)."""
    fro_all = ones_all = 1.0
    n_in_all = 1
    for A in mats:
        fro_all *= float((A * A).sum())
        ones_all *= float((A.sum(1) ** 2).sum())  # 1^T A^T A 1, the sum of all its entries
        n_in_all *= A.shape[1]
    pairs = n_in_all * (n_in_all - 1)
    cross = (ones_all - fro_all) / pairs if pairs else 0.0
    return GraphNode(label, "mix", inputs, backward_cross=cross, mats=tuple(mats))


def _mean_matrices(n: fx.Node, shape_in) -> list[np.ndarray] | None:
    """A mean over positions (``x.mean((2, 3))``, ``torch.mean``): an averaging row for each
    reduced axis, the identity for the others; None when the dims are not constants or include
    the batch or the channel axis (dim 1 is the channels of a conv map but the positions of a
    token sequence: not guessed)."""
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    if isinstance(dims, int):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)) or not dims or not all(isinstance(v, int) for v in dims):
        return None
    rank = len(shape_in) + 1
    dims = {v % rank for v in dims}
    if min(dims) < 2:
        return None
    return [
        np.full((1, shape_in[v - 1]), 1.0 / shape_in[v - 1]) if v in dims else np.eye(shape_in[v - 1])
        for v in range(2, rank)
    ]


def _maxpool_node(m, label, inputs, shape_in, shape_out, source: GraphNode | None) -> GraphNode:
    """A max pooling of P = the kernel's elements (adaptive: the largest bin) after a
    nondecreasing activation (max phi(z) = phi(max z)) or of a Gaussian state (a dense or norm
    output); else no map."""
    if getattr(m, "return_indices", False) or source is None:
        return GraphNode(label, "unknown", inputs, why="a max pooling with indices")
    d = int(type(m).__name__[-2])
    if type(m).__name__.startswith("Adaptive"):
        pool = math.prod(math.ceil(a / b) for a, b in zip(shape_in[-d:], shape_out[-d:]))
    else:
        pool = math.prod(_per_axis(m.kernel_size, d))
    ratio = math.prod(shape_out) / math.prod(shape_in)
    mats = ()
    if type(m).__name__.startswith("Adaptive"):
        mats = _axis_matrices(_ADAPTIVE_AVG[d](1), shape_in, shape_out)
    elif _per_axis(m.dilation, d) == (1,) * d:
        avg = _AVG[d](m.kernel_size, m.stride, m.padding, m.ceil_mode, count_include_pad=False)
        mats = _axis_matrices(avg, shape_in, shape_out)
    mats = tuple(mats or ())
    if source.op == "act" and _nondecreasing(source.fn[0]):
        return GraphNode(label, "maxpool", inputs, backward=ratio, pool=pool, fn=source.fn, mats=mats)
    if source.op in ("dense", "norm"):
        return GraphNode(label, "maxpool", inputs, backward=ratio, pool=pool, mats=mats)
    return GraphNode(label, "unknown", inputs, why=f"a max pooling after {source.name}")


_AVG = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}
_ADAPTIVE_AVG = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}


def _is_mean(n: fx.Node) -> bool:
    return (n.op == "call_function" and n.target is torch.mean) or (
        n.op == "call_method" and n.target == "mean"
    )


def _matches(classes, maxpool: bool):
    def match(gm: fx.GraphModule, n: fx.Node) -> bool:
        if n.op == "call_module":
            return isinstance(gm.get_submodule(n.target), classes)
        if n.op == "call_function" and n.target in POOL_FUNCTIONS:
            return issubclass(POOL_FUNCTIONS[n.target], MAXPOOL_MODULES) == maxpool
        return not maxpool and _is_mean(n)

    return match


def _mix(t, n) -> GraphNode:
    a, label, ins = n.args[0], t.label(n), t.inputs(n)
    if not (t.shape(a) and t.shape(n) and len(ins) == 1):
        return t.unknown(n)
    is_mean = n.op == "call_method" or n.target is torch.mean
    pm = None if is_mean else _as_module(t.gm, n)
    mats = None
    if is_mean:
        mats = _mean_matrices(n, t.shape(a))
    elif pm is not None:
        mats = _axis_matrices(pm, t.shape(a), t.shape(n))
    what = "a mean over these dims" if is_mean else type(pm).__name__ if pm else "its arguments"
    if mats is None:
        return GraphNode(label, "unknown", ins, why=f"{label} ({what})")
    return _mix_node(label, ins, list(mats))


def _maxpool(t, n) -> GraphNode:
    a, label, ins = n.args[0], t.label(n), t.inputs(n)
    if not (t.shape(a) and t.shape(n) and len(ins) == 1):
        return t.unknown(n)
    pm = _as_module(t.gm, n)
    if pm is None:
        return GraphNode(label, "unknown", ins, why=label)
    return _maxpool_node(pm, label, ins, t.shape(a), t.shape(n), t.nodes[ins[0]])


register(TracedOp("mix", _matches(MIX_MODULES, False), _mix))
register(TracedOp("maxpool", _matches(MAXPOOL_MODULES, True), _maxpool))
