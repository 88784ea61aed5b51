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
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional, get_args

import typer
from rich.markup import escape

from sigprop import inits, kinds, specs
from sigprop.options import declared_options
from sigprop.width.spec import WidthSpec

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
    own |= {o.name: o.cli_flag for o in declared_options(WidthSpec)}
    own |= {o.name: o.cli_flag for k in kinds.KINDS.values() for o in k.width_options or ()}
    return "/".join(FLAGS.get(f) or own.get(f) or "--" + f.replace("_", "-") for f in field.split("/"))


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    csv = "csv"


class TableFormat(str, enum.Enum):
    """The formats of a command whose record has no per-layer rows to put in CSV (hessian, theory)."""

    table = "table"
    json = "json"


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
    base = Path if o.path else o.type
    if o.choices:
        base = enum.Enum(f"{prefix}_{o.name}", {str(c): str(c) for c in o.choices}, type=str)
    decl = f"{o.cli_flag}/{o.off}" if o.type is bool and o.off else o.cli_flag
    help_ = o.help + (f" [default: {o.shown}]" if o.shown else "")
    extra = {"min": o.min} if o.min is not None else {}
    if o.positional and o.default is None:  # an argument another option may stand for (TARGET, --config)
        return Annotated[Optional[base], Argument(help=o.help, show_default=False)], None
    if o.positional:  # a required argument
        return Annotated[base, Argument(help=o.help, show_default=False)], inspect.Parameter.empty
    if o.repeat:
        return Annotated[Optional[list[base]], Option(decl, help=help_, **extra)], None
    annotation = Optional[base] if o.default is None else base
    default = base(o.default) if o.choices and o.default is not None else o.default
    return Annotated[annotation, Option(decl, help=help_, **extra)], default


def cli_values(options, given: dict) -> dict:
    """The library's values of the options a command got: an enum member as its value, a
    repeated flag as a tuple, the CLI's text parsed (``Opt.parse``); one not given (None) left
    out, to take its default."""
    out = {}
    for o in options:
        v = given.get(o.name)
        if v is None:
            continue
        v = v.value if isinstance(v, enum.Enum) else str(v) if isinstance(v, Path) else v
        out[o.name] = o.parse(v) if o.parse else tuple(v) if isinstance(v, list) else v
    return out


def declared_table(options, prefix: str, changes: dict | None = None) -> list:
    """(name, annotation, default) of a command's declared options (those with ``cli``), each with
    its ``changes`` for the command; an option read only with another (``Opt.needs``) and one
    whose value is text the command line parses into a tuple are not given by default."""
    out = []
    for o in (o for o in options if o.cli):
        c = dict((changes or {}).get(o.name, {}))
        if o.needs:
            c.setdefault("default", None)
            c.setdefault("shown", str(o.default))
        elif isinstance(o.default, tuple) and not o.repeat:
            c.setdefault("default", None)
        out.append((o.name, *_annotated(replace(o, **c), prefix)))
    return out


def declared_spec(cls, values: dict):
    """The spec ``cls`` of a command's values (its declared options), an option given without
    the one it needs (``Opt.needs``) refused in one line."""
    options = declared_options(cls)
    given = cli_values(options, values)
    for o in options:
        if o.needs and o.name in given and not given.get(o.needs):
            raise specs.SigpropError(
                f"sets what {flag(o.needs)} measures: it takes {flag(o.needs)} too", field=o.name
            )
    return cls(**given)


FormatOpt = Annotated[Format, Option("--format", help="Output format.")]
OutputOpt = Annotated[Optional[Path], Option(help="Write the output to this file (whole, never half).")]
AnyInitName = enum.Enum("AnyInitName", {name: name for name in inits.names()}, type=str)


class CheckFormat(str, enum.Enum):
    text = "text"
    json = "json"


class CommandOptions:
    """What a command got, handed to it as one object: where its output goes (``fmt``, ``output``,
    ``plot``; a probe's ``check``) and the library's options by name (``values``: every option its
    spec declares for the command line, sigprop/options.py)."""

    OUTPUT = ("check", "fmt", "output", "plot")

    def __init__(self, **kw) -> None:
        for name in self.OUTPUT:
            setattr(self, name, kw.pop(name, None))
        self.values = kw

    def resolve(self) -> "CommandOptions":
        """The library's specs of the values (``command`` calls it after the kind's own spec,
        so a bad net is named before a bad probe option), set on the object itself: the
        command's body reads them and never calls back here."""
        return self


class ProbeOptions(CommandOptions):
    def resolve(self) -> "ProbeOptions":
        """The probe and the gate the command line asks for (``probe``, ``gate``)."""
        self.probe, self.gate = specs.probe_specs(cli_values(specs.probe_options(), self.values))
        return self


class HessianOptions(CommandOptions):
    def resolve(self) -> "HessianOptions":
        self.spec = declared_spec(specs.HessianSpec, self.values)
        return self


class SpectrumOptions(CommandOptions):
    def resolve(self) -> "SpectrumOptions":
        self.spec = declared_spec(specs.SpectrumSpec, self.values)
        return self


def _plot(help_: str):
    return Annotated[Optional[Path], Option(help=help_)]


TableFormatOpt = Annotated[TableFormat, Option("--format", help="Output format.")]
#: what a probe command takes besides the library's options: --check, and where its output goes
OUTPUT_OPTIONS = (
    ("check", CheckOpt, False),
    ("fmt", FormatOpt, Format.table),
    ("output", OutputOpt, None),
    ("plot", PlotOpt, None),
)
HESSIAN_OUTPUT = (
    ("fmt", TableFormatOpt, TableFormat.table),
    ("output", OutputOpt, None),
    (
        "plot",
        _plot("Also draw the curvature per init (bar: mean ± sd, points: draws) to this .png/.svg/.pdf."),
        None,
    ),
)
SPECTRUM_OUTPUT = (
    ("fmt", TableFormatOpt, TableFormat.table),
    ("output", OutputOpt, None),
    (
        "plot",
        _plot(
            "Write the figure (.png/.svg/.pdf; needs the plot extra): the spectrum's histogram per init, and "
            "with --depths the spread against depth."
        ),
        None,
    ),
)


def spectrum_table(kind: kinds.Kind):
    """``sigprop spectrum KIND``'s shared options: ``specs.SpectrumSpec``'s declared ones."""
    return (*declared_table(declared_options(specs.SpectrumSpec), "spectrum"), *SPECTRUM_OUTPUT)


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
    changes = {name: {"default": v} for name, v in kind.probe_defaults.items()}
    changes.setdefault("band", {})["shown"] = kind.band_help
    return (*declared_table(specs.probe_options(), "probe", changes), *OUTPUT_OPTIONS)


def hessian_table(kind: kinds.Kind):
    """``sigprop hessian KIND``'s shared options: ``specs.HessianSpec``'s declared ones, its
    --samples help stating the kind's default."""
    changes = {"samples": {"shown": f"{kind.curvature_samples} synthetic; all of --data"}}
    return (*declared_table(declared_options(specs.HessianSpec), "hessian", changes), *HESSIAN_OUTPUT)


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
        spec = kind.make(values, names)
        return body(kind, spec, opts.resolve())

    run_command.__signature__ = inspect.Signature(own + shared)
    run_command.__annotations__ = {
        p.name: p.annotation for p in run_command.__signature__.parameters.values()
    }
    run_command.__name__ = kind.name
    return run_command
