"""A sweep in parts, without a driver: ``--shard i/N`` runs the i-th of N disjoint parts of the
grid into its own file (a SLURM array task each), and ``sigprop sweep merge OUT PARTS...`` joins
the parts' files into one.  No torch.

A part's point is the same line it would be in the whole sweep (the shard is not in its config:
a merged file resumes, plots and compares as the serial sweep's).  Each part's file starts with a
header line (``SHARD_SCHEMA``: the shard, N, the grid's size and this part's configs), which
``done_keys`` and ``read_rows`` pass over, so that the merge can list the points no part holds.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from sigprop import files
from sigprop.errors import SigpropError
from sigprop.results import FAILED_SCHEMA, SHARD_SCHEMA, SWEEP_SCHEMA
from sigprop.specs import parse_shard
from sigprop.sweeps.grid import Point, config_key
from sigprop.sweeps.run import _text, append, owned, sweep_line


def shard(points: list[Point], i: int, n: int) -> list[Point]:
    """The i-th of n disjoint parts of the grid: every n-th point from the i-th (each part gets
    every size and init in turn, so the parts take about as long)."""
    return points[i::n]


def grid_identity(configs: list[dict]) -> dict:
    """The whole grid's identity, carried by each part: ``hash``, of every point's key in the
    grid's order (two parts merge only when it is equal: the same grid, every option alike), and
    ``axes``, each config key's values over the grid (to name the options two grids differ in)."""
    keys = [config_key(c) for c in configs]
    axes: dict[str, list] = {}
    for c in configs:
        for k, v in c.items():
            seen = axes.setdefault(k, [])
            if v not in seen:
                seen.append(v)
    return {"hash": hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16], "axes": axes}


def header(points: list[Point], i: int, n: int) -> dict:
    return {
        "schema": SHARD_SCHEMA,
        "shard": i,
        "of": n,
        "points": len(points),
        "grid": grid_identity([p.config for p in points]),
        "configs": [p.config for p in shard(points, i, n)],
    }


def differs(mine: dict, theirs: dict, names=("this grid", "the file"), within: bool = False) -> str:
    """The options two grids' identities differ in, in words ("depth [3, 4] in a.jsonl, [5, 6] in
    b.jsonl"); ``within``: not those whose values in ``mine`` are all among ``theirs`` (points
    of a part of the grid)."""
    a, b = mine.get("axes", {}), theirs.get("axes", {})
    words = [
        f"{k} {_values(a.get(k))} in {names[0]}, {_values(b.get(k))} in {names[1]}"
        for k in dict.fromkeys([*a, *b])
        if a.get(k) != b.get(k) and not (within and k in a and k in b and all(v in b[k] for v in a[k]))
    ]
    return "; ".join(words[:4]) or "the points' order"


def _values(v) -> str:
    if v is None:
        return "(none)"
    return str(v[0]) if len(v) == 1 else "[" + ", ".join(map(str, v)) + "]"


def first_line(path: Path, field: str):
    """The first JSON line of a file (None for an empty one, or one that does not begin with JSON)."""
    first = next((t for t in _text(path, field).splitlines() if t.strip()), None)
    try:
        return json.loads(first) if first else None
    except json.JSONDecodeError:
        return None


def start(out: Path, points: list[Point], text: str) -> list[Point]:
    """The points of part ``text`` ("i/N", ``parse_shard``), its file ``out`` begun with its
    header (again: checked to be this part's)."""
    i, n = parse_shard(text)
    out = files.check_target(out, "out", append=True)
    begin(out, header(points, i, n))
    return shard(points, i, n)


def begin(out: Path, head: dict, what: str = "grid") -> None:
    """A part's file begun with its header ``head`` -- or, begun already, checked to be this
    part's of this ``what`` (a sweep's grid, a width check): another part's file, or the same
    part of another grid, is refused in one line naming the options that differ."""
    if out.exists() and out.stat().st_size > 0:
        theirs = first_line(out, "out")
        if theirs != head:
            why = (
                f"{out} is not part {head['shard']}/{head['of']} of this {what} ({_why(theirs, head, what)})"
            )
            raise SigpropError(f"{why}: give another --out", field="out")
    else:
        append(out, head)


def _why(theirs, head: dict, what: str) -> str:
    """Why a file's first line is not this part's header, in words."""
    if not isinstance(theirs, dict) or theirs.get("schema") != head["schema"]:
        return "its first line is not this part's header"
    if (theirs.get("shard"), theirs.get("of")) != (head["shard"], head["of"]):
        return f"it is part {theirs.get('shard')}/{theirs.get('of')}"
    apart = differs(head["grid"], theirs.get("grid") or {}, (f"this {what}", "the file"))
    return f"it is that part of another {what}: {apart}"


def _label(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items() if k not in ("command",) and v not in (None, []))


class _Parts:
    """What the parts hold: rows by key (each once), failure lines of points with no row, the
    headers' shards and configs, the grid they are parts of, and the files that are empty."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[dict, Path]] = {}
        self.failed: dict[str, dict] = {}
        self.shards: dict[int, Path] = {}
        self.of: int | None = None
        self.grid: tuple[dict, Path] | None = None
        self.expected: dict[str, dict] = {}
        self.empty: list[Path] = []

    def read(self, path: Path) -> None:
        """One part's file: its header first (the part of which grid), then its own points."""
        if path.is_file() and not _text(path, "parts").strip():
            self.empty.append(path)
            return
        mine: set[str] | None = None
        advice = " (merge the parts' files of one sigprop sweep --shard i/N)"
        for number, line in owned(path, "parts", "sigprop sweep", lambda x: sweep_line(x, True), advice):
            schema = line["schema"]
            if schema != SHARD_SCHEMA and mine is None:
                raise SigpropError(
                    f"{path} does not begin with a part's header ({SHARD_SCHEMA}): not a part of sigprop "
                    "sweep --shard i/N (a part of sigprop 0.18.0 or earlier: run that part again)",
                    field="parts",
                )
            if schema == SHARD_SCHEMA:
                if mine is not None:
                    raise SigpropError(f"{path} holds two parts' headers: not a part's file", field="parts")
                mine = self.header(line, path)
                continue
            key = config_key(line["config"])
            if key not in mine:
                raise SigpropError(
                    f"{path}:{number}: {_label(line['config'])} is not a point of its part (its header's): "
                    "a part's file holds its own points only",
                    field="parts",
                )
            if schema == SWEEP_SCHEMA:
                if key in self.rows:
                    raise SigpropError(
                        f"{_label(line['config'])} is in both {self.rows[key][1]} and {path}: each point "
                        "once (merge the parts of one sweep)",
                        field="parts",
                    )
                self.rows[key] = (line, path)
            elif schema == FAILED_SCHEMA:
                self.failed[key] = line

    def header(self, line: dict, path: Path) -> set[str]:
        i, n, grid = line.get("shard"), line.get("of"), line.get("grid")
        if not isinstance(grid, dict) or "hash" not in grid:
            raise SigpropError(f"{path}: its header carries no grid identity", field="parts")
        if self.grid is not None and grid["hash"] != self.grid[0]["hash"]:
            raise SigpropError(
                f"{path} is a part of another grid than {self.grid[1]} "
                f"({differs(self.grid[0], grid, (str(self.grid[1]), str(path)))}): "
                "merge the parts of one sweep",
                field="parts",
            )
        if self.of is not None and n != self.of:
            raise SigpropError(f"{path} is a part of {n}, the others of {self.of}", field="parts")
        if i in self.shards:
            raise SigpropError(f"{self.shards[i]} and {path} are both part {i}/{n}", field="parts")
        self.of, self.shards[i], self.grid = n, path, self.grid or (grid, path)
        configs = {config_key(c): c for c in line["configs"]}
        self.expected.update(configs)
        return set(configs)


def merge(out: Path, parts: list[Path]) -> tuple[int, list[str]]:
    """Join the parts' files into ``out`` (a new file, written whole): every row once (a point in
    two parts is refused), and the failure lines of points no part measured.  Every part must be
    of one grid (its header's identity: every option alike), else nothing is written.  Returns
    the rows written and what is missing: the points of the parts' headers with no row, the
    parts whose file is empty, and the parts no file was given of."""
    out = Path(out)
    if out.exists():
        raise SigpropError(f"{out} exists: merge writes a new file", field="merged")
    if not parts:
        raise SigpropError("give the parts' files to merge", field="parts")
    found = _Parts()
    for path in parts:
        found.read(Path(path))
    if found.of is None:
        raise SigpropError(
            f"{' and '.join(map(str, found.empty))} {'is' if len(found.empty) == 1 else 'are'} empty: no "
            "part to merge (did the parts' jobs start?)",
            field="parts",
        )
    missing = [
        f"{_label(c)}" + (" (failed: its line says why)" if k in found.failed else "")
        for k, c in found.expected.items()
        if k not in found.rows
    ]
    missing += [f"{path}: empty (its part never wrote its header)" for path in found.empty]
    absent = sorted(set(range(found.of)) - set(found.shards))
    if absent:
        given = "no file given" if not found.empty else "no file holds them (the empty file(s) may be theirs)"
        missing.append(f"part(s) {', '.join(map(str, absent))} of {found.of}: {given}")
    lines = [row for row, _ in found.rows.values()]
    lines += [f for k, f in found.failed.items() if k not in found.rows]
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, allow_nan=False) + "\n")
    os.replace(tmp, out)
    return len(found.rows), missing
