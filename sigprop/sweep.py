"""``sigprop sweep``: a grid of probes, one JSON line per configuration, resumable.  No torch.

The grid is size x width x init, each axis as the net kind declares it (sigprop/kinds/:
``sweep_size`` -- depth or blocks --, ``sweep_spec`` -- what the width means for the net, e.g. a
ResNet's residual and hidden width, a CNN's channels, a WRN's widening factor --,
``sweep_config`` -- what the kind adds to a point's key); each point is one probe of one init
with the shared options (samples, seeds, seed, dtype, device; docs/cli.md).

Each finished point is appended to the output as one line (one ``write`` of the whole line,
flushed): an interrupted sweep leaves only whole lines, and a rerun skips the points whose
``key`` is already in the file.

The loop is the library's (``run``; ``sigprop.api.sweep`` hands it the probe): the CLI only
parses and prints, and an executor -- serial by default, a cluster's in 0.13.0 -- decides where
the points run, while every line is written here, in the calling process, as results arrive.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

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


def configure(
    kind: kinds.Kind,
    sizes: dict[str, Any],
    width=None,
    init=None,
    input_dim: int | None = None,
    probe: specs.ProbeSpec | None = None,
    curvature: specs.HessianSpec | None = None,
) -> list[Point]:
    """The points of a sweep of ``kind`` from what a user gives: ``sizes`` {axis: values} (only the
    kind's own axis, ``Kind.sweep_size``, applies), the widths and inits (lists of values or
    comma-separated strings; None: the kind's defaults, and proposed,he), the input dimension of
    a kind that sets it apart, the probe's options, or ``curvature``'s (then no cosine).  Every
    refusal names its option, before anything runs."""
    probe = probe or specs.ProbeSpec()
    for axis, given in sizes.items():
        if given is not None and axis != kind.sweep_size:
            raise SigpropError(f"does not apply to sweep {kind.name}; use --{kind.sweep_size}", field=axis)
    if not kind.sweep_input_dim and input_dim is not None:
        raise SigpropError(
            f"does not apply to sweep {kind.name} (its input is not set apart from the swept width)",
            field="input_dim",
        )
    if curvature is not None and probe.correlations:
        raise SigpropError("--curvature measures no cosine; drop --correlation", field="correlation")

    def joined(values, default: str) -> str:
        if not values:
            return default
        return values if isinstance(values, str) else ",".join(str(v) for v in values)

    size_values = parse_ints(joined(sizes.get(kind.sweep_size), kind.sweep_sizes), kind.sweep_size)
    widths = parse_ints(joined(width, kind.sweep_widths), "width")
    names = parse_inits(joined(init, "proposed,he"), kind)
    return grid(kind, size_values, widths, names, probe, input_dim, curvature)


def serial(fn: Callable, items: list) -> Iterator:
    """The default executor: ``fn`` of each item in turn, in this process."""
    return map(fn, items)


def run(
    points: list[Point],
    out: Path,
    measure: Callable[[Point], Any],
    on_plan: Callable[[int, int], None] | None = None,
    on_point: Callable[[int, int, Point, dict], None] | None = None,
    executor: Callable[[Callable, list], Iterable] = serial,
) -> list[dict[str, Any]]:
    """Run the points not yet in ``out`` and append each one's line as it finishes: ``measure(point)``
    is its result (a probe's, or the curvature's); ``executor(fn, points)`` yields ``fn``'s
    results as the points finish (``serial``: here, one after the other).  ``on_plan(total,
    to_run)`` is told before anything runs; ``on_point(i, to_run, point, row)`` after each line
    is written.  Returns the lines this call wrote."""
    out = Path(out)
    if out.exists() and not out.is_file():
        raise SigpropError(f"{out} is not a regular file", field="out")
    if not out.resolve().parent.is_dir():
        raise SigpropError(f"directory {out.resolve().parent} does not exist", field="out")
    done = done_keys(out)
    todo = [p for p in points if p.key not in done]
    if on_plan is not None:
        on_plan(len(points), len(todo))

    def one(point: Point) -> tuple[Point, dict[str, Any]]:
        t0 = time.perf_counter()
        result = measure(point)
        return point, row(point, result, time.perf_counter() - t0)

    written = []
    for i, (point, line) in enumerate(executor(one, todo), 1):
        append(out, line)
        written.append(line)
        if on_point is not None:
            on_point(i, len(todo), point, line)
    return written


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
    """The JSON line of one finished point (its keys are written by sigprop/results/)."""
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
