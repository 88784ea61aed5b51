"""One registry idiom for every extension family (../shared/STYLE.md habit 2; timm's
``_registry.py``): net kinds, engines, init schemes and their samplers, observers, traced ops,
their moment maps, sweep executors and what a sweep's point measures.  No torch here.

A ``Registry`` is a dict of entries by name, in the order they were added (the order traced ops
are tried in, and inits listed in): ``add`` refuses a name already taken, naming both entries
and the modules that added them (two plug-ins, or one file imported twice by two paths, no
longer silently replace one another); ``lookup`` raises one ``SigpropError`` naming the field,
the closest valid name and the list.
"""

from __future__ import annotations

import difflib
import sys
from typing import Generic, TypeVar

from sigprop.errors import SigpropError

T = TypeVar("T")


def _caller(skip: tuple[str, ...]) -> str:
    """The module (and line) that called into the registry, past the registry's own modules and
    ``skip`` (a family's ``register`` wrapper)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "?")
        if module != __name__ and module not in skip:
            return f"{module} (line {frame.f_lineno})"
        frame = frame.f_back
    return "?"


class Registry(dict, Generic[T]):
    """The entries of one extension family by name (``family``: what a message calls one,
    ``field``: the option a lookup's error names; ``skip``: the family's wrapper modules, left
    out of where an entry came from)."""

    def __init__(self, family: str, field: str | None = None, skip: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.family, self.field, self.skip = family, field, skip
        self.origin: dict[str, str] = {}

    def add(self, name: str, item: T, *, first: bool = False) -> T:
        """Add ``item`` under ``name`` (``first``: before every entry, where order matters);
        a name taken raises, naming both."""
        where = _caller(self.skip)
        if not isinstance(name, str) or not name:
            raise SigpropError(f"a {self.family} needs a name (from {where})", field=self.field)
        if name in self:
            raise SigpropError(
                f"{self.family} {name!r} registered twice: by {where}, and before by {self.origin[name]}; "
                "give the new one another name",
                field=self.field,
            )
        if first:
            rest = list(self.items())
            self.clear()
            self[name] = item
            self.update(rest)
        else:
            self[name] = item
        self.origin[name] = where
        return item

    def remove(self, name: str) -> T:
        """Take the entry ``name`` out (a test's plug-in, after it)."""
        self.origin.pop(name, None)
        return self.pop(name)

    def lookup(self, name: str, valid: list[str] | None = None) -> T:
        """The entry ``name``, or one SigpropError with the closest of ``valid`` (default: every
        name) and the list."""
        valid = list(self) if valid is None else valid
        if name in valid:
            return self[name]
        close = difflib.get_close_matches(str(name), valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = ", ".join(valid) or "none is registered"
        raise SigpropError(f"unknown {self.family} {name!r}{hint}; choose from {known}", field=self.field)
