"""Normalisations as traced ops (docs/theory.md §13): batch norm in training mode (statistics over
the batch: var = q - k, the units' offsets removed), layer, group and instance norm (per-sample
statistics over ``units`` elements holding ``group`` offsets); q' = mean gamma^2 + mean beta^2,
and backward r = (mean gamma^2/var) r' (the group's mean and the projection's directions out)."""

from __future__ import annotations

import math

import torch.nn as nn

from sigprop.model.graph import GraphNode, Part, map_op, merged, token_groups
from sigprop.model.ops.registry import TracedOp, register

NORM_MODULES = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)


def _norm_node(m: nn.Module, name, inputs, shape_in) -> GraphNode:
    """A normalisation's node: its gain and bias, and what one of its statistics is taken over
    (``GraphNode``): batch norm over the batch (group 0); layer norm over its normalized
    shape, one offset per leading entry; group norm over a group's channels and positions;
    instance norm over one channel's positions."""
    gamma = getattr(m, "weight", None)
    beta = getattr(m, "bias", None)
    g2 = 1.0 if gamma is None else float(gamma.detach().double().pow(2).mean())
    b2 = 0.0 if beta is None else float(beta.detach().double().pow(2).mean())
    units = group = 0
    positions = math.prod(shape_in[1:]) if shape_in else 1
    if isinstance(m, nn.LayerNorm):
        units, group = math.prod(m.normalized_shape), m.normalized_shape[0]
    elif isinstance(m, nn.GroupNorm):
        group = m.num_channels // m.num_groups
        units = group * positions
    elif isinstance(m, (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)):
        units, group = positions, 1
    return GraphNode(name, "norm", inputs, forward=g2, bias=b2, units=units, group=group)


def norm_variance(nd: GraphNode, q: float, m: float, k: float) -> float:
    """The variance a normalisation divides by."""
    if nd.group == 0:
        return q - k
    return (q - k) * (1.0 - 1.0 / max(nd.units, 1)) + (k - m * m) * (1.0 - 1.0 / nd.group)


register(
    TracedOp(
        "norm",
        lambda gm, n: n.op == "call_module" and isinstance(gm.get_submodule(n.target), NORM_MODULES),
        lambda t, n: _norm_node(t.module(n), n.target, t.inputs(n), t.shape(n.args[0])),
    )
)


def _forward(nd: GraphNode, i: int, fold) -> None:
    """Per channel (batch and instance norm) or over every part (layer and group norm)."""
    src = fold.states[nd.inputs[0]]
    # per channel, per group of tokens (each token its own statistics), or over them all
    parts = src if nd.group in (0, 1) or token_groups(src) else [merged(src)]
    out = []
    for s in parts:
        var = norm_variance(nd, s.q, s.mean, s.shared)
        kept = lambda k: (k - s.mean**2) * (1.0 - 1.0 / nd.group) / var if nd.group and var > 0.0 else 0.0
        tokens = None if s.tokens is None else nd.forward * kept(s.tokens) + nd.bias
        out.append(
            Part(
                s.share,
                nd.forward + nd.bias,
                0.0,
                nd.forward * kept(s.shared) + nd.bias,
                s.profile,
                tokens,
                s.axis,
            )
        )
    fold.states[i] = out


def _backward(nd: GraphNode, i: int, g: list, fold) -> None:
    for j in nd.inputs:
        src = fold.states[j]
        parts = src if nd.group in (0, 1) or token_groups(src) else [merged(src)]
        out = []
        for s, (r, rk, p) in zip(parts, g if len(g) == len(parts) else g[:1] * len(parts)):
            var = norm_variance(nd, s.q, s.mean, s.shared)
            if var <= 0.0:
                fold.poisoned[j] = True
                break
            if nd.group == 0:  # batch statistics: a sample's own shared part is kept
                out.append((nd.forward / var * r, nd.forward / var * rk, p))
            else:  # the group's mean goes: 1/group of the shared part, 2 of `units` directions
                ck = nd.forward / var * rk * (1.0 - 1.0 / nd.group)
                out.append((nd.forward / var * (r - rk) * (1.0 - 2.0 / max(nd.units, 2)) + ck, ck, p))
        if not fold.poisoned[j]:
            fold.give(j, out, i)


map_op("norm", _forward, _backward)


# --------------------------------------------------------------------------------------------
# RMSNorm: x / rms(x) over the last dims, times a gain (no centring, no offset)
# --------------------------------------------------------------------------------------------
def rms_node(name: str, inputs: tuple, weight, shape) -> GraphNode:
    """An RMSNorm over ``shape`` (its last dims) with gain ``weight`` (None: 1): ``forward`` the
    gain's mean square, ``units`` the elements one statistic is taken over."""
    g2 = 1.0 if weight is None else float(weight.detach().double().pow(2).mean())
    return GraphNode(name, "rmsnorm", inputs, forward=g2, units=int(math.prod(shape)))


def _rms_forward(nd: GraphNode, i: int, fold) -> None:
    """y = g x / rms(x) per token (rms over ``units`` features, mean and offsets kept): q' = mean
    g^2, and every other moment divided by q -- m' = m g-bar/sqrt(q) taken as m sqrt(g^2/q), k' =
    g^2 k/q, t' = g^2 t/q (Zhang & Sennrich 2019's RMSNorm at infinite width: rms(x)^2 -> q)."""
    out = []
    for s in fold.states[nd.inputs[0]]:
        if s.q <= 0.0:
            return
        f = nd.forward / s.q
        tokens = None if s.tokens is None else f * s.tokens
        out.append(Part(s.share, nd.forward, s.mean * math.sqrt(f), f * s.shared, s.profile, tokens, s.axis))
    fold.states[i] = out


def _rms_backward(nd: GraphNode, i: int, g: list, fold) -> None:
    """r = (g^2/q) r' (1 - 1/units): the gradient divided by the scale, its component along x
    (one of ``units`` directions) removed; the shared moment alike."""
    for j in nd.inputs:
        src = fold.states[j]
        parts = g if len(g) == len(src) else g[:1] * len(src)
        out = []
        for s, (r, rk, p) in zip(src, parts):
            f = nd.forward / s.q if s.q > 0 else 0.0
            out.append((f * r * (1.0 - 1.0 / max(nd.units, 1)), f * rk, p))
        fold.give(j, out, i)


def _rms_module(t, n) -> GraphNode:
    m = t.module(n)
    return rms_node(n.target, t.inputs(n), m.weight, m.normalized_shape)


register(
    TracedOp(
        "norm",
        lambda gm, n: n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.RMSNorm),
        _rms_module,
    )
)
map_op("rmsnorm", _rms_forward, _rms_backward)
