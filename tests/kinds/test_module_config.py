"""``sigprop module --config PATH`` (issue 69 item 1): a Hugging Face config.json built by
``AutoModel.from_config`` (the base model, its own init, no weights), read at its last hidden
state on token ids.  On a config that fits it measures exactly what a factory building the same
class from the same config measures (same seed, same draws: the same floats); --arg overrides a
field; a bad --config is one line naming it; the result reruns; a sweep takes it."""

from __future__ import annotations

import json

import pytest

import sigprop
from sigprop.cli import main
from sigprop.errors import SigpropError
from sigprop.model.hf import Hidden

transformers = pytest.importorskip("transformers")

T = 12


@pytest.fixture
def config(tmp_path):
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=100, max_position_embeddings=T,
    )  # fmt: skip
    path = tmp_path / "config.json"
    d = json.loads(cfg.to_json_string())
    d["torch_dtype"] = d["dtype"] = "bfloat16"  # a released config's: its checkpoint's, not the init's
    path.write_text(json.dumps(d))
    return path


def _rows(run):
    return [
        (x.name, x.forward.rms, x.backward.rms, x.forward.predicted, x.backward.predicted) for x in run.layers
    ]


def test_a_config_measures_what_its_factory_measures(config):
    """The same class from the same config under the same seed: every site's ratios and
    predictions equal (the same draws in the same order) -- drawn in float32 though the config
    names bfloat16 (AutoModel would draw in it)."""

    def factory():
        d = {k: v for k, v in json.loads(config.read_text()).items() if k not in ("torch_dtype", "dtype")}
        return Hidden(transformers.LlamaModel(transformers.LlamaConfig(**d)))

    got = sigprop.probe_module(config=str(config), input_shape=(T,), samples=8, inits=("as-is", "proposed"))
    want = sigprop.probe_module(
        model=factory, input_shape=(T,), vocab=100, samples=8, inits=("as-is", "proposed")
    )
    assert [_rows(r) for r in got.runs] == [_rows(r) for r in want.runs]
    assert got.config["vocab"] == 100  # the config's vocab_size
    assert got.config["target"] == "sigprop.model.hf:from_config"


def test_an_arg_overrides_a_field_of_the_config(config):
    one = sigprop.probe_module(config=str(config), args=("num_hidden_layers=1",), input_shape=(T,), samples=4)
    assert [l.name for l in one.runs[0].layers] == ["model.embed_tokens", "model.layers.0", "model.norm"]


@pytest.mark.parametrize(
    "write, says",
    [
        (None, "no file"),
        ("{not json", "is not a JSON file"),
        ('{"hidden_size": 8}', "names no model_type"),
        ('{"model_type": "no-such-family"}', "no-such-family"),
    ],
    ids=["missing", "not-json", "no-model-type", "unknown-family"],
)
def test_a_bad_config_is_one_line_naming_it(tmp_path, capsys, write, says):
    path = tmp_path / "c.json"
    if write is not None:
        path.write_text(write)
    assert main(["module", "--config", str(path), "--input-shape", "8", "--samples", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--config" in err[0] and says in err[0], err


def test_a_target_beside_a_config_is_refused(config):
    with pytest.raises(SigpropError, match="not both") as got:
        sigprop.probe_module(target="x.py:f", config=str(config), input_shape=(T,))
    assert got.value.field == "config"


def test_a_config_run_reruns_and_sweeps(config, tmp_path):
    out = tmp_path / "r.json"
    argv = ["module", "--config", str(config), "--input-shape", str(T), "--samples", "4"]
    assert main([*argv, "--format", "json", "--output", str(out)]) == 0
    assert main(["rerun", str(out)]) == 0
    lines = tmp_path / "s.jsonl"
    sweep = [
        "sweep",
        "module",
        "--config",
        str(config),
        "--arg",
        "num_hidden_layers=1,2",
        "--input-shape",
        str(T),
    ]
    assert main([*sweep, "--samples", "4", "--out", str(lines)]) == 0
    got = [json.loads(line) for line in lines.read_text().splitlines()]
    assert len(got) == 2


def test_a_config_edited_since_the_run_is_refused_on_rerun(config, tmp_path, capsys):
    """The result records the config's digest beside its path: a rerun of a file edited since
    (here: one more layer) is one line naming --config, not another model measured under the old
    record."""
    out = tmp_path / "r.json"
    assert main(["module", "--config", str(config), "--input-shape", str(T), "--samples", "2",
                 "--format", "json", "--output", str(out)]) == 0  # fmt: skip
    d = json.loads(config.read_text())
    d["num_hidden_layers"] = 3
    config.write_text(json.dumps(d))
    capsys.readouterr()
    assert main(["rerun", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has changed since the run" in err[0], err
