"""``sigprop check``: the TOML file's checks run, one line each, a summary, JSON or JUnit XML; exit 1
on a failure."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from sigprop import checks as checks_mod
from sigprop import report
from sigprop.cli import common
from sigprop.cli.options import (
    Argument,
    CheckFormat,
    Option,
)
from sigprop.cli.output import _check_output_target, _say, write_output
from sigprop.errors import SigpropError


def check(
    file: Annotated[
        Optional[Path],
        Argument(
            help="TOML file of [checks.NAME] (or [tool.sigprop.checks.NAME]) tables. [default: "
            "./pyproject.toml, else ./sigprop.toml]"
        ),
    ] = None,
    fmt: Annotated[
        CheckFormat,
        Option("--format", help="text: one line per check and init, then a summary; json: one document."),
    ] = CheckFormat.text,
    output: Annotated[
        Optional[Path], Option(help="Write the report to this file (whole, never half).")
    ] = None,
    junit: Annotated[
        Optional[Path], Option(help="Also write a JUnit XML report here (for CI test panels).")
    ] = None,
) -> None:
    """Run named probe configurations with expectations from TOML: exit 0 all met, 1 one not met, 2 bad
    config."""
    _check_output_target(output)
    _check_output_target(junit, "junit")
    path, table = checks_mod.find_config(file, Path.cwd())
    entries = checks_mod.load(path, table)
    _say(f"sigprop check: {len(entries)} check(s) from {path}")

    api = common.core()  # the lazy torch import at the CLI's edge

    console = Console(highlight=False, soft_wrap=True)
    lines: list[str] = []

    def show(outcome) -> None:
        line = report.check_line(outcome)
        lines.append(line)
        if fmt is CheckFormat.text and output is None:
            console.print(line, style=None if outcome.ok else "bold red", markup=False)

    def failed(entry, exc) -> None:
        if isinstance(exc, SigpropError):
            raise SigpropError(f"check {entry.name!r} ({entry.where}): {exc}", exit_code=2) from None

    result = api.run_checks(entries, source=str(path), on_outcome=show, on_error=failed)
    summary = report.check_summary(result.outcomes, result.seconds)
    if fmt is CheckFormat.json:
        write_output(report.check_json(result), output)
    elif output is not None:
        write_output("\n".join(lines + [summary]) + "\n", output)
    else:
        console.print(summary, markup=False)
    if junit is not None:
        write_output(report.junit_xml(result), junit)
    if fmt is CheckFormat.json or output is not None:
        _say(f"sigprop check: {summary}")
    if not result.passed:
        raise typer.Exit(1)
