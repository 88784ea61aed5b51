"""Measurements of a walk, one file each (../shared/STYLE.md: "observers/").  The registry is here;
no torch here (an observer's collecting half imports it in its own file).

An observer sees the walk (sigprop/walker/): ``start`` allocates its buffers, ``forward`` and
``backward`` see every recorded state and gradient, ``result`` hands its array to the driver
(sigprop/run.py) as float64 numpy.  The built-in ones -- the norm ratios (``ratios``), the BN
statistics (``bn``), the cosines of input pairs (``correlation``) -- have records of their own
in sigprop/results/, which the net kinds fill.  A plug-in observer (a new measurement, added
from one file: docs/architecture.md, "Add a measurement"; tests/observers/test_extra_observer.py)
registers a factory with ``register`` and turns its array into a ``results.Measurement`` in
``summarize`` -- per row a few values (and, if it gates, its checks); the JSON, the table, the
figure, ``--check`` and ``--observe NAME`` read it generically.
"""

from __future__ import annotations

import copy
from typing import Callable

from sigprop.errors import SigpropError
from sigprop.registry import Registry


class Observer:
    """A measurement: ``start`` allocates, ``forward``/``backward`` see each entry, ``result`` is
    its tensor.  The base class ignores everything (override what you measure)."""

    name = ""

    def fresh(self) -> "Observer":
        """A new observer for one walk, built as this one was (its constructor's arguments kept):
        a deep copy of this one, which has not walked (its buffers come in ``start``).  An
        observer that holds what must not be copied overrides it."""
        return copy.deepcopy(self)

    def start(self, w, entries: int) -> None:
        pass

    def forward(self, w, entry: int, state: dict, out: dict | None) -> None:
        pass

    def top(self, w, entry: int) -> None:
        pass

    def backward(self, w, entry: int, grad: dict, ref) -> None:
        pass

    def result(self):
        return None

    def summarize(self, array, run):
        """A plug-in's record of one init's run (``results.Measurement``) from its array (float64
        numpy, draws first) and the run so far (its rows, predictions and checks)."""
        raise NotImplementedError


#: the built-in collectors by the name a kind asks for (filled by their files), and the plug-in
#: measurements by the name ``--observe`` takes
COLLECTORS: Registry[Callable[[], Observer]] = Registry("observer", skip=(__name__,))
PLUGINS: Registry[Callable[[], Observer]] = Registry("observer", field="observe", skip=(__name__,))


def collector(name: str):
    """Register a built-in collector (a decorator on its class)."""

    def deco(cls):
        return COLLECTORS.add(name, cls)

    return deco


def register(factory: Callable[[], Observer], name: str | None = None) -> Callable[[], Observer]:
    """Register a plug-in measurement: ``factory()`` makes a fresh observer for each walk."""
    key = name or factory().name
    if key in COLLECTORS:
        raise SigpropError(
            f"observer {key!r} registered twice: a built-in collector has the name; give the new one another",
            field="observe",
        )
    return PLUGINS.add(key, factory)


def check_names(names) -> None:
    """Every name a registered plug-in, or one SigpropError naming ``observe`` (before a run
    allocates anything)."""
    for name in names:
        if name not in PLUGINS:
            known = ", ".join(PLUGINS) or "none is registered"
            raise SigpropError(f"unknown measurement {name!r}; registered plug-ins: {known}", field="observe")


def make(name: str) -> Observer:
    """A fresh observer by name (built-in or plug-in)."""
    return (COLLECTORS.get(name) or PLUGINS[name])()
