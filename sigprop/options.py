"""One option, declared once: ``Opt`` says what an option is (its field and API keyword, type,
default, help, CLI flag, TOML key) and where it is taken (the command line, the API's keywords, a
TOML check, ``sigprop sweep``, ``sigprop rerun``).  A net kind declares its own options as a
tuple of ``Opt`` (sigprop/kinds/); the probe's and the gate's are the fields of ``specs.ProbeSpec``
and ``specs.GateSpec`` declared with ``declared`` -- the dataclass field is the declaration, and
``declared_options`` reads it back.  Every place that takes an option derives it from here
(docs/architecture.md, "Add a probe option"); tests/test_options.py adds one and finds it in each.

No torch, and nothing of sigprop above the errors: specs.py and the kinds import this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

#: the dataclass field metadata key that makes a field an option
OPTION = "sigprop.option"


@dataclass(frozen=True)
class Opt:
    """One option: the spec field and API keyword ``name``, its CLI flag (``--`` + the name with
    dashes unless ``flag`` says otherwise), its TOML key (``key``, else the name; dashes or
    underscores).  ``type``: what the CLI parses (int, str, bool, float; a bool with ``off`` is a
    pair of flags ``--on/--off``); ``choices``: the accepted values; ``default`` None with
    ``shown``: an optional value whose default the help states."""

    name: str
    type: type
    default: Any
    help: str
    min: int | None = None
    choices: tuple | None = None
    flag: str | None = None
    off: str | None = None
    shown: str | None = None
    #: the TOML/JSON types it takes (default: ``type``; a width may be 256 or "150:250")
    toml: tuple = ()
    #: the CLI takes it as an argument (``sigprop module TARGET``), not a flag
    positional: bool = False
    #: the CLI flag may repeat (``--arg a=1 --arg b=2``): the value is a tuple
    repeat: bool = False
    #: False: an API keyword only (``model=``: a Python object no command line can name)
    cli: bool = True
    #: the TOML key of a check when it is not the name (``correlation`` for ``correlations``)
    key: str | None = None
    #: the command line's text to the library's value (``--band 0.5:2`` -> (0.5, 2.0))
    parse: Callable[[Any], Any] | None = None
    #: a keyword of the API's ``probe_<kind>`` functions
    api: bool = True
    #: a key of a TOML check (``sigprop check``)
    check: bool = True
    #: an option of ``sigprop sweep``: every point is probed with it
    sweep: bool = False
    #: a sweep option's part in a point's resume key: "always", "set" (when not its default: a
    #: file written before the option existed still resumes), the name of another option (when
    #: that one is set: the input pairs with the cosines) or "" (never: where a point runs)
    keyed: str = "set"
    #: where ``sigprop rerun`` reads it from a result document: "config" (as given), "environment"
    #: (what the run resolved, the config's value where the environment lacks it: the device
    #: ``auto`` became) or "" (not read back: the thread count, rerun bounds it by this machine's)
    recorded: str = "config"
    #: the annotation of the API keyword (the spec field's, as written)
    annotation: str = ""
    #: the command line takes a path (``--data FILE``); the library keeps it as text
    path: bool = False
    #: read only with this other option (``--probes`` with ``--density``): on the command line
    #: not given by default, and given without that option refused in one line
    needs: str = ""

    @property
    def cli_flag(self) -> str:
        if self.positional:  # an argument: messages name it as the usage line does
            return self.name.upper()
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def toml_key(self) -> str:
        return self.key or self.name


def declared(type_: type, default: Any, help: str, **meta) -> Any:
    """A spec field that is an option: ``samples: int = declared(int, 1000, "Random inputs N.",
    min=1, sweep=True)``.  The dataclass field carries the default; its metadata the rest of the
    ``Opt`` (its name and annotation are the field's)."""
    return field(default=default, metadata={OPTION: {"type": type_, "help": help, **meta}})


def declared_options(*classes) -> tuple[Opt, ...]:
    """The options the dataclasses ``classes`` declare (``declared`` fields), in field order."""
    return tuple(
        Opt(name=f.name, default=f.default, annotation=str(f.type), **f.metadata[OPTION])
        for cls in classes
        for f in fields(cls)
        if OPTION in f.metadata
    )


def keyed(spec) -> dict:
    """The sweep options of ``spec`` (a declared dataclass) that a sweep point's resume key holds
    (``Opt.keyed``), tuples as lists (the key is JSON)."""
    options = {o.name: o for o in declared_options(type(spec)) if o.sweep}
    out = {}
    for o in options.values():
        rule = o.keyed
        if rule in ("always", "set"):
            taken = rule == "always" or getattr(spec, o.name) != o.default
        else:
            taken = bool(rule) and getattr(spec, rule) != options[rule].default
        if taken:
            v = getattr(spec, o.name)
            out[o.name] = list(v) if isinstance(v, tuple) else v
    return out
