"""The user-model engine (``sigprop module``, ``sigprop.probe_module``; docs/theory.md §13): a
user's own ``torch.nn.Module`` built, initialised, measured with autograd hooks and traced into
a graph of moment maps.

* ``build``: a draw of the model and what a probe changes in it (no stochastic op, training-mode
  normalisation, weights needing no gradient), its output, its forward called;
* ``sites``: where it is measured, and the ``Survey`` of one forward before a run;
* ``measure``: one draw's forward and backward ratios at the sites;
* ``init``: the paper's init for any model (``init_``, ``sigprop.init_``) and its roles;
* ``trace``: torch.fx's graph made into moment-map nodes by the traced ops;
* ``ops/``: the traced ops, one file per family (matching, node, maps);
* ``graph``: the nodes and their fold, ``predict_graph`` (no torch);
* ``functions``: the model's loss with the head (the curvature's) and its Jacobian (the
  spectrum's), for sigprop/hessian.py's and sigprop/spectra.py's estimators;
The model engine itself -- a probe, a spectrum, a curvature of a model kind -- sits beside the
plan engine, in sigprop/engines/model.py (registered in sigprop/engines/' registry when a model
kind first asks for it).

The package re-exports the names below; its submodules ``build``, ``measure`` and ``trace`` are
reached as modules (``from sigprop.model import build``), never shadowed by their functions.
"""

from sigprop.maps import GraphNode, GraphPrediction, predict_graph
from sigprop.model.build import (
    check_finite,
    check_finite_weights,
    exact_weight_norm,
    output_choice,
    output_tensor,
    prepare,
    rows,
    trainable,
)
from sigprop.model.forward import Deterministic, call, first_line
from sigprop.model.init import InitRecord, calibrate, init_, init_notes, roles
from sigprop.model.measure import mean_squares
from sigprop.model.sites import Survey, auto_sites, resolve_sites, survey
from sigprop.model.trace import Traced, trace_graph

__all__ = [
    "Deterministic",
    "GraphNode",
    "GraphPrediction",
    "InitRecord",
    "Survey",
    "Traced",
    "auto_sites",
    "calibrate",
    "call",
    "check_finite",
    "check_finite_weights",
    "exact_weight_norm",
    "first_line",
    "init_",
    "init_notes",
    "mean_squares",
    "output_choice",
    "output_tensor",
    "predict_graph",
    "prepare",
    "resolve_sites",
    "roles",
    "rows",
    "survey",
    "trace_graph",
    "trainable",
]
