"""Where the CLI's output goes: stdout or a whole file, rich tables, one-line messages on
stderr, the progress bar.  Rendering only (sigprop/report/ draws; nothing is computed here)."""

from __future__ import annotations

import os
import sys
import time
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


#: seconds between two progress lines on a stderr that is not a terminal (a log); the run's
#: estimate is said once when it exceeds ``LONG_RUN``
LOG_INTERVAL = float(os.environ.get("SIGPROP_PROGRESS_SECONDS", "60"))
LONG_RUN = 60.0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class _Progress:
    """What every long run says on stderr: once its second step is done, the estimate of the
    whole run from that step's time and the steps planned (when it exceeds ``LONG_RUN``: "about
    12 min for at most 9,000 Hessian-vector products at 0.08 s each"), then its progress -- a
    rich bar on a terminal, else a line every ``LOG_INTERVAL`` seconds (a log, a CI job)."""

    def __init__(self, total_label: str, unit: str) -> None:
        self.label, self.unit = total_label, unit
        self.bar = _bar() if sys.stderr.isatty() else None
        self.task = self.bar.add_task(total_label, total=None) if self.bar else None
        self.t0 = self.last = self.t1 = 0.0
        self.said = False

    def start(self) -> None:
        self.t0 = self.last = time.monotonic()
        if self.bar is not None:
            self.bar.start()

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()

    def _line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(text, highlight=False, soft_wrap=True)
        else:
            _say(text)

    def update(self, done: int, total: int, label: str = "") -> None:
        now = time.monotonic()
        if done == 1:
            self.t1 = now
        elif done == 2 and total > 2 and not self.said:
            step = now - self.t1
            left = step * (total - done)
            self.said = True
            if now - self.t0 + left > LONG_RUN:
                self._line(
                    f"sigprop: {self.label}: about {_duration(now - self.t0 + left)} in all, for at most "
                    f"{total:,} {self.unit} at {step:.2g} s each"
                    + ("" if self.bar is not None else f"; a line every {_duration(LOG_INTERVAL)} here")
                )
        if self.bar is not None:
            self.bar.update(
                self.task, completed=done, total=total, description=f"{self.label} {label}".strip()
            )
        elif now - self.last >= LOG_INTERVAL and done < total:
            self.last = now
            rate = (now - self.t1) / max(done - 1, 1) if done > 1 else None
            eta = "" if rate is None else f", about {_duration(rate * (total - done))} left"
            _say(
                f"sigprop: {self.label} {label}: {done:,} of at most {total:,} {self.unit}, "
                f"{_duration(now - self.t0)} elapsed{eta}"
            )


def _bar() -> Progress:
    """The progress bar on a terminal: it names the init and the pass running now, and shows
    elapsed time and the estimate only once a tenth of the steps are done (the first layers
    include one-time setup: an early estimate misleads)."""

    class _Remaining(TimeRemainingColumn):
        def render(self, task):
            if task.total and task.completed < 0.1 * task.total:
                return TextColumn("estimating").render(task)
            return super().render(task)

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        _Remaining(),
        console=_stderr(),
        transient=True,
    )


def _progress_callback(total_label: str, unit: str = "steps"):
    """(progress, update): ``_Progress`` and its update, for the core's ``progress`` callback."""
    prog = _Progress(total_label, unit)
    return prog, prog.update
