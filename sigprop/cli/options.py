"""Every option and choice the commands share, declared once (typer ``Annotated`` aliases).

Choices come from the registries (``inits``, ``specs``); a test runs the parser on every name.
"""

from __future__ import annotations

import enum
import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from sigprop import inits, specs

#: the flag (or argument) of each library field whose name is not "--" + field with dashes
FLAGS = {"fmt": "--format", "inits": "--init", "result": "RESULT", "results": "RESULTS", "file": "FILE",
         "batch": "batch (recorded in the result)"}


def Option(*param_decls, help: str | None = None, **kw):
    """``typer.Option`` with its help text escaped for rich: a bracket in it ("[sqrt 2, sqrt e]",
    "[default: 16]") is shown, not read as markup and dropped (tests/cli/test_help.py)."""
    return typer.Option(*param_decls, help=None if help is None else escape(help), **kw)


def Argument(*param_decls, help: str | None = None, **kw):
    """``typer.Argument`` with its help text escaped for rich (as ``Option``)."""
    return typer.Argument(*param_decls, help=None if help is None else escape(help), **kw)


def flag(field: str) -> str:
    """The CLI's name for a library field (``input_dim`` -> ``--input-dim``); several, joined by /."""
    return "/".join(FLAGS.get(f, "--" + f.replace("_", "-")) for f in field.split("/"))


#: CLI choices come from the registry (tests/cli/test_cli.py runs the parser on every name)
InitName = enum.Enum("InitName", {name: name for name in inits.names("mlp")}, type=str)
ResNetInitName = enum.Enum("ResNetInitName", {name: name for name in inits.names("resnet")}, type=str)
CNNInitName = enum.Enum("CNNInitName", {name: name for name in inits.names("cnn")}, type=str)
WRNInitName = enum.Enum("WRNInitName", {name: name for name in inits.names("wrn")}, type=str)
WRNPreset = enum.Enum("WRNPreset", {name: name for name in specs.WRN_PRESETS}, type=str)


class Norm(str, enum.Enum):
    wn = "wn"
    bn = "bn"
    none = "none"


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    csv = "csv"


class TableFormat(str, enum.Enum):
    """The formats of a command whose record has no per-layer rows to put in CSV (hessian, theory)."""

    table = "table"
    json = "json"


class DType(str, enum.Enum):
    float32 = "float32"
    float64 = "float64"


Precision = enum.Enum("Precision", {p: p for p in specs.PRECISIONS}, type=str)
Head = enum.Enum("Head", {h: h for h in specs.HEADS}, type=str)

StreamOpt = Annotated[
    Optional[bool],
    Option("--stream/--no-stream", help="Redraw the weights in the backward pass instead of storing them. [default: only when they would not fit]"),
]
GraphsOpt = Annotated[
    Optional[bool],
    Option("--graphs/--no-graphs", help="Capture each layer's kernels once as a CUDA graph and replay it (CUDA only; checked against the eager step). [default: on with CUDA]"),
]
PlotOpt = Annotated[
    Optional[Path], Option(help="Also draw the Figure-1-style plot to this .png/.svg/.pdf (needs the plot extra: pip install sigprop[plot]).")
]
PrecisionOpt = Annotated[
    Precision, Option(help="float32 matmuls on CUDA: fp32 (IEEE) or tf32 (tensor cores; docs/theory.md for its bias).")
]


Gate = enum.Enum("Gate", {g: g for g in specs.GATES}, type=str)
CheckOpt = Annotated[bool, Option("--check", help="Exit 1 unless every init passes the --gate verdict (default: the signal is preserved).")]
GateOpt = Annotated[
    Gate,
    Option(help="What --check asks: preserved (the typical end-to-end ratio lies in --band: the signal survives) "
                      "or theory (it agrees with the init's own finite-width prediction)."),
]
BandOpt = Annotated[
    Optional[str],
    Option(help="LO:HI factors around the reference for the 'preserved' verdict; must contain 1. [default: 0.1:10 for mlp "
                "(around norm preservation) and cnn (around the lossless reference); 1:1 for resnet, i.e. Theorem 3's "
                "[sqrt 2, sqrt e] per stage, and for wrn, the same band times each group's stride-2 transition, each with its "
                "finite-width allowance]"),
]
CorrelationOpt = Annotated[
    Optional[list[str]],
    Option("--correlation", help="Also measure how the cosine of two inputs propagates, from input pairs of cosine C0 in [-1, 1], "
                                       "beside the infinite-width prediction (repeatable or comma-separated; docs/theory.md section 10)."),
]
PairsOpt = Annotated[int, Option(min=1, help="Input pairs per --correlation cosine.")]
MaxCorrelationOpt = Annotated[
    Optional[float],
    Option(help="Also fail --check when the last state's mean cosine of input pairs with cosine 0 exceeds X "
                      "(inputs mapped to one direction; measures C0 = 0; docs/ci.md)."),
]
ThreadsOpt = Annotated[
    Optional[int],
    Option(min=1, help="CPU threads torch may use (recorded in the result). [default: half the cores this process may run on; OMP_NUM_THREADS where set]"),
]


#: Figure 1 (top) of Arpit et al. 2019, appendix A.1: the three schemes compared there
FIGURE1_INITS = ["he", "proposed", "proposed-gaussian"]


#: the probe options shared by ``mlp`` and ``resnet`` (``sweep`` has its own help texts)
SamplesOpt = Annotated[int, Option(min=1, help="Random inputs (and error vectors) N.")]
SeedOpt = Annotated[int, Option(min=0, help="Base seed of widths, inputs, errors and weights.")]
SeedsOpt = Annotated[int, Option(min=1, help="Independent weight draws S.")]
DeviceOpt = Annotated[str, Option(help="auto, cpu, cuda or cuda:K (auto = CUDA when available).")]
DTypeOpt = Annotated[DType, Option(help="Floating-point type of the probe.")]
FormatOpt = Annotated[Format, Option("--format", help="Output format.")]
OutputOpt = Annotated[Optional[Path], Option(help="Write the output to this file (whole, never half).")]
AnyInitName = enum.Enum("AnyInitName", {name: name for name in inits.names()}, type=str)


class Arch(str, enum.Enum):
    mlp = "mlp"
    resnet = "resnet"
    cnn = "cnn"
    wrn = "wrn"


class CheckFormat(str, enum.Enum):
    text = "text"
    json = "json"


@dataclass(frozen=True)
class RunOptions:
    """What a probe command and its ``sigprop hessian`` form both take."""

    samples: Optional[int]
    seed: int
    seeds: int
    device: str
    dtype: DType
    fmt: "Format | TableFormat"
    output: Optional[Path]
    threads: Optional[int]


@dataclass(frozen=True)
class ProbeOptions(RunOptions):
    """The options every probe command takes, handed to the command as one object."""

    check: bool
    gate: Gate
    band: Optional[str]
    stream: Optional[bool]
    precision: Precision
    graphs: Optional[bool]
    plot: Optional[Path]
    correlation: Optional[list[str]]
    pairs: int
    max_correlation: Optional[float]

    def probe_spec(self) -> specs.ProbeSpec:
        return specs.ProbeSpec(samples=self.samples, seed=self.seed, seeds=self.seeds, device=self.device, dtype=self.dtype.value,
                               stream=self.stream, precision=self.precision.value, graphs=self.graphs,
                               correlations=specs.parse_cosines(self.correlation or []), pairs=self.pairs, threads=self.threads)

    def gate_spec(self) -> specs.GateSpec:
        return specs.GateSpec(self.gate.value, None if self.band is None else specs.parse_band(self.band), self.max_correlation)


#: (name, option, default) of ``ProbeOptions``, in the order ``--help`` lists them
PROBE_OPTIONS = (
    ("samples", SamplesOpt, 1000), ("seed", SeedOpt, 0), ("seeds", SeedsOpt, 1), ("device", DeviceOpt, "auto"),
    ("dtype", DTypeOpt, DType.float32), ("fmt", FormatOpt, Format.table), ("output", OutputOpt, None),
    ("check", CheckOpt, False), ("gate", GateOpt, Gate.preserved), ("band", BandOpt, None), ("stream", StreamOpt, None),
    ("precision", PrecisionOpt, Precision.fp32), ("graphs", GraphsOpt, None), ("threads", ThreadsOpt, None),
    ("plot", PlotOpt, None), ("correlation", CorrelationOpt, None), ("pairs", PairsOpt, 256),
    ("max_correlation", MaxCorrelationOpt, None),
)


@dataclass(frozen=True)
class HessianOptions(RunOptions):
    """The options of every ``sigprop hessian NET`` command, handed to it as one object (the
    net's own options are the probe command's)."""

    iters: int
    tol: float
    top: int
    trace: int
    data: Optional[Path]
    head: Head
    batch_size: Optional[int]
    plot: Optional[Path]

    def hessian_spec(self) -> specs.HessianSpec:
        return specs.HessianSpec(samples=self.samples, seed=self.seed, seeds=self.seeds, device=self.device, dtype=self.dtype.value,
                                 iters=self.iters, tol=self.tol, top=self.top, trace=self.trace,
                                 data=None if self.data is None else str(self.data), head=self.head.value,
                                 batch_size=self.batch_size, threads=self.threads)


HESSIAN_OPTIONS = (
    ("samples", Annotated[Optional[int], Option(min=1, help="Data points N: synthetic x ~ N(0, I) with labels uniform over 10 classes, "
                                                                 "or with --data the first N of the file. [default: 512 synthetic; all of --data]")],
     None),
    ("seed", SeedOpt, 0), ("seeds", Annotated[int, Option(min=1, help="Weight draws; the table gives mean ± sd over them.")], 3),
    ("device", DeviceOpt, "auto"), ("dtype", DTypeOpt, DType.float32),
    ("fmt", Annotated[TableFormat, Option("--format", help="Output format.")], TableFormat.table), ("output", OutputOpt, None),
    ("iters", Annotated[int, Option(min=1, help="Hessian-vector products at most for the largest-magnitude eigenvalue "
                                                      "(restarted Lanczos).")], 100),
    ("tol", Annotated[float, Option(help="Converged when the relative residual ||Hy - λy||/|λ| is at most this "
                                               "(an eigenvalue then lies within tol |λ| of λ).")], 1e-3),
    ("top", Annotated[int, Option(min=0, help="Also the K largest-magnitude eigenvalues by Lanczos (0: no).")], 0),
    ("trace", Annotated[int, Option(min=0, help="Also the trace by Hutchinson's estimator with M Rademacher probes (0: no).")], 0),
    ("data", Annotated[Optional[Path], Option(help="Your data instead of synthetic: a .pt or .npz with x [N, ...] and integer labels y [N] in 0..9.")], None),
    ("head", Annotated[Head, Option(help="The 10-way head: pytorch (the paper's nets: plain nn.Linear at PyTorch's default init, "
                                                "the same for every init) or init (drawn by the init under test, gain 1; docs/theory.md section 12).")],
     Head.pytorch),
    ("batch_size", Annotated[Optional[int], Option(min=1, help="Accumulate each Hessian-vector product over minibatches of B samples "
                                                                    "(memory of one minibatch; a data-dependent init calibrated on the first, "
                                                                    "as the paper's code does). [default: all samples at once]")], None),
    ("threads", ThreadsOpt, None),
    ("plot", Annotated[Optional[Path], Option(help="Also draw the curvature per init (bar: mean ± sd, points: draws) to this .png/.svg/.pdf.")], None),
)


def with_options(command, table, cls, defaults: dict | None = None):
    """``command``'s own parameters, then the shared ones of ``table`` (typer reads
    ``__signature__``); called with the shared ones gathered into ``opts: cls``."""
    defaults = defaults or {}
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "opts"]
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(name, default), annotation=option)
              for name, option, default in table]

    @functools.wraps(command)
    def wrapper(**kwargs):
        opts = cls(**{name: kwargs.pop(name) for name, _, _ in table})
        return command(**kwargs, opts=opts)

    wrapper.__signature__ = inspect.Signature([p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + shared)
    wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
    return wrapper


def hessian_options(command):
    """The ``sigprop hessian NET`` form of a probe command (``with_options`` over ``HESSIAN_OPTIONS``)."""
    return with_options(getattr(command, "__wrapped__", command), HESSIAN_OPTIONS, HessianOptions)


def probe_options(command=None, **defaults):
    """Give a probe command (``mlp``, ``resnet``) the shared options: its signature gains the
    ``PROBE_OPTIONS`` parameters (typer reads ``__signature__``), and it is called with them
    gathered into ``opts: ProbeOptions`` -- each option declared once, here.  Used as
    ``@probe_options(samples=100)`` it gives that command its own defaults."""
    if command is None:
        return functools.partial(probe_options, **defaults)
    return with_options(command, PROBE_OPTIONS, ProbeOptions, defaults)
