"""The ``sigprop`` command line (typer only: parse, build specs, call the core, render).

No tensors here: the engine is imported inside the commands that need it, so ``sigprop --help``,
``sigprop inits`` and ``sigprop theory`` never import torch.  Errors become one line on stderr:
exit 2 for bad input, 1 for a failed ``--check``, 130 for Ctrl-C (see :func:`main`).
"""

from __future__ import annotations

import enum
import os
import sys
import tempfile
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
    add_completion=False,
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
PrecisionOpt = Annotated[
    Precision, typer.Option(help="float32 matmuls on CUDA: fp32 (IEEE) or tf32 (tensor cores; docs/theory.md for its bias).")
]


#: Figure 1 (top) of 001, appendix A.1: the three schemes compared there
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
    target = _check_output_target(output)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
    """A rich progress bar on stderr when stderr is a terminal; otherwise nothing."""
    if not sys.stderr.isatty():
        return None, None
    from rich.progress import Progress

    prog = Progress(console=_stderr(), transient=True)
    task = prog.add_task(total_label, total=None)

    def update(done: int, total: int) -> None:
        prog.update(task, completed=done, total=total)

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
    check: Annotated[bool, typer.Option("--check", help="Exit 1 unless every init preserves the signal.")] = False,
    stream: StreamOpt = None,
    precision: PrecisionOpt = Precision.fp32,
) -> None:
    """Probe a weight-normalized ReLU MLP (001 eq. 1-2): forward and backward norm ratios per layer."""
    names = [i.value for i in init] if init else list(FIGURE1_INITS)
    spec = specs.MLPSpec(depth=depth, input_dim=input_dim, width=specs.WidthSpec.parse(width), inits=tuple(names))
    probe = specs.ProbeSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype.value, stream=stream,
                            precision=precision.value)
    _run_probe(
        spec, probe, fmt, output, check,
        lambda env: f"sigprop mlp: device {env['device']} ({env['device_name']}), {env['dtype']}, "
        f"depth {depth}, widths {spec.width} (seed {seed}), {samples} samples x {seeds} draw(s)",
    )


def _run_probe(spec, probe, fmt: Format, output: Optional[Path], check: bool, banner) -> None:
    """Validate the output target, run the core with a progress bar, render, apply --check."""
    _check_output_target(output)

    from sigprop import api  # imports torch

    prog, update = _progress_callback("probing")
    if prog is not None:
        prog.start()
    try:
        result = api.probe(spec, probe, progress=update, on_start=lambda env: _say(banner(env)))
    finally:
        if prog is not None:
            prog.stop()
    render(result, fmt, output)
    if check and not result.passed:
        for run in result.runs:
            for c in run.checks:
                if not c.passed:
                    _say(
                        f"sigprop: check failed: {run.init}: {c.name} = {report.fmt_log10(c.log10_measured)} "
                        f"outside [{report.fmt_log10(c.log10_low)}, {report.fmt_log10(c.log10_high)}]"
                    )
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
    check: Annotated[bool, typer.Option("--check", help="Exit 1 unless every stage's ratios lie in the band [sqrt 2, sqrt e].")] = False,
    stream: StreamOpt = None,
    precision: PrecisionOpt = Precision.fp32,
) -> None:
    """Probe a residual network h^b = h^{b-1} + alpha F_b(h^{b-1}) (001 eq. 6) state by state."""
    if width is not None and norm is Norm.bn:
        raise SigpropError("the batch-normalized ResNet (004 appendix C) has no hidden layer; its width is --dim", option="--width")
    if init:
        names = [i.value for i in init]
    else:
        names = list(specs.RESNET_DEFAULT_INITS) if norm is Norm.wn else ["he"]
    spec = specs.ResNetSpec(
        blocks=blocks, stages=stages, dim=dim, width=specs.WidthSpec.parse(width or "150:250"),
        block_depth=block_depth, norm=norm.value, inits=tuple(names),
    )
    probe = specs.ProbeSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype.value, stream=stream,
                            precision=precision.value)
    shape = f"{stages} stage(s) x {blocks} blocks, d {dim}"
    shape += f", batch norm" if norm is Norm.bn else f", hidden {spec.width} x {block_depth}, norm {norm.value}"
    _run_probe(
        spec, probe, fmt, output, check,
        lambda env: f"sigprop resnet: device {env['device']} ({env['device_name']}), {env['dtype']}, "
        f"{shape} (seed {seed}), {samples} samples x {seeds} draw(s)",
    )


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


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI and return its exit code; every error is one line on stderr."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="sigprop", standalone_mode=False)
    except SigpropError as exc:
        _say(f"sigprop: error: {exc}")
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except UsageError as exc:
        msg = " ".join(exc.format_message().split())
        if not msg:  # bare `sigprop`: help was printed (no_args_is_help)
            return 0
        _say(f"sigprop: error: {msg} (see sigprop -h)")
        return 2
    except (typer.Abort, KeyboardInterrupt):
        _say("sigprop: interrupted")
        return 130
    except MemoryError:
        _say("sigprop: error: out of memory; reduce --samples, --depth or --width")
        return 2
    except Exception as exc:  # never a traceback; a bug still says what it was
        _say(f"sigprop: internal error: {type(exc).__name__}: {exc} (please report it)")
        return 1
    return rv if isinstance(rv, int) else 0


def run() -> None:  # console-script entry point
    sys.exit(main())
