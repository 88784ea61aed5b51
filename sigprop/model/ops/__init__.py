"""The traced ops: one file per op family, each a registry entry (``registry.TracedOp``) that
says how its calls are matched in torch.fx's graph (``match``) and which moment-map node a call
becomes (``node``, from the ``Tracing`` of sigprop/model/ops/registry.py); the node's forward and
backward maps are registered under its op's name in sigprop/maps/ (``maps.map_op``; no torch
there).  A new op is one file: a module that calls ``register`` and ``map_op``
(tests/model/test_extra_op.py adds one from the test file alone).  ``kind`` is the op's
category, which ``model.init.roles`` reads as well (a ReLU layer is a layer an ``act`` reads).
Importing this package registers the built-in ones."""

from sigprop.model.ops import activation, aten, attention, decoder, linear, norm, pool, structure, transformer
from sigprop.model.ops.registry import (
    TRACED,
    TracedOp,
    classify,
    classify_module,
    kind_of,
    register,
    symbolic_trace,
    unregister,
)

__all__ = [
    "TRACED",
    "TracedOp",
    "activation",
    "aten",
    "attention",
    "classify",
    "decoder",
    "classify_module",
    "kind_of",
    "symbolic_trace",
    "linear",
    "norm",
    "pool",
    "register",
    "structure",
    "transformer",
    "unregister",
]
