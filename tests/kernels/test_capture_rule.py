"""Which steps a replayed walk captures (sigprop/kernels/replay.py, issue 41): the walk announces
how many times it runs each step key (walker/walk.py ``step_counts``), and a step is captured
only when ``replay.MIN_LATER`` runs of its key follow the capturing one.  Before 0.14.0 a step
was captured at its second run: the default ``sigprop resnet`` (40 blocks of drawn widths,
three inits) captured 24 steps and replayed none of them again.

Checked with ``replay.Emulated`` (the replay plumbing without the CUDA capture): the announced
counts are the keys the walk then runs, for every kind of unit and walk; every captured step is
replayed at least MIN_LATER times after its capture; a key that recurs often enough is captured.
"""

import collections
import math

import pytest
import torch
import walks

from sigprop import inits, kinds, specs, walker
from sigprop.kernels import replay, sampling
from sigprop.kinds import mlp as mlp_kind
from sigprop.kinds.cnn import CNNSpec
from sigprop.kinds.resnet import ResNetSpec
from sigprop.kinds.wrn import WRNSpec

CPU = torch.device("cpu")


class Recording(replay.Emulated):
    """The emulated replay runner, recording the announced counts, every run's key, and the runs
    of each key that replayed a captured step."""

    def __init__(self) -> None:
        super().__init__()
        self.announced: collections.Counter = collections.Counter()
        self.ran: collections.Counter = collections.Counter()
        self.replayed: collections.Counter = collections.Counter()

    def expect(self, counts) -> None:
        super().expect(counts)
        self.announced = collections.Counter(counts)

    def run(self, key, body, inputs, reseed, direct=None):
        self.ran[key] += 1
        if key in self.steps:
            self.replayed[key] += 1
        return super().run(key, body, inputs, reseed, direct)


def _plan(kind: str, spec):
    return kinds.KINDS[kind].plan(spec, 3)


PLANS = {
    "mlp fixed": lambda: mlp_kind.steps([12] + [16] * 11),
    "mlp drawn": lambda: mlp_kind.steps([12, 9, 17, 17, 17, 17, 8, 11]),
    "resnet projection": lambda: (
        _plan(
            "resnet", ResNetSpec(blocks=5, stages=2, dim=6, width=specs.WidthSpec(7, 7), block_depth=2)
        ).steps
    ),
    "resnet drawn": lambda: _plan("resnet", ResNetSpec(blocks=12, dim=8, width=specs.WidthSpec(4, 9))).steps,
    "cnn": lambda: _plan("cnn", CNNSpec(depth=10, channels=4, image=(3, 8, 8))).steps,
    "wrn": lambda: _plan("wrn", WRNSpec(blocks=4, image=(3, 8, 8))).steps,
}


def _walk(steps, name: str, stream: bool, backward: bool = True, chunks: bool = False, monkeypatch=None):
    """Two draws of ``steps`` walked with a ``Recording`` runner (and its real MIN_LATER)."""
    if chunks:  # layers 2..L of the fixed MLP drawn 3 at a time (the CUDA path, run here)
        monkeypatch.setattr(sampling, "BATCHED_HAAR", "always")
        monkeypatch.setattr(sampling, "CHUNK_MAX", 3)
    scheme = inits.get(name)
    units, _ = walker.compile_plan(steps, scheme)
    n_in, n_out = (math.prod(units[i].shape_in if i == 0 else units[i].shape_out) for i in (0, -1))
    x, e = sampling.probe_inputs(3, 4, n_in, n_out, CPU, torch.float32)
    runner = Recording()
    walks.walk(steps, scheme, x, e if backward else None, 3, [0, 1], stream=stream, runner=runner)
    return runner


CASES = [
    (plan, name, stream, backward)
    for plan in PLANS
    for name in ("he", "proposed")
    for stream in (False, True)
    for backward in (True, False)
]


@pytest.mark.parametrize("plan,name,stream,backward", CASES)
def test_the_walk_announces_the_steps_it_runs(plan, name, stream, backward):
    runner = _walk(PLANS[plan](), name, stream, backward)
    assert runner.announced == runner.ran
    assert all(v == 0 for v in runner.left.values())


@pytest.mark.parametrize("stream", [False, True])
def test_chunked_haar_steps_are_announced(monkeypatch, stream):
    runner = _walk(PLANS["mlp fixed"](), "proposed", stream, chunks=True, monkeypatch=monkeypatch)
    assert any(k[0] == "chunk" for k in runner.ran) and any(k[0] == "fwd-given" for k in runner.ran)
    assert runner.announced == runner.ran


@pytest.mark.parametrize("plan,name,stream,backward", CASES)
def test_a_step_is_captured_when_and_only_when_its_replays_follow(plan, name, stream, backward):
    """Every captured step replays at least MIN_LATER runs after the run that captured it; a
    key that runs MIN_LATER + 2 times or more is captured (the first run is eager, the second
    captures), up to MAX_GRAPHS keys."""
    runner = _walk(PLANS[plan](), name, stream, backward)
    for key in runner.steps:
        assert runner.replayed[key] >= replay.MIN_LATER, (key, runner.ran[key])
    often = [k for k, n in runner.ran.items() if n >= replay.MIN_LATER + 2]
    assert len(runner.steps) == min(len(often), replay.MAX_GRAPHS)
    assert set(runner.steps) <= set(often)


def test_the_fixed_width_mlp_still_captures_and_drawn_widths_do_not():
    """The rule's two sides on real plans: 11 layers of one shape capture their forward and
    backward steps; a few shapes that recur twice capture nothing (before: two steps)."""
    fixed = _walk(PLANS["mlp fixed"](), "he", False)
    assert len(fixed.steps) == 2 and all(n >= replay.MIN_LATER for n in fixed.replayed.values())
    drawn = _walk(PLANS["mlp drawn"](), "he", False)
    assert not drawn.steps and drawn.status == "on"


def test_an_unannounced_key_is_captured_at_its_second_run():
    """A runner used without ``expect`` (a caller outside the walk) keeps the old rule."""
    runner = replay.Emulated()
    body = lambda a: {"b": a * 2}
    for _ in range(2):
        runner.run("k", body, {"a": torch.ones(3)}, lambda: None)
    assert "k" in runner.steps
