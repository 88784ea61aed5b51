"""The traced ops' registry (sigprop/model/ops/ holds the built-in ones, one file per family):
a ``TracedOp`` says how its calls are matched in torch.fx's graph and which moment-map node a
call becomes; its maps are registered under the node's op (``maps.map_op``, sigprop/maps/).  A
plug-in op of a module class of its own says which modules are its in ``keep``: the tracer keeps
such a module whole (one ``call_module`` node) instead of tracing its forward into primitive
calls."""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Callable

import torch.fx as fx
import torch.nn as nn

from sigprop.maps.state import GraphNode
from sigprop.registry import Registry


@dataclass
class Tracing:
    """What a traced op's ``node`` reads while the graph is built (sigprop/model/trace.py builds
    it; here, below the ops, so that an op reading it does not call back into the tracer): the
    graph module, the nodes made so far (``nodes``, each with its fx node in ``fx_of`` and its
    index in ``index``)."""

    gm: fx.GraphModule
    index: dict
    nodes: list
    fx_of: list
    #: the values of nodes that depend on no input (an ATen graph's positions, masks, constant
    #: embeddings: ``model.export``), by fx node
    values: dict = dataclasses.field(default_factory=dict)

    def value(self, n):
        """A node's constant value: a parameter or buffer (get_attr) or a recorded one; None."""
        if not isinstance(n, fx.Node):
            return None
        if n in self.values:
            return self.values[n]
        if n.op == "get_attr":
            try:
                return operator.attrgetter(n.target)(self.gm)
            except AttributeError:
                return None
        return None

    def shape(self, n) -> tuple | None:
        """The output's shape per sample (None where the propagation recorded none)."""
        meta = n.meta.get("tensor_meta") if isinstance(n, fx.Node) else None
        return tuple(meta.shape[1:]) if meta is not None and hasattr(meta, "shape") else None

    def inputs(self, n: fx.Node) -> tuple[int, ...]:
        """The node's tensor inputs (constants left out), as indices of ``nodes``."""
        return tuple(
            self.index[a]
            for a in n.all_input_nodes
            if a in self.index and self.nodes[self.index[a]].op != "const"
        )

    def label(self, n: fx.Node) -> str:
        return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))

    def module(self, n: fx.Node) -> nn.Module | None:
        return self.gm.get_submodule(n.target) if n.op == "call_module" else None

    def unknown(self, n: fx.Node) -> GraphNode:
        """No map: named by its module's class, or the call."""
        m = self.module(n)
        return GraphNode(
            self.label(n), "unknown", self.inputs(n), why=type(m).__name__ if m is not None else self.label(n)
        )


@dataclass(frozen=True)
class TracedOp:
    """A traced op: its category ``kind`` (dense, transposed, norm, act, identity, mix, maxpool,
    cat, add, mul, div, or a plug-in's own), ``match(gm, n)`` -- does fx node n call it? -- and
    ``node(tracing, n)`` -- the ``maps.GraphNode`` it becomes (an ``unknown`` one, naming
    why, where its arguments cannot be read) -- and ``keep(module)``, where given: True for the
    modules the tracer keeps whole (``symbolic_trace``; torch's own layers are kept whole
    anyway).  ``kind`` is what the
    init's roles read (a ``dense`` layer followed by an ``act`` takes its gain); the node's
    ``op`` names its maps (``maps.MAPS``)."""

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
