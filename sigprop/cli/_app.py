"""The typer application and its root options (``--version``, ``-h``)."""

from __future__ import annotations

from typing import Annotated

import typer

from sigprop import __version__

CONTEXT = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="sigprop",
    help="Signal propagation at initialization, measured beside the theory: norm ratios of activations and gradients, layer by "
         "layer, in weight-normalized MLPs, ResNets (with the batch-normalized and SkipInit baselines), plain CNNs and wide "
         "residual conv nets (mlp, resnet, cnn, wrn), the cosine of two inputs (--correlation), and the loss Hessian's "
         "curvature at init (hessian).",
    context_settings=CONTEXT,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

#: CLI choices come from the registry (a test asserts they match)

def _version(value: bool) -> None:
    if value:
        typer.echo(f"sigprop {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Signal propagation at initialization, measured beside the theory (Arpit et al. 2019)."""
