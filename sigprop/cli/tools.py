"""The other commands: ``check``, ``sweep``, ``plot``, ``rerun``, ``theory``, ``inits``, ``cite``,
``env``.  Each parses, calls the library and renders."""

from __future__ import annotations

import enum
import inspect
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sigprop import checks as checks_mod
from sigprop import citations, inits, kinds, report, specs
from sigprop import sweep as sweep_mod
from sigprop import theory as theory_mod
from sigprop.cli.options import (
    Argument,
    CheckFormat,
    CorrelationOpt,
    DType,
    Format,
    Option,
    PairsOpt,
    TableFormat,
)
from sigprop.cli.output import _check_output_target, _say, _stderr, render, render_rich, write_output
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


def P(name: str, annotation, default) -> inspect.Parameter:
    """A keyword-only parameter of a built command."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _size_parameters(swept) -> list[inspect.Parameter]:
    """The size axis of every swept kind (``Kind.sweep_size``: --depth, --blocks)."""
    out = []
    for size in dict.fromkeys(k.sweep_size for k in swept):
        which = [k for k in swept if k.sweep_size == size]
        defaults = "; ".join(f"{k.name} {k.sweep_sizes}" for k in which)
        out.append(
            P(
                size,
                Annotated[
                    Optional[list[str]],
                    Option(
                        help=f"The {size} of {', '.join(k.name for k in which)}, comma-separated or "
                        f"repeated. [default: {defaults}]"
                    ),
                ],
                None,
            )
        )
    return out


def _probe_parameters() -> list[inspect.Parameter]:
    """The probe's options of a sweep, and --curvature."""
    return [
        P(
            "samples",
            Annotated[int, Option(min=1, help="Random inputs (and error vectors) N.")],
            specs.ProbeSpec.samples,
        ),
        P("seed", Annotated[int, Option(min=0, help="Base seed.")], 0),
        P("seeds", Annotated[int, Option(min=1, help="Independent weight draws S per configuration.")], 1),
        P("device", Annotated[str, Option(help="auto, cpu, cuda or cuda:K.")], "auto"),
        P("dtype", Annotated[DType, Option(help="Floating-point type of the probe.")], DType.float32),
        P("correlation", CorrelationOpt, None),
        P("pairs", PairsOpt, 256),
        P(
            "curvature",
            Annotated[
                bool,
                Option(
                    "--curvature",
                    help="Measure the curvature at init (sigprop hessian: log10 "
                    "spectral norm of the loss Hessian per point, --seeds "
                    "draws) instead of probing.",
                ),
            ],
            False,
        ),
    ]


def _sweep_parameters() -> list[inspect.Parameter]:
    """``sigprop sweep``'s options: the kind (an argument), the size axis of every kind
    (``Kind.sweep_size``: --depth, --blocks), the widths, the inits and the probe's options."""
    swept = [k for k in kinds.KINDS.values() if k.sweeps]
    arch = enum.Enum("sweep_kind", {k.name: k.name for k in swept}, type=str)
    out = [
        inspect.Parameter(
            "arch",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=Annotated[arch, Argument(help=f"The net kind: {', '.join(k.name for k in swept)}.")],
        ),
        P(
            "out",
            Annotated[
                Path,
                Option(
                    help="JSON-lines file: one line per configuration, appended; existing ones are skipped."
                ),
            ],
            inspect.Parameter.empty,
        ),
    ]
    out += _size_parameters(swept)
    widths = "; ".join(f"{k.name}: {k.sweep_width_help}" for k in swept)
    defaults = "; ".join(f"{k.name} {k.sweep_widths}" for k in swept)
    with_input = [k.name for k in swept if k.sweep_input_dim]
    out += [
        P(
            "width",
            Annotated[
                Optional[list[str]],
                Option(help=f"Widths, comma-separated or repeated ({widths}). [default: {defaults}]"),
            ],
            None,
        ),
        P(
            "init",
            Annotated[
                Optional[list[str]], Option(help="Inits, comma-separated or repeated. [default: proposed,he]")
            ],
            None,
        ),
        P(
            "input_dim",
            Annotated[
                Optional[int],
                Option(
                    "--input-dim",
                    min=1,
                    help=f"The input dimension n_0 of "
                    f"{', '.join(with_input) or 'no kind'}. [default: the swept width]",
                ),
            ],
            None,
        ),
    ]
    return out + _probe_parameters()


def sweep(
    arch,
    out: Path,
    width=None,
    init=None,
    input_dim=None,
    samples=1000,
    seed=0,
    seeds=1,
    device="auto",
    dtype=DType.float32,
    correlation=None,
    pairs=256,
    curvature=False,
    **sizes,
) -> None:
    """Run a grid of probes (size x width x init; the size is depth or blocks, as the kind grows), one JSON
    line per configuration; resumes."""
    probe = specs.ProbeSpec(
        samples=samples,
        seed=seed,
        seeds=seeds,
        device=device,
        dtype=dtype.value,
        correlations=specs.parse_cosines(correlation or []),
        pairs=pairs,
    )
    hs = None
    if curvature:
        hs = specs.HessianSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype.value)
    from sigprop import api  # the lazy torch import at the CLI's edge

    prog, task = None, None

    def on_plan(total: int, to_run: int) -> None:
        nonlocal prog, task
        _say(f"sigprop sweep: {total} configuration(s), {total - to_run} already in {out}, {to_run} to run")
        if sys.stderr.isatty() and to_run:
            prog = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=_stderr(),
                transient=True,
            )
            task = prog.add_task("sweep", total=to_run)
            prog.start()

    def on_point(i: int, n: int, point, line: dict) -> None:
        text = report.point_line(i, n, point.label(), line)
        if prog is not None:
            prog.advance(task)
            prog.console.print(text, markup=False, highlight=False)
        else:
            _say(text)

    try:
        api.run_sweep(arch.value, out, sizes, width, init, input_dim, probe, hs, on_plan, on_point)
    finally:
        if prog is not None:
            prog.stop()


def plot_cmd(
    results: Annotated[Path, Argument(help="A sweep's JSON-lines file.", metavar="RESULTS")],
    out: Annotated[Path, Option(help="The figure: .png, .svg or .pdf.")],
    x: Annotated[str, Option(help="x axis: the sweep's size (depth or blocks) or width.")] = "depth",
    direction: Annotated[
        str,
        Option(
            help="forward or backward end-to-end ratio, or correlation: the last state's mean cosine "
            "of input pairs (a sweep run with --correlation), or curvature: the log10 spectral "
            "norm of the loss Hessian (a sweep run with --curvature)."
        ),
    ] = "forward",
) -> None:
    """Draw a sweep: end-to-end ratio (or cosine) against depth (or width), one line per init (needs the plot
    extra: pip install sigprop[plot])."""
    from sigprop import plot as plot_mod  # optional extra (matplotlib)

    if direction not in ("forward", "backward", "correlation", "curvature"):
        raise SigpropError(
            f"expected forward, backward, correlation or curvature, got {direction!r}", field="direction"
        )
    plot_mod.check_target(out, "out")
    rows = sweep_mod.read_rows(results)
    if direction == "correlation" and not any(r.get("correlation") for r in rows):
        raise SigpropError(
            "these rows measured no cosine; run the sweep with --correlation C0", field="direction"
        )
    if (direction == "curvature") != all("curvature" in r for r in rows):
        raise SigpropError(
            "a --curvature sweep plots with --direction curvature, and only it"
            if direction != "curvature"
            else "these rows measured no curvature; run the sweep with --curvature",
            field="direction",
        )
    axes = [*dict.fromkeys(k.sweep_size for k in kinds.KINDS.values()), "width"]
    if x not in axes or not sweep_mod.axis_values(rows, x):
        keys = [k for k in axes if sweep_mod.axis_values(rows, k)]
        raise SigpropError(f"no {x!r} in these rows; choose from {', '.join(keys)}", field="x")
    plot_mod.sweep_figure(rows, x, out, direction)
    _say(f"sigprop: wrote {out}")


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

    from sigprop import api  # the lazy torch import at the CLI's edge

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
    if junit is not None:
        try:
            _check_output_target(junit)
        except SigpropError as exc:
            raise SigpropError(str(exc.args[0]), field="junit") from None
    path, table = checks_mod.find_config(file, Path.cwd())
    entries = checks_mod.load(path, table)
    _say(f"sigprop check: {len(entries)} check(s) from {path}")

    from sigprop import api  # the lazy torch import at the CLI's edge

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
    sweep.__signature__ = inspect.Signature(_sweep_parameters())
    sweep.__annotations__ = {p.name: p.annotation for p in sweep.__signature__.parameters.values()}
    for name, fn in (
        ("sweep", sweep),
        ("plot", plot_cmd),
        ("rerun", rerun),
        ("check", check),
        ("theory", theory),
        ("inits", list_inits),
        ("cite", cite),
        ("env", env),
    ):
        app.command(name, help=escape(inspect.getdoc(fn)))(
            fn
        )  # a bracket in the help is shown, not read as markup
