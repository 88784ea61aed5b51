"""The probe commands, one per net kind (``sigprop mlp``, ``sigprop resnet``, ...): made from each
kind's declaration (sigprop/kinds/), they build the spec, run the core with a progress bar,
render, plot and apply --check.  No kind is named here."""

from __future__ import annotations

import typer
from rich.markup import escape

from sigprop import kinds, report
from sigprop.cli import common
from sigprop.cli.common import _banner, _plot_target, announce
from sigprop.cli.options import (
    ProbeOptions,
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


def _point_path(path, label: str):
    """A sweep point's own file beside ``path``: ``d.png`` -> ``d-depth=10.png``."""
    label = "-".join(label.split())
    safe = "".join(c if c.isalnum() or c in "=._-," else "_" for c in label)
    return path.with_name(f"{path.stem}-{safe}{path.suffix}")


def run_probe(kind: kinds.Kind, spec, opts: ProbeOptions) -> None:
    """Validate the output targets, run the core with a progress bar, render, plot, apply --check.
    A spec that is a sweep (``kind.expand``: ``--arg depth=10,20``) runs once per configuration:
    a table each and a summary, or one JSON line each; figures beside --plot, one each."""
    probe, gate = opts.probe, opts.gate
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
        for path in plots + ([_point_path(opts.plot, "all")] if len(points) > 1 else []):
            plot_mod.check_target(path)

    api = common.core()  # the lazy torch import at the CLI's edge: --help never loads it

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
                on_start=announce(banner, samples=probe.samples),
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
    if plot_mod is not None and len(points) > 1:  # the configurations side by side
        both = _point_path(opts.plot, "all")
        plot_mod.compare_figure(labels, results, both)
        _say(f"sigprop: wrote {both}")
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


def register(app: typer.Typer) -> None:
    """One probe command per registered kind."""
    for kind in kinds.KINDS.values():
        app.command(kind.name, help=escape(kind.summary))(
            command(kind, probe_table(kind), ProbeOptions, run_probe)
        )
