"""A sweep in parts, without a driver: ``--shard i/N`` runs the i-th of N disjoint parts of the
grid into its own file (a SLURM array task each), and ``sigprop sweep merge OUT PARTS...`` joins
the parts' files into one.  No torch.

A part's point is the same line it would be in the whole sweep (the shard is not in its config:
a merged file resumes, plots and compares as the serial sweep's).  Each part's file starts with a
header line (``SHARD_SCHEMA``: the shard, N, the grid's size and this part's configs), which
``done_keys`` and ``read_rows`` pass over, so that the merge can list the points no part holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sigprop import files
from sigprop.errors import SigpropError
from sigprop.results import FAILED_SCHEMA, SWEEP_SCHEMA
from sigprop.specs import parse_shard
from sigprop.sweeps.grid import Point, config_key
from sigprop.sweeps.run import _text, append, json_lines

#: the first line of a part's file
SHARD_SCHEMA = "sigprop.sweep.shard.v1"


def shard(points: list[Point], i: int, n: int) -> list[Point]:
    """The i-th of n disjoint parts of the grid: every n-th point from the i-th (each part gets
    every size and init in turn, so the parts take about as long)."""
    return points[i::n]


def header(points: list[Point], i: int, n: int) -> dict:
    return {
        "schema": SHARD_SCHEMA,
        "shard": i,
        "of": n,
        "points": len(points),
        "configs": [p.config for p in shard(points, i, n)],
    }


def start(out: Path, points: list[Point], text: str) -> list[Point]:
    """The points of part ``text`` ("i/N", ``parse_shard``), its file ``out`` begun with its
    header (again: checked to be this part's)."""
    i, n = parse_shard(text)
    out = files.check_target(out, "out", append=True)
    head = header(points, i, n)
    if out.exists():
        first = next((t for t in _text(out, "out").splitlines() if t.strip()), None)
        try:
            theirs = json.loads(first) if first else None
        except json.JSONDecodeError:
            theirs = None
        if theirs != head:
            raise SigpropError(
                f"{out} is not part {i}/{n} of this grid (its first line is not this part's header): give "
                "another --out",
                field="out",
            )
    else:
        append(out, head)
    return shard(points, i, n)


def _label(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items() if k not in ("command",) and v not in (None, []))


class _Parts:
    """What the parts hold: rows by key (each once), failure lines of points with no row, the
    headers' shards and configs."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[dict, Path]] = {}
        self.failed: dict[str, dict] = {}
        self.shards: dict[int, Path] = {}
        self.of: int | None = None
        self.expected: dict[str, dict] = {}

    def read(self, path: Path) -> None:
        for number, line in json_lines(path, "parts"):
            schema = line.get("schema") if isinstance(line, dict) else None
            if schema == SWEEP_SCHEMA:
                key = config_key(line["config"])
                if key in self.rows:
                    raise SigpropError(
                        f"{_label(line['config'])} is in both {self.rows[key][1]} and {path}: each point "
                        "once (merge the parts of one sweep)",
                        field="parts",
                    )
                self.rows[key] = (line, path)
            elif schema == FAILED_SCHEMA:
                self.failed[config_key(line["config"])] = line
            elif schema == SHARD_SCHEMA:
                self.header(line, path)
            else:
                raise SigpropError(f"{path}:{number}: not a line of sigprop sweep", field="parts")

    def header(self, line: dict, path: Path) -> None:
        i, n = line["shard"], line["of"]
        if self.of is not None and n != self.of:
            raise SigpropError(f"{path} is a part of {n}, the others of {self.of}", field="parts")
        if i in self.shards:
            raise SigpropError(f"{self.shards[i]} and {path} are both part {i}/{n}", field="parts")
        self.of, self.shards[i] = n, path
        self.expected.update({config_key(c): c for c in line["configs"]})


def merge(out: Path, parts: list[Path]) -> tuple[int, list[str]]:
    """Join the parts' files into ``out`` (a new file, written whole): every row once (a point in
    two parts is refused), and the failure lines of points no part measured.  Returns the rows
    written and what is missing: the points of the parts' headers with no row, and the parts
    no file was given of."""
    out = Path(out)
    if out.exists():
        raise SigpropError(f"{out} exists: merge writes a new file", field="merged")
    if not parts:
        raise SigpropError("give the parts' files to merge", field="parts")
    found = _Parts()
    for path in parts:
        found.read(Path(path))
    missing = [
        f"{_label(c)}" + (" (failed: its line says why)" if k in found.failed else "")
        for k, c in found.expected.items()
        if k not in found.rows
    ]
    if found.of is not None:
        absent = sorted(set(range(found.of)) - set(found.shards))
        if absent:
            missing.append(f"part(s) {', '.join(map(str, absent))} of {found.of}: no file given")
    lines = [row for row, _ in found.rows.values()]
    lines += [f for k, f in found.failed.items() if k not in found.rows]
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, allow_nan=False) + "\n")
    os.replace(tmp, out)
    return len(found.rows), missing
