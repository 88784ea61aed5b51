"""The typer application: its root options (``--version``, ``-h``) and the help that lists the
net kinds registered when it is built."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from sigprop import kinds
from sigprop.version import __version__

CONTEXT = {"help_option_names": ["-h", "--help"]}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"sigprop {__version__}")
        raise typer.Exit()


def root(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Signal propagation at initialization, measured beside the theory (Arpit et al. 2019)."""


def new_app() -> typer.Typer:
    """The bare application (the commands are added by sigprop/cli/__init__.py ``build``)."""
    app = typer.Typer(
        name="sigprop",
        help="Signal propagation at initialization, measured beside the theory: norm ratios of activations "
        "and gradients, "
        f"layer by layer, in each net kind's command ({', '.join(kinds.names())}), the cosine of two inputs "
        "(--correlation), and the loss Hessian's curvature at init (hessian).",
        context_settings=CONTEXT,
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
    )
    app.callback()(root)
    return app


def add_family(app: typer.Typer, name: str, help_: str, which, describe, make) -> typer.Typer:
    """``sigprop NAME KIND``: a command group with one command per kind in ``which`` (the kinds
    registered now), each helped by ``describe(kind)`` and built by ``make(kind)`` (hessian,
    spectrum, sweep); the group (a family may add a command of its own: ``sweep merge``)."""
    family = typer.Typer(help=help_, no_args_is_help=True)
    app.add_typer(family, name=name)
    for kind in which:
        family.command(kind.name, help=escape(describe(kind)))(make(kind))
    return family
