"""The walk: forward unit by unit, then backward from the top Record, each unit each way one
step of a ``replay`` runner, the observers handed every recorded state.  What the units and
observers read of it (the state's space, the draws, the arenas: ``Walk``) is sigprop/walker/
state.py, below them."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from sigprop.inits import InitScheme
from sigprop.kernels import replay
from sigprop.kernels.ops import channels_last
from sigprop.walker.state import LogSpace, Walk


@dataclass
class Walked:
    """A walk's observations ({observer name: tensor}) and what each unit kept (for the oracle)."""

    observed: dict
    kept: list


def walk(
    units: Sequence,
    scheme: InitScheme,
    x: torch.Tensor,
    e: torch.Tensor | None,
    seed: int,
    draws,
    observers: Sequence,
    record_input: bool,
    space=None,
    progress: Callable[[], None] | None = None,
    stream: bool = False,
    runner: replay.Eager | None = None,
    fuse: bool = False,
) -> Walked:
    """Run ``units`` on inputs x [N, n_0] for S = len(draws) draws at once: forward unit by unit,
    then (``e`` given: the error vectors at the top [N, n_top]) backward to the first recorded
    state.  Entries: the input when ``record_input``, then each unit's output.  Each observer
    sees every entry's state forward and gradient backward.  A data-dependent init runs eagerly
    (its calibration reads the batch on the host), as does a plan with a unit that is not
    ``replayable``.  ``fuse``: the dense and conv layers' bookkeeping compiled (kernels/fused.py)."""
    space = space or LogSpace()
    if runner is None or scheme.standardizes or not all(u.replayable for u in units):
        runner = replay.Eager()
    w = Walk(units, scheme, space, x, seed, draws, stream, runner, keep=e is not None, fuse=fuse)
    if isinstance(runner, replay.Replayed):
        runner.expect(step_counts(w, int(not record_input)))
    # a conv state's rows are held channels last (kernels/ops.py ConvOp): the input and the error
    # vectors converted once; a norm or cosine of a row does not depend on its units' order
    x = channels_last(x, units[0].shape_in)
    e = None if e is None else channels_last(e, units[-1].shape_out)
    first = 0 if record_input else 1
    entries = len(units) + int(record_input)
    for obs in observers:
        obs.start(w, entries)
    state, w.ref = space.start(x, w.S)
    if record_input:
        for obs in observers:
            obs.forward(w, 0, state, None)
    kept = []
    for i, unit in enumerate(units):
        state, out, k = unit.forward(w, i, state)
        kept.append(k)
        for obs in observers:
            obs.forward(w, i + int(record_input), state, out)
        if progress is not None:
            progress()
    if e is not None:
        grad, ref = space.grad_start(e, w.S)
        for obs in observers:
            obs.top(w, entries - 1)
        for i in range(len(units) - 1, first - 1, -1):
            grad = units[i].backward(w, i, grad, kept[i], kept[i - 1] if i > 0 else None)
            for obs in observers:
                obs.backward(w, i - 1 + int(record_input), grad, ref)
            if progress is not None:
                progress()
    return Walked({obs.name: obs.result() for obs in observers}, kept)


def step_counts(w: Walk, first: int) -> collections.Counter:
    """How many times the walk runs each step key (the runner captures only steps that recur:
    kernels/replay.py): every unit forward, with a backward (``w.keep``) every unit from
    ``first`` up, and the Haar chunks' steps."""
    counts: collections.Counter = collections.Counter()
    for i, unit in enumerate(w.units):
        fwd, bwd = unit.step_keys(w, w.units[i - 1] if i > 0 else None)
        counts[fwd] += 1
        if w.keep and i >= first:
            counts[bwd] += 1
    if w.chunks is not None:
        counts.update(w.chunks.step_keys(w))
    return counts
