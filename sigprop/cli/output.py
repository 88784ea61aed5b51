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


def _stderr() -> Console:
    return Console(stderr=True)


def _say(line: str) -> None:
    """One unwrapped line on stderr (rich would wrap long messages at the terminal width)."""
    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()


def _check_output_target(output: Optional[Path], field: str = "output") -> Optional[Path]:
    """Fail on a bad --output before the run, not after minutes of compute (``files.check_target``)."""
    return None if output is None else files.check_target(output, field)


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
        draw(Console() if sys.stdout.isatty() else Console(width=160))  # as --output
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
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


#: step durations a run's estimate waits for: their median is its time a step, so that one step
#: holding a compile (``--fuse``) or a warm-up is timed apart instead of multiplied
SETTLE_STEPS = 3


class _Progress:
    """What every long run says on stderr: an estimate of the whole run (when it exceeds
    ``LONG_RUN``: "about 12 min for at most 9,000 Hessian-vector products at 0.08 s each"), then
    its progress -- a rich bar on a terminal, else a line every ``LOG_INTERVAL`` seconds (a log,
    a CI job).  The estimate is said once ``SETTLE_STEPS`` steps after the first are timed, from
    their median: the time already spent (setup, compiles, warm-up: the first steps) is counted
    apart, not as the time of every step (``--fuse``'s compile in the second step once read as
    "about 7 min at 60 s each" of a run that took 159 s).  A core that can guess a step's time
    before the first one (the curvature, from its gradient's time) says so through ``prior``;
    the measured estimate then follows as the refined one."""

    def __init__(self, total_label: str, unit: str) -> None:
        self.label, self.unit = total_label, unit
        self.bar = _bar() if sys.stderr.isatty() else None
        self.task = self.bar.add_task(total_label, total=None) if self.bar else None
        self.t0 = self.last = self.prev = 0.0
        self.done = 0  # the steps done at ``prev``
        self.steps: list[float] = []  # the durations of the steps after the first
        self.said = self.guessed = False
        #: a core's own model of the time left (``remaining``): seconds, and when it was told
        self.left: tuple[float, float] | None = None
        self.first_left = 0.0

    def __call__(self, done: int, total: int, label: str = "") -> None:
        self.update(done, total, label)

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

    def _tail(self) -> str:
        return "" if self.bar is not None else f"; a line every {_duration(LOG_INTERVAL)} here"

    def prior(self, total: int, step: float, basis: str) -> None:
        """Before the first step: the whole run's estimate from a guess of a step's time (``basis``
        says what it is from), said when it exceeds ``LONG_RUN``."""
        spent = time.monotonic() - self.t0
        if spent + step * total > LONG_RUN:
            self.guessed = True
            self._line(
                f"sigprop: {self.label}: about {_duration(spent + step * total)} in all, for at most "
                f"{total:,} {self.unit} at about {step:.2g} s each ({basis}; refined after the first "
                f"{SETTLE_STEPS + 1}){self._tail()}"
            )

    def remaining(self, seconds: float) -> None:
        """A core's own estimate of the time left (the width check's clock: each point's time by
        its width, so that the widest points still to run are counted as they are): said when
        the whole run exceeds ``LONG_RUN`` -- once, and again when it moves by more than half --
        and read by the log lines in place of the steps' median."""
        now = time.monotonic()
        self.left, self.said = (now, seconds), True
        spent = now - self.t0
        whole = spent + seconds
        if whole > LONG_RUN and (not self.first_left or abs(whole - self.first_left) > 0.5 * self.first_left):
            again = "refined: " if self.first_left else ""
            self.first_left = whole
            self._line(
                f"sigprop: {self.label}: {again}about {_duration(whole)} in all, {_duration(seconds)} left "
                f"(each point's time by its width, from the steps timed so far){self._tail()}"
            )

    def _step(self) -> float:
        """The time of one step: the median of the timed ones (a compile is one outlier)."""
        return sorted(self.steps)[len(self.steps) // 2] if self.steps else 0.0

    def _estimate(self, now: float, done: int, total: int) -> None:
        step = self._step()
        spent, left = now - self.t0, step * (total - done)
        self.said = True
        if spent + left <= LONG_RUN and not self.guessed:
            return
        first = spent - step * (done - 1)  # setup and the first steps beyond their share
        apart = ""
        if first > 0.25 * (spent + left):
            apart = f", after {_duration(first)} of setup, compiles and warm-up"
        self._line(
            f"sigprop: {self.label}: {'refined: ' if self.guessed else ''}about {_duration(spent + left)} in "
            f"all, for at most {total:,} {self.unit} at {step:.2g} s each{apart}"
            + ("" if self.guessed else self._tail())
        )

    def update(self, done: int, total: int, label: str = "") -> None:
        now = time.monotonic()
        if done > self.done:  # a call that repeats a count (a draw's end) times nothing
            if self.done >= 1:
                self.steps += [(now - self.prev) / (done - self.done)] * min(done - self.done, SETTLE_STEPS)
            self.prev, self.done = now, done
        if not self.said and len(self.steps) >= SETTLE_STEPS and total > done:
            self._estimate(now, done, total)
        if self.bar is not None:
            self.bar.update(
                self.task, completed=done, total=total, description=f"{self.label} {label}".strip()
            )
        elif now - self.last >= LOG_INTERVAL and done < total:
            self.last = now
            eta = "" if not self.steps else f", about {_duration(self._step() * (total - done))} left"
            if self.left is not None:  # the core's own model
                eta = f", about {_duration(max(0.0, self.left[1] - (now - self.left[0])))} left"
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
    """(progress, update): ``_Progress`` and the callable the core's ``progress`` takes (the
    object itself: a core that guesses a step's time before the first finds ``prior`` on it)."""
    prog = _Progress(total_label, unit)
    return prog, prog
