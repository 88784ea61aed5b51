"""Linear, ConvNd and ConvTransposeNd as traced ops (docs/theory.md §13): a weight layer of c_out
rows, q' = (||W||^2_F/c_out) (M q) + ||b||^2/c_out per element, its gradient r = (||W||^2_F/c_in)
M^T r' (M the conv's window over the positions; a Linear's none), and a layer a data-dependent
init calibrated on the probe's batch (``standardized``: each unit mean 0 and sd 1 there)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from sigprop import theory
from sigprop.maps.state import GraphNode
from sigprop.model.ops.registry import TracedOp, register

DENSE_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
TRANSPOSED_MODULES = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def weight_node(
    name, inputs, w, b, shape_in=None, shape_out=None, groups: int = 1, mats=(), kind: str = "dense"
) -> GraphNode:
    """The one dense map of a weight layer, a Linear's [c_out, c_in] or a conv's [c_out, c_in /
    groups, *taps] (any op that reads one: a module, ``aten.linear``, ``addmm`` transposed, a
    functional conv): per element q' = (||W||^2/c_out) q + ||b||^2/c_out forward; backward
    r = (||W||^2/c_in) M^T r' with a conv's window ``mats`` (each input element in c_out k^d
    products, fewer at a padded border), else r = ||W||^2 numel_out/(c_out numel_in) r' (a
    Linear: ||W||^2/c_in).  Its tokens (``shape_in`` with positions) share the weights; on a
    vector the gradient's shared moment does not pass (docs/theory.md §13)."""
    w = w.detach().double()
    sq = float(w.pow(2).sum())
    c_out, c_in = w.shape[0], w.shape[1] * groups
    bias = 0.0 if b is None else float(b.detach().double().pow(2).sum()) / c_out
    backward = sq / c_in
    if w.dim() > 2 and not mats and shape_in and shape_out:  # a conv without its box
        backward = sq * math.prod(shape_out) / (c_out * math.prod(shape_in))
    return GraphNode(
        name,
        kind,
        inputs,
        forward=sq / c_out,
        backward=backward,
        bias=bias,
        width=c_out,
        positions=len(shape_in) > 1 if shape_in else True,
        mats=mats,
        rows=w.pow(2).sum(1).cpu().numpy() if w.dim() == 2 else None,
    )


def _dense_node(m: nn.Module, shape_in, shape_out, name, inputs) -> GraphNode:
    """A Linear or ConvNd module: ``weight_node`` of its weight, a conv with its taps' box over
    the positions (``_conv_matrices``) where it can be built."""
    mats = _conv_matrices(m, shape_in, shape_out) if not isinstance(m, nn.Linear) else ()
    return weight_node(
        name,
        inputs,
        m.weight,
        m.bias,
        shape_in,
        shape_out,
        getattr(m, "groups", 1),
        mats,
        "standardized" if getattr(m, "_sigprop_standardized", False) else "dense",
    )


def _conv_matrices(m: nn.Module, shape_in, shape_out, transposed: bool = False) -> tuple:
    """A conv's (or transposed conv's) window over the positions, one matrix per spatial axis
    (n_out x n_in, entry: the taps joining the two positions over k), each from torch's own 1-D
    conv of the identity with a kernel of 1/k (so stride, padding, dilation and the padding mode
    are torch's); () where the shapes do not read as (channels, *positions)."""
    d = len(m.kernel_size)
    if len(shape_in) != d + 1 or len(shape_out) != d + 1:
        return ()
    mats = []
    for i in range(d):
        n_in, n_out = shape_in[1 + i], shape_out[1 + i]
        k, st, dil = m.kernel_size[i], m.stride[i], m.dilation[i]
        zero = _zero_padded(m, i, n_in, transposed)
        if zero is not None:  # the theory's own window (the one a plan's energy map reads)
            left, size = zero
            if size != n_out:
                return ()
            mats.append(theory.conv_window(n_in, n_out, k, st, left, dil) / k)
            continue
        eye = torch.eye(n_in, dtype=torch.float64).reshape(n_in, 1, n_in)
        ker = torch.full((1, 1, k), 1.0 / k, dtype=torch.float64)
        try:
            if transposed:
                pad, extra = m.padding[i], m.output_padding[i]
                a = F.conv_transpose1d(eye, ker, stride=st, padding=pad, output_padding=extra, dilation=dil)
            elif isinstance(m.padding, str):
                if m.padding_mode != "zeros":
                    return ()
                a = F.conv1d(eye, ker, stride=st, padding=m.padding, dilation=dil)
            elif m.padding_mode != "zeros":
                padded = F.pad(eye, (m.padding[i],) * 2, mode=m.padding_mode)
                a = F.conv1d(padded, ker, stride=st, dilation=dil)
            else:
                a = F.conv1d(eye, ker, stride=st, padding=m.padding[i], dilation=dil)
        except (RuntimeError, NotImplementedError, ValueError):
            return ()
        if a.shape[-1] != n_out:
            return ()
        mats.append(a.reshape(n_in, n_out).T.cpu().numpy())
    return tuple(mats)


def _zero_padded(m: nn.Module, i: int, n_in: int, transposed: bool) -> tuple[int, int] | None:
    """(left padding, output size) along axis i of a zero-padded conv, as torch pads it (an odd
    "same" total puts the extra zero on the right); None for a transposed conv or another
    padding mode (read by torch's own conv of the identity)."""
    if transposed or m.padding_mode != "zeros":
        return None
    k, st, dil = m.kernel_size[i], m.stride[i], m.dilation[i]
    span = dil * (k - 1)
    if isinstance(m.padding, str):
        return (span // 2, n_in) if m.padding == "same" else (0, (n_in - span - 1) // st + 1)
    pad = m.padding[i]
    return pad, (n_in + 2 * pad - span - 1) // st + 1


def _transposed_node(m: nn.Module, shape_in, shape_out, name, inputs) -> GraphNode:
    """A transposed conv (weight [c_in, c_out/groups, k...]): the adjoint of a conv, so each
    output element sums c_in (k/s)^d products on average -- q' = (||W||^2/c_out) T q with T its
    window over the positions (``_conv_matrices``: 1/s per axis inside the map) -- and each
    input element's gradient a row of c_out k^d weights: r = (||W||^2/c_in) T^T r'."""
    w = m.weight.detach().double()
    sq, c_in = float(w.pow(2).sum()), w.shape[0]
    c_out = shape_out[0]
    bias = 0.0 if m.bias is None else float(m.bias.detach().double().pow(2).sum()) / c_out
    mats = _conv_matrices(m, shape_in, shape_out, transposed=True)
    numel_in, numel_out = math.prod(shape_in), math.prod(shape_out)
    return GraphNode(
        name,
        "dense",
        inputs,
        forward=sq / c_out if mats else sq * numel_in / (c_in * numel_out),
        backward=sq / c_in,
        bias=bias,
        width=c_out,
        mats=mats,
    )


def _dense(t, n) -> GraphNode:
    m, a = t.module(n), n.args[0]
    if t.shape(a) and t.shape(n):
        return _dense_node(m, t.shape(a), t.shape(n), n.target, t.inputs(n))
    return t.unknown(n)


def _transposed(t, n) -> GraphNode:
    m, a = t.module(n), n.args[0]
    if t.shape(a) and t.shape(n) and m.groups == 1:
        return _transposed_node(m, t.shape(a), t.shape(n), n.target, t.inputs(n))
    return t.unknown(n)


def _module_of(classes):
    return lambda gm, n: n.op == "call_module" and isinstance(gm.get_submodule(n.target), classes)


register(TracedOp("dense", _module_of(DENSE_MODULES), _dense))
register(TracedOp("transposed", _module_of(TRANSPOSED_MODULES), _transposed))
