"""``sigprop sweep`` and ``sigprop plot``: the options of a sweep over every kind that sweeps (the loop
is the library's, sigprop/sweeps/), and its figure."""

from __future__ import annotations

import enum
import inspect
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from sigprop import files, kinds, report, specs, sweeps
from sigprop.cli import common
from sigprop.cli._app import add_family
from sigprop.cli.options import (
    Argument,
    Option,
    _hidden,
    cli_values,
    declared_table,
)
from sigprop.cli.output import _say, _stderr
from sigprop.errors import SigpropError
from sigprop.sweeps.cluster import parse_resources


def P(name: str, annotation, default) -> inspect.Parameter:
    """A keyword-only parameter of a built command."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _size_parameters(swept, kind) -> list[inspect.Parameter]:
    """The size axis of every swept kind (``SweepAxes.size``: --depth, --blocks), its help
    ``kind``'s alone where it is ``kind``'s."""
    out = []
    for size in dict.fromkeys(k.sweep_axes.size for k in swept):
        which = [k for k in swept if k.sweep_axes.size == size]
        which = [kind] if kind in which else which
        defaults = "; ".join(f"{k.name} {k.sweep_axes.sizes}" for k in which)
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


#: --measure's and --executor's choices: the library's names (``sweeps.MEASURES``, the built-in
#: executors of ``sweeps.EXECUTORS``)
Measure = enum.Enum("Measure", {m: m for m in sweeps.MEASURES}, type=str)
Executor = enum.Enum("Executor", {e: e for e in sweeps.EXECUTORS}, type=str)


def _probe_parameters(kind) -> list[inspect.Parameter]:
    """What each point measures, with which options."""
    taken = declared_table([o for o in specs.probe_options() if o.sweep], "probe", _changes(kind))
    return (
        [
            P(
                "measure",
                Annotated[
                    Measure,
                    Option(
                        help="What each point measures: probe (the kind's command), hessian (the curvature "
                        "at init, as sigprop hessian) or spectrum (the input-output Jacobian's singular "
                        "values, as sigprop spectrum)."
                    ),
                ],
                Measure.probe,
            ),
        ]
        + [P(*row) for row in taken]
        + [
            P(
                "curvature",
                Annotated[
                    bool,
                    Option(
                        "--curvature",
                        help="The same as --measure hessian (0.12's flag; deprecated, removed in 0.19.0).",
                    ),
                ],
                False,
            ),
        ]
    )


def _changes(kind) -> dict:
    """The probe options as ``sigprop sweep`` takes them: its samples default to the measurement's."""
    probe, spectrum = (sweeps.default_samples(kind, m) for m in ("probe", "spectrum"))
    return {"samples": {"default": None, "shown": f"{probe}; --measure spectrum {spectrum}"}}


def _executor_parameters() -> list[inspect.Parameter]:
    """Where the points run (sigprop/sweeps/: here, or on a Dask cluster)."""
    return [
        P(
            "executor",
            Annotated[
                Executor,
                Option(
                    help="local: here, one point after the other; dask: on a Dask cluster, one point per "
                    "task (--workers N or --scheduler ADDRESS; pip install 'sigprop[cluster]')."
                ),
            ],
            Executor.local,
        ),
        P(
            "workers",
            Annotated[
                Optional[int], Option(min=1, help="--executor dask: a local cluster of N worker processes.")
            ],
            None,
        ),
        P(
            "scheduler",
            Annotated[
                Optional[str],
                Option(help="--executor dask: the address of a running Dask scheduler, tcp://HOST:PORT."),
            ],
            None,
        ),
        P(
            "scheduler_file",
            Annotated[
                Optional[str],
                Option(
                    "--scheduler-file",
                    help="--executor dask: the JSON file a running scheduler wrote its address to (dask "
                    "scheduler --scheduler-file PATH, as an HPC batch job starts one); waited for up to "
                    "--worker-wait.",
                ),
            ],
            None,
        ),
        P(
            "worker_threads",
            Annotated[
                Optional[int],
                Option(
                    "--worker-threads",
                    min=1,
                    help="--executor dask --workers: torch threads per worker process. [default: 1]",
                ),
            ],
            None,
        ),
    ] + _queue_parameters()


def _queue_parameters() -> list[inspect.Parameter]:
    """What the points ask of a cluster, how long to wait for one, and which part of the grid
    runs here."""
    return [
        P(
            "resources",
            Annotated[
                Optional[str],
                Option(
                    help="--executor dask: what each point asks of a worker, NAME=AMOUNT (GPU=1: one point "
                    "per GPU; a local cluster's worker i gets GPU i)."
                ),
            ],
            None,
        ),
        P(
            "shard",
            Annotated[
                Optional[str],
                Option(
                    help="Run the i-th of N disjoint parts of the grid, i/N with 0 <= i < N (a SLURM "
                    "array task's $SLURM_ARRAY_TASK_ID/N), into its own --out; sigprop sweep merge joins "
                    "the parts.",
                ),
            ],
            None,
        ),
        P(
            "worker_wait",
            Annotated[
                Optional[float],
                Option(
                    "--worker-wait",
                    help="--executor dask: seconds to wait for a worker -- the first to join, and whenever "
                    "none is left or none offers --resources -- before stopping in one line (the points "
                    "done are kept). [default: 60]",
                ),
            ],
            None,
        ),
        P(
            "wait_workers",
            Annotated[
                Optional[int],
                Option(
                    "--wait-workers",
                    min=1,
                    help="--scheduler/--scheduler-file: workers to wait for before the points are sent "
                    "(a queue starts its jobs over minutes), up to --worker-wait; fewer by then: the "
                    "sweep runs on those. [default: 1]",
                ),
            ],
            None,
        ),
    ]


def _model_parameters() -> list[inspect.Parameter]:
    """A model's sweep (``sigprop sweep module TARGET``): its --arg values and input shapes."""
    return [
        P(
            "arg",
            Annotated[
                Optional[list[str]],
                Option(
                    "--arg",
                    help="module: a keyword argument of TARGET, name=value (repeatable); a bare comma list "
                    "sweeps (depth=10,20,50), several such items: every combination.",
                ),
            ],
            None,
        ),
        P(
            "input_shape",
            Annotated[
                Optional[list[str]],
                Option(
                    "--input-shape",
                    help="module: the input's shape without the batch (3,64,64); repeat to sweep shapes.",
                ),
            ],
            None,
        ),
        P(
            "sites",
            Annotated[Optional[str], Option(help="module: where to measure (sigprop module's).")],
            None,
        ),
        P("vocab", Annotated[Optional[int], Option(min=1, help="module: token ids below VOCAB.")], None),
        P(
            "config",
            Annotated[
                Optional[str],
                Option(
                    help="module, instead of TARGET: a Hugging Face config.json (sigprop module's); --arg "
                    "then sweeps its fields (num_hidden_layers=4,8)."
                ),
            ],
            None,
        ),
    ]


def _sweep_parameters(kind: kinds.Kind) -> list[inspect.Parameter]:
    """``sigprop sweep KIND``'s options: a model's TARGET (an argument), the axes the kind sweeps
    (``Kind.sweep_fields``: its size axis -- --depth, --blocks --, the widths, an MLP's input
    dimension; a model's --arg, --input-shape, --sites, --vocab), the inits, what is measured and
    where the points run.  The other kinds' axes are parsed but left out of the help
    (``_hidden``), so that one given is refused with what this kind takes instead."""
    swept = [k for k in kinds.KINDS.values() if k.sweep_axes is not None]
    sized = [k for k in swept if "width" in k.sweep_fields()]
    out = [
        inspect.Parameter(
            "target",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=None,
            annotation=Annotated[
                Optional[str],
                Argument(
                    help="The model, MODULE:CALLABLE or FILE.py:CALLABLE.",
                    show_default=False,
                    hidden="target" not in kind.sweep_fields(),
                ),
            ],
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
    out += _size_parameters(sized, kind)
    described = [kind] if kind in sized else sized  # the help speaks of this kind where it sweeps widths
    widths = "; ".join(f"{k.name}: {k.sweep_axes.width_help}" for k in described)
    defaults = "; ".join(f"{k.name} {k.sweep_axes.widths}" for k in described)
    with_input = [k.name for k in sized if k.sweep_axes.input_dim]
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
                Optional[list[str]],
                Option(help="Inits, comma-separated or repeated. [default: proposed,he; a model as-is]"),
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
    out += _model_parameters()
    own = set(kind.sweep_fields())
    out = [p if p.name in own or p.name in ("target", "out", "init") else _hidden(p) for p in out]
    return out + _probe_parameters(kind) + _executor_parameters()


class _Progress:
    """The sweep's progress on stderr: a bar with the points done, running and failed and the
    time left (a terminal), else one line per point."""

    def __init__(self, out: Path, slots: int):
        self.out, self.slots, self.prog, self.task = out, slots, None, None
        #: the executor's count of the points running now (``running(left)``)
        self.running = None
        self.failed = self.refused = self.done = 0

    def plan(self, total: int, to_run: int) -> None:
        _say(
            f"sigprop sweep: {total} configuration(s), {total - to_run} already in {self.out}, "
            f"{to_run} to run"
        )
        if sys.stderr.isatty() and to_run:
            self.prog = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[state]}"),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                console=_stderr(),
                transient=True,
            )
            self.task = self.prog.add_task("sweep", total=to_run, state=self._state(0, to_run))
            self.prog.start()

    def _state(self, done: int, total: int) -> str:
        running = self.running(total - done) if self.running else min(self.slots, total - done)
        return f"running {running}, failed {self.failed}"

    def point(self, i: int, n: int, point, line: dict) -> None:
        self.failed += "error" in line
        self.refused += bool(line.get("refused"))
        self.done += 1
        text = report.point_line(i, n, point.label(), line)
        if self.prog is not None:
            self.prog.update(self.task, advance=1, state=self._state(i, n))
            self.prog.console.print(text, markup=False, highlight=False)
        else:
            _say(text)

    def stop(self) -> None:
        if self.prog is not None:
            self.prog.stop()


def sweep(
    kind: kinds.Kind,
    out: Path,
    target=None,
    width=None,
    init=None,
    input_dim=None,
    arg=None,
    input_shape=None,
    sites=None,
    vocab=None,
    config=None,
    measure=Measure.probe,
    curvature=False,
    executor=Executor.local,
    shard=None,
    **sizes,
) -> None:
    """Run a grid (size x width x init; a model's --arg values x input shapes x init), one JSON line per
    point, here or on a Dask cluster; resumes.  ``sizes``: the kind's axes, the probe options
    ``sigprop sweep`` takes (``specs.probe_options``: ``sweep``) and the executor's
    (``sweeps.EXECUTOR_OPTIONS``)."""
    what = measure.value
    if curvature:
        if measure not in (Measure.probe, Measure.hessian):
            raise SigpropError(f"is --measure hessian; not with --measure {what}", field="curvature")
        _say("note: --curvature is deprecated since 0.17.0, removed in 0.19.0; use --measure hessian")
        what = "hessian"
    taken = [o for o in specs.probe_options() if o.sweep]
    values = cli_values(taken, {o.name: sizes.pop(o.name, None) for o in taken})
    probe, _ = specs.probe_specs({"samples": sweeps.default_samples(kind, what), **values})
    options = {name: sizes.pop(name, None) for name in sweeps.EXECUTOR_OPTIONS}
    given = {**sizes, "width": width, "input_dim": input_dim, "target": target, "arg": arg}
    given |= {"input_shape": input_shape, "sites": sites, "vocab": vocab, "config": config}
    api = common.core()  # the lazy torch import at the CLI's edge

    options["resources"] = parse_resources(options["resources"])
    points = api.sweep_points(kind.name, init, probe, what, **given)  # every refusal before a worker starts
    if shard is not None:
        points = sweeps.start_shard(out, points, shard)
    chosen = api.sweep_executor(executor.value, **options)  # checked: what follows is no refusal of them
    chosen.say = lambda text: _say(f"sigprop sweep: {text}")
    workers = options["workers"]
    if workers is not None:  # its processes take seconds to start, each loading torch
        _say(f"sigprop sweep: starting a local cluster of {workers} worker process(es) ...")
    with chosen as ex:
        progress = _Progress(out, ex.slots)
        progress.running = ex.running
        if executor.value == "dask":
            _say(f"sigprop sweep: on {ex.describe()}")
        for note in ex.notes:
            _say(f"sigprop sweep: note: {note}")
        try:
            sweeps.run(points, out, api.measure_point, progress.plan, progress.point, ex, shard is not None)
        finally:
            progress.stop()
    if progress.failed:
        _say(
            f"sigprop sweep: {progress.failed} point(s) failed (their lines in {out} say why; a rerun "
            "measures them again)"
        )
        # every point refused its input (a device, a memory bound): bad input, as a probe's refusal
        raise typer.Exit(2 if progress.refused == progress.done else 1)


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
    rows, arg_axes = sweeps.plot_rows(sweeps.read_rows(results))
    if any("spectrum" in r for r in rows):
        raise SigpropError(
            "a --measure spectrum sweep is not drawn yet: its lines hold the spectrum's summaries "
            "(sigprop spectrum --plot draws one configuration)",
            field="results",
        )
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
    axes = [
        *dict.fromkeys(
            k.sweep_axes.size for k in kinds.KINDS.values() if k.sweep_axes and "width" in k.sweep_fields()
        )
    ]
    axes = list(dict.fromkeys([*axes, "width", *arg_axes]))
    if x not in axes or not sweeps.axis_values(rows, x):
        keys = [k for k in axes if sweeps.axis_values(rows, k)]
        raise SigpropError(f"no {x!r} in these rows; choose from {', '.join(keys)}", field="x")
    plot_mod.sweep_figure(rows, x, out, direction, others=arg_axes)
    _say(f"sigprop: wrote {out}")


SWEEP_HELP = (
    "Run a grid (size x width x init; a model's --arg values x input shapes x init), one JSON line per "
    "point, here or on a Dask cluster; resumes. One command per net kind: sigprop sweep KIND --help "
    "lists what that kind sweeps."
)


def _kind_sweep(kind: kinds.Kind):
    """``sigprop sweep KIND``: ``sweep`` for this kind, its signature ``_sweep_parameters``'s."""

    def run_sweep(**kw) -> None:
        sweep(kind, **kw)

    run_sweep.__signature__ = inspect.Signature(_sweep_parameters(kind))
    return run_sweep


def merge_cmd(
    out: Annotated[Path, Argument(help="The merged sweep's JSON-lines file (a new file).", metavar="OUT")],
    parts: Annotated[
        list[Path], Argument(help="The parts' files (sigprop sweep ... --shard i/N).", metavar="PARTS")
    ],
) -> None:
    """Join the parts of a sweep run with --shard i/N into one file: every point once (a point in two parts
    is refused), the points no part holds listed (exit 1)."""
    files.check_target(out, "merged")
    rows, missing = sweeps.merge(out, parts)
    _say(f"sigprop sweep merge: {rows} point(s) from {len(parts)} part(s) into {out}")
    if missing:
        shown = "; ".join(missing[:10]) + (f"; and {len(missing) - 10} more" if len(missing) > 10 else "")
        _say(
            f"sigprop sweep merge: {len(missing)} missing: {shown} (rerun their parts, or the whole "
            f"sweep on {out})"
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """``sigprop sweep`` with one command per kind that sweeps, from the kinds registered now, and
    ``sigprop sweep merge``."""
    family = add_family(
        app,
        "sweep",
        SWEEP_HELP,
        [k for k in kinds.KINDS.values() if k.sweep_axes is not None],
        lambda kind: f"Sweep the net of `sigprop {kind.name}` over a grid of its options and inits.",
        _kind_sweep,
    )
    family.command("merge")(merge_cmd)
