"""The net kinds: one file per kind, and ``KINDS``, the one registry every other module asks
(../shared/STYLE.md: "only kinds/ knows which nets exist").  No torch here.

A kind declares, in one place: its spec (fields, defaults, validation naming the field, to and
from the JSON config that ``sigprop rerun`` and ``sigprop sweep`` read), its options (which the
CLI turns into a command, ``sigprop check`` into TOML keys, the API into keywords), the plan
builder, the memory estimate, which observers a probe runs, its theory of a run (``RunTheory``:
the engine pairs every row's statistics with it) and its verdict rules, and the hints the table
and the figure read.  A kind registers itself with ``@register``; a new one -- a test's deep
linear net, later the user's own module -- needs no other file (docs/architecture.md, "Add a
net kind"; tests/kinds/test_extra_kind.py).
"""

from __future__ import annotations

from sigprop.kinds import cnn, mlp, module, resnet, wrn
from sigprop.kinds.base import (
    KINDS,
    ROW_BYTES,
    Hints,
    Kind,
    Memory,
    Opt,
    RunTheory,
    StepSizes,
    SweepAxes,
    get,
    init_tuple,
    names,
    need_two_samples,
    of,
    register,
)

#: the kinds register themselves on import (``base.register``); the CLI lists them in the order
#: the paper introduces its nets
for _kind in (mlp.MLP, resnet.ResNet, cnn.CNN, wrn.WRN, module.ModuleKind):
    KINDS[_kind.name] = KINDS.pop(_kind.name)

__all__ = [
    "KINDS",
    "ROW_BYTES",
    "Hints",
    "Kind",
    "Memory",
    "Opt",
    "RunTheory",
    "StepSizes",
    "SweepAxes",
    "get",
    "init_tuple",
    "names",
    "need_two_samples",
    "of",
    "register",
]
