"""``sigprop sweep`` and ``sigprop plot``: the options of a sweep over every kind that sweeps (the loop
is the library's, sigprop/sweep.py), and its figure."""

from __future__ import annotations

import enum
import inspect
import sys
from pathlib import Path
from typing import Annotated, Optional

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sigprop import kinds, report, specs
from sigprop import sweep as sweep_mod
from sigprop.cli.options import (
    Argument,
    CorrelationOpt,
    DType,
    Option,
    PairsOpt,
)
from sigprop.cli.output import _say, _stderr
from sigprop.errors import SigpropError


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


def prepare() -> None:
    """``sweep``'s signature from the kinds registered now (``_sweep_parameters``)."""
    sweep.__signature__ = inspect.Signature(_sweep_parameters())
    sweep.__annotations__ = {p.name: p.annotation for p in sweep.__signature__.parameters.values()}
