"""Running the walker's per-layer steps eagerly, or captured once and replayed (CUDA graphs).

A deep probe repeats the same few dozen kernels per layer (draw the directions, one batched
matmul, scale, ReLU, normalise, pack the mask: ~60 kernels per layer forward and backward,
docs/benchmarks.md "Launch overhead").  At width 1024 on an H100 each kernel is a few
microseconds of GPU work, so the loop is bound by the host issuing them, not by the GPU.  A CUDA
graph records one layer's kernels once and replays them with one launch.

The walker writes each step as a *body*: a function of tensors (and of generators it reseeds per
layer) that returns a dict of tensors.  A runner executes it:

* ``Eager``: calls the body (the default, and every CPU run);
* ``CudaGraphs``: per step shape (its ``key``), copies the inputs into static buffers, runs the
  body once eagerly (warm-up, and the reference), captures it into a ``torch.cuda.CUDAGraph`` with
  the generators registered, replays it for the same layer and compares with the eager outputs;
  from then on a layer is: copy inputs in, reseed the generators, one replay.  Any failure to
  capture, or a replay that differs from the eager step, turns graphs off for the rest of the
  run (eager from then on, same numbers) and is recorded (``status``).
* ``Emulated``: the same static-buffer plumbing with the capture replaced by calling the body and
  copying its outputs into the static output buffers -- so the tests on a CPU exercise
  everything but the CUDA capture itself (tests/kernels/test_replay.py::test_replayed_steps_*).

Random numbers under replay: a generator registered with a graph is read on each replay at its
current seed and offset (PyTorch's graph-safe Philox state, ``CUDAGeneratorState::
replay_prologue``); ``manual_seed`` before a replay sets the offset to 0, as before an eager
draw, so the replayed draws are the eager draws.  The run-time comparison above checks this on
the device rather than trusting it.
"""

from __future__ import annotations

from typing import Callable

import torch

Body = Callable[..., dict]

#: at most this many distinct step shapes are captured per walk (the others run eagerly)
MAX_GRAPHS = 8
#: a step is captured only when at least this many runs of its key follow the capturing run.
#: Capturing costs about two eager steps of host time beyond the eager run it replaces (the
#: warm-up on a side stream, recording the same calls, instantiating, one replay and the
#: comparison's reads); each later replay saves most of an eager step (a few input copies and
#: one launch instead of ~30-90 kernels: docs/benchmarks.md "Launch overhead").  An estimate
#: from those counts, to be checked on a device (issue 41).
MIN_LATER = 4


class Eager:
    """Call the body: what every CPU run does."""

    status = "off"
    generators: list = []

    def bind(self, generators) -> None:
        """The generators the steps draw from.  A runner serves one walk: its captured
        steps replay that call's kernels, generators and buffers."""
        if getattr(self, "_bound", False):
            raise RuntimeError("a step runner serves one walk")
        self._bound = True
        self.generators = list(generators)

    def release(self) -> None:
        """Free what the runner holds (captured graphs, their memory pools, static buffers)."""

    def run(
        self, key, body: Body, inputs: dict, reseed: Callable[[], None], direct: dict | None = None
    ) -> dict:
        """``direct``: keyword arguments only an eager call gets (e.g. where to write in place)."""
        reseed()
        return body(**inputs, **(direct or {}))


class _Step:
    def __init__(self, inputs: dict) -> None:
        self.inputs = {k: None if v is None else v.clone() for k, v in inputs.items()}
        self.device = next(v.device for v in inputs.values() if v is not None)
        self.outputs: dict = {}
        self.graph = None


class Replayed(Eager):
    """Static buffers per step shape; subclasses say how a step is captured and replayed.

    A shape seen for the first time runs eagerly (random widths make most shapes unique:
    capturing those would only cost), and so does one that recurs fewer than ``MIN_LATER``
    times after its second run (the walk announces its counts: ``expect``).  Otherwise, the
    second time: the body runs eagerly on the static
    inputs (the reference, and the warm-up a capture needs), is captured, and is replayed for
    the same layer; the replay must reproduce the eager outputs (``_same``) or graphs are off
    for the rest of the call.  Any exception while capturing does the same.  Either way the
    layer's numbers are the eager ones, and ``status`` says what happened."""

    def __init__(self) -> None:
        self.steps: dict = {}
        self.seen: set = set()
        self.left: dict = {}  # runs of each announced key still to come (``expect``)
        self.captured = 0  # steps captured (and checked) over the call
        self.status = "on"
        self.off = False

    def expect(self, counts) -> None:
        """How many times the walk will run each step key (walker/walk.py ``step_counts``): a
        key is captured only when ``MIN_LATER`` runs follow the capturing one.  A key not
        announced is captured at its second run."""
        self.left = dict(counts)

    def release(self) -> None:
        self.steps.clear()
        self.seen.clear()

    def _worth_capturing(self, key) -> bool:
        later = self.left.get(key)
        return key in self.seen and len(self.steps) < MAX_GRAPHS and (later is None or later >= MIN_LATER)

    def run(self, key, body, inputs, reseed, direct=None):
        if key in self.left:
            self.left[key] -= 1  # now: the runs after this one
        if self.off:
            return Eager.run(self, key, body, inputs, reseed, direct)
        step = self.steps.get(key)
        if step is None:
            if not self._worth_capturing(key):
                self.seen.add(key)
                return Eager.run(self, key, body, inputs, reseed, direct)
            step = _Step(inputs)
            try:
                self._first(step, body, reseed)
            except Exception as exc:  # any capture failure: eager for the rest, recorded
                return self._fall_back(exc, key, body, inputs, reseed, direct)
            self.steps[key] = step
            self.captured += 1
            return step.outputs
        try:
            for k, v in inputs.items():
                if v is not None:
                    step.inputs[k].copy_(v)
        except Exception as exc:  # nothing ran: the caller's inputs are intact
            return self._fall_back(exc, key, body, inputs, reseed, direct)
        try:
            reseed()
            self._replay(step, body)
        except Exception as exc:  # redo the layer eagerly from the static inputs
            # (a step never writes its inputs; a caller's input may be this step's own output,
            # which a half-run replay could have overwritten)
            return self._fall_back(exc, key, body, step.inputs, reseed, direct)
        return step.outputs

    def _fall_back(self, exc: Exception, key, body, inputs, reseed, direct) -> dict:
        self.off = True
        self.steps.clear()
        self.captured = 0
        msg = str(exc).splitlines()[0][:160] if str(exc) else ""
        self.status = f"fell back to eager: {type(exc).__name__}: {msg}"
        return Eager.run(self, key, body, inputs, reseed, direct)

    def _first(self, step: _Step, body: Body, reseed) -> None:
        reseed()
        eager = self._warm_up(step, body)
        self._capture(step, body)
        reseed()
        self._replay(step, body)
        what = _same(eager, step.outputs)
        if what is not None:
            raise RuntimeError(f"the replayed step differs from the eager one in {what!r}")

    def _warm_up(self, step: _Step, body: Body) -> dict:
        return body(**step.inputs)

    def _capture(self, step: _Step, body: Body) -> None:
        """Record the body on ``step.inputs``; set ``step.outputs`` (static, overwritten by each replay)."""
        raise NotImplementedError

    def _replay(self, step: _Step, body: Body) -> None:
        raise NotImplementedError


class Emulated(Replayed):
    """The static-buffer plumbing of ``CudaGraphs`` on any device: "capture" allocates static
    outputs (from one run of the body), "replay" runs the body on the static inputs and copies
    into them.  A caller that kept an output past the next replay of its step (which a real
    graph would overwrite) sees it overwritten here too."""

    def _capture(self, step, body):
        step.outputs = {k: None if v is None else torch.empty_like(v) for k, v in body(**step.inputs).items()}

    def _replay(self, step, body):
        for k, v in body(**step.inputs).items():
            if v is not None:
                step.outputs[k].copy_(v)


def _same(a: dict, b: dict) -> str | None:
    """None when the replayed outputs ``b`` match the eager ``a``, else the first that differs."""
    for k, x in a.items():
        y = b.get(k)
        if x is None or y is None:
            if (x is None) != (y is None):
                return k
            continue
        if x.dtype.is_floating_point:
            if not torch.allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=False):
                return k
        elif not torch.equal(x, y):
            return k
    return None


class CudaGraphs(Replayed):
    """One ``torch.cuda.CUDAGraph`` per step shape, with the bound generators registered."""

    def _warm_up(self, step, body):
        with torch.cuda.device(step.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # lazy handles (cuBLAS, cuSOLVER) are made outside the capture
                eager = body(**step.inputs)
            torch.cuda.current_stream().wait_stream(side)
        return eager

    def _capture(self, step, body):
        with torch.cuda.device(step.device):
            graph = torch.cuda.CUDAGraph()
            for gen in self.generators:
                graph.register_generator_state(gen)
            with torch.cuda.graph(graph):
                step.outputs = body(**step.inputs)
        step.graph = graph

    def _replay(self, step, body):
        with torch.cuda.device(step.device):
            step.graph.replay()
