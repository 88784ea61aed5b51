"""A measurement is one file (issue 28, item 1): a plug-in observer declared here and nowhere in the
package -- the fraction of a state's units that are positive (a ReLU net at init keeps about
half) -- registered for the test only, then run through the API, ``--observe``, the JSON (and
``rerun``), the table, the CSV, the figure and ``--check`` (its own gate ANDed into ``passed``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sigprop import api, observers, specs
from sigprop.cli import main
from sigprop.errors import SigpropError
from sigprop.kinds.mlp import MLPSpec
from sigprop.results import Check, Measurement, compare_documents


class Activity(observers.Observer):
    """Per draw and state, the fraction of units > 0 over the samples [S, E] (float64, on the
    device: no host read while the walk runs)."""

    name = "activity"
    #: the gate: every state's mean activity within this range
    band = (0.3, 0.7)

    def start(self, w, entries):
        self.buf = torch.full((w.S, entries), float("nan"), dtype=torch.float64, device=w.device)

    def forward(self, w, entry, state, out):
        rows = w.space.rows(state)
        self.buf[:, entry] = (rows > 0).to(torch.float64).mean(dim=(-2, -1))

    def result(self):
        return self.buf

    def summarize(self, array, run):
        mean = np.nanmean(array, axis=0)  # over draws
        rows = [[None if np.isnan(v) else float(v)] for v in mean]
        lo, hi = self.band
        worst = float(mean[np.argmax(np.abs(mean - 0.5))])
        check = Check(
            "fraction of units active (the state farthest from 1/2)",
            bool(lo <= worst <= hi),
            float(np.log10(worst)),
            np.log10(lo),
            np.log10(hi),
            verdict=self.name,
            note="" if lo <= worst <= hi else f"a state has {worst:.2f} of its units active",
        )
        return Measurement(self.name, "fraction of units active", ["active"], rows, [check])


class Narrow(Activity):
    """The same measurement with a band no ReLU net meets: its gate must fail."""

    name = "narrow-activity"
    band = (0.9, 1.0)


@pytest.fixture
def plugins():
    observers.register(Activity)
    observers.register(Narrow)
    try:
        yield
    finally:
        del observers.PLUGINS["activity"], observers.PLUGINS["narrow-activity"]


SPEC = MLPSpec(depth=5, input_dim=24, width=specs.WidthSpec(24, 24), inits=("proposed",))


def test_the_api_runs_a_plug_in_by_name_and_by_instance(plugins):
    by_name = api.probe(SPEC, specs.ProbeSpec(samples=60, device="cpu", observe=("activity",)))
    m = by_name.runs[0].measurements[0]
    assert m.name == "activity" and len(m.rows) == 5 and all(0.35 < row[0] < 0.65 for row in m.rows)
    assert by_name.passed and tuple(by_name.config["observe"]) == ("activity",)
    by_instance = api.probe(SPEC, specs.ProbeSpec(samples=60, device="cpu"), observe=[Activity()])
    assert by_instance.runs[0].measurements[0].rows == m.rows


def test_the_json_records_it_and_rerun_runs_it_again(plugins):
    doc = json.loads(
        json.dumps(
            api.probe(SPEC, specs.ProbeSpec(samples=30, device="cpu", observe=("activity",))).to_dict()
        )
    )
    assert doc["runs"][0]["measurements"][0]["columns"] == ["active"]
    assert doc["runs"][0]["checks"][-1]["verdict"] == "activity"
    count, diffs = compare_documents(doc["runs"], api.rerun(doc).to_dict()["runs"])
    assert diffs == [] and count > 50


def test_the_cli_shows_it_and_its_gate_checks(plugins, capsys, tmp_path):
    args = [
        "mlp",
        "--depth",
        "5",
        "--width",
        "24",
        "--input-dim",
        "24",
        "--samples",
        "60",
        "--device",
        "cpu",
        "--init",
        "proposed",
    ]
    png = tmp_path / "a.png"
    assert main([*args, "--observe", "activity", "--plot", str(png), "--check"]) == 0
    out = capsys.readouterr().out
    assert "fraction of units active" in out and "activity:" in out
    assert png.stat().st_size > 10_000
    assert main([*args, "--observe", "activity", "--format", "csv"]) == 0
    assert "activity_active" in capsys.readouterr().out.splitlines()[0]
    assert main([*args, "--observe", "narrow-activity", "--check"]) == 1  # its gate is ANDed into --check
    err = capsys.readouterr().err
    assert "check failed (narrow-activity)" in err and "of its units active" in err
    assert main([*args, "--observe", "nope"]) == 2 and "--observe" in capsys.readouterr().err


def test_a_plug_in_cannot_take_a_built_in_name():
    class Clash(Activity):
        name = "fwd"

    with pytest.raises(SigpropError, match="observer 'fwd' registered twice: a built-in"):
        observers.register(Clash)
    observers.register(Activity)
    try:
        with pytest.raises(SigpropError, match="observer 'activity' registered twice: by .*, and before by"):
            observers.register(Activity)
    finally:
        observers.PLUGINS.remove("activity")


class Threshold(Activity):
    """Activity above a threshold given to its constructor (an observer with an argument)."""

    name = "threshold"

    def __init__(self, at: float) -> None:
        self.at = at

    def forward(self, w, entry, state, out):
        rows = w.space.rows(state)
        self.buf[:, entry] = (rows > self.at).to(torch.float64).mean(dim=(-2, -1))


def test_an_instance_with_constructor_arguments_runs_as_built():
    """Each walk gets a fresh copy of the instance given (``Observer.fresh``), its arguments kept:
    0.16.0 rebuilt it by ``type(o)()``, a TypeError for this one.  A threshold of 0 reads
    ReLU activity (about 1/2); a threshold far above the states reads 0."""
    zero = api.probe(SPEC, specs.ProbeSpec(samples=60, device="cpu"), observe=[Threshold(0.0)])
    rows = zero.runs[0].measurements[0].rows
    assert all(0.35 < row[0] < 0.65 for row in rows)
    high = api.probe(SPEC, specs.ProbeSpec(samples=60, device="cpu"), observe=[Threshold(1e9)])
    assert all(row[0] == 0.0 for row in high.runs[0].measurements[0].rows)
