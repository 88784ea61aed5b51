"""``sigprop width``: its table, JSON, --check exit codes, figure, and one-line refusals."""

from __future__ import annotations

import json

import pytest

from sigprop.cli import main

FAST = ["--widths", "32,64,128", "--depth", "3", "--input-dim", "8", "--steps", "1", "--batch-size", "16"]
NET = """
import torch.nn as nn
def make(width=8, depth=1):
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), *[m for _ in range(depth) for m in
                         (nn.Linear(width, width), nn.ReLU())], nn.Linear(width, 3))
def fixed(width=8):
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
"""


def run(capsys, args):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_table_and_check(capsys):
    code, out, err = run(capsys, ["width", "mlp", *FAST, "--check"])
    assert code == 1
    assert "SP with Adam" in out and "μP with Adam: width-stable" in out and "act 0" in out
    assert "check failed: SP with Adam" in err
    code, out, _ = run(capsys, ["width", "mlp", *FAST, "--param", "mup", "--check"])
    assert code == 0 and "✓ μP" in out


def test_the_cnn(capsys):
    code, out, _ = run(capsys, ["width", "cnn", "--widths", "4,8,16", "--image", "3x6x6", "--steps", "1",
                                "--batch-size", "4", "--format", "json"])  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["config"]["chain"] is True and doc["config"]["input_shape"] == [3, 6, 6]
    roles = [s["role"] for s in doc["runs"][0]["slopes"] if s["step"] == 0]
    assert roles == ["input", "hidden", "hidden", "output"]


def test_json_is_the_contract(capsys, tmp_path):
    target = tmp_path / "r.json"
    code, out, _ = run(capsys, ["width", "mlp", *FAST, "--format", "json", "--output", str(target)])
    assert code == 0 and out == ""
    doc = json.loads(target.read_text())
    assert doc["schema"] == "sigprop.width.v1" and doc["width_stable"] is False
    assert [r["param"] for r in doc["runs"]] == ["sp", "mup"]
    s = doc["runs"][1]["slopes"][0]
    assert {"site", "role", "step", "l1", "l1_se", "delta", "init", "low", "high", "agrees"} <= set(s)
    assert doc["config"]["widths"] == [32, 64, 128] and doc["config"]["chain"] is True


def test_a_model(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(NET)
    args = [
        "width",
        "module",
        "net.py:make",
        "--arg",
        "width=32,64,128",
        "--arg",
        "depth=2",
        "--input-shape",
        "4",
    ]
    code, out, _ = run(capsys, [*args, "--steps", "1", "--format", "json"])
    assert code == 0
    doc = json.loads(out)
    assert doc["config"]["width_arg"] == "width" and doc["config"]["kwargs"] == {"depth": 2}
    assert [s["role"] for s in doc["runs"][0]["slopes"] if s["step"] == 0] == [
        "input",
        "hidden",
        "hidden",
        "output",
    ]


@pytest.mark.parametrize(
    "args,words",
    [
        (["mlp", "--widths", "64"], "--widths: give at least two widths"),
        (["mlp", "--widths", "64,x"], "--widths: expected widths like 64,128,256"),
        (["mlp", "--param", "ntk"], "--param: ntk is defined for SGD"),
        (["mlp", "--lr", "0"], "--lr: the learning rate must be positive"),
        (["mlp", "--device", "tpu"], "--device: unknown device 'tpu'"),
        (["module", "net.py:make", "--input-shape", "4"], "--arg: give the width as exactly one --arg"),
        (
            ["module", "net.py:make", "--arg", "width=8,16", "--arg", "depth=1,2", "--input-shape", "4"],
            "(width, depth are)",
        ),
        (["module", "net.py:fixed", "--arg", "width=8,16,32", "--input-shape", "4"], "changes no layer"),
        (
            ["module", "net.py:make", "--arg", "size=8,16,32", "--input-shape", "4"],
            "factory raised TypeError",
        ),
        (["module", "net.py:make", "--arg", "width=8,16,32"], "--input-shape: give the input's shape"),
        (["mlp", *FAST, "--optimizer", "sgd", "--lr", "1e30"], "--lr: the loss is not finite"),
    ],
)
def test_bad_input_is_one_line(capsys, tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(NET)
    code, out, err = run(capsys, ["width", *args])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert words in lines[-1] and "Traceback" not in err
    # refused before the run, one line; a run that diverges: its banner, then the one line
    assert len(lines) == (2 if "not finite" in words else 1)


def test_the_figure(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    fig = tmp_path / "w.png"
    code, _, err = run(capsys, ["width", "mlp", *FAST, "--plot", str(fig)])
    assert code == 0 and fig.stat().st_size > 10_000 and "wrote" in err
