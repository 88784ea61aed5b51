"""A sweep in parts without a driver (issue 49, item 6): ``--shard i/N`` runs the i-th of N
disjoint parts into its own file, ``sigprop sweep merge`` joins them; the merged file equals the
serial sweep's, point for point (the same seeds on the same kernels: the same bits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sigprop.cli import main

GRID = ["sweep", "mlp", "--depth", "3,4,5", "--width", "8,16", "--init", "he", "--samples", "32"]
GRID += ["--device", "cpu"]


def _rows(path: Path) -> dict[str, dict]:
    """The file's sweep rows by key, each once (asserted), without timings and environment."""
    out = {}
    for text in path.read_text().splitlines():
        line = json.loads(text)
        if line.get("schema") != "sigprop.sweep.v1":
            continue
        key = json.dumps(line["config"], sort_keys=True)
        assert key not in out
        out[key] = {k: v for k, v in line.items() if k not in ("seconds", "environment")}
    return out


def test_the_parts_merged_equal_the_serial_sweep(tmp_path, capsys):
    serial = tmp_path / "serial.jsonl"
    assert main([*GRID, "--out", str(serial)]) == 0
    parts = [tmp_path / f"part{i}.jsonl" for i in range(3)]
    for i, part in enumerate(parts):
        assert main([*GRID, "--shard", f"{i}/3", "--out", str(part)]) == 0
        assert len(_rows(part)) == 2  # 6 points in 3 parts, disjoint
    # a part resumes: its points are there, nothing runs twice
    assert main([*GRID, "--shard", "1/3", "--out", str(parts[1])]) == 0
    assert "2 already in" in capsys.readouterr().err
    merged = tmp_path / "merged.jsonl"
    assert main(["sweep", "merge", str(merged), *map(str, parts)]) == 0
    assert _rows(merged) == _rows(serial)
    # the merged file is a sweep's file: resuming the whole grid on it runs nothing
    capsys.readouterr()
    assert main([*GRID, "--out", str(merged)]) == 0
    assert "6 already in" in capsys.readouterr().err


def test_a_missing_part_is_listed_and_a_point_twice_refused(tmp_path, capsys):
    parts = [tmp_path / f"part{i}.jsonl" for i in range(3)]
    for i in (0, 2):
        assert main([*GRID, "--shard", f"{i}/3", "--out", str(parts[i])]) == 0
    capsys.readouterr()
    out = tmp_path / "m.jsonl"
    assert main(["sweep", "merge", str(out), str(parts[0]), str(parts[2])]) == 1
    err = capsys.readouterr().err
    assert "4 point(s) from 2 part(s)" in err and "part(s) 1 of 3: no file given" in err, err
    assert len(_rows(out)) == 4
    # rows without a part's header, another part's rows under a header, a part given twice, an
    # existing OUT: one line each, nothing written
    copy = tmp_path / "copy.jsonl"
    head, rows = parts[0].read_text().split("\n", 1)
    copy.write_text(rows)
    forged = tmp_path / "forged.jsonl"
    forged.write_text(head.replace('"shard": 0', '"shard": 1') + "\n" + rows)
    for args, words in (
        ([str(tmp_path / "a.jsonl"), str(parts[0]), str(copy)], "does not begin with a part's header"),
        ([str(tmp_path / "c.jsonl"), str(parts[0]), str(forged)], "is in both"),
        ([str(tmp_path / "b.jsonl"), str(parts[0]), str(parts[0])], "are both part 0/3"),
        ([str(out), str(parts[0])], "OUT: "),
    ):
        assert main(["sweep", "merge", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert not any((tmp_path / f"{x}.jsonl").exists() for x in "abc")


@pytest.mark.parametrize("shard", ["3/3", "-1/2", "1/0", "a/b", "1", ""])
def test_a_shard_that_is_no_part_is_refused(tmp_path, capsys, shard):
    out = tmp_path / "r.jsonl"
    assert main([*GRID, "--shard", shard, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--shard: expected i/N with 0 <= i < N" in err, err
    assert not out.exists()


def test_a_part_file_of_another_part_is_refused(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert main([*GRID, "--shard", "0/3", "--out", str(out)]) == 0
    before = out.read_text()
    capsys.readouterr()
    assert main([*GRID, "--shard", "1/3", "--out", str(out)]) == 2
    assert "is not part 1/3 of this grid" in capsys.readouterr().err
    assert out.read_text() == before


#: the 2-depth grid the parts below are of
PART = {"--depth": "3,4", "--width": "8", "--init": "he", "--samples": "32", "--device": "cpu"}


def _grid(*options: str) -> list[str]:
    """``sigprop sweep mlp`` of ``PART``'s grid, ``options`` in place of its own."""
    grid = {**PART, **dict(zip(options[::2], options[1::2]))}
    return ["sweep", "mlp", *(x for kv in grid.items() for x in kv)]


def _part(tmp_path, name: str, shard: str, *options: str) -> Path:
    """Part ``shard`` of the 2-depth grid into ``name``, ``options`` in place of the grid's own."""
    path = tmp_path / name
    assert main([*_grid(*options), "--shard", shard, "--out", str(path)]) == 0
    return path


@pytest.mark.parametrize(
    "options, named",
    [
        (("--depth", "5,6"), "depth [3, 4] in"),
        (("--samples", "40"), "samples 32 in"),
        (("--seed", "1"), "seed 0 in"),
    ],
)
def test_a_part_of_another_grid_or_other_options_is_refused(tmp_path, capsys, options, named):
    """Issue 66, item 1: part 0/2 of --depth 3,4 and part 1/2 of --depth 5,6 (or of other --samples)
    merged with exit 0 into one file; each part carries its whole grid's identity now."""
    p0 = _part(tmp_path, "p0.jsonl", "0/2")
    p1 = _part(tmp_path, "p1.jsonl", "1/2", *options)
    capsys.readouterr()
    out = tmp_path / "m.jsonl"
    assert main(["sweep", "merge", str(out), str(p0), str(p1)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a part of another grid than" in err and named in err, err
    assert not out.exists()
    # the same part of the other grid on this part's file: refused too, naming the option
    assert main([*_grid(), "--shard", "1/2", "--out", str(p1)]) == 2
    err = capsys.readouterr().err
    assert "is not part 1/2 of this grid (it is that part of another grid: " in err and named in err, err


def test_an_empty_part_is_said_empty(tmp_path, capsys):
    p0 = _part(tmp_path, "p0.jsonl", "0/2")
    empty = tmp_path / "p1.jsonl"
    empty.write_text("")
    capsys.readouterr()
    out = tmp_path / "m.jsonl"
    assert main(["sweep", "merge", str(out), str(p0), str(empty)]) == 1
    err = capsys.readouterr().err
    assert f"{empty}: empty" in err and "no file given" not in err, err
    assert main(["sweep", "merge", str(tmp_path / "n.jsonl"), str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is empty: no part to merge" in err, err
    assert not (tmp_path / "n.jsonl").exists()


def test_the_whole_grid_onto_a_part_file_is_refused(tmp_path, capsys):
    p0 = _part(tmp_path, "p0.jsonl", "0/2")
    before = p0.read_text()
    capsys.readouterr()
    assert main([*_grid(), "--out", str(p0)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is part 0/2 of a sweep" in err and "--shard 0/2" in err, err
    assert p0.read_text() == before
