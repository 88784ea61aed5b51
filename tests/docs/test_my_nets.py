"""examples/my_nets.py: the models docs/quickstart.md and docs/ci.md run as ``examples/my_nets.py:NAME``
are shipped (issue 47: the quickstart described them without the file), and each runs through
sigprop -- here at small sizes."""

import importlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

from sigprop.cli import main

ROOT = Path(__file__).resolve().parents[2]
NETS = ROOT / "examples" / "my_nets.py"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_factory_the_docs_name_is_shipped():
    spec = importlib.util.spec_from_file_location("my_nets", NETS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    named = {n for path in DOCS for n in re.findall(r"my_nets\.py:(\w+)", path.read_text(encoding="utf-8"))}
    assert named == {"wn_resnet", "encoder", "gpt2", "llama", "cnn"}
    assert all(callable(getattr(module, n, None)) for n in named)
    assert not re.search(r"(?<![/\w])my_nets\.py", " ".join(p.read_text(encoding="utf-8") for p in DOCS))


@pytest.mark.parametrize(
    "args",
    [
        [
            "examples/my_nets.py:wn_resnet",
            "--arg",
            "blocks=2",
            "--arg",
            "channels=8",
            "--input-shape",
            "3,8,8",
        ],
        ["examples/my_nets.py:encoder", "--arg", "layers=2", "--arg", "d=16", "--input-shape", "4,16"],
        [
            "examples/my_nets.py:gpt2",
            "--arg",
            "layers=2",
            "--arg",
            "d=16",
            "--vocab",
            "50",
            "--input-shape",
            "4",
        ],
        [
            "examples/my_nets.py:llama",
            "--arg",
            "layers=2",
            "--arg",
            "d=32",
            "--vocab",
            "50",
            "--input-shape",
            "4",
        ],
    ],
    ids=["wn_resnet", "encoder", "gpt2", "llama"],
)
def test_each_factory_runs_through_sigprop(args, monkeypatch, capsys):
    if "gpt2" in args[0] or "llama" in args[0]:
        pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)  # the docs run them from the repository's root
    assert main(["module", *args, "--samples", "4", "--init", "as-is", "--init", "proposed"]) == 0, (
        capsys.readouterr().err
    )
    out = capsys.readouterr().out
    assert "signal" in out and "internal error" not in out


@pytest.mark.parametrize(
    "args",
    [
        ["examples/my_nets.py:cnn", "--arg", "width=4,8,16", "--input-shape", "3,8,8"],
        ["examples/my_nets.py:llama", "--arg", "d=16,32,64", "--arg", "lm=True", "--arg", "layers=1",
         "--vocab", "50", "--input-shape", "4"],
    ],
    ids=["cnn", "llama"],
)  # fmt: skip
def test_the_width_checks_the_docs_run(args, monkeypatch, capsys):
    if "llama" in args[0]:
        pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)
    code = main(["width", "module", *args, "--steps", "1", "--batch-size", "2", "--format", "json"])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert {r["param"] for r in doc["runs"]} == {"sp", "mup"}
    assert doc["config"]["attention_calls"] == (1 if "llama" in args[0] else 0)


def test_the_encoders_layers_are_drawn_apart():
    """nn.TransformerEncoder deep-copies its layer; the example re-draws each (attention's
    ``_reset_parameters`` included), as the quickstart's numbers assume."""
    spec = importlib.util.spec_from_file_location("my_nets", NETS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    m = module.encoder(layers=2, d=16)
    a, b = m.layers
    assert not a.self_attn.in_proj_weight.equal(b.self_attn.in_proj_weight)
    assert not a.linear1.weight.equal(b.linear1.weight)
