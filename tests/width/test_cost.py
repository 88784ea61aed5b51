"""What a check costs, said before the work (issue 66, item 2): the widest point's memory refused
in one line naming the option that gives the widths, before anything is built; the time left
counted by each point's width (a uniform estimate read "72 s left" with the widest half to run);
a check of 10^8 steps says its length from its first steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import sigprop
from sigprop.cli import main
from sigprop.errors import SigpropError
from sigprop.width import cost, train

FACTORY = """
import torch, torch.nn as nn
class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, width), nn.Linear(width, width), nn.Linear(width, 4)
        {extra}
    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))
def make(width=16):
    return Net(width)
"""


def _err(capsys) -> str:
    err = [t for t in capsys.readouterr().err.strip().splitlines() if not t.startswith("sigprop width ")]
    assert len(err) == 1, err
    return err[0]


def test_widths_too_wide_are_refused_before_anything_is_built(capsys, monkeypatch):
    """--widths 16,100000000 reached 9 GB without a word: the widest point's memory (4 x 10^16
    parameters, built on the meta device) is refused in one line naming --widths; nothing of its
    size is allocated (a real build would raise long before)."""
    built = []
    monkeypatch.setattr(train, "run_point", lambda *a, **k: built.append(1))
    assert main(["width", "mlp", "--widths", "16,32,100000000"]) == 2
    line = _err(capsys)
    assert (
        line.startswith("sigprop: error: --widths: the widest point (width 100,000,000: ") and "GiB" in line
    )
    assert "built on the meta device" in line and not built


@pytest.mark.parametrize("extra, how", [("", "built on the meta device"),
                                        ("torch.tensor(1.0).item()", "scaled from width 16")])  # fmt: skip
def test_a_model_too_wide_is_refused_naming_arg(tmp_path, monkeypatch, capsys, extra, how):
    """A factory that cannot build on the meta device (it reads a value) is scaled from a real
    build at its smallest width; either way the refusal names --arg, the option that gives the
    widths of a model."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(FACTORY.format(extra=extra))
    assert (
        main(["width", "module", "net.py:make", "--arg", "width=16,32,10000000", "--input-shape", "6"]) == 2
    )
    line = _err(capsys)
    assert line.startswith("sigprop: error: --arg: the widest point (width 10,000,000: ") and how in line, (
        line
    )


def test_the_estimate_counts_weights_and_adam_state():
    """The estimate's arithmetic: weights, gradients, Adam's two moments and its step's temporary
    (5 weights' worth) + 3 x the activations; SGD keeps no state."""
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 3))
    count, weights = cost.parameters(model)
    assert count == 10 * 20 + 20 + 20 * 3 + 3 and weights == 4 * count
    acts = cost.activations(model, torch.zeros(5, 10))
    assert acts == 4 * 5 * (20 + 20 + 3)
    assert cost.point_bytes(weights, acts, "adam") == 5 * weights + 3 * acts
    assert cost.point_bytes(weights, acts, "sgd") == 2 * weights + 3 * acts
    meta = cost.on_meta(lambda w: nn.Sequential(nn.Linear(10, w), nn.ReLU(), nn.Linear(w, 3)), 20)
    assert cost.parameters(meta) == (count, weights) and cost.activations(meta, torch.zeros(5, 10)) == acts


def test_sigprop_s_own_net_failing_is_not_blamed_on_target(monkeypatch):
    """A memory error while sigprop builds or trains its own MLP named TARGET: it names --widths."""

    def boom(*a, **k):
        raise RuntimeError("DefaultCPUAllocator: not enough memory")

    monkeypatch.setattr(train, "run_point", boom)
    with pytest.raises(SigpropError) as e:
        sigprop.width_check("mlp", widths=[16, 32, 64], depth=3, input_dim=6, steps=1, seeds=2, batch_size=8)
    assert e.value.field == "widths" and "not enough memory" in e.value.message


class _Time:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_the_clock_counts_the_wide_points_still_to_run(monkeypatch):
    """Steps cost a + b x parameters: with the widest and the narrowest timed, the time left is
    each remaining point's own, not the median point's times their number."""
    now = _Time()
    monkeypatch.setattr(cost.time, "perf_counter", now)
    counts = {16: 1_000, 64: 16_000, 256: 256_000}
    step = {w: 0.001 + 1e-6 * c for w, c in counts.items()}  # a step: 1 ms + 1 µs a parameter
    build = {w: 1e-6 * c for w, c in counts.items()}
    todo = [256, 16, 64, 256, 16, 64]
    clock = cost.Clock(counts, [(w, 3) for w in todo])
    truth = sum(build[w] + 4 * step[w] for w in todo)
    for i, w in enumerate(todo):
        left = truth - sum(build[u] + 4 * step[u] for u in todo[:i])
        if i >= 2:  # the two ends timed: each point's time read between them
            assert clock.left() == pytest.approx(left, rel=1e-6)
        clock.start(w, 3)
        now.t += build[w]
        for _ in range(4):
            now.t += step[w]
            clock.tick()
        clock.done()
    assert clock.left() == 0.0
    # one width timed: the others proportional to their parameters -- never the median point's time
    first = cost.Clock(counts, [(w, 3) for w in todo])
    first.start(256, 3)
    for _ in range(2):
        now.t += step[256]
        first.tick()
    wide = 1.5 * 4 * step[256]  # the rest of this point and the other widest one
    assert wide < first.left() < wide + 2 * 4 * (step[16] + step[64])


class _Stop(BaseException):
    pass


def test_a_check_of_many_steps_says_its_length_from_its_first_steps():
    """--steps 100000000 printed only the banner for minutes: the clock's estimate is told after
    the widest point's first steps, before any point finishes."""
    told = []

    class Progress:
        def __call__(self, done, total, label=""):
            raise AssertionError("a point finished before the estimate")

        def remaining(self, seconds):
            told.append(seconds)
            raise _Stop

    with pytest.raises(_Stop):
        sigprop.width_check("mlp", widths=[16, 32, 64], depth=3, input_dim=6, steps=100_000_000, seeds=2,
                            batch_size=8, progress=Progress())  # fmt: skip
    assert told and told[0] > 1e5  # 10^8 steps of at least a microsecond each
