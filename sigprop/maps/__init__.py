"""The moment maps and their fold, for any graph of nodes (no torch here): a node's state per part
and the fold's context (``state``: ``GraphNode``, ``Part``, ``Fold``, the maps' registry
``MAPS`` and ``map_op``), the fold (``graph``: ``predict_graph``, ``fold_graph``), the moments
between two states that shared weights correlate and the tangent (``cross``), the token Gram
matrix behind a causal attention (``gram``), the Jacobian's spectrum (``free``:
``fold_jacobian``), and the ops' maps: the layers a state goes through (``layers``: dense, norm,
act, pool, attention) and the graph's wiring (``structure``: add, scale, cat, slice, ..., a
decoder's rotary and broadcast). A traced model's nodes are built from torch.fx's graph by
sigprop/model/ops/ (torch); the maps they name live here, below the plans, so that a fold of
sigprop's own nets and of a user's model can be one (issue 51, item 1; docs/architecture.md,
"Two folds, one set of layer maps"). Importing the package registers the built-in maps."""

from sigprop.maps import cross, free, gram, graph, layers, state, structure
from sigprop.maps.graph import GraphPrediction, fold_graph, predict_graph
from sigprop.maps.state import MAPS, Fold, GraphNode, OpMap, Part, map_op

__all__ = [
    "MAPS",
    "Fold",
    "GraphNode",
    "GraphPrediction",
    "OpMap",
    "Part",
    "cross",
    "fold_graph",
    "free",
    "gram",
    "graph",
    "layers",
    "map_op",
    "predict_graph",
    "state",
    "structure",
]
