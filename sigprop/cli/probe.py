"""The probe commands, one per net kind (``sigprop mlp``, ``sigprop resnet``, ...), and their
``sigprop hessian KIND`` forms: made from each kind's declaration (sigprop/kinds/), they build the
spec, run the core with a progress bar, render, plot and apply --check.  No kind is named here."""

from __future__ import annotations

import typer
from rich.markup import escape

from sigprop import kinds, report
from sigprop.cli.options import (
    HESSIAN_OPTIONS,
    SPECTRUM_OPTIONS,
    HessianOptions,
    ProbeOptions,
    SpectrumOptions,
    command,
    probe_table,
)
from sigprop.cli.output import (
    _check_output_target,
    _progress_callback,
    _say,
    render,
    render_rich,
    write_output,
)
from sigprop.errors import SigpropError

HESSIAN_HELP = (
    "The curvature at init: the largest-magnitude eigenvalue of the loss Hessian (restarted Lanczos), and on "
    "request "
    "its top-k (Lanczos) and trace (Hutchinson), per init (Arpit et al. 2019, section 5.3, Table 2)."
)


def _banner(kind: kinds.Kind, spec, seed: int, seeds: int):
    """The line a run starts with, from the environment record: device, dtype, the net, the draws."""
    return lambda env: (
        f"sigprop {kind.name}: device {env['device']} ({env['device_name']}), {env['dtype']}, "
        f"{kind.banner(spec)} "
        f"(seed {seed}), {env['samples']} samples x {seeds} draw(s)"
    )


def _plot_target(path):
    """A --plot target checked before the run (the plot extra imported only when asked for)."""
    if path is None:
        return None
    from sigprop import plot as plot_mod  # optional extra (matplotlib): only with --plot

    plot_mod.check_target(path)
    return plot_mod


def _point_path(path, label: str):
    """A sweep point's own file beside ``path``: ``d.png`` -> ``d-depth=10.png``."""
    label = "-".join(label.split())
    safe = "".join(c if c.isalnum() or c in "=._-," else "_" for c in label)
    return path.with_name(f"{path.stem}-{safe}{path.suffix}")


def run_probe(kind: kinds.Kind, spec, opts: ProbeOptions) -> None:
    """Validate the output targets, run the core with a progress bar, render, plot, apply --check.
    A spec that is a sweep (``kind.expand``: ``--arg depth=10,20``) runs once per configuration:
    a table each and a summary, or one JSON line each; figures beside --plot, one each."""
    probe, gate = opts.probe_spec(), opts.gate_spec()
    points = kind.expand(spec)
    labels = kind.point_labels(points)
    _check_output_target(opts.output)
    if len(points) > 1 and opts.fmt.value == "csv":
        raise SigpropError(
            f"a sweep of {len(points)} configurations is not one CSV table: use --format json (one "
            "line per configuration) or table",
            field="format",
        )
    plots = [None] * len(points)
    plot_mod = _plot_target(opts.plot)
    if plot_mod is not None:
        plots = [opts.plot] if len(points) == 1 else [_point_path(opts.plot, label) for label in labels]
        for path in plots:
            plot_mod.check_target(path)

    from sigprop import api  # the lazy torch import at the CLI's edge: --help never loads it

    results = []
    for point, label in zip(points, labels):
        prog, update = _progress_callback("probing", "layer steps")
        banner = _banner(kind, point, probe.seed, probe.seeds)
        if prog is not None:
            prog.start()
        try:
            result = api.probe(
                point,
                probe,
                progress=update,
                on_start=lambda env, banner=banner: _say(banner({"samples": probe.samples, **env})),
                gate=gate,
            )
        except SigpropError as exc:  # which configuration of a sweep it was
            if len(points) == 1:
                raise
            raise SigpropError(f"{label}: {exc.message}", field=exc.field, exit_code=exc.exit_code) from None
        finally:
            if prog is not None:
                prog.stop()
        results.append(result)
        if len(points) == 1 or opts.fmt.value == "table":
            render(result, opts.fmt, opts.output if len(points) == 1 else None)
    if len(points) > 1:
        if opts.fmt.value == "json":
            write_output("".join(report.to_json_line(r) for r in results), opts.output)
        else:
            render_rich(lambda console: report.render_sweep_summary(labels, results, console), opts.output)
    for result, path in zip(results, plots):
        if path is not None:
            plot_mod.probe_figure(result, path)
            _say(f"sigprop: wrote {path}")
    failed = False
    for result, label in zip(results, labels):
        if not opts.check or result.passed:
            continue
        failed = True
        where = f"{label}: " if len(points) > 1 else ""
        for run in result.runs:
            for c in run.gate_checks():
                if not c.passed:
                    # a plug-in's gate says why in its note (the verdicts' notes are in the table)
                    why = f"; {c.note}" if c.note and c.verdict not in ("preserved", "theory") else ""
                    _say(
                        f"sigprop: check failed ({report.verdict_words(c.verdict)}): {where}{run.init}: "
                        f"{report.gate_text(c)}{why}"
                    )
    if failed:
        raise typer.Exit(1)


def run_hessian(kind: kinds.Kind, spec, opts: HessianOptions) -> None:
    """``sigprop hessian KIND``: validate, measure the curvature with a progress bar, render."""
    hs = opts.hessian_spec()
    _check_output_target(opts.output)
    plot_mod = _plot_target(opts.plot)
    if hs.density and hs.probes == 1:
        _say(ONE_PROBE)

    from sigprop import api  # the lazy torch import at the CLI's edge

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


#: --probes 1: said, not refused (a quick look is a fair use), so that nobody reads one probe's
#: quadrature as the density
ONE_PROBE = (
    "sigprop: warning: --probes 1: the density is one probe's quadrature (a single random sample "
    "of the spectral measure), not an average"
)

SPECTRUM_HELP = (
    "The input-output Jacobian's spectrum at init: its singular values, exactly at a few inputs, per init "
    "and draw, beside the large-width theory (Pennington, Schoenholz & Ganguli 2018)."
)


def run_spectrum(kind: kinds.Kind, spec, opts: SpectrumOptions) -> None:
    """``sigprop spectrum KIND``: validate, measure the spectra with a progress bar, render."""
    ss = opts.spectrum_spec()
    _check_output_target(opts.output)
    plot_mod = _plot_target(opts.plot)

    from sigprop import api  # the lazy torch import at the CLI's edge

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
    """One probe command per registered kind, and ``sigprop hessian`` with one command per kind."""
    for kind in kinds.KINDS.values():
        app.command(kind.name, help=escape(kind.summary))(
            command(kind, probe_table(kind), ProbeOptions, run_probe)
        )
    hessian_app = typer.Typer(help=HESSIAN_HELP, no_args_is_help=True)
    app.add_typer(hessian_app, name="hessian")
    for kind in (k for k in kinds.KINDS.values() if k.curvature):
        hessian_app.command(
            kind.name,
            help=escape(
                f"Curvature at init of the net of `sigprop {kind.name}` (same net options), with a "
                "10-way linear head and cross-entropy; per init, mean ± sd over --seeds draws."
            ),
        )(command(kind, HESSIAN_OPTIONS, HessianOptions, run_hessian, "hessian"))
    spectrum_app = typer.Typer(help=SPECTRUM_HELP, no_args_is_help=True)
    app.add_typer(spectrum_app, name="spectrum")
    for kind in kinds.KINDS.values():
        spectrum_app.command(
            kind.name,
            help=escape(
                f"The input-output Jacobian's singular values of the net of `sigprop {kind.name}` (same net "
                "options), exactly at a few inputs, per init and draw, beside the large-width theory."
            ),
        )(command(kind, SPECTRUM_OPTIONS, SpectrumOptions, run_spectrum, "spectrum"))
