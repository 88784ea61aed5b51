"""Plans -> units: ``compile_plan`` turns a plan's steps into the walk's units (the steps between
two Records), and ``as_function`` composes their ``apply`` into one differentiable function of
the input (the curvature's and the spectrum's)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from sigprop import plans
from sigprop.inits import InitScheme
from sigprop.kernels.ops import ConvOp, DenseOp
from sigprop.walker.bn import BN_EPS, BNConvUnit, BNLayer
from sigprop.walker.dense import ConvLayer, DenseLayer
from sigprop.walker.residual import ResidualBlock
from sigprop.walker.state import SPACES
from sigprop.walker.walk import walk


def _op(step) -> DenseOp:
    return ConvOp(step) if isinstance(step, plans.Conv) else DenseOp(step)


def one_draw_at_a_time(steps: Sequence, device: torch.device) -> bool:
    """Whether a plan's draws walk one at a time by default: on a CPU when it has a conv, whose
    per-draw convs (``ConvOp``) would otherwise be stacked into one [S, ...] tensor, a copy of
    every activation and gradient each layer that a single draw's view avoids (a WRN, one
    thread: 1.2x the autograd floor batched against 0.95-1.03x one at a time,
    benchmarks/floor.py conv).  Dense layers keep their batched ``bmm`` (5-10% faster than one
    draw at a time at width 512)."""
    return device.type == "cpu" and any(isinstance(s, plans.Conv) for s in steps)


def compile_plan(steps: Sequence, scheme: InitScheme) -> tuple[list, bool]:
    """The units of a plan and whether its input is recorded (a leading ``Record``).

    [Linear, Record] -> ``DenseLayer``, [Conv, Record] -> ``ConvLayer`` (generator = its position,
    1-based); [Open, Linear|Conv ..., Close, Record] -> ``ResidualBlock`` (the b-th block's
    generator ids start at (units before the first block) + b (layers + 1), the same for every
    init); a conv with batch norm -> ``BNConvUnit`` (alone, or a block of them); [BatchNorm,
    Linear, Record] and [Open, BatchNorm, Linear, Close, Record] -> ``BNLayer`` (generator = its
    entry index)."""
    c = _Compiling(steps, scheme)
    record_input = bool(steps) and isinstance(steps[0], plans.Record)
    i = 1 if record_input else 0
    while i < len(steps):
        make = UNITS.get(type(steps[i]))
        if make is None:
            raise ValueError(f"cannot compile step {steps[i]!r} at position {i}")
        unit, i = make(c, i)
        c.units.append(unit)
    return c.units, record_input


class _Compiling:
    """``compile_plan``'s state: the steps, the scheme, the units so far, and the residual blocks'
    generator numbering (the units before the first block, the blocks so far)."""

    def __init__(self, steps: Sequence, scheme: InitScheme) -> None:
        self.steps, self.scheme = steps, scheme
        self.units: list = []
        self.residual, self.before = 0, None


def _linear(c: _Compiling, i: int):
    """[Linear, Record] -> ``DenseLayer``."""
    return DenseLayer(c.steps[i], len(c.units) + 1), i + 2


def _conv(c: _Compiling, i: int):
    """[Conv, Record] -> ``ConvLayer``, or with batch norm (the BN WRN's conv1) ``BNConvUnit``."""
    s = c.steps[i]
    if s.bn:
        return BNConvUnit([s], None, residual=False, layer_ids=[len(c.units) + 1], eps=BN_EPS), i + 2
    return ConvLayer(s, len(c.units) + 1), i + 2


def _batch_norm(c: _Compiling, i: int):
    """[BatchNorm, Linear, Record] -> ``BNLayer`` (the BN ResNet's stem)."""
    return BNLayer(c.steps[i + 1].role, len(c.units), residual=False, eps=c.steps[i].eps), i + 3


def _block(c: _Compiling, i: int):
    """[Open, ..., Close, Record] -> ``BNLayer`` (a BN ResNet block), ``BNConvUnit`` (a BN WRN
    block) or ``ResidualBlock``."""
    steps = c.steps
    j = next(k for k in range(i, len(steps)) if isinstance(steps[k], plans.Close))
    close, inner = steps[j], steps[i + 1 : j]
    if isinstance(inner[0], plans.BatchNorm):
        return BNLayer(inner[1].role, len(c.units), residual=True, eps=inner[0].eps), j + 2
    if c.before is None:
        c.before = len(c.units)
    c.residual += 1
    base = c.before + c.residual * (len(inner) + 1)
    ids = range(base, base + len(inner) + 1)
    if inner[0].bn:
        return BNConvUnit(inner, close.projection, residual=True, layer_ids=ids, eps=BN_EPS), j + 2
    proj = None if close.projection is None else _op(close.projection)
    unit = ResidualBlock(
        [_op(st) for st in inner],
        [st.relu for st in inner],
        proj,
        c.scheme.alpha(close.blocks_in_stage),
        ids,
        c.scheme.by_block_index,
    )
    return unit, j + 2


#: the step that opens a unit -> how it compiles (the unit and the position after it): a new kind
#: of step is one entry here with its unit class
UNITS = {plans.Linear: _linear, plans.Conv: _conv, plans.BatchNorm: _batch_norm, plans.Open: _block}


@dataclass
class Function:
    """A plan's net at init as an ordinary differentiable function: ``params`` (name -> leaf
    tensor, one draw; unit i's as ``i.name``) and ``forward(params, x, upto=None)`` -- each unit's
    ``apply`` over its parameters, composed (the last state, or the state after the first
    ``upto`` units)."""

    units: list
    params: dict
    forward: Callable
    shape_out: tuple


def as_function(
    steps, scheme: InitScheme, x: torch.Tensor, seed: int, draw: int, space: str = "log"
) -> Function:
    """The net of the plan ``steps`` under ``scheme``, draw ``draw``, as a function: the walker
    draws (and, for a data-dependent init, calibrates on x) the weights exactly as the probe
    does, and keeps them (used by the Hessian, sigprop/hessian.py, and the spectra,
    sigprop/spectra.py)."""
    units, record_input = compile_plan(steps, scheme)
    last = units[-1].shape_out
    with torch.no_grad():  # a walk with an error vector keeps its weights (its ratios are not observed)
        e = torch.ones(x.shape[0], math.prod(last), device=x.device, dtype=x.dtype)
        kept = walk(units, scheme, x, e, seed, [draw], [], record_input, space=SPACES[space]()).kept
    params: dict[str, torch.Tensor] = {}
    keys: list[list[tuple[str, str]]] = []
    for i, (u, k) in enumerate(zip(units, kept)):
        own = u.parameters(k, scheme.normalized, x.device, x.dtype)
        keys.append([(name, f"{i}.{name}") for name, _ in own])
        params.update({f"{i}.{name}": t for name, t in own})

    def forward(p: dict, xb: torch.Tensor, upto: int | None = None) -> torch.Tensor:
        """The state after the first ``upto`` units (all when None)."""
        h = xb
        for u, names in list(zip(units, keys))[:upto]:
            h = u.apply({name: p[full] for name, full in names}, h)
        return h

    return Function(units, params, forward, tuple(last))
