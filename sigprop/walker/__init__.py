"""One walker over plans (torch): a plan's steps compiled into units, run forward and backward in
log space for S weight draws at once, with measurements as observers.

A plan (sigprop/plans/: a flat sequence of steps) is compiled into *units*: the steps between
two ``Record``s.  Five unit kinds exist --

* ``DenseLayer``: a linear (WN or plain) layer and its ReLU (a layer of the MLP, Arpit et al.
  2019, eq. 1-5), recorded forward at its output h^l = ReLU(a^l) and backward at its
  pre-activation, delta^l = dl/da^l (eq. 4-5);
* ``ConvLayer``: a ``DenseLayer`` whose matmul is a k x k convolution (the plain CNN's layers,
  the WRN's conv1), recorded as the dense layer is;
* ``ResidualBlock``: Open, the branch's layers (dense or conv), Close (identity or projection
  skip, alpha), recorded at the block output h^b both ways (h^b and dl/dh^b; Arpit et al. 2019,
  eq. 6);
* ``BNLayer``: BatchNorm -> ReLU -> linear, as the stem (x^1 = W^0 BN(x^0)^+) or as a residual
  block (x^{l+1} = x^l + W^l BN(x^l)^+) of the BN ResNet of De & Smith 2020, appendix C,
  recorded at its output x^{l+1} both ways;
* ``BNConvUnit``: the batch-normalized WRN's conv1 and blocks (convs each followed by
  training-mode BN), recorded at their outputs both ways --

and ``walk`` runs any sequence of them: forward unit by unit, then backward from the top Record
to the first recorded one, each unit (each way) one step of a ``replay`` runner (eager, or a
CUDA graph), weights stored in an arena or redrawn from their generators (streamed), every
draw of a batch along a leading dim.  The walker measures nothing itself: it hands each
recorded state (and each unit's output) to its observers (sigprop/observers/), which own their
buffers.  Each unit is also a differentiable function of its parameters (``apply``, with
``parameters`` read from what the walk kept): the curvature (sigprop/hessian.py) builds its loss
from the units the probe walked.

The package: ``state`` (the spaces, the walk's shared context ``Walk``), ``walk`` (the walk),
``dense``, ``residual``, ``bn`` (the units), ``haar`` (chunked Haar draws), ``compile`` (plans ->
units, ``as_function``); every name is re-exported here.

The numbers are those of the three hand-written walkers this replaced (0.4.0's) bit for bit on
a CPU: the same kernels on the same data in the same order (``benchmarks/golden.py``).
"""

from sigprop.walker.bn import (
    BN_EPS,
    BNConvUnit,
    BNLayer,
    KeptBN,
    KeptBNConv,
)
from sigprop.walker.compile import (
    Function,
    as_function,
    compile_plan,
    one_draw_at_a_time,
)
from sigprop.walker.dense import (
    BlockParams,
    ConvLayer,
    DenseLayer,
    KeptLayer,
)
from sigprop.walker.haar import HaarChunks
from sigprop.walker.residual import (
    KeptBlock,
    ResidualBlock,
)
from sigprop.walker.state import (
    SPACES,
    LogSpace,
    PlainSpace,
    Walk,
)
from sigprop.walker.walk import (
    Walked,
    walk,
)

__all__ = [
    "BNConvUnit",
    "BNLayer",
    "BN_EPS",
    "BlockParams",
    "ConvLayer",
    "DenseLayer",
    "Function",
    "HaarChunks",
    "KeptBN",
    "KeptBNConv",
    "KeptBlock",
    "KeptLayer",
    "LogSpace",
    "PlainSpace",
    "ResidualBlock",
    "SPACES",
    "Walk",
    "Walked",
    "as_function",
    "compile_plan",
    "one_draw_at_a_time",
    "walk",
]
