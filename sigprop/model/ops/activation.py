"""Elementwise activations as traced ops (docs/theory.md §13): for z ~ N(m, q - m^2), q' = E[phi(z)^2],
m' = E[phi(z)], the shared moment E[phi(z_a) phi(z_b)] for z_a, z_b sharing the unit's offset, and
backward r = E[phi'(z)^2] r', rk = E[phi'(z_a) phi'(z_b)] rk' (``theory.activation_moments``,
``theory.shared_moments``: Gauss-Legendre split at the kink)."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from sigprop.maps import layers as act_maps
from sigprop.maps.state import GraphNode
from sigprop.model.ops.registry import TracedOp, register

#: elementwise activations the trace maps by quadrature (module classes, functions,
#: tensor methods)
ACTIVATION_MODULES = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.ELU,
    nn.Softplus,
    nn.Mish,
    nn.Hardtanh,
    nn.ReLU6,
)
ACTIVATION_FUNCTIONS = {
    torch.relu: torch.relu,
    F.relu: F.relu,
    F.gelu: F.gelu,
    F.silu: F.silu,
    torch.tanh: torch.tanh,
    torch.sigmoid: torch.sigmoid,
    F.leaky_relu: F.leaky_relu,
    F.elu: F.elu,
    # in place: the same function (a probe's measurement is taken before the next op reads it)
    torch.relu_: torch.relu,
    F.relu_: F.relu,
    torch.tanh_: torch.tanh,
    torch.sigmoid_: torch.sigmoid,
    F.leaky_relu_: F.leaky_relu,
    F.elu_: F.elu,
}
ACTIVATION_METHODS = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu_": torch.relu,
    "tanh_": torch.tanh,
    "sigmoid_": torch.sigmoid,
}


def _numpy_fn(fn):
    """A torch elementwise function as a float64 numpy function (for theory's quadrature)."""

    def f(z: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return fn(torch.from_numpy(np.asarray(z, dtype=np.float64))).cpu().numpy()

    def df(z: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.asarray(z, dtype=np.float64)).requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(fn(t).sum(), t)
        return g.cpu().numpy()

    return f, df


def _nondecreasing(phi) -> bool:
    z = np.linspace(-50.0, 50.0, 4001)
    return bool(np.all(np.diff(phi(z)) >= -1e-12))


def _numpy_activation(n: fx.Node, m: nn.Module | None):
    """(phi, phi') of an ``act`` node in numpy where the function is one of the common ones
    (ReLU, leaky ReLU, tanh, sigmoid, SiLU, exact GELU): the quadratures of the moment maps
    evaluate it on 65,536 points a call, and the generic path (torch, with autograd for phi') is
    a third of a small model's probe; else ``_numpy_fn`` of ``_activation``.  The same values to
    float64 rounding (tests/kinds/test_module.py)."""
    both = None
    if m is not None:
        if type(m) is nn.ReLU:
            both = act_maps.relu
        elif type(m) is nn.LeakyReLU:
            both = act_maps.leaky(float(m.negative_slope))
        elif type(m) is nn.GELU and m.approximate == "none":
            both = act_maps.gelu
        else:
            both = {nn.Tanh: act_maps.tanh, nn.Sigmoid: act_maps.sigmoid, nn.SiLU: act_maps.silu}.get(type(m))
    elif not [a for a in n.args[1:] if not isinstance(a, fx.Node)] and not set(n.kwargs) - {"inplace"}:
        # an in-place variant as its function (``ACTIVATION_FUNCTIONS``, ``ACTIVATION_METHODS``)
        table = ACTIVATION_FUNCTIONS if n.op == "call_function" else ACTIVATION_METHODS
        key = table.get(n.target)
        both = {
            torch.relu: act_maps.relu,
            F.relu: act_maps.relu,
            torch.tanh: act_maps.tanh,
            torch.sigmoid: act_maps.sigmoid,
            F.silu: act_maps.silu,
            F.gelu: act_maps.gelu,
        }.get(key)
    if both is None:
        return _numpy_fn(_activation(n, m))
    return act_maps.pair(both)


def _activation(n: fx.Node, m: nn.Module | None):
    """The elementwise function an ``act`` node applies: the module, or the function or tensor
    method with the node's constant arguments (in-place flags dropped)."""
    if m is not None:  # in float64, as the quadrature evaluates it (PReLU's slope is a parameter)
        return copy.deepcopy(m).double()
    if n.op == "call_method":
        return ACTIVATION_METHODS[n.target]
    fn = ACTIVATION_FUNCTIONS[n.target]
    kw = {k: v for k, v in n.kwargs.items() if k != "inplace"}
    extra = [a for a in n.args[1:] if not isinstance(a, fx.Node)]
    return lambda t: fn(t, *extra, **kw)


def act_node(m: nn.Module, name: str, inputs: tuple, shape: tuple = ()) -> GraphNode:
    """The ``act`` node of an activation module called outside any fx node (an expansion of a
    module torch.fx keeps whole: sigprop/model/ops/transformer.py)."""
    return GraphNode(name, "act", inputs, fn=_numpy_activation(None, m), shape=tuple(shape))


def _matches(gm: fx.GraphModule, n: fx.Node) -> bool:
    if n.op == "call_module":
        m = gm.get_submodule(n.target)
        # PReLU with one slope is elementwise
        return isinstance(m, ACTIVATION_MODULES) or (isinstance(m, nn.PReLU) and m.weight.numel() == 1)
    if n.op == "call_function":
        return n.target in ACTIVATION_FUNCTIONS
    return n.op == "call_method" and n.target in ACTIVATION_METHODS


register(
    TracedOp(
        "act",
        _matches,
        lambda t, n: GraphNode(t.label(n), "act", t.inputs(n), fn=_numpy_activation(n, t.module(n))),
    )
)
