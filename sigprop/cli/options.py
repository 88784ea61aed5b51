"""Every option and choice the commands share, declared once (typer ``Annotated`` aliases), and
the typer parameters of a net kind's own options (``kind_parameters``: read from its
declaration in sigprop/kinds/).

Choices come from the registries (``kinds``, ``inits``, ``specs``); tests/cli/test_cli.py checks
them against the registries and runs the parser on every name.
"""

from __future__ import annotations

import copy
import enum
import inspect
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional, get_args

import typer
from rich.markup import escape

from sigprop import inits, kinds, specs

#: the flag (or argument) of each library field whose name is not "--" + field with dashes (the
#: net kinds' own flags are read from their options: ``flag``)
FLAGS = {
    "fmt": "--format",
    "inits": "--init",
    "result": "RESULT",
    "results": "RESULTS",
    "file": "FILE",
    "parts": "PARTS",
    "merged": "OUT",
    "batch": "batch (recorded in the result)",
}


def Option(*param_decls, help: str | None = None, **kw):
    """``typer.Option`` with its help text escaped for rich: a bracket in it ("[sqrt 2, sqrt e]",
    "[default: 16]") is shown, not read as markup and dropped (tests/cli/test_help.py)."""
    return typer.Option(*param_decls, help=None if help is None else escape(help), **kw)


def Argument(*param_decls, help: str | None = None, **kw):
    """``typer.Argument`` with its help text escaped for rich (as ``Option``)."""
    return typer.Argument(*param_decls, help=None if help is None else escape(help), **kw)


def flag(field: str) -> str:
    """The CLI's name for a library field (``input_dim`` -> ``--input-dim``); several, joined by /."""
    own = {o.name: o.cli_flag for k in kinds.KINDS.values() for o in k.options}
    own |= {o.name: o.cli_flag for o in specs.probe_options() if o.cli}
    return "/".join(FLAGS.get(f) or own.get(f) or "--" + f.replace("_", "-") for f in field.split("/"))


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    csv = "csv"


class TableFormat(str, enum.Enum):
    """The formats of a command whose record has no per-layer rows to put in CSV (hessian, theory)."""

    table = "table"
    json = "json"


Head = enum.Enum("Head", {h: h for h in specs.HEADS}, type=str)

PlotOpt = Annotated[
    Optional[Path],
    Option(
        help="Also draw the Figure-1-style plot to this .png/.svg/.pdf (needs the plot extra: pip install "
        "sigprop[plot])."
    ),
]
CheckOpt = Annotated[
    bool,
    Option(
        "--check",
        help="Exit 1 unless every init passes the --gate verdict (default: the signal is preserved).",
    ),
]


def _annotated(o: kinds.Opt, prefix: str):
    """The typer annotation of a net kind's option: its type (an enum of its choices), optional
    when its default is None, the flag (``--on/--off`` for a bool with ``off``), its bound and
    help (with the default it states when the value is optional)."""
    base = o.type
    if o.choices:
        base = enum.Enum(f"{prefix}_{o.name}", {str(c): str(c) for c in o.choices}, type=str)
    decl = f"{o.cli_flag}/{o.off}" if o.type is bool and o.off else o.cli_flag
    help_ = o.help + (f" [default: {o.shown}]" if o.shown else "")
    extra = {"min": o.min} if o.min is not None else {}
    if o.positional:  # a required argument (sigprop module TARGET)
        return Annotated[base, Argument(help=o.help, show_default=False)], inspect.Parameter.empty
    if o.repeat:
        return Annotated[Optional[list[base]], Option(decl, help=help_, **extra)], None
    annotation = Optional[base] if o.default is None else base
    default = base(o.default) if o.choices and o.default is not None else o.default
    return Annotated[annotation, Option(decl, help=help_, **extra)], default


def declared(name: str, **changes):
    """The typer annotation and default of the probe option ``name`` as ``specs.ProbeSpec`` or
    ``specs.GateSpec`` declares it (sigprop/options.py), with ``changes`` for one command (its
    help, its default)."""
    o = next(o for o in specs.probe_options() if o.name == name)
    return _annotated(replace(o, **changes), "probe")


def cli_values(options, given: dict) -> dict:
    """The library's values of the options a command got: an enum member as its value, a
    repeated flag as a tuple, the CLI's text parsed (``Opt.parse``); one not given (None) left
    out, to take its default."""
    out = {}
    for o in options:
        v = given.get(o.name)
        if v is None:
            continue
        v = v.value if isinstance(v, enum.Enum) else v
        out[o.name] = o.parse(v) if o.parse else tuple(v) if isinstance(v, list) else v
    return out


FormatOpt = Annotated[Format, Option("--format", help="Output format.")]
OutputOpt = Annotated[Optional[Path], Option(help="Write the output to this file (whole, never half).")]
AnyInitName = enum.Enum("AnyInitName", {name: name for name in inits.names()}, type=str)


class CheckFormat(str, enum.Enum):
    text = "text"
    json = "json"


@dataclass(frozen=True)
class RunOptions:
    """What ``sigprop hessian`` and ``sigprop spectrum`` both take (``dtype``: an enum member of
    the declared choices)."""

    samples: Optional[int]
    seed: int
    seeds: int
    device: str
    dtype: enum.Enum
    fmt: "Format | TableFormat"
    output: Optional[Path]
    threads: Optional[int]


class ProbeOptions:
    """The options every probe command takes, handed to the command as one object: the output's
    (``fmt``, ``output``, ``check``, ``plot``) and the library's (``values``, by name: every
    option ``specs.probe_options`` declares for the command line)."""

    def __init__(self, fmt, output, check, plot, **values) -> None:
        self.fmt, self.output, self.check, self.plot = fmt, output, check, plot
        self.values = values

    def specs(self) -> tuple[specs.ProbeSpec, specs.GateSpec]:
        """The probe and the gate the command line asks for."""
        return specs.probe_specs(cli_values(specs.probe_options(), self.values))


#: what a probe command takes besides the library's options: where its output goes, and --check
OUTPUT_OPTIONS = (
    ("check", CheckOpt, False),
    ("fmt", FormatOpt, Format.table),
    ("output", OutputOpt, None),
    ("plot", PlotOpt, None),
)


@dataclass(frozen=True)
class HessianOptions(RunOptions):
    """The options of every ``sigprop hessian NET`` command, handed to it as one object (the
    net's own options are the probe command's)."""

    iters: int
    tol: float
    top: int
    trace: int
    density: bool
    probes: Optional[int]
    steps: Optional[int]
    per_layer: bool
    data: Optional[Path]
    head: Head
    batch_size: Optional[int]
    plot: Optional[Path]

    def hessian_spec(self) -> specs.HessianSpec:
        for name in ("probes", "steps"):
            if getattr(self, name) is not None and not self.density:
                raise specs.SigpropError(
                    "sets the eigenvalue density's quadrature: it takes --density too", field=name
                )
        return specs.HessianSpec(
            samples=self.samples,
            seed=self.seed,
            seeds=self.seeds,
            device=self.device,
            dtype=self.dtype.value,
            iters=self.iters,
            tol=self.tol,
            top=self.top,
            trace=self.trace,
            density=self.density,
            probes=specs.HessianSpec.probes if self.probes is None else self.probes,
            steps=specs.HessianSpec.steps if self.steps is None else self.steps,
            per_layer=self.per_layer,
            data=None if self.data is None else str(self.data),
            head=self.head.value,
            batch_size=self.batch_size,
            threads=self.threads,
        )


@dataclass(frozen=True)
class SpectrumOptions(RunOptions):
    """The options of every ``sigprop spectrum NET`` command (the net's own are the probe's)."""

    depths: bool
    plot: Optional[Path]
    path: str
    probes: int
    steps: int
    top: int
    batch_size: Optional[int]
    at: Optional[str]

    def spectrum_spec(self) -> specs.SpectrumSpec:
        try:
            at = tuple(int(v) for v in self.at.split(",")) if self.at else ()
        except ValueError:
            raise specs.SigpropError(f"expected depths like 5,10,20, got {self.at!r}", field="at") from None
        return specs.SpectrumSpec(
            at=at,
            samples=8 if self.samples is None else self.samples,
            seed=self.seed,
            seeds=self.seeds,
            device=self.device,
            dtype=self.dtype.value,
            threads=self.threads,
            depths=self.depths,
            path=self.path,
            probes=self.probes,
            steps=self.steps,
            top=self.top,
            batch_size=self.batch_size,
        )


SPECTRUM_OPTIONS = (
    (
        "samples",
        Annotated[
            Optional[int],
            Option(min=1, help="Inputs x ~ N(0, I) at which the Jacobian is taken exactly. [default: 8]"),
        ],
        None,
    ),
    ("seed", *declared("seed")),
    ("seeds", Annotated[int, Option(min=1, help="Weight draws.")], 3),
    ("device", *declared("device")),
    ("dtype", *declared("dtype")),
    ("fmt", Annotated[TableFormat, Option("--format", help="Output format.")], TableFormat.table),
    ("output", OutputOpt, None),
    ("threads", *declared("threads")),
    (
        "depths",
        Annotated[
            bool,
            Option(
                "--depths",
                help="Also the Jacobian of every layer's (block's) output in the input: the spread against "
                "depth beside its theory (n_l reverse products a sample for each depth l).",
            ),
        ],
        False,
    ),
    (
        "at",
        Annotated[
            Optional[str],
            Option(
                "--at",
                help="Also the Jacobian of the input to these depths only (a comma list, e.g. 5,10,20: "
                "the recorded states of --depths), beside its theory.",
            ),
        ],
        None,
    ),
    (
        "plot",
        Annotated[
            Optional[Path],
            Option(
                help="Write the figure (.png/.svg/.pdf; needs the plot extra): the spectrum's histogram per "
                "init, and with --depths the spread against depth."
            ),
        ],
        None,
    ),
    (
        "path",
        Annotated[
            str,
            Option(
                help="exact (J formed, an SVD a sample), lanczos (J^T J as an operator: Lanczos for "
                "sigma_max, stochastic Lanczos quadrature for the rest), or auto: exact when it fits in "
                "memory."
            ),
        ],
        "auto",
    ),
    ("probes", Annotated[int, Option(min=1, help="lanczos path: quadrature probes a sample.")], 10),
    ("steps", Annotated[int, Option(min=2, help="lanczos path: Lanczos steps a probe.")], 30),
    (
        "top",
        Annotated[
            int,
            Option(
                min=0,
                help="Also the K largest and K smallest singular values (mean over samples; lanczos path: "
                "Lanczos on J^T J or J J^T, the smaller).",
            ),
        ],
        0,
    ),
    (
        "batch_size",
        Annotated[
            Optional[int],
            Option(
                min=1, help="exact path: the samples' Jacobians B at a time (the memory of B). [default: all]"
            ),
        ],
        None,
    ),
)


def _curvature_samples(default: int):
    """``sigprop hessian``'s --samples, its help stating the kind's default (``Kind.curvature_samples``)."""
    return Annotated[
        Optional[int],
        Option(
            min=1,
            help="Data points N: synthetic x ~ N(0, I) with labels uniform over 10 classes, "
            f"or with --data the first N of the file. [default: {default} synthetic; all of --data]",
        ),
    ]


HESSIAN_OPTIONS = (
    ("samples", _curvature_samples(specs.HESSIAN_SAMPLES), None),
    ("seed", *declared("seed")),
    ("seeds", Annotated[int, Option(min=1, help="Weight draws; the table gives mean ± sd over them.")], 3),
    ("device", *declared("device")),
    ("dtype", *declared("dtype")),
    ("fmt", Annotated[TableFormat, Option("--format", help="Output format.")], TableFormat.table),
    ("output", OutputOpt, None),
    (
        "iters",
        Annotated[
            int,
            Option(
                min=1,
                help="Hessian-vector products at most for the largest-magnitude eigenvalue "
                "(restarted Lanczos).",
            ),
        ],
        100,
    ),
    (
        "tol",
        Annotated[
            float,
            Option(
                help="Converged when the relative residual ||Hy - λy||/|λ| is at most this "
                "(an eigenvalue then lies within tol |λ| of λ)."
            ),
        ],
        1e-3,
    ),
    (
        "top",
        Annotated[int, Option(min=0, help="Also the K largest-magnitude eigenvalues by Lanczos (0: no).")],
        0,
    ),
    (
        "trace",
        Annotated[
            int,
            Option(min=0, help="Also the trace by Hutchinson's estimator with M Rademacher probes (0: no)."),
        ],
        0,
    ),
    (
        "density",
        Annotated[
            bool,
            Option(
                "--density",
                help="Also the eigenvalue density by stochastic Lanczos quadrature (--probes x --steps "
                "Hessian-vector products a draw); --plot draws it on a symmetric log axis.",
            ),
        ],
        False,
    ),
    # a quick look by default (issue 47: a documented --density example ran 22 h on a laptop CPU);
    # Ghorbani et al. 2019's scale is --probes 10 --steps 90, behind the options
    # None: not given (refused without --density, which alone reads them)
    (
        "probes",
        Annotated[
            Optional[int],
            Option(min=1, help=f"--density: Rademacher probes. [default: {specs.HessianSpec.probes}]"),
        ],
        None,
    ),
    (
        "steps",
        Annotated[
            Optional[int],
            Option(
                min=2,
                help="--density: Lanczos steps a probe (quadrature nodes). "
                f"[default: {specs.HessianSpec.steps}]",
            ),
        ],
        None,
    ),
    (
        "per_layer",
        Annotated[
            bool,
            Option(
                "--per-layer",
                help="Also the largest-magnitude eigenvalue of each layer's diagonal block of the Hessian "
                "(restarted Lanczos, up to --iters products a layer): where the curvature sits.",
            ),
        ],
        False,
    ),
    (
        "data",
        Annotated[
            Optional[Path],
            Option(
                help="Your data instead of synthetic: a .pt or .npz with x [N, ...] and integer labels y [N] "
                "in 0..9."
            ),
        ],
        None,
    ),
    (
        "head",
        Annotated[
            Head,
            Option(
                help="The 10-way head: pytorch (the paper's nets: plain nn.Linear at PyTorch's default init, "
                "the same for every init) or init (drawn by the init under test, gain 1; docs/theory.md "
                "section 12)."
            ),
        ],
        Head.pytorch,
    ),
    (
        "batch_size",
        Annotated[
            Optional[int],
            Option(
                min=1,
                help="Accumulate each Hessian-vector product over minibatches of B samples "
                "(memory of one minibatch; a data-dependent init calibrated on the first, "
                "as the paper's code does). [default: all samples at once]",
            ),
        ],
        None,
    ),
    ("threads", *declared("threads")),
    (
        "plot",
        Annotated[
            Optional[Path],
            Option(
                help="Also draw the curvature per init (bar: mean ± sd, points: draws) to this "
                ".png/.svg/.pdf."
            ),
        ],
        None,
    ),
)


def init_choices(kind: kinds.Kind):
    """The ``--init`` choices of a kind: the registry's inits defined for what the net provides."""
    offered = [n for n in inits.names(kind.provides) if n not in kind.excluded_inits]
    return enum.Enum(f"{kind.name}_init", {n: n for n in offered}, type=str)


def kind_parameters(kind: kinds.Kind) -> list[inspect.Parameter]:
    """A kind's own options (sigprop/kinds/: ``Kind.options``) and its ``--init`` as typer
    parameters, in the order the kind declares them."""
    out = []
    for o in (o for o in kind.options if o.cli):
        annotation, default = _annotated(o, kind.name)
        out.append(
            inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
    init = Annotated[Optional[list[init_choices(kind)]], Option("--init", help=kind.init_help)]
    out.append(inspect.Parameter("init", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=init))
    return out


def kind_values(kind: kinds.Kind, kw: dict) -> tuple[dict, tuple[str, ...] | None]:
    """The option values a command got (the ones given or defaulted; enum members as their
    values) and the init names (None: the kind's defaults), taken out of ``kw``."""
    values = {}
    for o in (o for o in kind.options if o.cli):
        v = kw.pop(o.name)
        if v is not None:
            values[o.name] = v.value if isinstance(v, enum.Enum) else v
    init = kw.pop("init")
    return values, (tuple(i.value for i in init) if init else None)


def probe_table(kind: kinds.Kind):
    """A kind's probe command's shared options: every option ``specs.probe_options`` declares for
    the command line, its ``--band`` help stating the kind's default band and its defaults
    (``Kind.probe_defaults``) replacing the declared ones; then ``OUTPUT_OPTIONS``."""
    out = []
    for o in (o for o in specs.probe_options() if o.cli):
        changes = {"default": kind.probe_defaults.get(o.name, o.default)}
        if o.name == "band":
            changes["shown"] = kind.band_help
        out.append((o.name, *_annotated(replace(o, **changes), "probe")))
    return (*out, *OUTPUT_OPTIONS)


def hessian_table(kind: kinds.Kind):
    """``HESSIAN_OPTIONS`` for a kind's ``sigprop hessian`` command: its --samples help states the
    kind's default."""
    return tuple(
        (name, _curvature_samples(kind.curvature_samples) if name == "samples" else opt, default)
        for name, opt, default in HESSIAN_OPTIONS
    )


def _hidden(p: inspect.Parameter) -> inspect.Parameter:
    """The same parameter, left out of the command's help (still parsed, so that it can be
    refused with the kind's reason rather than typer's "No such option")."""
    base, info = get_args(p.annotation)[0], copy.copy(get_args(p.annotation)[1])
    info.hidden = True
    return p.replace(annotation=Annotated[base, info])


def command(kind: kinds.Kind, table, cls, body, family: str = "probe"):
    """A typer command for ``kind``: its own parameters, then the shared ones of ``table``
    (typer reads ``__signature__``); called as ``body(kind, spec, opts)`` with the spec the kind
    makes of its values and the shared options gathered into ``opts: cls``.  What the kind
    refuses in this command ``family`` (``Kind.refuses``) is left out of the help, and given a
    value other than its default it is refused in one line with the kind's reason."""
    # an option both declare (the module kind's --data under `sigprop hessian`) is the shared
    # one, and its value goes to both
    both = {name for name, _, _ in table} & {o.name for o in kind.options if o.cli}
    own = [p for p in kind_parameters(kind) if p.name not in both]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=option)
        for name, option, default in table
    ]
    refused = kind.refuses.get(family, {})
    defaults = {p.name: p.default for p in own + shared}
    own, shared = ([_hidden(p) if p.name in refused else p for p in ps] for ps in (own, shared))

    def run_command(**kw):
        for name, why in refused.items():
            given = kw.get(name, defaults[name])
            if given != defaults[name] and given not in (None, [], (), False):  # --no-stream: as it runs
                command_ = kind.name if family == "probe" else f"{family} {kind.name}"
                raise specs.SigpropError(f"sigprop {command_} does not take it: {why}", field=name)
        opts = cls(**{name: kw[name] if name in both else kw.pop(name) for name, _, _ in table})
        values, names = kind_values(kind, kw)
        return body(kind, kind.make(values, names), opts)

    run_command.__signature__ = inspect.Signature(own + shared)
    run_command.__annotations__ = {
        p.name: p.annotation for p in run_command.__signature__.parameters.values()
    }
    run_command.__name__ = kind.name
    return run_command
