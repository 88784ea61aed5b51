"""The traced ops' registry (sigprop/model/ops/ holds the built-in ones, one file per family):
a ``TracedOp`` says how its calls are matched in torch.fx's graph and which moment-map node a
call becomes; its maps are registered beside it (``graph.map_op``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.fx as fx


@dataclass(frozen=True)
class TracedOp:
    """A traced op: its category ``kind`` (dense, transposed, norm, act, identity, mix, maxpool,
    cat, add, mul, div, or a plug-in's own), ``match(gm, n)`` -- does fx node n call it? -- and
    ``node(tracing, n)`` -- the ``graph.GraphNode`` it becomes (an ``unknown`` one, naming
    why, where its arguments cannot be read)."""

    kind: str
    match: Callable[[fx.GraphModule, fx.Node], bool]
    node: Callable


#: the registered traced ops, in the order they are tried (built-ins first; a plug-in is tried
#: before them with ``register(op, first=True)``)
TRACED: list[TracedOp] = []


def register(op: TracedOp, first: bool = False) -> TracedOp:
    """Add a traced op (``first``: tried before every registered one)."""
    if first:
        TRACED.insert(0, op)
    else:
        TRACED.append(op)
    return op


def unregister(op: TracedOp) -> None:
    TRACED.remove(op)


def classify(gm: fx.GraphModule, n: fx.Node) -> TracedOp | None:
    """The traced op fx node n calls (None: a placeholder, a constant, the output, or a call
    no op matches)."""
    if n.op in ("placeholder", "get_attr", "output"):
        return None
    return next((op for op in TRACED if op.match(gm, n)), None)


def kind_of(gm: fx.GraphModule, n: fx.Node) -> str:
    """What an fx node is: input, const, output, its traced op's kind, or other."""
    if n.op in ("placeholder", "get_attr", "output"):
        return {"placeholder": "input", "get_attr": "const", "output": "output"}[n.op]
    op = classify(gm, n)
    return "other" if op is None else op.kind
