"""A model traced by torch.fx into a graph of moment maps (``graph.GraphNode``): each call made a
node by the traced op that matches it (sigprop/model/ops/), or an ``unknown`` one naming it; the
shapes from a forward of two samples (a batch norm needs two), whose result is also the model's
``Survey`` (sigprop/model/sites.py) -- the input checked, the modules called, the memory."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.passes.shape_prop import ShapeProp

from sigprop.errors import SigpropError
from sigprop.model import ops
from sigprop.model.build import Deterministic, check_finite, first_line, output_choice, output_tensor, rows
from sigprop.model.graph import GraphNode
from sigprop.model.sites import Survey


@dataclass
class Tracing:
    """What a traced op's ``node`` reads while the graph is built: the graph module, the nodes
    made so far (``nodes``, each with its fx node in ``fx_of`` and its index in ``index``)."""

    gm: fx.GraphModule
    index: dict
    nodes: list
    fx_of: list

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


@dataclass
class Traced:
    """A model traced by ``trace_graph``: its graph of moment maps (``nodes``), the last node
    inside every module path (``last_in``: a site's node), and the ``Survey`` the shape
    propagation's forward of two samples gives for free; ``why`` (and no nodes) where torch.fx
    could not trace it."""

    nodes: list | None
    last_in: dict
    why: str = ""
    survey: Survey | None = None

    def where(self, sites: list[str]) -> list[int | None]:
        return [self.last_in.get(s) for s in sites]


def trace(model: nn.Module, x: torch.Tensor, sites: list[str]):
    """The model's graph of moment maps and each site's node (None where the site is not in the
    graph), or (None, None, why) when torch.fx cannot trace it (``trace_graph``)."""
    t = trace_graph(model, x)
    return (None, None, t.why) if t.nodes is None else (t.nodes, t.where(sites), "")


def _survey_of(gm: fx.GraphModule, out, rows_: int, what: str) -> Survey:
    """``survey``'s record from a shape propagation: its modules' outputs (bytes per sample),
    the module paths it ran (calls and their enclosing modules), and its output."""
    total, called = 0, set()
    for n in gm.graph.nodes:
        called |= set((n.meta.get("nn_module_stack") or {}).keys())
        if n.op == "call_module":
            called.add(n.target)
            meta = n.meta.get("tensor_meta")
            if meta is not None and hasattr(meta, "shape"):
                total += math.prod(meta.shape) * meta.dtype.itemsize
    y = output_tensor(out)
    check_finite(y, f"{what}'s output on the probe's inputs")
    return Survey(total // max(rows_, 1), frozenset(called), y[0].numel(), output_choice(out))


def _node(t: Tracing, n: fx.Node) -> GraphNode:
    """The graph node of fx node n: input, const, output, or its traced op's."""
    if n.op in ("placeholder", "get_attr"):
        return GraphNode(n.name, "input" if n.op == "placeholder" else "const", ())
    if n.op == "output":
        return GraphNode(n.name, "output", t.inputs(n)[:1])
    ins = n.all_input_nodes
    if ins and all(a in t.index and t.nodes[t.index[a]].op == "const" for a in ins):
        return GraphNode(n.name, "const", ())  # arithmetic on sizes or constants: no state
    op = ops.classify(t.gm, n)
    return t.unknown(n) if op is None else op.node(t, n)


class _Root(nn.Module):
    """A model torch.fx keeps whole, as the child ``root`` of a module that calls it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.root = model

    def forward(self, x):  # one input: torch.fx traces no *args
        return self.root(x)


def _unwrapped(t: Traced) -> Traced:
    """A ``_Root`` trace with the model's own paths: ``root.layers.0`` -> ``layers.0``."""
    strip = lambda s: s[len("root.") :] if s.startswith("root.") else ("" if s == "root" else s)
    if t.nodes is None:
        return t
    nodes = [dataclasses.replace(nd, name=strip(nd.name), why=nd.why.replace("root.", "")) for nd in t.nodes]
    return Traced(nodes, {strip(k): v for k, v in t.last_in.items()}, t.why, None)


def trace_graph(model: nn.Module, x, what: str = "the model") -> Traced:
    """``Traced``: torch.fx's graph of the model with its shapes (a forward of two samples, no
    graph -- a batch norm needs two) made into moment maps."""
    two = rows(x, 0, 2) if isinstance(x, tuple) else (x[:2],)
    if not isinstance(x, tuple) and fx.Tracer().is_leaf_module(model, "") and ops.classify_module(model):
        # torch's own module as the whole model (an nn.TransformerEncoder): traced as the one
        # call of a wrapper, whose path prefix is taken off again (``_unwrapped``)
        return _unwrapped(trace_graph(_Root(model), x, what))
    try:
        gm = ops.symbolic_trace(model)
        # ShapeProp prints the traceback of a failing node itself: the failure is said in one line
        with torch.no_grad(), Deterministic(), contextlib.redirect_stderr(io.StringIO()):
            out = ShapeProp(gm).propagate(*two)
    except Exception as exc:
        return Traced(
            None, {}, f"torch.fx could not trace the model ({type(exc).__name__}: {first_line(exc)})"
        )
    try:
        seen = _survey_of(gm, out, two[0].shape[0], what)
    except SigpropError as exc:
        if "NaN" in exc.message:
            raise
        seen = None  # an output sigprop cannot read: ``survey`` says why on the model itself
    if any(n.op == "call_module" and list(gm.get_submodule(n.target).children()) for n in gm.graph.nodes):
        # a module kept whole (torch's nn.TransformerEncoder): which of its children its forward
        # calls is not in the graph; ``survey``'s hooks see them
        seen = None
    t = Tracing(gm, {}, [], [])
    last_in: dict[str, int] = {}  # a module path -> the last node inside it
    for n in gm.graph.nodes:
        node = _node(t, n)
        # an op may expand one call into the nodes its forward computes (a module kept whole:
        # ``ops.transformer``), each named by its module's path: a site inside reads its last
        for sub in node if isinstance(node, list) else [node]:
            t.index[n] = len(t.nodes)
            t.fx_of.append(n)
            t.nodes.append(dataclasses.replace(sub, shape=sub.shape or t.shape(n) or ()))
            if isinstance(node, list):
                parts = sub.name.split(".")
                for k in range(1, len(parts) + 1):
                    last_in[".".join(parts[:k])] = t.index[n]
        for path in (n.meta.get("nn_module_stack") or {}).keys():
            last_in[path] = t.index[n]
        if n.op == "call_module":
            last_in[n.target] = t.index[n]
    return Traced(t.nodes, last_in, "", seen)
