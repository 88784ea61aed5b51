"""The small commands: ``rerun``, ``theory``, ``inits``, ``cite``, ``env``; and ``register``, which
adds every command besides the probes in the order ``sigprop -h`` lists them (``sweep`` and
``plot`` from sigprop/cli/sweep.py, ``check`` from sigprop/cli/check.py).  Each parses, calls
the library and renders."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from sigprop import citations, inits, report
from sigprop import theory as theory_mod
from sigprop.cli import check as check_cli
from sigprop.cli import common
from sigprop.cli import sweep as sweep_cli
from sigprop.cli.options import (
    Argument,
    Format,
    Option,
    TableFormat,
)
from sigprop.cli.output import _check_output_target, _say, render, render_rich, write_output
from sigprop.errors import SigpropError
from sigprop.results import rerun_differences


def cite(
    init: Annotated[
        Optional[list[str]],
        Option(help="Only the papers behind this init (repeatable). [default: every init]"),
    ] = None,
) -> None:
    """Print BibTeX of the papers behind sigprop and its init schemes."""
    for name in init or ():
        inits.get(name)  # a known init, or one line with a did-you-mean
    keys = citations.keys_for({n: s.cites for n, s in inits.INITS.items()}, init or None)
    write_output("\n\n".join(citations.BIBTEX[k] for k in keys) + "\n", None)


def env() -> None:
    """Versions, device, dtype and thread counts: paste this into a bug report."""
    from sigprop import environment  # the lazy torch import at the CLI's edge: it reports on torch

    rows = environment.gather()
    width = max(len(k) for k, _ in rows)
    write_output("\n".join(f"{k:{width}s} {v}" if k else v for k, v in rows) + "\n", None)


def rerun(
    result: Annotated[Path, Argument(help="A result of a probe command's --format json.", metavar="RESULT")],
    fmt: Annotated[Format, Option("--format", help="Output format of the new run.")] = Format.table,
    output: Annotated[
        Optional[Path], Option(help="Write the new run's output to this file (whole, never half).")
    ] = None,
) -> None:
    """Run a recorded result again (its config, seed, device, threads) and compare: exit 0 identical, 1
    different."""
    _check_output_target(output)
    try:
        doc = json.loads(result.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SigpropError(f"cannot read {result}: {exc.strerror or exc}", field="result") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SigpropError(f"{result} is not JSON: {exc}", field="result") from None

    api = common.core()  # the lazy torch import at the CLI's edge

    new = api.rerun(
        doc,
        on_start=lambda env: _say(
            f"sigprop rerun: {doc.get('command')} from {result} on {env['device']} "
            f"({report.count(env['threads'], 'thread')})"
        ),
    )
    render(new, fmt, output)
    count, diffs, moved = rerun_differences(doc, new)
    if moved:
        _say("sigprop rerun: note: " + ", ".join(f"{k} was {a!r}, now {b!r}" for k, a, b in moved))
    if diffs:
        where, a, b = diffs[0]
        _say(
            f"sigprop rerun: DIFFERENT: {len(diffs)} of {count} numbers differ; first at "
            f"runs{where[where.find('[') :] if where.startswith('[') else '.' + where}: {a!r} -> {b!r}"
        )
        raise typer.Exit(1)
    _say(f"sigprop rerun: reproduced: all {count} numbers identical")


def theory(
    n: Annotated[
        Optional[list[int]],
        Option("--n", min=2, help="n for K_n (repeatable). Default: 2, 3, 10, 100, 1000, 10^6, 10^7."),
    ] = None,
    blocks: Annotated[
        Optional[list[int]],
        Option("--blocks", min=1, help="Residual blocks B (repeatable). Default: 1, 2, 10, 40, 100, 1000."),
    ] = None,
    fmt: Annotated[TableFormat, Option("--format", help="Output format.")] = TableFormat.table,
    output: Annotated[Optional[Path], Option(help="Write the output to this file.")] = None,
) -> None:
    """K_n of Theorem 1 (closed form and quadrature) and the ResNet ratio (1 + 1/B)^{B/2}."""
    _check_output_target(output)
    result = theory_mod.table(n, blocks)
    if fmt is TableFormat.json:
        write_output(report.to_json(result), output)
    else:
        render_rich(lambda console: report.render_theory(result, console), output)


def list_inits() -> None:
    """List the init schemes with a one-line description and the paper they come from."""
    rows = [(s.name, s.description, s.paper) for s in inits.INITS.values()]
    report.render_inits(rows, Console())


def register(app: typer.Typer) -> None:
    """The commands besides the probes, in the order ``sigprop -h`` lists them."""
    sweep_cli.register(app)
    for name, fn in (
        ("plot", sweep_cli.plot_cmd),
        ("rerun", rerun),
        ("check", check_cli.check),
        ("theory", theory),
        ("inits", list_inits),
        ("cite", cite),
        ("env", env),
    ):
        app.command(name, help=escape(inspect.getdoc(fn)))(
            fn
        )  # a bracket in the help is shown, not read as markup
