"""``sigprop check``: named probe configurations with their expectations, read from TOML.

The config layer of the CI gate (no torch here): it finds the file, validates every check
before anything runs, and turns each into specs the core runs.  Every error names the file and
the line of the offending key (or of the check's table), and exits 2.

A check is a TOML table under ``[tool.sigprop.checks]`` in pyproject.toml, or under
``[checks]`` in sigprop.toml (or any file given on the command line)::

    [checks.figure1-top]
    command = "mlp"                      # the net kind: any probe command (sigprop -h)
    depth = 20
    init = ["proposed", "proposed-gaussian"]
    expect = "pass"                      # "pass": every init must pass the gate;
                                         # "fail": every init must fail it (a known-bad init)
    gate = "preserved"                   # or "theory" (--gate); band = [0.1, 10] (--band)
    max_correlation = 0.9                # also fail when inputs of cosine 0 end above 0.9
    lowest_curvature = "proposed"        # instead of a probe: the curvature at init (sigprop
                                         # hessian) of the inits listed; passes when this one's
                                         # mean log10 spectral norm is the lowest (keys iters, tol, head,
                                         # batch_size)

Every option of the kind's command is a key (dashes or underscores), read from the kind's
declaration (sigprop/kinds/); a check without ``init`` checks ``proposed`` (``DEFAULT_INIT``).
docs/ci.md lists the keys.
"""

from __future__ import annotations

import difflib
import re

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sigprop import kinds, specs
from sigprop.errors import SigpropError
from sigprop.options import declared_options

META_KEYS = {
    "command": str,
    "init": (str, list),
    "expect": str,
    "description": str,
    "lowest_curvature": str,
}


def curvature_keys() -> dict:
    """The keys of a ``lowest_curvature`` check alone (TOML key -> option): the options
    ``specs.HessianSpec`` declares for a check, beside the probe's it shares."""
    return {o.toml_key: o for o in declared_options(specs.HessianSpec) if o.check}


def probe_keys() -> dict:
    """The probe's and the gate's keys a check takes (TOML key -> option), as ``specs.ProbeSpec``
    and ``specs.GateSpec`` declare them."""
    return {o.toml_key: o for o in specs.probe_options() if o.check}


EXPECT = ("pass", "fail")


class ConfigError(SigpropError):
    """A bad check configuration: ``where`` is ``file:line``."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass(frozen=True)
class CheckSpec:
    name: str
    command: str  # the net kind's name
    spec: Any  # the kind's spec
    probe: specs.ProbeSpec
    expect: str = "pass"
    description: str = ""
    where: str = ""
    raw: dict = field(default_factory=dict)
    gate: specs.GateSpec = specs.GateSpec()
    #: a curvature check (``lowest_curvature``): the Hessian spec and the init that must be lowest
    curvature: specs.HessianSpec | None = None
    lowest: str | None = None


def find_config(path: Path | None, cwd: Path) -> tuple[Path, tuple[str, ...]]:
    """The file and the table holding the checks.  Default: pyproject.toml's
    ``[tool.sigprop.checks]`` in ``cwd`` when it has one, else ``cwd/sigprop.toml``."""
    if path is not None:
        if not path.is_file():
            raise ConfigError(str(path), "no such file")
        data = _parse(path)
        if isinstance(data.get("tool", {}).get("sigprop", {}).get("checks"), dict):
            return path, ("tool", "sigprop", "checks")
        return path, ("checks",)
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file() and isinstance(
        _parse(pyproject).get("tool", {}).get("sigprop", {}).get("checks"), dict
    ):
        return pyproject, ("tool", "sigprop", "checks")
    local = cwd / "sigprop.toml"
    if local.is_file():
        return local, ("checks",)
    raise ConfigError(
        str(cwd),
        "no checks found: add [tool.sigprop.checks.NAME] to pyproject.toml, "
        "write sigprop.toml with [checks.NAME] tables, or name a file",
    )


def _parse(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:  # the message carries "(at line L, column C)"
        m = re.search(r"at line (\d+)", str(exc))
        raise ConfigError(f"{path}:{m.group(1) if m else '?'}", f"TOML syntax: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read: {exc}") from None


class _Lines:
    """Line numbers of check tables and keys, found by scanning the text (tomllib gives none)."""

    def __init__(self, path: Path, table: tuple[str, ...]) -> None:
        self.path = path
        self.lines = path.read_text(encoding="utf-8").splitlines()
        self.prefix = r"\.".join(re.escape(t) for t in table)

    def header(self, name: str) -> int:
        pat = re.compile(rf"^\s*\[\s*{self.prefix}\s*\.\s*(\"|')?{re.escape(name)}(\"|')?\s*\]")
        for i, line in enumerate(self.lines, 1):
            if pat.match(line):
                return i
        for i, line in enumerate(self.lines, 1):  # inline table or dotted keys: first mention
            if re.search(rf"\b{re.escape(name)}\b", line):
                return i
        return 1

    def key(self, name: str, key: str) -> int:
        start = self.header(name)
        pat = re.compile(rf"^\s*(\"|')?{re.escape(key)}(\"|')?\s*=")
        for i in range(start, len(self.lines)):
            line = self.lines[i]
            if line.lstrip().startswith("["):
                break
            if pat.match(line):
                return i + 1
        return start

    def where(self, name: str, key: str | None = None) -> str:
        return f"{self.path}:{self.header(name) if key is None else self.key(name, key)}"


def load(path: Path, table: tuple[str, ...]) -> list[CheckSpec]:
    """Validate every check of the file (all of them, before any runs)."""
    data = _parse(path)
    lines = _Lines(path, table)
    node: Any = data
    for t in table:
        node = node.get(t) if isinstance(node, dict) else None
    if not isinstance(node, dict) or not node:
        raise ConfigError(f"{path}:1", f"no [{'.'.join(table)}.NAME] tables")
    out = []
    for name, raw in node.items():
        if not isinstance(raw, dict):
            raise ConfigError(lines.where(name), f"check {name!r} must be a table of options")
        out.append(_check(name, raw, lines))
    return out


def _check(name: str, raw: dict, lines: _Lines) -> CheckSpec:
    opts = {str(k).replace("-", "_"): v for k, v in raw.items()}
    original = {str(k).replace("-", "_"): str(k) for k in raw}
    where = lambda key=None: lines.where(name, original.get(key, key) if key else None)
    command = opts.get("command")
    if command not in kinds.KINDS:
        raise ConfigError(
            where("command" if "command" in opts else None),
            f"check {name!r}: command must be one of {', '.join(map(repr, kinds.names()))}, got {command!r}",
        )
    kind = kinds.get(command)
    own = {o.name: (o.toml or o.type) for o in kind.options}
    taken = {k: o.toml or o.type for k, o in {**probe_keys(), **curvature_keys()}.items()}
    _check_keys(name, command, opts, original, {**META_KEYS, **taken, **own}, where)
    expect = opts.get("expect", "pass")
    if expect not in EXPECT:
        raise ConfigError(where("expect"), f'check {name!r}: expect must be "pass" or "fail", got {expect!r}')
    names = opts.get("init")
    if isinstance(names, str):
        names = [names]
    if names is not None and not all(isinstance(n, str) for n in names):
        raise ConfigError(where("init"), f"check {name!r}: init must be a name or a list of names")
    try:
        given = {o.name: opts[k] for k, o in probe_keys().items() if k in opts}
        probe, gate = specs.probe_specs(given, kind.probe_defaults)
        spec = _spec(kind, {k: opts[k] for k in own if k in opts}, names)
        curvature, lowest = _curvature(name, kind, spec, opts, original, where)
    except ConfigError:
        raise
    except SigpropError as exc:
        key = (exc.field or "").split("/")[0]  # library fields are the TOML keys (with underscores)
        key = next((o.toml_key for o in specs.probe_options() if o.name == key), key)
        raise ConfigError(
            where(key if key in opts else None), f"check {name!r}: {key or 'value'}: {exc.args[0]}"
        ) from None
    return CheckSpec(
        name,
        command,
        spec,
        probe,
        expect,
        str(opts.get("description", "")),
        where(),
        dict(raw),
        gate,
        curvature,
        lowest,
    )


def _check_keys(name: str, command: str, opts: dict, original: dict, allowed: dict, where) -> None:
    """Every key of a check is one its command takes, of its type (a TOML boolean is not a number)."""
    for key, value in opts.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                where(key), f"check {name!r}: unknown key {original[key]!r} for {command}{hint}"
            )
        want = allowed[key]
        wrong_bool = isinstance(value, bool) and bool not in (want if isinstance(want, tuple) else (want,))
        if wrong_bool or not isinstance(value, want):
            raise ConfigError(
                where(key), f"check {name!r}: {original[key]} must be {_type_name(want)}, got {value!r}"
            )


def _curvature(name: str, kind, spec, opts: dict, original: dict, where):
    """(the curvature spec, the init expected lowest) of a ``lowest_curvature`` check, or (None,
    None); the curvature keys belong to such a check only."""
    lowest = opts.get("lowest_curvature")
    if lowest is None:
        for key in curvature_keys():
            if key in opts:
                raise ConfigError(
                    where(key), f"check {name!r}: {original[key]} applies to a lowest_curvature check only"
                )
        return None, None
    listed = kind.inits(spec)
    if lowest not in listed or len(listed) < 2:
        raise ConfigError(
            where("lowest_curvature"),
            f"check {name!r}: lowest_curvature must name one of two or more inits listed in init, "
            f"got {lowest!r}",
        )
    taken = {**probe_keys(), **curvature_keys()}
    fields = {o.name for o in declared_options(specs.HessianSpec)}
    given = {o.name: opts[k] for k, o in taken.items() if k in opts and o.name in fields}
    return specs.HessianSpec(**given), lowest


#: a check without ``init`` checks the paper's init (docs/cli.md), where the net takes it
DEFAULT_INIT = "proposed"


def _spec(kind: kinds.Kind, values: dict, names: list[str] | None):
    """The check's net: its inits as listed, else ``DEFAULT_INIT``, else -- a net that cannot take
    it, e.g. a batch-normalized one (He weights) -- the command's own defaults."""
    if names is not None:
        return kind.make(values, tuple(names))
    try:
        return kind.make(values, (DEFAULT_INIT,))
    except SigpropError as exc:
        if exc.field != "init":
            raise
        return kind.make(values, None)


def _type_name(want) -> str:
    kinds = want if isinstance(want, tuple) else (want,)
    words = {int: "an integer", str: "a string", bool: "true or false", list: "a list", float: "a number"}
    return " or ".join(words[k] for k in kinds)
