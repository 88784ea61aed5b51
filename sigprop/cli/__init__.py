"""The ``sigprop`` command line (typer only: parse, build specs, call the core, render).

No tensors here: the core (sigprop/api.py, which loads torch) is imported inside the commands
that run it, so ``sigprop --help``, ``sigprop inits`` and ``sigprop theory`` never import torch.
Errors become one line on stderr: exit 2 for bad input, 1 for a failed ``--check``, 130 for
Ctrl-C (see :func:`main`).

A package: ``_app`` (the typer app and its root options), ``options`` (every shared option
declared once; a net kind's options as typer parameters), ``output`` (where output goes),
``probe`` (one command per net kind and its ``hessian`` form), ``tools`` (the other commands).
The application is built by ``main`` when it runs, from the registries as they are then: a net
kind registered by a user's code before ``main`` gets its command; a run builds the family of
commands it names alone (``build``: a probe's, hessian's, spectrum's or the tools'), help and
anything unknown the whole application.
"""

from __future__ import annotations

import difflib
import importlib
import re
import sys
from typing import Optional

import typer

from sigprop import kinds
from sigprop.cli._app import new_app
from sigprop.cli.options import flag
from sigprop.cli.output import _say
from sigprop.errors import SigpropError

try:  # recent typer vendors click as typer._click; older typer uses click itself
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import UsageError


def _given(option: str, argv: list[str]) -> str | None:
    """The value ``argv`` gives ``option`` last (``--depth 3`` or ``--depth=3``), or None."""
    found = None
    for i, tok in enumerate(argv):
        if tok == option and i + 1 < len(argv):
            found = argv[i + 1]
        elif tok.startswith(option + "="):
            found = tok.split("=", 1)[1]
    return found


def _not_an_integer(option: str, value: str | None) -> str:
    """Why ``value`` is not one integer, and what to give instead: several values go to a sweep;
    a number in another notation is written out."""
    if value is not None and "," in value:
        return (
            f"{option}: expected one integer, got {value!r} (for several values use sigprop sweep, which "
            "takes comma-separated lists)"
        )
    try:
        number = float(value) if value is not None else None
    except ValueError:
        number = None
    if number is not None and number.is_integer() and abs(number) < 2**63:
        return f"{option}: expected one integer, got {value!r} (write it out: {int(number)})"
    return f"{option}: expected one integer" + ("" if value is None else f", got {value!r}")


def _usage_hint(msg: str, argv: list[str] = ()) -> str:
    """typer's words for a bad choice or number, without its validator's prefix, with a
    did-you-mean and the way to give several values."""
    msg = msg.replace("Value error, ", "")
    m = re.match(r"Invalid value for '(--[\w-]+)': '([^']*)' is not one of (.*?)\.?$", msg)
    if m:
        option, value, choices = m.groups()
        names = re.findall(r"'([^']+)'", choices)
        if "," in value:
            return (
                f"{option}: {value!r} is not a name; give one per option: --init he --init proposed "
                f"(choose from {', '.join(names)})"
            )
        close = difflib.get_close_matches(value, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{option}: unknown value {value!r}{hint}; choose from {', '.join(names)}"
    m = re.match(r"Invalid value for '(--[\w-]+)'", msg)
    if m and re.search(r"valid int(eger)?\b", msg):  # typer's "a valid integer", click's "a valid int range"
        return _not_an_integer(m.group(1), _given(m.group(1), list(argv)))
    return msg


def repeated(command, argv: list[str]) -> str | None:
    """The first option of the command ``argv`` runs that takes one value and is given twice
    (``--depth 3 --depth 4``; ``--check --no-check``): click keeps the last without a word, so
    it is refused before parsing.  Options that take several (``--init``, a sweep's axes) may
    repeat; nothing after ``--`` is read."""
    cmd, rest = command, list(argv)
    # click's classes duck-typed: typer vendors its own copy of click, whose Group is not click's
    while hasattr(cmd, "commands"):  # down to the command the arguments name
        i = next((i for i, tok in enumerate(rest) if tok in cmd.commands), None)
        if i is None:
            return None
        cmd, rest = cmd.commands[rest[i]], rest[i + 1 :]
    options = {n: p for p in cmd.params if hasattr(p, "secondary_opts") for n in p.opts + p.secondary_opts}
    seen: set[str] = set()
    i = 0
    while i < len(rest) and rest[i] != "--":
        name = rest[i].split("=", 1)[0]
        p = options.get(name)
        if p is not None:
            if not p.multiple and not p.count:
                if p.name in seen:
                    return name
                seen.add(p.name)
            i += 0 if p.is_flag or "=" in rest[i] else 1  # its value is not an option
        i += 1
    return None


#: the families of commands, each a module of sigprop/cli/ whose ``register`` adds them, and the
#: top-level names it adds (the probes': one per registered net kind)
FAMILIES = {
    "probe": None,
    "curvature": ("hessian",),
    "spectrum": ("spectrum",),
    "width": ("width",),
    "tools": ("sweep", "plot", "rerun", "check", "theory", "inits", "cite", "env"),
}


def build(command: str | None = None) -> typer.Typer:
    """The application: the probe command of every registered net kind, ``sigprop hessian KIND``,
    ``sigprop spectrum KIND`` and the other commands -- or, where ``command`` names one of them,
    only the family that holds it (a plain ``sigprop mlp`` builds no hessian, spectrum or sweep
    command: 0.16 ran every family's registration for every run); help, an unknown name or an
    option first build them all."""
    app = new_app()
    names = {family: tuple(kinds.names()) if n is None else n for family, n in FAMILIES.items()}
    wanted = [f for f, n in names.items() if command in n] or list(FAMILIES)
    for family in wanted:
        importlib.import_module(f"sigprop.cli.{family}").register(app)
    return app


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI and return its exit code; every error is one line on stderr."""
    given = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(build(given[0] if given else None))
    twice = repeated(command, given)
    if twice is not None:
        _say(f"sigprop: error: {twice}: given twice; it takes one value")
        return 2
    try:
        rv = command.main(args=argv, prog_name="sigprop", standalone_mode=False)
    except SigpropError as exc:
        _say(f"sigprop: error: {flag(exc.field) + ': ' if exc.field else ''}{exc.message}")
        return exc.exit_code
    except typer.Exit as exc:
        if exc.exit_code == 130:  # typer turns Ctrl-C into Exit(130) itself
            _say("sigprop: interrupted")
        return exc.exit_code
    except UsageError as exc:
        msg = " ".join(exc.format_message().split())
        if not msg:  # bare `sigprop`: help was printed (no_args_is_help)
            return 0
        _say(f"sigprop: error: {_usage_hint(msg, given)} (see sigprop -h)")
        return 2
    except (typer.Abort, KeyboardInterrupt):
        _say("sigprop: interrupted")
        return 130
    except MemoryError:
        _say("sigprop: error: out of memory; reduce --samples, --depth or --width")
        return 2
    except Exception as exc:  # never a traceback; a bug still says what it was
        if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError, without importing torch
            _say(
                "sigprop: error: the GPU ran out of memory during the run (its free memory changed since the "
                "estimate?); reduce --samples, --depth/--blocks or --width, use --stream, or --device cpu"
            )
            return 2
        _say(f"sigprop: internal error: {type(exc).__name__}: {exc} (please report it)")
        return 1
    if rv == 130:  # typer's click returns 130 for Ctrl-C (KeyboardInterrupt) without standalone mode
        _say("sigprop: interrupted")
    return rv if isinstance(rv, int) else 0
