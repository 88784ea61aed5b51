"""The traced ops' registry (sigprop/model/ops/ holds the built-in ones, one file per family):
a ``TracedOp`` says how its calls are matched in torch.fx's graph and which moment-map node a
call becomes; its maps are registered beside it (``graph.map_op``).  A plug-in op of a module
class of its own says which modules are its in ``keep``: the tracer keeps such a module whole (one
``call_module`` node) instead of tracing its forward into primitive calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.fx as fx
import torch.nn as nn

from sigprop.registry import Registry


@dataclass(frozen=True)
class TracedOp:
    """A traced op: its category ``kind`` (dense, transposed, norm, act, identity, mix, maxpool,
    cat, add, mul, div, or a plug-in's own), ``match(gm, n)`` -- does fx node n call it? -- and
    ``node(tracing, n)`` -- the ``graph.GraphNode`` it becomes (an ``unknown`` one, naming
    why, where its arguments cannot be read) -- and ``keep(module)``, where given: True for the
    modules the tracer keeps whole (``symbolic_trace``; torch's own layers are kept whole
    anyway).  ``kind`` is what the
    init's roles read (a ``dense`` layer followed by an ``act`` takes its gain); the node's
    ``op`` names its maps (``graph.MAPS``)."""

    kind: str
    match: Callable[[fx.GraphModule, fx.Node], bool]
    node: Callable
    keep: Callable[[nn.Module], bool] | None = None


#: the registered traced ops by name, in the order they are tried (built-ins first; a plug-in is
#: tried before them with ``register(op, first=True)``)
TRACED: Registry[TracedOp] = Registry("traced op", skip=(__name__,))


def op_name(op: TracedOp) -> str:
    """A traced op's default name: its category and where its node builder and matcher are
    written (module, name, line): the same op registered twice -- or its file loaded twice --
    has the same name."""

    def at(fn) -> str:
        code = getattr(fn, "__code__", None)
        line = f":{code.co_firstlineno}" if code is not None else ""
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}{line}"

    return f"{op.kind} {at(op.node)} / {at(op.match)}"


def register(op: TracedOp, first: bool = False, name: str | None = None) -> TracedOp:
    """Add a traced op (``first``: tried before every registered one; ``name``: default
    ``op_name``); a name taken is refused, naming both registrations."""
    return TRACED.add(name or op_name(op), op, first=first)


def unregister(op: TracedOp) -> None:
    """Take ``op`` out (a test's plug-in, after it)."""
    TRACED.remove(next(k for k, v in TRACED.items() if v is op))


class _Tracer(fx.Tracer):
    """torch.fx's tracer, keeping whole the modules one of ``kept`` says True of."""

    def __init__(self, kept: list[Callable[[nn.Module], bool]]) -> None:
        super().__init__()
        self.kept = kept

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return any(k(m) for k in self.kept) or super().is_leaf_module(m, qualname)


def symbolic_trace(model: nn.Module) -> fx.GraphModule:
    """``torch.fx.symbolic_trace``, with the modules of the registered ops' ``keep`` kept whole
    (torch's own call where no op keeps any)."""
    kept = [op.keep for op in TRACED.values() if op.keep is not None]
    if not kept:
        return fx.symbolic_trace(model)
    tracer = _Tracer(kept)
    graph = tracer.trace(model)
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


def classify(gm: fx.GraphModule, n: fx.Node) -> TracedOp | None:
    """The traced op fx node n calls (None: a placeholder, a constant, the output, or a call
    no op matches)."""
    if n.op in ("placeholder", "get_attr", "output"):
        return None
    return next((op for op in TRACED.values() if op.match(gm, n)), None)


def classify_module(m: nn.Module) -> TracedOp | None:
    """The traced op that matches a call of module ``m`` (as the one node of a graph)."""
    graph = fx.Graph()
    node = graph.call_module("m", (graph.placeholder("x"),))
    root = nn.Module()
    root.add_module("m", m)
    return classify(fx.GraphModule(root, graph), node)


def kind_of(gm: fx.GraphModule, n: fx.Node) -> str:
    """What an fx node is: input, const, output, its traced op's kind, or other."""
    if n.op in ("placeholder", "get_attr", "output"):
        return {"placeholder": "input", "get_attr": "const", "output": "output"}[n.op]
    op = classify(gm, n)
    return "other" if op is None else op.kind
