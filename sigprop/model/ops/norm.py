"""Normalisations as traced ops (docs/theory.md §13): batch norm in training mode (statistics over
the batch: var = q - k, the units' offsets removed), layer, group and instance norm (per-sample
statistics over ``units`` elements holding ``group`` offsets); q' = mean gamma^2 + mean beta^2,
and backward r = (mean gamma^2/var) r' (the group's mean and the projection's directions out)."""

from __future__ import annotations

import math

import torch.nn as nn

from sigprop.model.graph import GraphNode, Part, map_op, merged
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


def _token_parts(parts) -> bool:
    return len(parts) > 1 and all(s.axis == "tokens" for s in parts)


def _forward(nd: GraphNode, i: int, fold) -> None:
    """Per channel (batch and instance norm) or over every part (layer and group norm)."""
    src = fold.states[nd.inputs[0]]
    # per channel, per group of tokens (each token its own statistics), or over them all
    parts = src if nd.group in (0, 1) or _token_parts(src) else [merged(src)]
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
        parts = src if nd.group in (0, 1) or _token_parts(src) else [merged(src)]
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
