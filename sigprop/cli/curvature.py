"""``sigprop hessian KIND``: the curvature at init of a net kind's net, one command per kind that
measures it."""

from __future__ import annotations

import typer

from sigprop import kinds, report
from sigprop.cli import common
from sigprop.cli._app import add_family
from sigprop.cli.common import ONE_PROBE, _banner, _plot_target
from sigprop.cli.options import (
    HessianOptions,
    command,
    hessian_table,
)
from sigprop.cli.output import (
    _check_output_target,
    _progress_callback,
    _say,
    render_rich,
    write_output,
)

HESSIAN_HELP = (
    "The curvature at init: the largest-magnitude eigenvalue of the loss Hessian (restarted Lanczos), and on "
    "request "
    "its top-k (Lanczos) and trace (Hutchinson), per init (Arpit et al. 2019, section 5.3, Table 2)."
)


def run_hessian(kind: kinds.Kind, spec, opts: HessianOptions) -> None:
    """``sigprop hessian KIND``: validate, measure the curvature with a progress bar, render."""
    hs = opts.spec
    _check_output_target(opts.output)
    plot_mod = _plot_target(opts.plot)
    if hs.density and hs.probes == 1:
        _say(ONE_PROBE)

    api = common.core()  # the lazy torch import at the CLI's edge

    prog, update = _progress_callback("hessian", "Hessian-vector products")
    banner = _banner(kind, spec, hs.seed, hs.seeds)
    if prog is not None:
        prog.start()
    try:
        result = api.hessian(
            spec, hs, progress=update, on_start=lambda env: _say(report.hessian_banner(banner(env), env, hs))
        )
    finally:
        if prog is not None:
            prog.stop()
    if opts.fmt.value == "json":
        write_output(report.to_json(result), opts.output)
    else:
        render_rich(lambda console: report.render_hessian(result, console), opts.output)
    if plot_mod is not None:
        plot_mod.hessian_figure(result, opts.plot)
        _say(f"sigprop: wrote {opts.plot}")


def register(app: typer.Typer) -> None:
    """``sigprop hessian`` with one command per kind that measures the curvature."""
    add_family(
        app,
        "hessian",
        HESSIAN_HELP,
        [k for k in kinds.KINDS.values() if k.curvature],
        lambda kind: (
            f"Curvature at init of the net of `sigprop {kind.name}` (same net options), with a "
            "10-way linear head and cross-entropy; per init, mean ± sd over --seeds draws."
        ),
        lambda kind: command(kind, hessian_table(kind), HessianOptions, run_hessian, "hessian"),
    )
