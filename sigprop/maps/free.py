"""The input-output Jacobian's spectrum through a graph (docs/theory.md §14): per node the mean
and the normalised variance (var/mean^2) of the eigenvalues of J J^T, J the Jacobian of the
node's state in the graph's input, at large width by free probability.  Each op gives its law
(``OpMap.jacobian``: a weight layer, a ReLU, a scaling, a residual sum, a pass-through; the
plans' ``predict_jacobian`` composed the same laws over a plan's steps, and stays their oracle,
tests/theory/test_plan_graphs.py); an op without one, or a node whose law does not hold there (a
conv, a batch norm, directions without an S-transform coefficient), stops the fold with its
words.  No torch here."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from sigprop.maps.state import MAPS, GraphNode


@dataclass
class JacobianFold:
    """What the laws read: the nodes, per node the (mean, normalised variance) so far
    (``states``) and its units per sample (``units``)."""

    nodes: Sequence[GraphNode]
    states: list
    units: list

    def fork_of(self, skip: int, branch: int) -> tuple[int, GraphNode | None] | None:
        """A residual block's input (its fork) and its projection (None: an identity skip), from
        its sum's skip and branch -- the skip the fork itself or a weight layer reading it, the
        branch a chain of one-input nodes from the fork; None where the sum is not such a block."""
        s = self.nodes[skip]
        fork, projection = (s.inputs[0], s) if s.op == "dense" and len(s.inputs) == 1 else (skip, None)
        j = branch
        while j != fork:
            if len(self.nodes[j].inputs) != 1 or j < fork:
                return None
            j = self.nodes[j].inputs[0]
        return fork, projection


def directions(nd: GraphNode) -> float | str:
    """A weight layer's S-transform coefficient of its rows' directions (``params["s1"]``: -1 for
    i.i.d. entries, 0 for orthogonal rows; ``theory.S1_OF_DIRECTION``), or why it has none."""
    p = nd.params if isinstance(nd.params, dict) else {}
    s1 = p.get("s1")
    return f"{p.get('direction', 'unknown')} directions" if s1 is None else s1


def fold_jacobian(nodes: Sequence[GraphNode]) -> tuple[list, str]:
    """Per node (mean, normalised variance) of J J^T's eigenvalues (None past a node whose law
    does not hold), and the words of the first such node ("" where every node has one)."""
    fold = JacobianFold(nodes, [None] * len(nodes), [0] * len(nodes))
    for i, nd in enumerate(nodes):
        if nd.op == "input":
            fold.states[i], fold.units[i] = (1.0, 0.0), math.prod(nd.shape)
            continue
        op = MAPS.get(nd.op)
        law = None if op is None else op.jacobian
        got = f"{nd.op} ({nd.name})" if law is None else law(nd, i, fold)
        if isinstance(got, str):
            return fold.states, got
        fold.states[i] = got
        fold.units[i] = nd.width if nd.op == "dense" else fold.units[nd.inputs[0]]
    return fold.states, ""


__all__ = ["JacobianFold", "directions", "fold_jacobian"]
