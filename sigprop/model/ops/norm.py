"""Normalisations as traced ops (docs/theory.md §13): batch norm in training mode (statistics over
the batch: var = q - k, the units' offsets removed), layer, group and instance norm (per-sample
statistics over ``units`` elements holding ``group`` offsets); q' = mean gamma^2 + mean beta^2,
and backward r = (mean gamma^2/var) r' (the group's mean and the projection's directions out)."""

from __future__ import annotations

import math

import torch.nn as nn

from sigprop.maps.state import GraphNode
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


#: every normalisation class torch has (``nn.RMSNorm`` from torch 2.4)
_NORMS = NORM_MODULES + tuple(getattr(nn, c) for c in ("RMSNorm",) if hasattr(nn, c))


def is_norm(m: nn.Module) -> bool:
    """A normalisation: torch's (``NORM_MODULES``, ``nn.RMSNorm``) or a model's own class named as
    one (Hugging Face's ``LlamaRMSNorm``, ``T5LayerNorm``)."""
    return isinstance(m, _NORMS) or type(m).__name__.endswith(("LayerNorm", "RMSNorm", "GroupNorm"))


def _norm_node(m: nn.Module, name, inputs, shape_in) -> GraphNode:
    """A normalisation's node: its gain and bias, and what one of its statistics is taken over
    (``GraphNode``): batch norm over the batch (group 0); layer norm over its normalized
    shape, one offset per leading entry; group norm over a group's channels and positions;
    instance norm over one channel's positions."""
    units = group = 0
    positions = math.prod(shape_in[1:]) if shape_in else 1
    if isinstance(m, nn.LayerNorm):
        units, group = math.prod(m.normalized_shape), m.normalized_shape[0]
    elif isinstance(m, nn.GroupNorm):
        group = m.num_channels // m.num_groups
        units = group * positions
    elif isinstance(m, (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)):
        units, group = positions, 1
    return norm_node(name, inputs, getattr(m, "weight", None), getattr(m, "bias", None), units, group)


def norm_node(name, inputs, gamma, beta, units: int, group: int) -> GraphNode:
    """A normalisation's node from its gain and offset (None: 1 and 0) and what one statistic is
    taken over (``_norm_node``; ATen's ``layer_norm``): their mean squares, ``gain_offset``."""
    g2 = 1.0 if gamma is None else float(gamma.detach().double().pow(2).mean())
    b2 = 0.0 if beta is None else float(beta.detach().double().pow(2).mean())
    return GraphNode(
        name, "norm", inputs, forward=g2, bias=b2, units=units, group=group, params=gain_offset(gamma, beta)
    )


def gain_offset(gamma, beta) -> tuple[float, float]:
    """A layer norm's gain's variance over its units and its offset's mean (what its output's
    token mean holds, ``_centre``)."""
    var = 0.0 if gamma is None else float(gamma.detach().double().var(unbiased=False))
    return var, 0.0 if beta is None else float(beta.detach().double().mean())


register(
    TracedOp(
        "norm",
        lambda gm, n: n.op == "call_module" and isinstance(gm.get_submodule(n.target), NORM_MODULES),
        lambda t, n: _norm_node(t.module(n), n.target, t.inputs(n), t.shape(n.args[0])),
    )
)


# --------------------------------------------------------------------------------------------
# RMSNorm: x / rms(x) over the last dims, times a gain (no centring, no offset)
# --------------------------------------------------------------------------------------------
#: torch's eps of an RMSNorm given none (``F.rms_norm``, ``nn.RMSNorm``): float32's machine eps
RMS_DEFAULT_EPS = 1.1920928955078125e-07


def rms_node(name: str, inputs: tuple, weight, shape, eps=None) -> GraphNode:
    """An RMSNorm over ``shape`` (its last dims) with gain ``weight`` (None: 1) and ``eps``
    (None: torch's default): ``forward`` the gain's mean square, ``units`` the elements one
    statistic is taken over, ``bias`` the eps."""
    g2 = 1.0 if weight is None else float(weight.detach().double().pow(2).mean())
    e = RMS_DEFAULT_EPS if eps is None else float(eps)
    return GraphNode(name, "rmsnorm", inputs, forward=g2, units=int(math.prod(shape)), bias=e)


def _rms_module(t, n) -> GraphNode:
    m = t.module(n)
    return rms_node(n.target, t.inputs(n), m.weight, m.normalized_shape, m.eps)


register(
    TracedOp(
        "norm",
        lambda gm, n: n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.RMSNorm),
        _rms_module,
    )
)
