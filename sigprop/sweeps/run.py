"""A sweep's loop and its file: the points not yet in ``--out`` go to an executor, and every line
is appended here, in the calling process, as its point finishes.  No torch.

One writer: whichever executor runs the points (``serial`` here, one after the other; a Dask
cluster's, sigprop/sweeps/cluster.py), the lines are written by the client, one ``write`` of a
whole line each, flushed and synced, so a killed client loses only the points in flight and a
rerun skips the points whose ``key`` is already in the file.  A point that raises is one
failure line (``sigprop.sweep.failed.v1``: its error, where it ran) and the sweep goes on; a
failure line is not a result, so a rerun measures that point again.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from sigprop import files
from sigprop.errors import SigpropError, described
from sigprop.results import FAILED_SCHEMA, SHARD_SCHEMA, SWEEP_SCHEMA
from sigprop.sweeps.grid import Point, config_key
from sigprop.version import __version__


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
    part: bool = False,
) -> list[dict[str, Any]]:
    """Run the points not yet in ``out`` and append each one's line as it finishes: ``measure(point)``
    is its result (a probe's, the curvature's or the spectrum's); ``executor(fn, points)`` yields
    ``fn(point)`` -- (point, line) -- as the points finish (``serial``: here, one after the
    other).  ``on_plan(total, to_run)`` is told before anything runs; ``on_point(i, to_run,
    point, line)`` after each line is written (a failure's line has ``"error"``).  ``part``: the
    points are one part of the grid (``--shard``), ``out`` that part's file.  Returns the lines
    this call wrote."""
    out = Path(out)
    files.check_target(out, "out", append=True)
    done = done_keys(out, part)
    todo = [p for p in points if p.key not in done]
    if len({p.key for p in todo}) != len(todo):
        raise SigpropError("two points of this sweep have the same key", field="out")
    if on_plan is not None:
        on_plan(len(points), len(todo))
    written = []
    for i, (point, line) in enumerate(executor(partial(finish, measure=measure), todo), 1):
        append(out, line)
        written.append(line)
        if on_point is not None:
            on_point(i, len(todo), point, line)
    return written


def finish(point: Point, measure: Callable[[Point], Any]) -> tuple[Point, dict[str, Any]]:
    """One task, wherever it runs: the point and its line -- its result's, or the failure's."""
    t0 = time.perf_counter()
    try:
        result = measure(point)
    except Exception as exc:  # recorded, and the sweep goes on (KeyboardInterrupt is not an Exception)
        return point, failed(point, exc, time.perf_counter() - t0)
    return point, row(point, result, time.perf_counter() - t0)


def row(point: Point, result, seconds: float) -> dict[str, Any]:
    """The JSON line of one finished point (its keys are written by sigprop/results/), its
    environment record naming the host it ran on and its sigprop (a cluster's client checks it,
    sigprop/sweeps/cluster.py)."""
    line = point.measurement.row(point.config, point.init, result, seconds)
    line["environment"] = {**line["environment"], "sigprop": __version__, **where_it_ran()}
    return line


def where_it_ran() -> dict[str, str]:
    """The host a point ran on, and the Dask worker's address where it ran on one (a late worker of
    another version is named as the scheduler lists it)."""
    out = {"host": socket.gethostname()}
    distributed = sys.modules.get("distributed")  # imported on a worker; never imported here for it
    if distributed is not None:
        try:
            out["worker"] = distributed.get_worker().address
        except Exception:  # not inside a Dask worker's task
            pass
    return out


def failed(point: Point, exc: BaseException, seconds: float | None, host: str | None = None) -> dict:
    """The line of a point that raised (or whose workers died): its config, the error in one
    line, where it ran (``host``: None for here)."""
    return {
        "schema": FAILED_SCHEMA,
        "config": point.config,
        "init": point.init,
        "error": described(exc),
        # sigprop refused the point's input (a memory bound, a device): not a fault of the run
        "refused": isinstance(exc, SigpropError),
        "seconds": None if seconds is None else round(seconds, 3),
        "environment": {"sigprop": __version__, "host": host or socket.gethostname()},
    }


def done_keys(path: Path, part: bool = False) -> set[str]:
    """Keys of the points already in the file (failure lines are not).  A file that is not text, or
    holds a line that is not JSON, is refused before anything runs: appending to it would make a
    file ``sigprop plot`` refuses (``read_rows``) -- the same line named by both.  So is a file of
    another command (a line of ``sigprop width``), and a part's file (its header) unless ``part``:
    the whole grid appended to one part's file would mix it with the others'."""
    if not path.exists():
        return set()
    advice = (
        "; sigprop sweep appends only to its own JSON-lines files (remove the line, or give another --out)"
    )
    keys = set()
    for number, line in owned(path, "out", "sigprop sweep", lambda line: sweep_line(line, True), advice):
        if line.get("schema") == SHARD_SCHEMA and not part:
            raise SigpropError(
                f"{path} is part {line.get('shard')}/{line.get('of')} of a sweep (its line {number} is a "
                f"part's header): give --shard {line.get('shard')}/{line.get('of')}, or another --out",
                field="out",
            )
        if line.get("schema") == SWEEP_SCHEMA and "config" in line:
            keys.add(config_key(line["config"]))
    return keys


def written_by(line, row: str, failed_by: str, header: str | None = None) -> bool:
    """Whether a JSON line is one a command writes: its row (schema ``row``), a failed point of it
    (``FAILED_SCHEMA``, its config holding the key ``failed_by`` that only that command's configs
    hold), or its part's header (schema ``header``, where given)."""
    if not isinstance(line, dict):
        return False
    schema = line.get("schema")
    if schema == FAILED_SCHEMA:
        return isinstance(line.get("config"), dict) and failed_by in line["config"]
    return schema == row or (header is not None and schema == header)


def sweep_line(line, header: bool = False) -> bool:
    """Whether a JSON line is one ``sigprop sweep`` writes: a row, a failed point of a sweep (its
    config names the ``command``), or (``header``) a part's header."""
    return written_by(line, SWEEP_SCHEMA, "command", SHARD_SCHEMA if header else None)


def whose(line) -> str:
    """What a foreign line is, in words: the command its schema names (``sigprop.width.point.v1``:
    sigprop width's), or that it has none."""
    schema = line.get("schema") if isinstance(line, dict) else None
    if not isinstance(schema, str):
        return "a JSON line with no sigprop schema"
    if schema == FAILED_SCHEMA:
        return f"a failed point of another command ({schema})"
    parts = schema.split(".")
    owner = f"sigprop {parts[1]}'s" if len(parts) > 2 and parts[0] == "sigprop" else "another program's"
    return f"a line of {owner} ({schema})"


def owned(path: Path, field: str, command: str, accept: Callable[[Any], bool], advice: str = ""):
    """(line number, line) of each line of a JSON-lines file that ``accept`` takes as ``command``'s
    own; the first line of another command's schema is one SigpropError naming ``field``, the line
    and whose it is (a file is never mixed with another command's)."""
    for number, line in json_lines(path, field, advice):
        if not accept(line):
            raise SigpropError(f"{path}:{number}: {whose(line)}, not {command}'s{advice}", field=field)
        yield number, line


def json_lines(path: Path, field: str, advice: str = ""):
    """(line number, value) of each non-blank line of a JSON-lines file; a line that is not JSON
    is one SigpropError naming ``field`` and the line (then ``advice``)."""
    for number, text in enumerate(_text(path, field).splitlines(), 1):
        if not text.strip():
            continue
        try:
            yield number, json.loads(text)
        except json.JSONDecodeError:
            raise SigpropError(f"{path}:{number}: not a JSON line{advice}", field=field) from None


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
    """The sweep rows of a JSON-lines file, for ``sigprop plot`` (failure lines are not rows)."""
    if not path.is_file():
        what = f"{path} is a directory, not a file" if path.is_dir() else f"no such file: {path}"
        raise SigpropError(what, field="results")
    rows = [
        r for _, r in json_lines(path, "results") if isinstance(r, dict) and r.get("schema") == SWEEP_SCHEMA
    ]
    if not rows:
        raise SigpropError(f"{path} holds no sweep rows ({SWEEP_SCHEMA})", field="results")
    commands = sorted({str(r.get("config", {}).get("command")) for r in rows})
    if len(commands) > 1:
        raise SigpropError(
            f"{path} mixes sweeps of {' and '.join(commands)}; plot one kind per file", field="results"
        )
    return rows


def plot_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows for the figure: a model's ``--arg`` items (``config.args``, ["depth=10"]) become axes
    of their own (``config.depth`` = 10, a Python literal where it reads as one); returns the rows
    and those axes' names (the JSON lines are not changed)."""
    out, names = [], {}
    for r in rows:
        config = dict(r["config"])
        for item in config.pop("args", None) or []:
            name, _, text = str(item).partition("=")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text
            config[name] = value if isinstance(value, (int, float, str, bool)) else text
            names[name] = None
        out.append({**r, "config": config})
    return out, list(names)


def axis_values(rows: Iterable[dict[str, Any]], x: str) -> list:
    return sorted({r["config"].get(x) for r in rows if x in r["config"]})
