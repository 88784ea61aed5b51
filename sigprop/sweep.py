"""``sigprop sweep``: a grid of probes, one JSON line per configuration, resumable.  No torch.

The grid is size x width x init, each axis as the net kind declares it (sigprop/kinds/:
``sweep_size`` -- depth or blocks --, ``sweep_spec`` -- what the width means for the net, e.g. a
ResNet's residual and hidden width, a CNN's channels, a WRN's widening factor --,
``sweep_config`` -- what the kind adds to a point's key); each point is one probe of one init
with the shared options (samples, seeds, seed, dtype, device; docs/cli.md).

Each finished point is appended to the output as one line (one ``write`` of the whole line,
flushed): an interrupted sweep leaves only whole lines, and a rerun skips the points whose
``key`` is already in the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from sigprop import inits, kinds, specs
from sigprop.errors import SigpropError
from sigprop.results import SWEEP_SCHEMA, curvature_row, sweep_row


def parse_ints(text: str, field: str) -> list[int]:
    """``10,20,50`` -> [10, 20, 50]; every value an integer >= 1, no duplicates."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise SigpropError(f"expected comma-separated integers such as 10,20,50, got {text!r}", field=field)
    values = [int(p) for p in parts]
    if min(values) < 1:
        raise SigpropError(f"values must be >= 1, got {text!r}", field=field)
    if len(set(values)) != len(values):
        raise SigpropError(f"a value is repeated in {text!r}", field=field)
    return values


def parse_inits(text: str, kind: kinds.Kind) -> list[str]:
    """``proposed,he`` -> the names, each defined for the kind's net, none twice."""
    names = [p.strip() for p in str(text).split(",") if p.strip()]
    if not names:
        raise SigpropError("give at least one init", field="init")
    for n in names:
        inits.get(
            n, kind.provides, kind.noun
        )  # defined for this net, or a one-line error with a did-you-mean
    if len(set(names)) != len(names):
        raise SigpropError("an init is named twice", field="init")
    return names


@dataclass(frozen=True)
class Point:
    """One configuration of the grid: what runs, and its resume key."""

    kind: kinds.Kind
    size: int  # the kind's size axis (depth or blocks)
    width: int
    init: str
    spec: Any
    probe: specs.ProbeSpec
    #: measure the curvature at init (``sigprop hessian``) instead of probing
    curvature: specs.HessianSpec | None = None

    @property
    def config(self) -> dict[str, Any]:
        d = {
            "command": self.kind.name,
            self.kind.sweep_size: self.size,
            "width": self.width,
            "init": self.init,
            "samples": self.probe.samples,
            "seeds": self.probe.seeds,
            "seed": self.probe.seed,
            "dtype": self.probe.dtype,
            **self.kind.sweep_config(self.spec),
        }
        if self.probe.correlations:  # only then: the keys of rows without cosines stay as they were (resume)
            d["correlations"], d["pairs"] = list(self.probe.correlations), self.probe.pairs
        if self.curvature is not None:
            # the head is part of the key: a 0.6.0 row (each init's own head) is re-measured, not resumed
            d["curvature"] = {
                "iters": self.curvature.iters,
                "tol": self.curvature.tol,
                "head": self.curvature.head,
            }
        return d

    @property
    def key(self) -> str:
        return json.dumps(self.config, sort_keys=True)

    def label(self) -> str:
        return f"{self.kind.name} {self.kind.sweep_size} {self.size} width {self.width} {self.init}"


def grid(
    kind: kinds.Kind,
    sizes: list[int],
    widths: list[int],
    names: list[str],
    probe: specs.ProbeSpec,
    input_dim: int | None = None,
    curvature: specs.HessianSpec | None = None,
) -> list[Point]:
    """Every point, validated up front (a bad point fails before anything runs)."""
    return [
        Point(kind, size, width, name, kind.sweep_spec(size, width, name, input_dim), probe, curvature)
        for size in sizes
        for width in widths
        for name in names
    ]


def done_keys(path: Path) -> set[str]:
    """Keys of the points already in the file (lines that do not parse are ignored; a file that
    is not text is refused: appending to it would corrupt it further)."""
    if not path.exists():
        return set()
    keys = set()
    for line in _text(path, "out").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("schema") == SWEEP_SCHEMA and "config" in row:
            keys.add(json.dumps(row["config"], sort_keys=True))
    return keys


def _text(path: Path, field: str) -> str:
    """A JSON-lines file's text, or one SigpropError naming ``field``."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SigpropError(f"cannot read {path}: {exc.strerror or exc}", field=field) from None
    except UnicodeDecodeError as exc:
        raise SigpropError(
            f"{path} is not a JSON-lines file (not UTF-8 text: {exc.reason} at byte {exc.start})", field=field
        ) from None


def row(point: Point, result, seconds: float) -> dict[str, Any]:
    """The JSON line of one finished point (its keys are written by results.py)."""
    if point.curvature is not None:
        return curvature_row(point.config, point.init, result, seconds)
    return sweep_row(point.config, point.init, result, seconds)


def append(path: Path, data: dict[str, Any]) -> None:
    """Append one whole line (single write, flushed and synced)."""
    line = json.dumps(data, allow_nan=False) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The sweep rows of a JSON-lines file, for ``sigprop plot``."""
    if not path.is_file():
        raise SigpropError(f"no such file: {path}", field="results")
    rows = []
    for i, line in enumerate(_text(path, "results").splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            raise SigpropError(f"{path}:{i}: not a JSON line", field="results") from None
        if isinstance(r, dict) and r.get("schema") == SWEEP_SCHEMA:
            rows.append(r)
    if not rows:
        raise SigpropError(f"{path} holds no sweep rows ({SWEEP_SCHEMA})", field="results")
    commands = sorted({str(r.get("config", {}).get("command")) for r in rows})
    if len(commands) > 1:
        raise SigpropError(
            f"{path} mixes sweeps of {' and '.join(commands)}; plot one kind per file", field="results"
        )
    return rows


def axis_values(rows: Iterable[dict[str, Any]], x: str) -> list:
    return sorted({r["config"].get(x) for r in rows if x in r["config"]})
