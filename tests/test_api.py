"""sigprop/api.py: one function per registered kind made from its declaration, specs by name, the
lazy package (``import sigprop`` loads no torch), the document a rerun reads."""

import inspect
import subprocess
import sys

import pytest

import sigprop
from sigprop import api, kinds, specs
from sigprop.errors import SigpropError


def test_every_kind_has_its_keyword_function_with_its_own_defaults():
    for kind in kinds.KINDS.values():
        fn = getattr(sigprop, f"probe_{kind.name}")
        params = inspect.signature(fn).parameters
        for o in kind.options:
            assert params[o.name].default == o.default
        assert params["samples"].default == kind.probe_defaults.get("samples", specs.ProbeSpec.samples)
        assert kind.summary in fn.__doc__
    assert inspect.signature(sigprop.probe_wrn).parameters["samples"].default == 100


def test_spec_by_name_names_the_unknown_option():
    s = api.spec("mlp", depth=3, width=16, inits="he")
    assert (s.depth, str(s.width), s.inits) == (3, "16", ("he",))
    with pytest.raises(SigpropError) as err:
        api.spec("mlp", blocks=3)
    assert err.value.field == "blocks" and "depth" in str(err.value)
    with pytest.raises(SigpropError, match="did you mean 'mlp'"):
        api.spec("mpl")


def test_importing_sigprop_loads_no_torch_until_the_api_is_used():
    code = (
        "import sys, sigprop; a = 'torch' in sys.modules; sigprop.probe_mlp; "
        "print(a, 'torch' in sys.modules, sigprop.__version__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[:2] == ["False", "True"] and out[2] == sigprop.__version__
    with pytest.raises(AttributeError):
        sigprop.no_such_thing


def test_rerun_specs_reads_a_document_and_refuses_others():
    doc = api.probe(
        api.spec("mlp", depth=2, width=8, input_dim=8, inits="proposed"),
        specs.ProbeSpec(samples=4, device="cpu", correlations=(0.5,), pairs=3),
    ).to_dict()
    net, probe, gate, threads = api.rerun_specs(doc)
    assert (
        net.depth == 2
        and probe.correlations == (0.5,)
        and probe.pairs == 3
        and threads == doc["environment"]["threads"]
    )
    for bad in ({}, {**doc, "schema": "other"}, {**doc, "command": "rnn"}):
        with pytest.raises(SigpropError) as err:
            api.rerun_specs(bad)
        assert err.value.field == "result"


def test_an_unknown_measurement_is_refused_before_anything_runs(monkeypatch):
    from sigprop.kernels import sampling

    monkeypatch.setattr(sampling, "probe_inputs", lambda *a, **k: pytest.fail("drew inputs"))
    with pytest.raises(SigpropError) as err:
        api.probe(api.spec("mlp", depth=2), specs.ProbeSpec(observe=("nothing-registered",), device="cpu"))
    assert err.value.field == "observe" and "none is registered" in str(err.value)
