"""``sigprop spectrum KIND``: the input-output Jacobian's spectrum of a net kind's net, one command
per kind."""

from __future__ import annotations

import typer

from sigprop import kinds, report
from sigprop.cli import common
from sigprop.cli._app import add_family
from sigprop.cli.common import ONE_PROBE, _banner, _plot_target
from sigprop.cli.options import (
    SpectrumOptions,
    command,
    spectrum_table,
)
from sigprop.cli.output import (
    _check_output_target,
    _progress_callback,
    _say,
    render_rich,
    write_output,
)

SPECTRUM_HELP = (
    "The input-output Jacobian's spectrum at init: its singular values, exactly at a few inputs, per init "
    "and draw, beside the large-width theory (Pennington, Schoenholz & Ganguli 2018)."
)


def run_spectrum(kind: kinds.Kind, spec, opts: SpectrumOptions) -> None:
    """``sigprop spectrum KIND``: validate, measure the spectra with a progress bar, render."""
    ss = opts.spec
    _check_output_target(opts.output)
    plot_mod = _plot_target(opts.plot)

    api = common.core()  # the lazy torch import at the CLI's edge

    prog, update = _progress_callback("spectrum", "draws")
    banner = _banner(kind, spec, ss.seed, ss.seeds)
    if prog is not None:
        prog.start()
    try:

        def started(env: dict) -> None:
            _say("sigprop spectrum" + banner(env)[7:])
            if env.get("path") == "lanczos" and ss.probes == 1:
                _say(ONE_PROBE)

        result = api.spectrum(spec, ss, progress=update, on_start=started)
    finally:
        if prog is not None:
            prog.stop()
    if opts.fmt.value == "json":
        write_output(report.to_json(result), opts.output)
    else:
        render_rich(lambda console: report.render_spectrum(result, console), opts.output)
    if plot_mod is not None:
        plot_mod.spectrum_figure(result, opts.plot)
        _say(f"sigprop: wrote {opts.plot}")


def register(app: typer.Typer) -> None:
    """``sigprop spectrum`` with one command per kind."""
    add_family(
        app,
        "spectrum",
        SPECTRUM_HELP,
        kinds.KINDS.values(),
        lambda kind: (
            f"The input-output Jacobian's singular values of the net of `sigprop {kind.name}` (same "
            "net options), exactly at a few inputs, per init and draw, beside the large-width theory."
        ),
        lambda kind: command(kind, spectrum_table(kind), SpectrumOptions, run_spectrum, "spectrum"),
    )
