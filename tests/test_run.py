"""sigprop/run.py, the one driver: it holds no ``if`` on the engine -- every command reaches its
kind's engine through the registry (sigprop/engines/) -- and it records the config, the tolerances
and the environment of every probe."""

import dataclasses

import pytest

from sigprop import engines, kinds, run, specs, theory
from sigprop.errors import SigpropError
from sigprop.kinds.mlp import MLPSpec

SPEC = MLPSpec(depth=3, input_dim=16, width=specs.WidthSpec(16, 16), inits=("proposed",))
PROBE = specs.ProbeSpec(samples=8, device="cpu")


def test_every_kind_names_a_registered_engine():
    assert "plan" in engines.ENGINES and "model" in engines.registry.LAZY
    for kind in kinds.KINDS.values():
        assert engines.of(kind).name == kind.engine
    assert "model" in engines.ENGINES  # registered by its first lookup


class Recording(engines.Engine):
    """The plan engine, with every call it gets written down."""

    name = "plan"

    def __init__(self, inner, calls):
        self.inner, self.calls = inner, calls

    def measure(self, *a):
        self.calls.append("measure")
        return self.inner.measure(*a)

    def assemble(self, *a):
        self.calls.append("assemble")
        return self.inner.assemble(*a)

    def curvature(self, *a):
        self.calls.append("curvature")
        return self.inner.curvature(*a)

    def spectrum(self, *a):
        self.calls.append("spectrum")
        return self.inner.spectrum(*a)


def test_probe_curvature_and_spectrum_go_through_the_kinds_engine(monkeypatch):
    calls = []
    monkeypatch.setitem(engines.ENGINES, "plan", Recording(engines.ENGINES["plan"], calls))
    result = run.probe(SPEC, PROBE)
    run.curvature(SPEC, specs.HessianSpec(samples=16, device="cpu", iters=5))
    run.spectrum(SPEC, specs.SpectrumSpec(samples=2, device="cpu"))
    assert calls == ["measure", "assemble", "curvature", "spectrum"]  # one init: one record
    # the record: the config as the API and `sigprop rerun` read it, the tolerances, the version
    assert result.config["command"] == "mlp" and result.config["depth"] == 3
    assert result.config["samples"] == 8 and result.config["gate"] == "preserved"
    assert result.tolerances["z_check"] == theory.Z_CHECK and "band" in result.tolerances
    assert result.environment["sigprop"] and result.environment["device"] == "cpu"


def test_a_kind_whose_engine_is_not_registered_is_an_internal_error(monkeypatch):
    kind = kinds.of(SPEC)
    monkeypatch.setattr(type(kind), "engine", "nowhere")
    with pytest.raises(SigpropError, match="internal error: no engine 'nowhere'"):
        run.probe(SPEC, PROBE)


def test_an_unknown_measurement_is_refused_before_anything_runs(monkeypatch):
    calls = []
    monkeypatch.setitem(engines.ENGINES, "plan", Recording(engines.ENGINES["plan"], calls))
    with pytest.raises(SigpropError) as err:
        run.probe(SPEC, dataclasses.replace(PROBE, observe=("nothing",)))
    assert err.value.field == "observe" and calls == []
