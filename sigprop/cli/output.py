"""Where the CLI's output goes: stdout or a whole file, rich tables, one-line messages on
stderr, the progress bar.  Rendering only (sigprop/report.py draws; nothing is computed here)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from sigprop import files, report
from sigprop.cli.options import Format
from sigprop.errors import SigpropError


def _stderr() -> Console:
    return Console(stderr=True)


def _say(line: str) -> None:
    """One unwrapped line on stderr (rich would wrap long messages at the terminal width)."""
    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()


def _check_output_target(output: Optional[Path]) -> Optional[Path]:
    """Fail on a bad --output before the run, not after minutes of compute."""
    if output is None:
        return None
    target = output.resolve()
    if target.is_dir():
        raise SigpropError(f"{output} is a directory", field="output")
    if not target.parent.is_dir():
        raise SigpropError(f"directory {target.parent} does not exist", field="output")
    return target


def write_output(text: str, output: Optional[Path]) -> None:
    """Write ``text`` to stdout, or whole to ``output`` (temp file + rename: never half a file)."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    files.atomic_write(_check_output_target(output), write)


def render(result, fmt: Format, output: Optional[Path]) -> None:
    if fmt is Format.json:
        write_output(report.to_json(result), output)
    elif fmt is Format.csv:
        write_output(report.to_csv(result), output)
    else:
        render_rich(lambda console: report.render_table(result, console), output)


def render_rich(draw, output: Optional[Path]) -> None:
    """A rich rendering to the terminal, or as plain text (no colour) to ``output``."""
    if output is None:
        # a pipe or file has no width to respect: do not let rich squeeze columns to 80
        draw(Console() if sys.stdout.isatty() else Console(width=120))
        return
    with open(os.devnull, "w") as sink:
        console = Console(record=True, file=sink, width=160, color_system=None)
        draw(console)
    write_output(console.export_text(), output)


def _progress_callback(total_label: str):
    """A rich progress bar on stderr when stderr is a terminal; otherwise nothing.  It names the
    init and the pass running now, and shows elapsed time and the estimate only once a tenth of
    the steps are done (the first layers include one-time setup: an early estimate misleads)."""
    if not sys.stderr.isatty():
        return None, None

    class _Remaining(TimeRemainingColumn):
        def render(self, task):
            if task.total and task.completed < 0.1 * task.total:
                return TextColumn("estimating").render(task)
            return super().render(task)

    prog = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        _Remaining(),
        console=_stderr(),
        transient=True,
    )
    task = prog.add_task(total_label, total=None)

    def update(done: int, total: int, label: str = "") -> None:
        prog.update(task, completed=done, total=total, description=f"{total_label} {label}".strip())

    return prog, update
