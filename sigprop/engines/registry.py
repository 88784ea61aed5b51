"""The engines' registry: an engine runs a kind's probe, curvature and spectrum; a kind names its
engine (``Kind.engine``: "plan" for sigprop's own nets, "model" for a user's module), and
sigprop/run.py dispatches through ``of(kind)``.  A new engine is a subclass of ``Engine``
registered once at import (sigprop/engines/__init__.py imports the built-in ones; ``LAZY`` names
those imported on first use)."""

from __future__ import annotations

import importlib

from sigprop.errors import SigpropError
from sigprop.registry import Registry


class Engine:
    """What an engine does: ``measure`` (a probe's observations, ``engines.shared.Measured``),
    ``assemble`` (one init's record from them), ``curvature`` (a ``HessianResult``), ``spectrum``
    (a ``SpectrumResult``), each for one kind and spec, reporting ``progress(done, total,
    label)`` and calling ``on_start(env)`` once the inputs are validated."""

    name = ""

    def measure(self, kind, spec, probe_spec, progress, on_start, extra):
        raise NotImplementedError

    def curvature(self, kind, spec, hs, progress, on_start):
        raise NotImplementedError

    def spectrum(self, kind, spec, ss, progress, on_start):
        raise NotImplementedError

    def assemble(self, kind, name: str, scheme, spec, plan, arrays: dict, probe, gate):
        """One init's ``results.RunResult`` from its observations (``name``: the init as the result
        names it; ``scheme``: what ran): per row the statistics beside the kind's predictions, and
        the kind's verdicts."""
        raise NotImplementedError


#: name -> the registered engine
ENGINES: Registry[Engine] = Registry("engine", skip=(__name__,))

#: engines outside this package, imported (and so registered) the first time a kind asks for
#: one: the "model" engine (sigprop/engines/model.py) brings torch.fx and the traced-op maps, 80 ms
#: of import a run of sigprop's own nets never needs (docs/benchmarks.md, "Import")
LAZY = {"model": "sigprop.engines.model"}


def register(engine: Engine) -> Engine:
    """Add ``engine`` under its name (once: a second engine of one name is refused)."""
    return ENGINES.add(engine.name, engine)


def of(kind) -> Engine:
    """The engine that runs ``kind`` (its ``engine`` attribute), imported first if it is ``LAZY``."""
    if kind.engine not in ENGINES and kind.engine in LAZY:
        importlib.import_module(LAZY[kind.engine])
    try:
        return ENGINES[kind.engine]
    except KeyError:
        raise SigpropError(f"internal error: no engine {kind.engine!r} for {kind.name!r}") from None
