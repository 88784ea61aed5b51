"""Networks as plans: sequences of steps, and their theory by composition.  No torch here.

A plan is a flat tuple of steps -- ``Linear`` (a WN or plain dense layer with its role, a ReLU
after it or not), ``Conv`` (a k x k convolution with zero padding and stride), ``Open`` and
``Close`` around a residual block (the skip: identity or a projection step; the branch
multiplier alpha^2), ``BatchNorm`` (training-mode BN and a ReLU) and ``Record`` where a state
is measured -- built by a net kind (sigprop/kinds/).  The walker runs the steps (torch: each
weighted step's op in sigprop/kernels/ops.py); the theory composes them: every step carries its
moment maps and ``predict`` / ``predict_correlation`` fold them over any plan, in the manner of
neural-tangents' ``serial`` (a layer's kernel_fn composed with the next's).

The moment maps are those of a conv net's per-position energy (docs/theory.md §11): a dense
layer is a 1 x 1 convolution on a 1 x 1 map, so one fold serves the MLP, the ResNet, the CNN
and the WRN, and the closed forms of the papers -- the MLP's product formula (Arpit et al. 2019,
Theorems 1-2), the ResNet's (1 + 1/B)^{B/2} (Theorems 3-4), the conv energy map -- are checks the
fold must equal (tests/theory/).  A layer whose scheme standardises its pre-activations over the
batch (the data-dependent init; a conv followed by batch norm) has the standardised map: its
output energy is its units (halved by a ReLU) whatever its input, and it has no backward map.

The steps live in sigprop/plans/steps.py (with the plan utilities, the memory a plan's walk
needs among them), the folds in sigprop/plans/folds.py; this package gives both their one name,
``plans``.  sigprop/plans/graphs.py (imported by name, not here: it loads the maps) builds a
plan as the graph of the maps' nodes, whose graph fold is the engine's theory (energies, gains,
spread, spectrum, pair kernels) and which the tests hold to the plan folds here, its oracle.
"""

from sigprop.plans.folds import (
    SEPARATION_FACTOR,
    NotDerived,
    Prediction,
    Separation,
    Spread,
    predict,
    predict_correlation,
    predict_density,
    predict_jacobian,
    separation,
    spread,
    upto,
)
from sigprop.plans.steps import (
    WEIGHTED,
    BatchNorm,
    Block,
    Close,
    Conv,
    Linear,
    Open,
    PlanMemory,
    Record,
    Step,
    batch_dependent,
    input_shape,
    layers,
    memory,
    nest,
    with_bn,
)

__all__ = [
    "SEPARATION_FACTOR",
    "WEIGHTED",
    "BatchNorm",
    "Block",
    "Close",
    "Conv",
    "Linear",
    "NotDerived",
    "Open",
    "PlanMemory",
    "Prediction",
    "Record",
    "Separation",
    "Spread",
    "Step",
    "batch_dependent",
    "input_shape",
    "layers",
    "memory",
    "nest",
    "predict",
    "predict_correlation",
    "predict_density",
    "predict_jacobian",
    "separation",
    "spread",
    "upto",
    "with_bn",
]
