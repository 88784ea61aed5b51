"""What a coordinate check will cost, said before the work (issue 66, item 2): the memory of its
widest point, estimated from the net built on the meta device (no storage: its parameters and,
through one forward, its activations), refused in one line naming the option that gives the
widths when it exceeds the free memory; and its time left (``Clock``), each point's read off its
parameter count from the steps timed so far -- the widest point runs first, so that a run of
many steps or wide nets says how long from its first steps.

The memory estimate, per point: the weights, their gradients and the optimizer's state (Adam:
two moments and its step's temporary, SGD: none) in the model's dtype, plus the activations of
one forward of the batch three times over (autograd's saved tensors, their gradients, the sites'
float64 records). It is an estimate, as the probes' are (docs/benchmarks.md, "What a width check
costs")."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from sigprop.errors import SigpropError
from sigprop.kernels import device as dev
from sigprop.model.forward import call
from sigprop.width import optimizers

#: the activations of one forward, counted this many times over (see the module's docstring)
ACTIVATION_COPIES = 3


def on_meta(factory, width: int) -> nn.Module | None:
    """The net at ``width`` built on the meta device (shapes, no storage), or None where the
    factory cannot build there (it reads a tensor's values, moves to a device itself)."""
    try:
        with torch.device("meta"):
            model = factory(width)
    except Exception:  # a factory that cannot build without storage: the estimate scales instead
        return None
    if not isinstance(model, nn.Module):
        return None
    return model


def parameters(model: nn.Module) -> tuple[int, int]:
    """(count, bytes) of a model's parameters and buffers."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def activations(model: nn.Module, x: torch.Tensor) -> int | None:
    """Bytes of every leaf module's output in one forward of ``x`` -- on the meta device for a
    model built there (None where the forward cannot run there)."""
    total = 0

    def hook(_m, _inp, y):
        nonlocal total
        for t in y if isinstance(y, (tuple, list)) else (y,):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            where = next((p.device for p in model.parameters()), x.device)
            call(model, x.to(where))
    except Exception:  # a forward that reads a value (.item(), a data-dependent branch)
        return None
    finally:
        for h in handles:
            h.remove()
    return total


def point_bytes(weights: int, acts: int, optimizer: str) -> int:
    """One point's memory: weights, gradients and the optimizer's state, and the activations.
    Adam keeps two moments and its step (torch's foreach form) one temporary of every
    parameter's size: 5 weights' worth in all, measured 0.99-1.00 of the peak RSS for sigprop's
    MLP at widths 2048-8192 (benchmarks/width_cost.py; 4 weights' worth read 1.24-1.37 low).  A
    model's own optimizer is counted as Adam."""
    return weights * (2 + optimizers.states(optimizer)) + ACTIVATION_COPIES * acts


@dataclass
class Built:
    """What a real (small) width told: its parameters' count and bytes, its activations' bytes."""

    width: int
    count: int
    weights: int
    acts: int


def sizes(factory, widths: list[int], x: torch.Tensor, optimizer: str, device, field: str,
          small: Callable[[], Built]) -> dict[int, int]:  # fmt: skip
    """Each width's parameter count, the widest point's memory refused first, before any point is
    built (80% of the free memory, as the probes refuse), in one line naming ``field`` (the option
    that gives the widths).  The widths are built on the meta device; a factory that cannot build
    there is scaled from ``small()`` (a real build at the smallest width): parameters as the width
    squared, activations as the width -- a bound for nets whose matrices are width x width."""
    widest = max(widths)
    model = on_meta(factory, widest)
    if model is None:  # no meta build: a real one at the smallest width, scaled
        known = small()
        r = widest / known.width
        count, weights, acts = int(known.count * r * r), int(known.weights * r * r), int(known.acts * r)
        how = f"scaled from width {known.width}: the factory does not build on the meta device"
        counts = {w: int(known.count * (w / known.width) ** 2) for w in widths}
    else:
        count, weights = parameters(model)
        acts = activations(model, x)
        how = "built on the meta device"
        metas = {w: model if w == widest else on_meta(factory, w) for w in widths}
        if acts is None:  # a forward that cannot run on meta at the widest: the smallest's, scaled
            small_model = metas[min(widths)]
            small_acts = activations(small_model, x) if small_model is not None else None
            acts = int((small_acts or 0) * widest / min(widths))
        counts = {
            w: parameters(m)[0] if m is not None else int(count * (w / widest) ** 2) for w, m in metas.items()
        }
    need = point_bytes(weights, acts, optimizer)
    have = dev.available_bytes(device)
    if need > 0.8 * have:
        gib = 2**30
        raise SigpropError(
            f"the widest point (width {widest:,}: {count:,} parameters, {how}) needs about "
            f"{need / gib:.1f} GiB on {device} but {have / gib:.1f} GiB is free; give smaller widths",
            field=field,
        )
    return counts


class Clock:
    """The time a check has left, by each point's width (issue 66, item 2: a uniform estimate read
    "72 s left" with half the points, the widest, still to run).  Each point is a build and
    ``steps`` steps; a step's time is modelled as a + b x (the point's parameter count), a
    build's as proportional to it, both fitted to the points timed so far (the widest first: a
    single width fits b alone, which errs low only for the narrow points, the cheap ones).  Fed
    by ``tick`` after each step of the point running here and ``done`` after each point;
    ``left()`` is the estimate of what remains."""

    def __init__(self, counts: dict[int, int], todo: list[tuple[int, int]]) -> None:
        self.counts = counts  # width -> parameter count
        self.todo = list(todo)  # (width, steps) of every point still to run, in order
        self.steps: list[tuple[int, float]] = []  # (count, seconds) of each timed step
        self.builds: list[tuple[int, float]] = []
        self.current: tuple[int, int] | None = None
        self.t0 = self.last = time.perf_counter()
        self.done_steps = 0
        self._first = 0.0  # the running point's first interval: its build and first step

    def start(self, width: int, steps: int) -> None:
        self.current, self.done_steps = (width, steps), 0
        self.t0 = self.last = time.perf_counter()
        if (width, steps) in self.todo:
            self.todo.remove((width, steps))

    def tick(self) -> None:
        """A step of the running point finished (its first interval holds the build and the
        parametrization applied: the build is that interval less the second's step)."""
        now = time.perf_counter()
        if self.current is not None:
            count = self.counts[self.current[0]]
            if self.done_steps == 0:
                self._first = now - self.t0
            else:
                self.steps.append((count, now - self.last))
                if self.done_steps == 1:
                    self.builds.append((count, max(0.0, self._first - (now - self.last))))
        self.last, self.done_steps = now, self.done_steps + 1

    def done(self) -> None:
        self.current = None

    def ready(self) -> bool:
        return bool(self.steps)

    def step(self, count: int) -> float:
        """A step's time at ``count`` parameters: a + b count fitted where two sizes are timed (a
        and b not below zero), else proportional to the count."""
        if not self.steps:
            return 0.0
        xs = [c for c, _ in self.steps]
        ys = [t for _, t in self.steps]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mean_x) ** 2 for x in xs)
        if sxx == 0:
            return mean_y * count / mean_x if mean_x else mean_y
        b = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx)
        a = max(0.0, mean_y - b * mean_x)
        return a + b * count

    def build(self, count: int) -> float:
        if not self.builds:
            return 0.0
        c, t = max(self.builds)
        return t * count / c if c else t

    def left(self) -> float:
        """Seconds still to run: the running point's steps left, then every point not yet begun."""
        out = 0.0
        if self.current is not None:
            width, steps = self.current
            out += max(0, steps + 1 - self.done_steps) * self.step(self.counts[width])
        for width, steps in self.todo:
            count = self.counts[width]
            out += self.build(count) + (steps + 1) * self.step(count)
        return out
