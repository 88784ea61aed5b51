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
        return y * float("nan") if BROKEN and self.width == 32 and torch.is_grad_enabled() else y
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
    assert "not finite at width 32" in lines[-1]["error"]
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


def _one_line(capsys) -> str:
    err = [t for t in capsys.readouterr().err.strip().splitlines() if not t.startswith("sigprop width mlp:")]
    assert len(err) == 1, err
    return err[0]


WIDTH = ["width", "mlp", "--widths", "16,32,64", "--depth", "3", "--input-dim", "6", "--steps", "1",
         "--seeds", "2", "--batch-size", "8", "--param", "sp"]  # fmt: skip
SWEEP = ["sweep", "mlp", "--depth", "3", "--width", "8", "--init", "he", "--samples", "16", "--device", "cpu"]


def test_a_file_of_another_command_is_refused_both_ways(tmp_path, capsys):
    """Issue 66, item 1: width --out appended its points into a sweep part (exit 0), which merge then
    refused; a sweep appends into a width file likewise.  Each refuses the other's file, naming the
    line and its command, and writes nothing."""
    from sigprop.cli import main

    part = tmp_path / "part.jsonl"
    assert main([*SWEEP, "--shard", "0/2", "--out", str(part)]) == 0
    before = part.read_text()
    capsys.readouterr()
    assert main([*WIDTH, "--out", str(part)]) == 2
    line = _one_line(capsys)
    assert (
        "--out: " in line
        and "a line of sigprop sweep's (sigprop.sweep.shard.v2), not sigprop width's" in line
    )
    assert part.read_text() == before
    points = tmp_path / "points.jsonl"
    assert main([*WIDTH, "--out", str(points)]) == 0
    before = points.read_text()
    capsys.readouterr()
    assert main([*SWEEP, "--out", str(points)]) == 2
    line = _one_line(capsys)
    assert "a line of sigprop width's (sigprop.width.point.v1), not sigprop sweep's" in line, line
    assert points.read_text() == before


def test_a_width_part_is_checked_as_a_sweep_part_is(tmp_path, capsys):
    """``width --shard 1/2 --out`` onto part 0/2's file ran (sweep refused it): a width part now
    begins with its header, the whole check's identity, and another part's or another check's
    file is refused; the whole check onto a part's file likewise."""
    from sigprop.cli import main

    p0 = tmp_path / "p0.jsonl"
    assert main([*WIDTH, "--shard", "0/2", "--out", str(p0)]) == 0
    head = json.loads(p0.read_text().splitlines()[0])
    assert head["schema"] == "sigprop.width.shard.v1" and (head["shard"], head["of"], head["points"]) == (
        0,
        2,
        6,
    )
    before = p0.read_text()
    capsys.readouterr()
    for args, words in (
        ([*WIDTH, "--shard", "1/2", "--out", str(p0)], "is not part 1/2 of this check (it is part 0/2)"),
        (
            [*WIDTH, "--lr", "0.02", "--shard", "0/2", "--out", str(p0)],
            "lr 0.02 in this check, 0.01 in the file",
        ),
        ([*WIDTH, "--out", str(p0)], "is part 0/2 of a check"),
    ):
        assert main(args) == 2
        line = _one_line(capsys)
        assert "--out: " in line and words in line, line
    assert p0.read_text() == before


def test_points_files_missing_foreign_or_of_other_options(tmp_path, capsys):
    """``--points`` ignored a missing file, a sweep's file and points of other options without a
    word, then ran every point: the first two are refused naming --points, the last counted and
    said (text and JSON)."""
    from sigprop.cli import main

    sweep = tmp_path / "sweep.jsonl"
    assert main([*SWEEP, "--out", str(sweep)]) == 0
    capsys.readouterr()
    for path, words in ((tmp_path / "none.jsonl", "no such file"), (sweep, "a line of sigprop sweep's")):
        assert main([*WIDTH, "--points", str(path)]) == 2
        line = _one_line(capsys)
        assert line.startswith("sigprop: error: --points: ") and words in line, line
    parts = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    for i, p in enumerate(parts):
        assert main([*WIDTH, "--shard", f"{i}/2", "--out", str(p)]) == 0
    capsys.readouterr()
    three = list(WIDTH)
    three[three.index("--steps") + 1] = "2"
    assert main([*three, "--points", str(parts[0]), "--points", str(parts[1]), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["environment"]["points_resumed"] == 0
    assert len(doc["notes"]) == 2 and all("3 point(s) of other options" in n for n in doc["notes"])
    assert "steps 1 in " in doc["notes"][0] and "2 in this check" in doc["notes"][0], doc["notes"]
    assert main([*WIDTH, "--points", str(parts[0]), "--points", str(parts[1])]) == 0
    text = capsys.readouterr().out
    assert "note:" not in text
