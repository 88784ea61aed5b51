"""A net kind is one file (issue 28, item 1): a deep linear WN net, declared here and nowhere in the
package, registered for the test only, then run through everything a built-in kind has -- the
API (a spec, ``sigprop.probe_linear``), the JSON round trip (``rerun`` reproduces every number),
the CLI's command with its own options, the table, the figure, ``--check``, ``sigprop check``,
``sigprop sweep`` and ``sigprop hessian``.  No module of the package is touched, and the kind
declares no memory plan and assembles no record: the engine estimates its memory from its steps
and pairs its rows with the theory it declares."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np
import pytest

import sigprop
from sigprop import api, kinds, plans, specs, stats
from sigprop.cli import main
from sigprop.inits import LayerRole
from sigprop.kinds import Hints, Kind, Opt, RunTheory, SweepAxes
from sigprop.results import compare_documents


@dataclass(frozen=True)
class LinearSpec:
    """L weight-normalized linear layers of one width, no ReLU: h^l = W^l h^{l-1}."""

    depth: int = 8
    width: int = 32
    inits: tuple[str, ...] = ("he",)

    def __post_init__(self) -> None:
        specs.check_size(self.depth, "depth")
        specs.check_size(self.width, "width")
        kinds.init_tuple(self, LinearNet.provides, LinearNet.noun)

    def to_dict(self) -> dict:
        return {**asdict(self), "inits": list(self.inits)}


@dataclass(frozen=True)
class LinearPlan:
    steps: tuple
    entries: list
    config: dict


class LinearNet(Kind):
    """The test's kind: every declaration a kind makes, in one class."""

    name = "linear"
    summary = "Probe a deep linear weight-normalized net (a test kind): norm ratios per layer."
    spec = LinearSpec
    noun = "the linear net"
    size_fields = "depth/width/samples"
    options = (
        Opt("depth", int, 8, "Number of layers L.", min=1),
        Opt("width", int, 32, "Every layer's width.", min=1),
    )
    default_inits = ("he",)
    hints = Hints(
        footer="a deep linear net: each layer keeps E||h||^2 with g = 1 (he), doubles it with row_sq 2"
    )
    sweep_axes = SweepAxes(sizes="4,8", widths="16")

    def make(self, values, inits_):
        return LinearSpec(**values, inits=self.default_inits if inits_ is None else inits_)

    def sweep_spec(self, size, width, init, input_dim):
        return LinearSpec(depth=size, width=width, inits=(init,))

    def banner(self, spec):
        return f"depth {spec.depth}, width {spec.width}"

    def describe(self, config):
        return f"linear, depth {config.get('depth')}, width {config.get('width')}"

    def plan(self, spec, seed):
        steps = []
        for _ in range(spec.depth):
            steps += [plans.Linear(LayerRole(spec.width, spec.width, "linear"), relu=False), plans.Record()]
        return LinearPlan(tuple(steps), [spec.width] * spec.depth, {})

    def run_theory(self, scheme, spec, plan, probe):
        """Per layer the composed prediction; a chi-square spread 1/(2n) per layer (the test's own
        model); its widths begin with the input's (row l is layer l + 1)."""
        pred = plans.predict(plan.steps, scheme)
        L, n = len(plan.entries), spec.width
        cumulants = lambda var: np.stack([np.zeros(L), np.asarray(var, dtype=float), np.zeros(L)], axis=1)
        spread = plans.Spread(
            cumulants([(l + 1) / (2 * n) for l in range(L)]),
            cumulants([(L - 1 - l) / (2 * n) for l in range(L)]),
            [],
            [],
            [],
        )
        sep = plans.Separation(None, None)
        return RunTheory(pred, sep, spread, [n] * (L + 1), scheme.description)

    def verdicts(self, th, spec, plan, arrays, layers, gate):
        """The two verdicts on the end-to-end ratios."""
        L, n = len(plan.entries), spec.width
        lo, hi = (math.log(v) for v in gate.band or specs.DECADE_BAND)
        checks = [
            stats.gate("forward ratio at the top", "preserved", layers[-1].forward, lo, hi),
            stats.gate("backward ratio at layer 1", "preserved", layers[0].backward, lo, hi),
        ]
        for what, st, ln, var in (
            ("forward ratio at the top", layers[-1].forward, th.pred.ln_forward[-1], L / (2 * n)),
            ("backward ratio at layer 1", layers[0].backward, th.pred.ln_backward[0], (L - 1) / (2 * n)),
        ):
            checks.append(
                stats.gate(what, "theory", st, ln - var - 4 * math.sqrt(var), ln + 4 * math.sqrt(var))
            )
        return checks, None


@pytest.fixture
def linear():
    """The kind registered for one test, then removed (the registry is the package's only list)."""
    kinds.register(LinearNet)
    try:
        yield kinds.KINDS["linear"]
    finally:
        del kinds.KINDS["linear"]


TINY = ["--depth", "6", "--width", "24", "--samples", "40", "--device", "cpu"]


def test_the_api_runs_the_new_kind(linear):
    spec = LinearSpec(depth=6, width=24, inits=("he", "unnormalized-he"))
    r = api.probe(spec, specs.ProbeSpec(samples=40, device="cpu"))
    assert r.command == "linear" and [run.init for run in r.runs] == ["he", "unnormalized-he"]
    he, un = r.runs
    assert he.preserved and he.agrees_with_theory
    # row_sq 2 without a ReLU: E||h||^2 doubles per layer, 2^{6/2} = 8 end to end
    assert un.layers[-1].forward.predicted == pytest.approx(8.0, rel=1e-12) and un.agrees_with_theory
    assert not un.preserved or un.layers[-1].forward.mean > 5
    keyword = sigprop.probe_linear(depth=6, width=24, samples=40, inits="he", device="cpu")
    assert keyword.runs[0].layers[-1].forward.mean == he.layers[-1].forward.mean
    assert "probe_linear" in dir(sigprop)


def test_the_json_round_trip_reproduces_every_number(linear, tmp_path):
    spec = LinearSpec(depth=5, width=16, inits=("he",))
    doc = json.loads(
        json.dumps(api.probe(spec, specs.ProbeSpec(samples=20, seeds=2, device="cpu")).to_dict())
    )
    assert doc["config"]["depth"] == 5 and doc["config"]["width"] == 16
    count, diffs = compare_documents(doc["runs"], api.rerun(doc).to_dict()["runs"])
    assert count > 100 and diffs == []


def test_the_cli_command_table_plot_and_check(linear, capsys, tmp_path):
    png = tmp_path / "linear.png"
    assert main(["linear", *TINY, "--init", "he", "--plot", str(png), "--check"]) == 0
    out = capsys.readouterr()
    assert "he" in out.out and "a deep linear net" in out.out and "signal preserved" in out.out
    assert out.err.startswith("sigprop linear: device cpu") and "depth 6, width 24" in out.err
    assert png.stat().st_size > 10_000
    assert main(["linear", *TINY, "--init", "unnormalized-he", "--band", "0.5:2", "--check"]) == 1
    assert "check failed (signal preserved): unnormalized-he" in capsys.readouterr().err
    assert main(["linear", "--depth", "0"]) == 2 and "--depth" in capsys.readouterr().err
    assert main(["linear", "--init", "skipinit"]) == 2  # an init the net does not provide for
    assert "--init" in capsys.readouterr().err
    # the kind declares no memory plan: its steps' estimate (plans.memory) refuses what cannot fit
    assert main(["linear", "--width", "2000000", "--depth", "3", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--depth/--width/--samples" in err and "GiB" in err and "Traceback" not in err


def test_sigprop_check_sweep_and_hessian_take_the_new_kind(linear, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sigprop.toml").write_text(
        '[checks.keeps]\ncommand = "linear"\ndepth = 6\nwidth = 24\nsamples = 40\ndevice = "cpu"\n\n'
        '[checks.explodes]\ncommand = "linear"\ndepth = 6\ninit = "unnormalized-he"\nband = [0.5, 2]\n'
        'expect = "fail"\nsamples = 40\ndevice = "cpu"\n'
    )
    assert main(["check"]) == 0
    assert "2 passed, 0 failed" in capsys.readouterr().out
    assert (
        main(
            [
                "sweep",
                "linear",
                "--out",
                "s.jsonl",
                "--depth",
                "3,5",
                "--width",
                "8",
                "--samples",
                "10",
                "--init",
                "he",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [r["config"]["depth"] for r in rows] == [3, 5] and all(
        r["config"]["command"] == "linear" for r in rows
    )
    assert (
        main(
            [
                "hessian",
                "linear",
                "--depth",
                "3",
                "--width",
                "8",
                "--samples",
                "16",
                "--seeds",
                "1",
                "--device",
                "cpu",
                "--format",
                "json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "linear" and np.isfinite(doc["runs"][0]["draws"][0]["eigenvalue"])


def test_an_unregistered_kind_is_gone_everywhere(capsys):
    """Without the fixture the registry, the CLI and the API know nothing of it."""
    assert "linear" not in kinds.KINDS
    assert main(["linear"]) == 2
    with pytest.raises(AttributeError):
        sigprop.probe_linear


def test_a_kind_without_sweep_axes_is_not_swept(linear, capsys, monkeypatch):
    """How ``sigprop sweep`` sweeps a kind is one declaration (``Kind.sweep_axes``, a
    ``SweepAxes``): the linear net's default sizes are the sweep's defaults and in its help, and a
    kind that declares none is not among the sweep's commands (until 0.17 seven attributes, one of
    them a flag)."""
    assert main(["sweep", "linear", "--help"]) == 0
    out = capsys.readouterr().out
    assert "linear 4,8" in " ".join(out.split()) and "linear 16" in " ".join(out.split())
    monkeypatch.setattr(LinearNet, "sweep_axes", None)
    assert main(["sweep", "linear", "--depth", "3"]) == 2
    err = capsys.readouterr().err
    assert "linear" in err and "Traceback" not in err
