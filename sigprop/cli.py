"""The ``sigprop`` command line (typer only: parse, build specs, call the core, render).

No tensors here: the engine is imported inside the commands that need it, so ``sigprop --help``,
``sigprop inits`` and ``sigprop theory`` never import torch.  Errors become one line on stderr:
exit 2 for bad input, 1 for a failed ``--check``, 130 for Ctrl-C (see :func:`main`).
"""

from __future__ import annotations

import enum
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from sigprop import __version__, inits, report, specs
from sigprop.errors import SigpropError

try:  # recent typer vendors click as typer._click; older typer uses click itself
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import UsageError

CONTEXT = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="sigprop",
    help="Signal propagation at initialization in weight-normalized MLPs and ResNets, measured beside the theory.",
    context_settings=CONTEXT,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

#: CLI choices come from the registry (a test asserts they match)
InitName = enum.Enum("InitName", {name: name for name in inits.names("mlp")}, type=str)
ResNetInitName = enum.Enum("ResNetInitName", {name: name for name in inits.names("resnet")}, type=str)


class Norm(str, enum.Enum):
    wn = "wn"
    bn = "bn"
    none = "none"


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    csv = "csv"


class DType(str, enum.Enum):
    float32 = "float32"
    float64 = "float64"


Precision = enum.Enum("Precision", {p: p for p in specs.PRECISIONS}, type=str)

#: options shared by mlp and resnet
StreamOpt = Annotated[
    Optional[bool],
    typer.Option("--stream/--no-stream", help="Redraw the weights in the backward pass instead of storing them. [default: only when they would not fit]"),
]
GraphsOpt = Annotated[
    Optional[bool],
    typer.Option("--graphs/--no-graphs", help="Capture each layer's kernels once as a CUDA graph and replay it (CUDA only; checked against the eager step). [default: on with CUDA]"),
]
PlotOpt = Annotated[
    Optional[Path], typer.Option(help="Also draw the Figure-1-style plot to this .png/.svg/.pdf (needs the plot extra: pip install sigprop\\[plot]).")
]
PrecisionOpt = Annotated[
    Precision, typer.Option(help="float32 matmuls on CUDA: fp32 (IEEE) or tf32 (tensor cores; docs/theory.md for its bias).")
]


Gate = enum.Enum("Gate", {g: g for g in specs.GATES}, type=str)
CheckOpt = Annotated[bool, typer.Option("--check", help="Exit 1 unless every init passes the --gate verdict (default: the signal is preserved).")]
GateOpt = Annotated[
    Gate,
    typer.Option(help="What --check asks: preserved (the typical end-to-end ratio lies in --band: the signal survives) "
                      "or theory (it agrees with the init's own finite-width prediction)."),
]
BandOpt = Annotated[
    Optional[str],
    typer.Option(help="LO:HI factors around norm preservation for the 'preserved' verdict; must contain 1. "
                      "[default: 0.1:10 for mlp; 1:1 for resnet, i.e. Theorem 3's [sqrt 2, sqrt e] per stage with its finite-width allowance]"),
]
ThreadsOpt = Annotated[
    Optional[int],
    typer.Option(min=1, help="CPU threads torch may use (recorded in the result). [default: half the cores this process may run on; OMP_NUM_THREADS where set]"),
]


def _gate(gate: Gate, band: Optional[str]) -> specs.GateSpec:
    return specs.GateSpec(gate.value, None if band is None else specs.parse_band(band))


#: Figure 1 (top) of Arpit et al. 2019, appendix A.1: the three schemes compared there
FIGURE1_INITS = ["he", "proposed", "proposed-gaussian"]


def _stderr() -> Console:
    return Console(stderr=True)


def _say(line: str) -> None:
    """One unwrapped line on stderr (rich would wrap long messages at the terminal width)."""
    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()


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
    """Signal propagation at initialization, measured beside the theory."""


def _check_output_target(output: Optional[Path]) -> Optional[Path]:
    """Fail on a bad --output before the run, not after minutes of compute."""
    if output is None:
        return None
    target = output.resolve()
    if target.is_dir():
        raise SigpropError(f"{output} is a directory", option="--output")
    if not target.parent.is_dir():
        raise SigpropError(f"directory {target.parent} does not exist", option="--output")
    return target


def write_output(text: str, output: Optional[Path]) -> None:
    """Write ``text`` to stdout, or whole to ``output`` (temp file + rename: never half a file)."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from sigprop import files

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    files.atomic_write(_check_output_target(output), write)


def render(result, fmt: Format, output: Optional[Path]) -> None:
    if fmt is Format.json:
        write_output(report.to_json(result), output)
    elif fmt is Format.csv:
        write_output(report.to_csv(result), output)
    else:
        render_rich(lambda console: report.render_table(result, console), output)


def render_rich(draw, output: Optional[Path]) -> None:
    """A rich rendering to the terminal, or as plain text (no colour) to ``output``."""
    if output is None:
        # a pipe or file has no width to respect: do not let rich squeeze columns to 80
        draw(Console() if sys.stdout.isatty() else Console(width=120))
        return
    with open(os.devnull, "w") as sink:
        console = Console(record=True, file=sink, width=160, color_system=None)
        draw(console)
    write_output(console.export_text(), output)




def _progress_callback(total_label: str):
    """A rich progress bar on stderr when stderr is a terminal; otherwise nothing.  It names the
    init and the pass running now, and shows elapsed time and the estimate only once a tenth of
    the steps are done (the first layers include one-time setup: an early estimate misleads)."""
    if not sys.stderr.isatty():
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    class _Remaining(TimeRemainingColumn):
        def render(self, task):
            if task.total and task.completed < 0.1 * task.total:
                return TextColumn("estimating").render(task)
            return super().render(task)

    prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    _Remaining(), console=_stderr(), transient=True)
    task = prog.add_task(total_label, total=None)

    def update(done: int, total: int, label: str = "") -> None:
        prog.update(task, completed=done, total=total, description=f"{total_label} {label}".strip())

    return prog, update


@app.command()
def mlp(
    depth: Annotated[int, typer.Option(min=1, help="Number of layers L.")] = 20,
    input_dim: Annotated[int, typer.Option("--input-dim", min=1, help="Input dimension n_0.")] = 500,
    width: Annotated[str, typer.Option(help="Layer width: N, or LO:HI to draw each layer's width uniformly from LO..HI (once per run).")] = "150:250",
    samples: Annotated[int, typer.Option(min=1, help="Random inputs (and error vectors) N.")] = 1000,
    seed: Annotated[int, typer.Option(min=0, help="Base seed of widths, inputs, errors and weights.")] = 0,
    seeds: Annotated[int, typer.Option(min=1, help="Independent weight draws S.")] = 1,
    init: Annotated[
        Optional[list[InitName]], typer.Option(help="Init scheme (repeatable). Default: he, proposed, proposed-gaussian (Figure 1 top).")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:K (auto = CUDA when available).")] = "auto",
    dtype: Annotated[DType, typer.Option(help="Floating-point type of the probe.")] = DType.float32,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    output: Annotated[Optional[Path], typer.Option(help="Write the output to this file (whole, never half).")] = None,
    check: CheckOpt = False,
    gate: GateOpt = Gate.preserved,
    band: BandOpt = None,
    stream: StreamOpt = None,
    precision: PrecisionOpt = Precision.fp32,
    graphs: GraphsOpt = None,
    threads: ThreadsOpt = None,
    plot: PlotOpt = None,
) -> None:
    """Probe a weight-normalized ReLU MLP (Arpit et al. 2019, eq. 1-2): forward and backward norm ratios per layer."""
    names = [i.value for i in init] if init else list(FIGURE1_INITS)
    spec = specs.MLPSpec(depth=depth, input_dim=input_dim, width=specs.WidthSpec.parse(width), inits=tuple(names))
    probe = specs.ProbeSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype.value, stream=stream,
                            precision=precision.value, graphs=graphs)
    _run_probe(
        spec, probe, _gate(gate, band), threads, fmt, output, check, plot,
        lambda env: f"sigprop mlp: device {env['device']} ({env['device_name']}), {env['dtype']}, "
        f"depth {depth}, widths {spec.width} (seed {seed}), {samples} samples x {seeds} draw(s)",
    )


def _run_probe(spec, probe, gate: specs.GateSpec, threads: Optional[int], fmt: Format, output: Optional[Path], check: bool,
               plot: Optional[Path], banner) -> None:
    """Validate the output targets, run the core with a progress bar, render, plot, apply --check."""
    _check_output_target(output)
    if plot is not None:
        from sigprop import plot as plot_mod

        plot_mod.check_target(plot)

    from sigprop import api  # imports torch

    api.set_threads(threads)
    prog, update = _progress_callback("probing")
    if prog is not None:
        prog.start()
    try:
        result = api.probe(spec, probe, progress=update, on_start=lambda env: _say(banner(env)), gate=gate)
    finally:
        if prog is not None:
            prog.stop()
    render(result, fmt, output)
    if plot is not None:
        plot_mod.probe_figure(result, plot)
        _say(f"sigprop: wrote {plot}")
    if check and not result.passed:
        for run in result.runs:
            for c in run.verdict_checks(run.gate):
                if not c.passed:
                    _say(f"sigprop: check failed ({report.VERDICT_WORDS[c.verdict]}): {run.init}: {report.gate_text(c)}")
        raise typer.Exit(1)


@app.command()
def resnet(
    blocks: Annotated[int, typer.Option(min=1, help="Residual blocks per stage B.")] = 40,
    stages: Annotated[int, typer.Option(min=1, help="Stages K; stage k > 1 opens with a WN projection that doubles the width.")] = 1,
    dim: Annotated[int, typer.Option(min=1, help="Residual-stream width of stage 1 (the input dimension) d.")] = 500,
    width: Annotated[
        Optional[str], typer.Option(help="Hidden width inside each block: N, or LO:HI drawn per hidden layer (once per run). [default: 150:250]")
    ] = None,
    block_depth: Annotated[int, typer.Option("--block-depth", min=1, help="D: a block is D x [WN-FC -> ReLU ->] WN-FC.")] = 1,
    norm: Annotated[Norm, typer.Option(help="wn (weight norm), bn (the BN ResNet of De & Smith, appendix C) or none.")] = Norm.wn,
    samples: Annotated[int, typer.Option(min=1, help="Random inputs (and error vectors) N.")] = 1000,
    seed: Annotated[int, typer.Option(min=0, help="Base seed of widths, inputs, errors and weights.")] = 0,
    seeds: Annotated[int, typer.Option(min=1, help="Independent weight draws S.")] = 1,
    init: Annotated[
        Optional[list[ResNetInitName]],
        typer.Option(help="Init scheme (repeatable). Default: he, proposed, proposed-gaussian (Figure 1 bottom); he with --norm none/bn."),
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:K (auto = CUDA when available).")] = "auto",
    dtype: Annotated[DType, typer.Option(help="Floating-point type of the probe.")] = DType.float32,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    output: Annotated[Optional[Path], typer.Option(help="Write the output to this file (whole, never half).")] = None,
    check: CheckOpt = False,
    gate: GateOpt = Gate.preserved,
    band: BandOpt = None,
    stream: StreamOpt = None,
    precision: PrecisionOpt = Precision.fp32,
    graphs: GraphsOpt = None,
    threads: ThreadsOpt = None,
    plot: PlotOpt = None,
) -> None:
    """Probe a residual network h^b = h^{b-1} + alpha F_b(h^{b-1}) (Arpit et al. 2019, eq. 6) state by state."""
    if width is not None and norm is Norm.bn:
        raise SigpropError("the batch-normalized ResNet (De & Smith 2020, appendix C) has no hidden layer; its width is --dim", option="--width")
    if init:
        names = [i.value for i in init]
    else:
        names = list(specs.RESNET_DEFAULT_INITS) if norm is Norm.wn else ["he"]
    spec = specs.ResNetSpec(
        blocks=blocks, stages=stages, dim=dim, width=specs.WidthSpec.parse(width or "150:250"),
        block_depth=block_depth, norm=norm.value, inits=tuple(names),
    )
    probe = specs.ProbeSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype.value, stream=stream,
                            precision=precision.value, graphs=graphs)
    shape = f"{stages} stage(s) x {blocks} blocks, d {dim}"
    shape += f", batch norm" if norm is Norm.bn else f", hidden {spec.width} x {block_depth}, norm {norm.value}"
    _run_probe(
        spec, probe, _gate(gate, band), threads, fmt, output, check, plot,
        lambda env: f"sigprop resnet: device {env['device']} ({env['device_name']}), {env['dtype']}, "
        f"{shape} (seed {seed}), {samples} samples x {seeds} draw(s)",
    )


AnyInitName = enum.Enum("AnyInitName", {name: name for name in inits.names()}, type=str)


@app.command()
def cite(
    init: Annotated[Optional[list[AnyInitName]], typer.Option(help="Only the papers behind this init (repeatable). [default: every init]")] = None,
) -> None:
    """Print BibTeX of the papers behind sigprop and its init schemes."""
    from sigprop import citations

    names = [i.value for i in init] if init else None
    keys = citations.keys_for({n: s.cites for n, s in inits.INITS.items()}, names)
    write_output("\n\n".join(citations.BIBTEX[k] for k in keys) + "\n", None)


@app.command()
def env() -> None:
    """Versions, device, dtype and thread counts: paste this into a bug report."""
    import importlib.metadata as md
    import platform

    def version(pkg: str) -> str:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"

    import torch  # the one command besides the probes that needs it: it reports on it

    lines = [
        f"sigprop      {__version__}",
        f"python       {platform.python_version()} ({platform.python_implementation()}, {sys.executable})",
        f"platform     {platform.platform()}",
        f"cpus         {os.cpu_count()}",
    ]
    lines += [f"{pkg:12s} {version(pkg)}" for pkg in ("torch", "numpy", "scipy", "typer", "rich", "matplotlib")]
    lines += [
        f"torch threads {torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} inter-op",
        f"default dtype {str(torch.get_default_dtype()).replace('torch.', '')} (sigprop probes in float32 unless --dtype)",
        f"cuda         {'available' if torch.cuda.is_available() else 'not available'}"
        + (f", {torch.cuda.device_count()} device(s), CUDA {torch.version.cuda}" if torch.cuda.is_available() else ""),
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            lines.append(f"  cuda:{i}     {torch.cuda.get_device_name(i)}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} free)")
    lines.append(f"--device auto {'cuda' if torch.cuda.is_available() else 'cpu'}")
    lines += [f"{k:12s} {os.environ[k]}" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NO_COLOR") if k in os.environ]
    write_output("\n".join(lines) + "\n", None)


class Arch(str, enum.Enum):
    mlp = "mlp"
    resnet = "resnet"


@app.command()
def sweep(
    arch: Annotated[Arch, typer.Argument(help="mlp or resnet.")],
    out: Annotated[Path, typer.Option(help="JSON-lines file: one line per configuration, appended; existing ones are skipped.")],
    depth: Annotated[Optional[list[str]], typer.Option(help="MLP depths, comma-separated or repeated. [default: 10,20,50]")] = None,
    blocks: Annotated[Optional[list[str]], typer.Option(help="ResNet blocks, comma-separated or repeated. [default: 10,40,100]")] = None,
    width: Annotated[Optional[list[str]], typer.Option(help="Widths, comma-separated or repeated (ResNet: residual and hidden width). [default: 128,512]")] = None,
    init: Annotated[Optional[list[str]], typer.Option(help="Inits, comma-separated or repeated. [default: proposed,he]")] = None,
    input_dim: Annotated[Optional[int], typer.Option("--input-dim", min=1, help="MLP input dimension n_0. [default: the swept width]")] = None,
    samples: Annotated[int, typer.Option(min=1, help="Random inputs (and error vectors) N.")] = 1000,
    seed: Annotated[int, typer.Option(min=0, help="Base seed.")] = 0,
    seeds: Annotated[int, typer.Option(min=1, help="Independent weight draws S per configuration.")] = 1,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:K.")] = "auto",
    dtype: Annotated[DType, typer.Option(help="Floating-point type of the probe.")] = DType.float32,
) -> None:
    """Run a grid of probes (depth or blocks x width x init), appending one JSON line per configuration; resumes."""
    from sigprop import sweep as sweep_mod

    kind = arch.value
    wrong = {"mlp": ("--blocks", blocks), "resnet": ("--depth", depth)}[kind]
    if wrong[1] is not None:
        right = "--depth" if kind == "mlp" else "--blocks"
        raise SigpropError(f"does not apply to sweep {kind}; use {right}", option=wrong[0])
    if kind == "resnet" and input_dim is not None:
        raise SigpropError("--input-dim does not apply to sweep resnet (its input is the swept width)", option="--input-dim")
    joined = lambda values, default: ",".join(values) if values else default
    if kind == "mlp":
        sizes = sweep_mod.parse_ints(joined(depth, "10,20,50"), "--depth")
    else:
        sizes = sweep_mod.parse_ints(joined(blocks, "10,40,100"), "--blocks")
    widths = sweep_mod.parse_ints(joined(width, "128,512"), "--width")
    names = sweep_mod.parse_inits(joined(init, "proposed,he"), kind)
    probe = specs.ProbeSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype.value)
    points = sweep_mod.grid(kind, sizes, widths, names, probe, input_dim)
    target = _check_output_target(out)
    if target is not None and target.exists() and not target.is_file():
        raise SigpropError(f"{out} is not a regular file", option="--out")
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
            result = api.probe(point.spec, point.probe)
            row = sweep_mod.row(point, result, time.perf_counter() - t0)
            sweep_mod.append(out, row)
            fwd = row["end_to_end"]["forward"]["log10_mean"]
            line = f"sweep [{i}/{len(todo)}] {point.label()}: forward {report.fmt_log10(fwd)} ({row['seconds']:.1f} s)"
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
    results: Annotated[Path, typer.Argument(help="A sweep's JSON-lines file.", metavar="RESULTS")],
    out: Annotated[Path, typer.Option(help="The figure: .png, .svg or .pdf.")],
    x: Annotated[str, typer.Option(help="x axis: depth, blocks or width.")] = "depth",
    direction: Annotated[str, typer.Option(help="forward or backward end-to-end ratio.")] = "forward",
) -> None:
    """Draw a sweep: end-to-end ratio against depth (or width), one line per init (needs the plot extra: pip install sigprop\\[plot])."""
    from sigprop import plot as plot_mod
    from sigprop import sweep as sweep_mod

    if direction not in ("forward", "backward"):
        raise SigpropError(f"expected forward or backward, got {direction!r}", option="--direction")
    plot_mod.check_target(out, "--out")
    rows = sweep_mod.read_rows(results)
    if x not in ("depth", "blocks", "width") or not sweep_mod.axis_values(rows, x):
        keys = [k for k in ("depth", "blocks", "width") if sweep_mod.axis_values(rows, k)]
        raise SigpropError(f"no {x!r} in these rows; choose from {', '.join(keys)}", option="--x")
    plot_mod.sweep_figure(rows, x, out, direction)
    _say(f"sigprop: wrote {out}")


@app.command()
def rerun(
    result: Annotated[Path, typer.Argument(help="A result of sigprop mlp/resnet --format json.", metavar="RESULT")],
    fmt: Annotated[Format, typer.Option("--format", help="Output format of the new run.")] = Format.table,
    output: Annotated[Optional[Path], typer.Option(help="Write the new run's output to this file (whole, never half).")] = None,
) -> None:
    """Run a recorded result again (its config, seed, device, threads) and compare: exit 0 identical, 1 different."""
    import json

    from sigprop.results import compare_documents

    _check_output_target(output)
    try:
        doc = json.loads(result.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SigpropError(f"cannot read {result}: {exc.strerror or exc}", option="RESULT") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SigpropError(f"{result} is not JSON: {exc}", option="RESULT") from None

    from sigprop import api  # imports torch

    new = api.rerun(doc, on_start=lambda env: _say(
        f"sigprop rerun: {doc.get('command')} from {result} on {env['device']} ({env['threads']} threads)"))
    render(new, fmt, output)
    count, diffs = compare_documents(doc.get("runs"), new.to_dict()["runs"])
    old_env = doc.get("environment", {})
    moved = [k for k in ("sigprop", "torch", "device_name", "threads") if old_env.get(k) != new.environment.get(k)]
    if moved:
        _say("sigprop rerun: note: " + ", ".join(f"{k} was {old_env.get(k)!r}, now {new.environment.get(k)!r}" for k in moved))
    if diffs:
        where, a, b = diffs[0]
        _say(f"sigprop rerun: DIFFERENT: {len(diffs)} of {count} numbers differ; first at runs{where[where.find('['):] if where.startswith('[') else '.' + where}: {a!r} -> {b!r}")
        raise typer.Exit(1)
    _say(f"sigprop rerun: reproduced: all {count} numbers identical")


class CheckFormat(str, enum.Enum):
    text = "text"
    json = "json"


@app.command()
def check(
    file: Annotated[
        Optional[Path],
        typer.Argument(help="TOML file of \\[checks.NAME] (or \\[tool.sigprop.checks.NAME]) tables. [default: ./pyproject.toml, else ./sigprop.toml]"),
    ] = None,
    fmt: Annotated[CheckFormat, typer.Option("--format", help="text: one line per check and init, then a summary; json: one document.")] = CheckFormat.text,
    output: Annotated[Optional[Path], typer.Option(help="Write the report to this file (whole, never half).")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="Also write a JUnit XML report here (for CI test panels).")] = None,
) -> None:
    """Run named probe configurations with expectations from TOML: exit 0 all met, 1 one not met, 2 bad config."""
    from sigprop import checks as checks_mod

    _check_output_target(output)
    if junit is not None:
        try:
            _check_output_target(junit)
        except SigpropError as exc:
            raise SigpropError(str(exc.args[0]), option="--junit") from None
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
    n: Annotated[Optional[list[int]], typer.Option("--n", min=2, help="n for K_n (repeatable). Default: 2, 3, 10, 100, 1000, 10^6, 10^7.")] = None,
    blocks: Annotated[Optional[list[int]], typer.Option("--blocks", min=1, help="Residual blocks B (repeatable). Default: 1, 2, 10, 40, 100, 1000.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="table or json.")] = Format.table,
    output: Annotated[Optional[Path], typer.Option(help="Write the output to this file.")] = None,
) -> None:
    """K_n of Theorem 1 (closed form and quadrature) and the ResNet ratio (1 + 1/B)^{B/2}."""
    from sigprop import theory as th
    from sigprop.results import KnRow, ResnetRow, TheoryResult

    if fmt is Format.csv:
        raise SigpropError("theory supports table or json", option="--format")
    ns = n or [2, 3, 10, 100, 1000, 10**6, 10**7]
    bs = blocks or [1, 2, 10, 40, 100, 1000]
    result = TheoryResult(
        kn=[KnRow(k, th.kn_closed_form(k), th.kn_quadrature(k)) for k in ns],
        resnet=[ResnetRow(b, r, th.RESNET_LOWER, th.RESNET_UPPER, th.in_resnet_band(r)) for b in bs for r in [th.resnet_ratio(b)]],
    )
    if fmt is Format.json:
        write_output(report.to_json(result), output)
    else:
        render_rich(lambda console: report.render_theory(result, console), output)


@app.command("inits")
def list_inits() -> None:
    """List the init schemes with a one-line description and the paper they come from."""
    rows = [(s.name, s.description, s.paper) for s in inits.INITS.values()]
    report.render_inits(rows, Console())


def _usage_hint(msg: str) -> str:
    """typer's words for a bad choice or number, without its validator's prefix, with a
    did-you-mean and the way to give several values."""
    import difflib
    import re

    msg = msg.replace("Value error, ", "")
    m = re.match(r"Invalid value for '(--[\w-]+)': '([^']*)' is not one of (.*?)\.?$", msg)
    if m:
        option, value, choices = m.groups()
        names = re.findall(r"'([^']+)'", choices)
        if "," in value:
            return f"{option}: {value!r} is not a name; give one per option: --init he --init proposed (choose from {', '.join(names)})"
        close = difflib.get_close_matches(value, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{option}: unknown value {value!r}{hint}; choose from {', '.join(names)}"
    if "valid integer" in msg:
        return msg.split(":")[0] + ": expected one integer (for several values use sigprop sweep, which takes comma-separated lists)"
    return msg


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI and return its exit code; every error is one line on stderr."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="sigprop", standalone_mode=False)
    except SigpropError as exc:
        _say(f"sigprop: error: {exc}")
        return exc.exit_code
    except typer.Exit as exc:
        if exc.exit_code == 130:  # typer turns Ctrl-C into Exit(130) itself
            _say("sigprop: interrupted")
        return exc.exit_code
    except UsageError as exc:
        msg = " ".join(exc.format_message().split())
        if not msg:  # bare `sigprop`: help was printed (no_args_is_help)
            return 0
        _say(f"sigprop: error: {_usage_hint(msg)} (see sigprop -h)")
        return 2
    except (typer.Abort, KeyboardInterrupt):
        _say("sigprop: interrupted")
        return 130
    except MemoryError:
        _say("sigprop: error: out of memory; reduce --samples, --depth or --width")
        return 2
    except Exception as exc:  # never a traceback; a bug still says what it was
        if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError, without importing torch
            _say("sigprop: error: the GPU ran out of memory during the run (its free memory changed since the "
                 "estimate?); reduce --samples, --depth/--blocks or --width, use --stream, or --device cpu")
            return 2
        _say(f"sigprop: internal error: {type(exc).__name__}: {exc} (please report it)")
        return 1
    if rv == 130:  # typer's click returns 130 for Ctrl-C (KeyboardInterrupt) without standalone mode
        _say("sigprop: interrupted")
    return rv if isinstance(rv, int) else 0


def run() -> None:  # console-script entry point
    sys.exit(main())
