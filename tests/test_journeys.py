"""No room entered twice by name (issue 51's "no room entered twice"): three journeys through
sigprop -- a probe from the CLI, a sweep point's probe from the API, a user's model -- traced by
benchmarks/journeys.py's profiler hook, and not one call from sigprop code that names a function
of a module already on the stack below another module's frame (a helper in the wrong room, a
method whose class lives in a room the call came from).  Calls back through a function handed
down (a runner's step body, a forward hook, torch's function mode, a quadrature's integrand, a
map reached through the registry) are the contract of a higher-order room and not counted."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

import pytest

from sigprop import api, specs
from sigprop.cli import main
from sigprop.kinds.mlp import MLPSpec


def _journeys():
    """benchmarks/journeys.py (the benchmark's own tracer, loaded from its file)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "journeys.py"
    spec = importlib.util.spec_from_file_location("journeys_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


J = _journeys()


def _by_name(run) -> list:
    """The calls of ``run()`` (second, warm run) that entered a room twice by name."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        run()
    _, _, twice = J.trace(run)
    return sorted(" <- ".join(path) for path, by in twice.items() if by)


def test_the_tracer_tells_a_room_entered_twice_by_name_from_a_function_handed_down():
    """The check can fail: two rooms compiled under sigprop-like file names, room a calling room
    b, which calls back both a function a handed it (not counted) and a's helper by name (counted)."""
    a: dict = {}
    exec(
        compile(
            "def outer():\n    return middle(given)\ndef given():\n    return 1\n"
            "def helper():\n    return 2\n",
            "/x/sigprop/fake_a.py",
            "exec",
        ),
        a,
    )
    b: dict = {"helper": a["helper"]}
    exec(compile("def middle(f):\n    return f() + helper()\n", "/x/sigprop/fake_b.py", "exec"), b)
    a["middle"] = b["middle"]
    _, _, twice = J.trace(a["outer"])
    way = ("sigprop/fake_b.py:middle", "sigprop/fake_a.py:outer")
    assert twice == {("sigprop/fake_a.py:given", *way): False, ("sigprop/fake_a.py:helper", *way): True}


def test_a_probe_from_the_command_line_enters_no_room_twice(tmp_path):
    assert _by_name(lambda: main(["mlp", "--depth", "4", "--samples", "8", "--device", "cpu"])) == []


def test_a_sweep_points_probe_enters_no_room_twice():
    spec = MLPSpec(depth=4, input_dim=16, width=specs.WidthSpec(16, 16), inits=("he", "proposed"))
    assert _by_name(lambda: api.probe(spec, specs.ProbeSpec(samples=8, device="cpu")).to_dict()) == []


#: a pre-norm residual stack with GELU MLPs: the fold's norm, activation and fork maps
MODEL = """import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def make():
    return nn.Sequential(nn.Linear(12, 16), Block(16), Block(16), nn.LayerNorm(16))
"""


def test_a_users_model_enters_no_room_twice(tmp_path):
    from sigprop.kinds.module import ModuleSpec

    factory = tmp_path / "block_factory.py"
    factory.write_text(MODEL)
    spec = ModuleSpec(target=f"{factory}:make", input_shape=(12,), inits=("as-is", "proposed"))
    assert _by_name(lambda: api.probe(spec, specs.ProbeSpec(samples=8, device="cpu"))) == []


def test_gpt2_from_the_command_line_enters_no_room_twice(tmp_path):
    pytest.importorskip("transformers")
    factory = tmp_path / "gpt2_factory.py"
    factory.write_text(J.GPT2)
    args = ["module", f"{factory}:make", "--input-shape", "8", "--vocab", "100", "--samples", "8"]
    assert _by_name(lambda: main([*args, "--device", "cpu"])) == []
