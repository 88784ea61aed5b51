"""``sigprop width KIND``: the coordinate check (Yang et al. 2021, section 6) of a net kind's net
or a user's model, one command per kind that declares its width options (``Kind.width_options``),
beside the theory of its width exponents; ``--check`` fails when a run is not width-stable."""

from __future__ import annotations

import inspect
from typing import Annotated

import typer

from sigprop import kinds, report
from sigprop.cli import common
from sigprop.cli._app import add_family
from sigprop.cli.common import _plot_target
from sigprop.cli.options import (
    Option,
    OutputOpt,
    TableFormat,
    TableFormatOpt,
    _plot,
    cli_values,
    declared_spec,
    declared_table,
)
from sigprop.cli.output import _check_output_target, _progress_callback, _say, render_rich, write_output
from sigprop.errors import SigpropError
from sigprop.options import declared_options
from sigprop.width.spec import WidthSpec, validate

WIDTH_HELP = (
    "The coordinate check: a net trained a few steps at several widths under SP, μP or NTK, each site's "
    "scale fitted against the width beside the exponent theory predicts (Yang et al. 2021), with a "
    "width-stable verdict --check gates on."
)
OUTPUT = (
    ("check", Annotated[bool, Option("--check", help="Exit 1 when a run is not width-stable.")], False),
    ("fmt", TableFormatOpt, TableFormat.table),
    ("output", OutputOpt, None),
    (
        "plot",
        _plot(
            "Write the figure (.png/.svg/.pdf; needs the plot extra): mean|h| against width per site, one "
            "panel per step, one row per parametrization, theory slopes dashed."
        ),
        None,
    ),
)


def _parameters(kind: kinds.Kind) -> list[inspect.Parameter]:
    table = declared_table(kind.width_options, f"width_{kind.name}") + declared_table(
        declared_options(WidthSpec), "width"
    )
    return [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        for name, annotation, default in [*table, *OUTPUT]
    ]


def run_width(kind: kinds.Kind, net_values: dict, spec_values: dict, out: dict) -> None:
    """Validate, train every point with a progress bar, render; exit 1 under --check when a run
    is not width-stable."""
    _check_output_target(out["output"])
    plot_mod = _plot_target(out["plot"])
    net = kind.width_net(net_values)
    spec = declared_spec(WidthSpec, spec_values)
    validate(spec, net)
    for name in ("check", "plot"):  # a shard's result has no runs: nothing to gate on or draw
        if spec.shard is not None and out[name]:
            raise SigpropError(
                f"a shard fits nothing: --{name} reads the whole check (the same command with --points "
                "PART ...)",
                field="shard",
            )
    api = common.core()  # the lazy torch import at the CLI's edge
    prog, update = _progress_callback("width", "points")
    if prog is not None:
        prog.start()
    try:

        def started() -> None:
            _say(
                f"sigprop width {kind.name}: widths {','.join(map(str, sorted(net.widths)))}, "
                f"{'/'.join(spec.params)}, {spec.optimizer} lr {spec.lr:g}, {spec.steps} steps, "
                f"{spec.seeds} seeds"
            )

        command = f"sigprop width {kind.name}"
        result = api.width_check_of(net, spec, command=command, progress=update, on_start=started)
    finally:
        if prog is not None:
            prog.stop()
    if out["fmt"].value == "json":
        write_output(report.to_json(result), out["output"])
    else:
        render_rich(lambda console: report.render_width(result, console), out["output"])
    if plot_mod is not None:
        plot_mod.width_figure(result, out["plot"])
        _say(f"sigprop: wrote {out['plot']}")
    if out["check"] and not result.passed:
        for run in result.runs:
            if not run.width_stable:
                _say(f"sigprop: check failed: {run.stable_words}")
        raise typer.Exit(1)


def make(kind: kinds.Kind):
    own = {o.name for o in kind.width_options}
    shared = {o.name for o in declared_options(WidthSpec)}

    def run_command(**kw):
        out = {name: kw.pop(name) for name, _, _ in OUTPUT}
        net_values = cli_values(kind.width_options, {k: v for k, v in kw.items() if k in own})
        spec_values = {k: v for k, v in kw.items() if k in shared}
        return run_width(kind, net_values, spec_values, out)

    run_command.__signature__ = inspect.Signature(_parameters(kind))
    run_command.__annotations__ = {
        p.name: p.annotation for p in run_command.__signature__.parameters.values()
    }
    run_command.__name__ = kind.name
    return run_command


def register(app: typer.Typer) -> None:
    """``sigprop width`` with one command per kind that has a coordinate check."""
    add_family(
        app,
        "width",
        WIDTH_HELP,
        [k for k in kinds.KINDS.values() if k.width_options is not None],
        lambda kind: (
            f"The coordinate check of {kind.noun}: trained a few steps at each width under each "
            "parametrization, each site's slope of log scale on log width beside theory's exponent."
        ),
        make,
    )
