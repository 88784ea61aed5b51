"""An option is declared once (sigprop/options.py; the fields of ``specs.ProbeSpec`` and
``specs.GateSpec``): one added there is taken by the command line, the API's keywords, a TOML
check, ``sigprop sweep`` (and its resume key), ``sigprop rerun``, and recorded in the result."""

import inspect
import json
from dataclasses import make_dataclass

import pytest

from sigprop import api, checks, kinds, specs
from sigprop.checks import ConfigError
from sigprop.cli import main
from sigprop.options import declared, declared_options

SMALL = ["--depth", "3", "--input-dim", "16", "--width", "16", "--samples", "8", "--device", "cpu"]


@pytest.fixture
def tagged(monkeypatch):
    """``ProbeSpec`` with one more declared field, ``tag`` (a label the result records), and
    nothing else changed: the one place an option is added."""
    field = declared(str, "none", "A label the result records.", sweep=True)
    cls = make_dataclass("ProbeSpec", [("tag", str, field)], bases=(specs.ProbeSpec,), frozen=True)
    monkeypatch.setattr(specs, "ProbeSpec", cls)
    return cls


def _json(capsys, args):
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_an_option_declared_once_is_taken_everywhere(tagged, tmp_path, capsys):
    # the command line: in the help, parsed, and recorded in the result's config
    assert main(["mlp", "--help"]) == 0
    assert "--tag" in capsys.readouterr().out
    doc = json.loads(_json(capsys, ["mlp", *SMALL, "--init", "he", "--tag", "t1", "--format", "json"]))
    assert doc["config"]["tag"] == "t1"

    # sigprop rerun reads it back from the document
    _, probe, _, _ = api.rerun_specs(doc)
    assert isinstance(probe, tagged) and probe.tag == "t1"

    # the API's keyword function: in its signature, and reaching the probe
    probe_mlp = api.keywords(kinds.get("mlp"))
    assert inspect.signature(probe_mlp).parameters["tag"].default == "none"
    r = probe_mlp(depth=3, input_dim=16, width="16", samples=8, device="cpu", inits="he", tag="t2")
    assert r.config["tag"] == "t2"

    # a TOML check: the key taken, of its declared type
    toml = tmp_path / "checks.toml"
    toml.write_text('[check.tagged]\ncommand = "mlp"\ndepth = 3\ninit = "he"\ntag = "t3"\n')
    (check,) = checks.load(toml, ("check",))
    assert check.probe.tag == "t3"
    toml.write_text('[check.tagged]\ncommand = "mlp"\ndepth = 3\ninit = "he"\ntag = 3\n')
    with pytest.raises(ConfigError, match="tag"):
        checks.load(toml, ("check",))

    # sigprop sweep: an option, and a point measured with another value is another point
    out = tmp_path / "sweep.jsonl"
    sweep = ["sweep", "mlp", "--depth", "3", "--width", "16", "--samples", "8", "--device", "cpu"]
    sweep += ["--init", "he", "--out", str(out)]
    for tag in ("t4", "t4", "t5"):
        assert main([*sweep, "--tag", tag]) == 0, capsys.readouterr().err
    capsys.readouterr()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["config"]["tag"] for line in lines] == ["t4", "t5"]  # the second t4 resumed


def test_an_option_not_declared_for_a_place_is_not_taken_there(monkeypatch, tmp_path, capsys):
    """``check=False``/``sweep=False``: the same option kept out of a TOML check and a sweep,
    refused there in one line (the declaration decides, not a list elsewhere)."""
    field = declared(str, "none", "A label the result records.", check=False)
    cls = make_dataclass("ProbeSpec", [("tag", str, field)], bases=(specs.ProbeSpec,), frozen=True)
    monkeypatch.setattr(specs, "ProbeSpec", cls)
    toml = tmp_path / "checks.toml"
    toml.write_text('[check.tagged]\ncommand = "mlp"\ndepth = 3\ninit = "he"\ntag = "t3"\n')
    with pytest.raises(ConfigError, match="tag"):
        checks.load(toml, ("check",))
    code = main(["sweep", "mlp", "--depth", "3", "--out", str(tmp_path / "s.jsonl"), "--tag", "x"])
    assert code == 2
    assert "--tag" in capsys.readouterr().err


def test_every_spec_field_is_declared():
    """Every field of the probe and the gate is an option (none taken by a list written elsewhere)."""
    from dataclasses import fields

    for cls in (specs.ProbeSpec, specs.GateSpec):
        assert [o.name for o in declared_options(cls)] == [f.name for f in fields(cls)]


def test_the_sweep_key_is_what_it_was():
    """A point's resume key holds samples, seeds, seed and dtype always, the cosines and their
    pairs only when cosines are measured (files written before keep resuming)."""
    from sigprop.options import keyed

    assert keyed(specs.ProbeSpec(samples=8)) == {"samples": 8, "seed": 0, "seeds": 1, "dtype": "float32"}
    assert keyed(specs.ProbeSpec(samples=8, pairs=64)) == keyed(specs.ProbeSpec(samples=8))
    assert keyed(specs.ProbeSpec(samples=8, correlations=(0.5,))) == {
        "samples": 8,
        "seed": 0,
        "seeds": 1,
        "dtype": "float32",
        "correlations": [0.5],
        "pairs": 256,
    }
    assert "device" not in keyed(specs.ProbeSpec(device="cpu"))


def test_a_curvature_option_declared_once_is_taken_by_the_command_and_a_check(monkeypatch, tmp_path, capsys):
    """The curvature's options are ``specs.HessianSpec``'s declared fields too: one added there is
    in ``sigprop hessian KIND --help``, parsed into the spec, and a key of a ``lowest_curvature``
    check (``check=True``), refused in a check that is not one."""
    from sigprop.cli.options import HessianOptions, hessian_table

    field = declared(int, 7, "A curvature option added in one place.", min=1)
    cls = make_dataclass("HessianSpec", [("extra", int, field)], bases=(specs.HessianSpec,), frozen=True)
    monkeypatch.setattr(specs, "HessianSpec", cls)
    assert main(["hessian", "mlp", "--help"]) == 0
    assert "--extra" in capsys.readouterr().out
    table = {name: default for name, _, default in hessian_table(kinds.get("mlp"))}
    assert table["extra"] == 7
    values = {name: default for name, default in table.items() if name not in ("fmt", "output", "plot")}
    assert HessianOptions(**{**values, "extra": 3}).resolve().spec.extra == 3
    toml = tmp_path / "checks.toml"
    body = 'command = "mlp"\ndepth = 3\ninit = ["proposed", "he"]\nextra = 5\n'
    toml.write_text("[check.c]\n" + body + 'lowest_curvature = "proposed"\n')
    (check,) = checks.load(toml, ("check",))
    assert check.curvature.extra == 5
    toml.write_text("[check.c]\n" + body)
    with pytest.raises(ConfigError, match="extra applies to a lowest_curvature check only"):
        checks.load(toml, ("check",))
