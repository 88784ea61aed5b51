"""A check's points in a file (``out=``): one line per point, a rerun reads them and runs only
the rest, and the result is the same bits as a run that never stopped."""

from __future__ import annotations

import json

import pytest

import sigprop
from sigprop.errors import SigpropError

NET = """
import torch, torch.nn as nn
BROKEN = {broken}
class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.width = width
        self.a, self.b, self.c = nn.Linear(6, width), nn.Linear(width, width), nn.Linear(width, 4)
    def forward(self, x):
        y = self.c(torch.relu(self.b(torch.relu(self.a(x)))))
        return y * float("nan") if BROKEN and self.width == 64 else y
def make(width=16):
    return Net(width)
"""
KW = dict(widths=[16, 32, 64], input_shape=(6,), params=["sp", "mup"], steps=2, seeds=2, batch_size=8)


def _runs(r):
    return json.dumps([run.to_dict() for run in r.runs])


def test_a_rerun_reads_the_points_and_runs_only_the_rest(tmp_path):
    out = tmp_path / "points.jsonl"
    first = sigprop.width_check("mlp", depth=3, input_dim=6, out=str(out), **KW)
    lines = out.read_text().splitlines()
    assert len(lines) == 2 * 2 * 3 and first.environment["points_resumed"] == 0
    assert {json.loads(line)["schema"] for line in lines} == {"sigprop.width.point.v1"}
    again = sigprop.width_check("mlp", depth=3, input_dim=6, out=str(out), **KW)
    assert again.environment["points_resumed"] == 12 and _runs(again) == _runs(first)
    out.write_text("\n".join(lines[:5]) + "\n")  # stopped after five points
    rest = sigprop.width_check("mlp", depth=3, input_dim=6, out=str(out), **KW)
    assert rest.environment["points_resumed"] == 5 and _runs(rest) == _runs(first)
    assert len(out.read_text().splitlines()) == 12
    other = sigprop.width_check("mlp", depth=3, input_dim=6, out=str(out), **{**KW, "lr": 0.02})
    assert other.environment["points_resumed"] == 0  # another option: other points


def test_a_failed_point_keeps_the_others_and_a_rerun_finishes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(NET.format(broken=True))
    out = tmp_path / "points.jsonl"
    args = ["width", "module", "net.py:make", "--arg", "width=16,32,64", "--input-shape", "6", "--steps", "1",
            "--seeds", "2", "--batch-size", "8", "--out", str(out)]  # fmt: skip
    from sigprop.cli import main

    assert main(args) == 2
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["schema"] for line in lines] == ["sigprop.width.point.v1"] * 2 + ["sigprop.sweep.failed.v1"]
    assert "not finite at width 64" in lines[-1]["error"]
    (tmp_path / "net.py").write_text(NET.format(broken=False))
    assert main([*args, "--format", "json"]) == 0
    points = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(p["schema"] == "sigprop.width.point.v1" for p in points) == 2 * 2 * 3


def test_an_executor_option_that_does_not_apply_is_refused(tmp_path):
    with pytest.raises(SigpropError) as e:
        sigprop.width_check("mlp", depth=3, input_dim=6, workers=2, **KW)
    assert e.value.field == "workers"


def test_shards_then_one_fit_equal_the_whole(tmp_path):
    """An array job's parts (``shard="i/N"``, each its own --out), then one run with every part as
    ``points`` fits them all without running one again: the same slopes and verdicts, bit for bit,
    as the check run at once."""
    whole = sigprop.width_check("mlp", depth=3, input_dim=6, **KW)
    parts = []
    for i in range(3):
        part = tmp_path / f"part-{i}.jsonl"
        r = sigprop.width_check("mlp", depth=3, input_dim=6, shard=f"{i}/3", out=str(part), **KW)
        assert r.runs == [] and r.environment["points_in_shard"] == 4
        parts.append(str(part))
    fitted = sigprop.width_check("mlp", depth=3, input_dim=6, points=parts, **KW)
    assert fitted.environment["points_resumed"] == 12 and _runs(fitted) == _runs(whole)
    with pytest.raises(SigpropError, match="expected i/N") as e:
        sigprop.width_check("mlp", depth=3, input_dim=6, shard="3/3", out=str(tmp_path / "x.jsonl"), **KW)
    assert e.value.field == "shard"
    with pytest.raises(SigpropError, match="--out PART.jsonl"):
        sigprop.width_check("mlp", depth=3, input_dim=6, shard="0/3", **KW)


@pytest.mark.parametrize("flag", [["--check"], ["--plot", "w.png"]])
def test_a_shard_refuses_what_reads_the_whole_check(flag, tmp_path, monkeypatch, capsys):
    """A shard fits nothing: --check and --plot are refused before it runs, in one line."""
    from sigprop.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["width", "mlp", "--widths", "16,32,64", "--shard", "0/2", "--out", "p.jsonl", *flag]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shard: a shard fits nothing" in err[0] and not (tmp_path / "p.jsonl").exists()
