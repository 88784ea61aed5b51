"""A plan's memory, estimated from its steps before anything is drawn (issue 51, item 2; until
0.17 each net kind wrote its own estimate, and the ResNet's streamed one left out the block it
re-draws).  No torch here.

Per draw of one init, for ``samples`` inputs in a dtype of ``itemsize`` bytes:

* the stored weights: every weighted step's fan_in x fan_out entries (projections included),
  unless the walk streams them (``stream``: each layer re-drawn for the backward pass, a block's
  layers together; two blocks' worth are then held, the one walked and the one drawn);
* one layer's draw temporaries: ``DRAW_TEMPORARIES`` of the largest weighted step;
* the bit-packed ReLU masks of every unit a ReLU follows (a weighted step with ``relu``, a batch
  norm's), kept for the backward pass;
* ``ACTIVATION_BUFFERS`` activation buffers of the widest state (a layer's input and output and
  their gradients, a block's skip and branch);
* four float64 ln-norm buffers per recorded row (the observers' forward and backward ratios);
* a batch-normalised unit's normalised output, kept for its backward pass.

Held against the storages a probe's ops create on the CPU (tests/kinds/test_memory.py: a
TorchDispatchMode counting live bytes, benchmarks/memory.py), the estimate is at least the
peak for every kind, stored and streamed, and at most 2.4x it (the conv nets' eight activation
buffers of the widest map and an MLP's buffers sized for its widest layer are the loosest terms;
docs/benchmarks.md, "Memory from the steps")."""

from __future__ import annotations

from typing import NamedTuple, Sequence

from sigprop.plans.steps import BatchNorm, Block, Record, Step, layers, nest

#: peak temporaries of drawing one layer, in units of its weight matrix (the Haar draw's:
#: sigprop/kernels/sampling.HAAR_TEMPORARIES, tested equal)
DRAW_TEMPORARIES = 4
#: activation buffers of the widest state a walk holds at once
ACTIVATION_BUFFERS = 8
#: float64 ln-norm buffers per recorded row and sample
LN_BUFFERS = 4


class PlanMemory(NamedTuple):
    """The bytes of one draw (``need``), the stored weights' bytes (``weights``), and what a
    captured step keeps: the largest weighted step's entries (``biggest``), the widest state's
    units (``widest``) and the weighted steps of the largest block (``block_layers``; 1 outside
    a block)."""

    need: int
    weights: int
    biggest: int
    widest: int
    block_layers: int


def _entries(step) -> int:
    return step.role.fan_in * step.role.fan_out


def memory(steps: Sequence[Step], samples: int, itemsize: int, stream: bool = False) -> PlanMemory:
    """The memory of one draw of the plan ``steps`` (this module's docstring, term by term)."""
    weighted = layers(steps)
    entries = [_entries(s) for s in weighted]
    blocks = [b for b in nest(steps) if isinstance(b, Block)]
    in_block = [layers([*b.inner, b.close]) for b in blocks]
    held = max([sum(_entries(s) for s in group) for group in in_block] + entries)
    norms = [s for s in steps if isinstance(s, BatchNorm)]
    widest = max([s.units_in for s in weighted] + [s.units_out for s in weighted])
    masks = sum((s.units_out + 7) // 8 for s in weighted if s.relu) + sum(
        (b.channels + 7) // 8 for b in norms
    )
    saved = sum(s.units_out for s in weighted if s.bn) + sum(b.channels for b in norms)
    rows = sum(isinstance(s, Record) for s in steps)
    weights = sum(entries) * itemsize
    need = (
        (2 * held * itemsize if stream else weights)
        + DRAW_TEMPORARIES * max(entries) * itemsize
        + samples * masks
        + ACTIVATION_BUFFERS * samples * widest * itemsize
        + LN_BUFFERS * rows * samples * 8
        + samples * saved * itemsize
    )
    return PlanMemory(need, weights, max(entries), widest, max([len(g) for g in in_block] + [1]))
