"""The other commands: ``check``, ``sweep``, ``plot``, ``rerun``, ``theory``, ``inits``, ``cite``,
``env``.  Each parses, calls the library and renders."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from sigprop import inits, report, specs
from sigprop.errors import SigpropError
from sigprop.cli._app import app
from sigprop.cli.options import Argument, Option, AnyInitName, Arch, CheckFormat, CorrelationOpt, DType, Format, PairsOpt, TableFormat
from sigprop.cli.output import _check_output_target, _say, _stderr, render, render_rich, write_output


@app.command()
def cite(
    init: Annotated[Optional[list[AnyInitName]], Option(help="Only the papers behind this init (repeatable). [default: every init]")] = None,
) -> None:
    """Print BibTeX of the papers behind sigprop and its init schemes."""
    from sigprop import citations

    names = [i.value for i in init] if init else None
    keys = citations.keys_for({n: s.cites for n, s in inits.INITS.items()}, names)
    write_output("\n\n".join(citations.BIBTEX[k] for k in keys) + "\n", None)


@app.command()
def env() -> None:
    """Versions, device, dtype and thread counts: paste this into a bug report."""
    from sigprop import environment  # imports torch: it reports on it

    rows = environment.gather()
    width = max(len(k) for k, _ in rows)
    write_output("\n".join(f"{k:{width}s} {v}" if k else v for k, v in rows) + "\n", None)




@app.command()
def sweep(
    arch: Annotated[Arch, Argument(help="mlp, resnet, cnn or wrn.")],
    out: Annotated[Path, Option(help="JSON-lines file: one line per configuration, appended; existing ones are skipped.")],
    depth: Annotated[Optional[list[str]], Option(help="MLP/CNN depths, comma-separated or repeated. [default: 10,20,50]")] = None,
    blocks: Annotated[Optional[list[str]], Option(help="ResNet/WRN blocks, comma-separated or repeated. [default: 10,40,100; WRN 1,16]")] = None,
    width: Annotated[Optional[list[str]], Option(help="Widths, comma-separated or repeated (ResNet: residual and hidden width; CNN: channels; WRN: the widening k). [default: 128,512; CNN 32,64; WRN 1]")] = None,
    init: Annotated[Optional[list[str]], Option(help="Inits, comma-separated or repeated. [default: proposed,he]")] = None,
    input_dim: Annotated[Optional[int], Option("--input-dim", min=1, help="MLP input dimension n_0. [default: the swept width]")] = None,
    samples: Annotated[int, Option(min=1, help="Random inputs (and error vectors) N.")] = 1000,
    seed: Annotated[int, Option(min=0, help="Base seed.")] = 0,
    seeds: Annotated[int, Option(min=1, help="Independent weight draws S per configuration.")] = 1,
    device: Annotated[str, Option(help="auto, cpu, cuda or cuda:K.")] = "auto",
    dtype: Annotated[DType, Option(help="Floating-point type of the probe.")] = DType.float32,
    correlation: CorrelationOpt = None,
    pairs: PairsOpt = 256,
    curvature: Annotated[bool, Option("--curvature", help="Measure the curvature at init (sigprop hessian: log10 spectral norm "
                                                               "of the loss Hessian per point, --seeds draws) instead of probing.")] = False,
) -> None:
    """Run a grid of probes (depth or blocks x width x init), appending one JSON line per configuration; resumes."""
    from sigprop import sweep as sweep_mod

    kind = arch.value
    by_depth = kind in ("mlp", "cnn")
    wrong = ("blocks", blocks) if by_depth else ("depth", depth)
    if wrong[1] is not None:
        right = "--depth" if by_depth else "--blocks"
        raise SigpropError(f"does not apply to sweep {kind}; use {right}", field=wrong[0])
    if kind != "mlp" and input_dim is not None:
        raise SigpropError(f"--input-dim does not apply to sweep {kind} (only the MLP's input is set apart from the swept width)",
                           field="input_dim")
    joined = lambda values, default: ",".join(values) if values else default
    if by_depth:
        sizes = sweep_mod.parse_ints(joined(depth, "10,20,50"), "depth")
    else:
        sizes = sweep_mod.parse_ints(joined(blocks, "1,16" if kind == "wrn" else "10,40,100"), "blocks")
    widths = sweep_mod.parse_ints(joined(width, {"cnn": "32,64", "wrn": "1"}.get(kind, "128,512")), "width")
    names = sweep_mod.parse_inits(joined(init, "proposed,he"), kind)
    probe = specs.ProbeSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype.value,
                            correlations=specs.parse_cosines(correlation or []), pairs=pairs)
    hs = None
    if curvature:
        if probe.correlations:
            raise SigpropError("--curvature measures no cosine; drop --correlation", field="correlation")
        hs = specs.HessianSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype.value)
    points = sweep_mod.grid(kind, sizes, widths, names, probe, input_dim, hs)
    target = _check_output_target(out)
    if target is not None and target.exists() and not target.is_file():
        raise SigpropError(f"{out} is not a regular file", field="out")
    done = sweep_mod.done_keys(out)
    todo = [p for p in points if p.key not in done]
    _say(f"sigprop sweep: {len(points)} configuration(s), {len(points) - len(todo)} already in {out}, {len(todo)} to run")

    import time

    from sigprop import api  # imports torch

    prog = None
    if sys.stderr.isatty() and todo:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=_stderr(), transient=True)
        task = prog.add_task("sweep", total=len(todo))
        prog.start()
    try:
        for i, point in enumerate(todo, 1):
            if prog is not None:
                prog.update(task, description=point.label())
            t0 = time.perf_counter()
            result = api.probe(point.spec, point.probe) if hs is None else api.hessian(point.spec, hs)
            row = sweep_mod.row(point, result, time.perf_counter() - t0)
            sweep_mod.append(out, row)
            if hs is None:
                fwd = row["end_to_end"]["forward"]["log10_mean"]
                cos = "".join(f", cosine {c['c0']:g} -> {c['end_mean']:.3f}" for c in row.get("correlation", []))
                what = f"forward {report.fmt_log10(fwd)}{cos}"
            else:
                m = row["curvature"]["log10_spectral_norm_mean"]
                what = "curvature diverged" if m is None else f"log10 spectral norm {m:.2f}"
            line = f"sweep [{i}/{len(todo)}] {point.label()}: {what} ({row['seconds']:.1f} s)"
            if prog is not None:
                prog.advance(task)
                prog.console.print(line, markup=False, highlight=False)
            else:
                _say(line)
    finally:
        if prog is not None:
            prog.stop()


@app.command("plot")
def plot_cmd(
    results: Annotated[Path, Argument(help="A sweep's JSON-lines file.", metavar="RESULTS")],
    out: Annotated[Path, Option(help="The figure: .png, .svg or .pdf.")],
    x: Annotated[str, Option(help="x axis: depth, blocks or width.")] = "depth",
    direction: Annotated[str, Option(help="forward or backward end-to-end ratio, or correlation: the last state's mean cosine "
                                                "of input pairs (a sweep run with --correlation), or curvature: the log10 spectral "
                                                "norm of the loss Hessian (a sweep run with --curvature).")] = "forward",
) -> None:
    """Draw a sweep: end-to-end ratio (or cosine) against depth (or width), one line per init (needs the plot extra: pip install sigprop[plot])."""
    from sigprop import plot as plot_mod
    from sigprop import sweep as sweep_mod

    if direction not in ("forward", "backward", "correlation", "curvature"):
        raise SigpropError(f"expected forward, backward, correlation or curvature, got {direction!r}", field="direction")
    plot_mod.check_target(out, "out")
    rows = sweep_mod.read_rows(results)
    if direction == "correlation" and not any(r.get("correlation") for r in rows):
        raise SigpropError("these rows measured no cosine; run the sweep with --correlation C0", field="direction")
    if (direction == "curvature") != all("curvature" in r for r in rows):
        raise SigpropError("a --curvature sweep plots with --direction curvature, and only it" if direction != "curvature" else
                           "these rows measured no curvature; run the sweep with --curvature", field="direction")
    if x not in ("depth", "blocks", "width") or not sweep_mod.axis_values(rows, x):
        keys = [k for k in ("depth", "blocks", "width") if sweep_mod.axis_values(rows, k)]
        raise SigpropError(f"no {x!r} in these rows; choose from {', '.join(keys)}", field="x")
    plot_mod.sweep_figure(rows, x, out, direction)
    _say(f"sigprop: wrote {out}")


@app.command()
def rerun(
    result: Annotated[Path, Argument(help="A result of sigprop mlp/resnet --format json.", metavar="RESULT")],
    fmt: Annotated[Format, Option("--format", help="Output format of the new run.")] = Format.table,
    output: Annotated[Optional[Path], Option(help="Write the new run's output to this file (whole, never half).")] = None,
) -> None:
    """Run a recorded result again (its config, seed, device, threads) and compare: exit 0 identical, 1 different."""
    import json

    from sigprop.results import rerun_differences

    _check_output_target(output)
    try:
        doc = json.loads(result.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SigpropError(f"cannot read {result}: {exc.strerror or exc}", field="result") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SigpropError(f"{result} is not JSON: {exc}", field="result") from None

    from sigprop import api  # imports torch

    new = api.rerun(doc, on_start=lambda env: _say(
        f"sigprop rerun: {doc.get('command')} from {result} on {env['device']} ({report.count(env['threads'], 'thread')})"))
    render(new, fmt, output)
    count, diffs, moved = rerun_differences(doc, new)
    if moved:
        _say("sigprop rerun: note: " + ", ".join(f"{k} was {a!r}, now {b!r}" for k, a, b in moved))
    if diffs:
        where, a, b = diffs[0]
        _say(f"sigprop rerun: DIFFERENT: {len(diffs)} of {count} numbers differ; first at runs{where[where.find('['):] if where.startswith('[') else '.' + where}: {a!r} -> {b!r}")
        raise typer.Exit(1)
    _say(f"sigprop rerun: reproduced: all {count} numbers identical")




@app.command()
def check(
    file: Annotated[
        Optional[Path],
        Argument(help="TOML file of [checks.NAME] (or [tool.sigprop.checks.NAME]) tables. [default: ./pyproject.toml, else ./sigprop.toml]"),
    ] = None,
    fmt: Annotated[CheckFormat, Option("--format", help="text: one line per check and init, then a summary; json: one document.")] = CheckFormat.text,
    output: Annotated[Optional[Path], Option(help="Write the report to this file (whole, never half).")] = None,
    junit: Annotated[Optional[Path], Option(help="Also write a JUnit XML report here (for CI test panels).")] = None,
) -> None:
    """Run named probe configurations with expectations from TOML: exit 0 all met, 1 one not met, 2 bad config."""
    from sigprop import checks as checks_mod

    _check_output_target(output)
    if junit is not None:
        try:
            _check_output_target(junit)
        except SigpropError as exc:
            raise SigpropError(str(exc.args[0]), field="junit") from None
    path, table = checks_mod.find_config(file, Path.cwd())
    entries = checks_mod.load(path, table)
    _say(f"sigprop check: {len(entries)} check(s) from {path}")

    from sigprop import api  # imports torch

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


@app.command()
def theory(
    n: Annotated[Optional[list[int]], Option("--n", min=2, help="n for K_n (repeatable). Default: 2, 3, 10, 100, 1000, 10^6, 10^7.")] = None,
    blocks: Annotated[Optional[list[int]], Option("--blocks", min=1, help="Residual blocks B (repeatable). Default: 1, 2, 10, 40, 100, 1000.")] = None,
    fmt: Annotated[TableFormat, Option("--format", help="Output format.")] = TableFormat.table,
    output: Annotated[Optional[Path], Option(help="Write the output to this file.")] = None,
) -> None:
    """K_n of Theorem 1 (closed form and quadrature) and the ResNet ratio (1 + 1/B)^{B/2}."""
    from sigprop.front import theory_table

    result = theory_table(n, blocks)
    if fmt is TableFormat.json:
        write_output(report.to_json(result), output)
    else:
        render_rich(lambda console: report.render_theory(result, console), output)


@app.command("inits")
def list_inits() -> None:
    """List the init schemes with a one-line description and the paper they come from."""
    rows = [(s.name, s.description, s.paper) for s in inits.INITS.values()]
    report.render_inits(rows, Console())
