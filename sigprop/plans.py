"""Networks as plans: sequences of steps, and their theory by composition (issue 17, first part).
No torch here.

A plan is a flat tuple of steps -- ``Linear`` (a WN or plain layer with its role, a ReLU after
it or not), ``Open`` and ``Close`` around a residual block (the skip: identity or a projection
layer; the branch multiplier alpha^2), ``Record`` where a state is measured -- built from a
spec's widths or a ``nets.ResNetPlan``.  Each step kind carries its moment map (the same affine
second-moment recursion ``theory.py`` writes per architecture), so a plan's prediction is the
composition of its steps: ``predict`` gives the ln RMS forward and backward ratios at every
``Record``.  tests/theory/test_plans.py checks the composition against ``theory.mlp_rms_prediction``
and ``theory.resnet_rms_prediction`` for every init and shape.  The engine does not run plans
yet: one walker over them is the rest of issue 17.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence, Union


from sigprop import theory
from sigprop.inits import LayerRole


@dataclass(frozen=True)
class Linear:
    """A (weight-normalized) linear layer with its role; ``relu``: a ReLU follows it."""

    role: LayerRole
    relu: bool


@dataclass(frozen=True)
class Open:
    """A residual block begins: its input is kept for the skip path."""

    stage: int = 1
    blocks_in_stage: int = 1


@dataclass(frozen=True)
class Close:
    """A residual block ends: h' = S h + alpha F(h), S the identity or the ``projection`` layer."""

    blocks_in_stage: int
    projection: LayerRole | None = None


@dataclass(frozen=True)
class Record:
    """The state here is measured (a row of the probe's table).  ``pre_activation``: the
    backward quantity is the gradient at the pre-activation of the ReLU layer just before (the
    MLP's dl/da^l, Arpit et al. 2019, eq. 5), not at its output (a ResNet's dl/dh^b)."""

    pre_activation: bool = False


@dataclass(frozen=True)
class BatchNorm:
    """Training-mode batch normalization (gamma = 1, beta = 0) followed by a ReLU, per channel
    over the batch (De & Smith 2020, appendix A).  Its moment map is not a per-sample one -- a
    sample's output depends on the whole batch -- so ``predict`` does not compose it: the BN
    net's predictions are De & Smith's mean-field recursion (``theory.bn_resnet_prediction``)."""

    eps: float


@dataclass(frozen=True)
class Conv:
    """A (weight-normalized) k x k convolution with zero padding and a ReLU after it (or not):
    ``role`` has fan_in = c_in k^2, fan_out = c_out, taps = k^2; ``shape_in`` = (c_in, H, W).
    Its moment map is spatial (the energy map, ``theory.cnn_rms_prediction``), not the
    per-sample (A, C) one: ``predict`` refuses it."""

    role: LayerRole
    shape_in: tuple[int, int, int]
    kernel: int
    stride: int = 1
    padding: int = 0
    relu: bool = True

    def out_hw(self) -> tuple[int, int]:
        k, s, p = self.kernel, self.stride, self.padding
        return tuple((n + 2 * p - k) // s + 1 for n in self.shape_in[1:])

    @property
    def shape_out(self) -> tuple[int, int, int]:
        return (self.role.fan_out, *self.out_hw())


Step = Union[Linear, Open, Close, Record, BatchNorm, Conv]


def mlp_steps(widths: Sequence[int]) -> tuple[Step, ...]:
    """Layer l: Linear(n_{l-1} -> n_l) + ReLU, recorded after each (Arpit et al. 2019, eq. 1-2)."""
    steps: list[Step] = []
    for l in range(1, len(widths)):
        steps += [Linear(LayerRole(widths[l - 1], widths[l]), relu=True), Record(pre_activation=True)]
    return tuple(steps)


def resnet_steps(plan) -> tuple[Step, ...]:
    """h^0 recorded, then per block: Open, the branch's layers (a ReLU after all but the last),
    Close (with the projection of a stage's first block), Record (Arpit et al. 2019, eq. 6)."""
    steps: list[Step] = [Record()]
    for blk in plan.blocks:
        roles = blk.branch_roles()
        steps.append(Open(blk.stage, blk.blocks_in_stage))
        steps += [Linear(r, relu=j < len(roles) - 1) for j, r in enumerate(roles)]
        steps += [Close(blk.blocks_in_stage, blk.projection_role()), Record()]
    return tuple(steps)


def bn_resnet_steps(plan, eps: float) -> tuple[Step, ...]:
    """The BN ResNet of De & Smith 2020, appendix C: x^0 recorded; the stem x^1 = W^0 BN(x^0)^+;
    blocks x^{l+1} = x^l + W^l BN(x^l)^+ (identity skip, alpha = 1); each state recorded."""
    d, B = plan.dim, len(plan.blocks)
    steps: list[Step] = [Record(), BatchNorm(eps), Linear(LayerRole(d, d, "relu", B, 0), relu=False), Record()]
    for l in range(1, B + 1):
        steps += [Open(1, B), BatchNorm(eps), Linear(LayerRole(d, d, "block_last", B, l - 1), relu=False), Close(B), Record()]
    return tuple(steps)


def cnn_steps(image: tuple[int, int, int], channels: int, depth: int, strided: int = 2, kernel: int = 3) -> tuple[Step, ...]:
    """The plain CNN of Arpit et al. 2019, section 5.1 (after Xiao et al. 2018): ``depth`` k x k
    convolutions of ``channels`` channels, padding (k - 1)/2, the first ``strided`` with stride 2,
    a ReLU after each, each recorded at its pre-activation (as the MLP's layers)."""
    steps: list[Step] = []
    shape = tuple(image)
    for l in range(depth):
        role = LayerRole(shape[0] * kernel * kernel, channels, taps=kernel * kernel)
        conv = Conv(role, shape, kernel, 2 if l < strided else 1, (kernel - 1) // 2)
        steps += [conv, Record(pre_activation=True)]
        shape = conv.shape_out
    return tuple(steps)


def convs(steps: Sequence[Step]) -> list[Conv]:
    """The conv steps of a plan, in order."""
    return [s for s in steps if isinstance(s, Conv)]


def _blocks(steps: Sequence[Step]) -> list:
    """Nest the flat steps: each Open..Close becomes (inner steps, Close)."""
    out: list = []
    stack: list[list] = [out]
    for s in steps:
        if isinstance(s, Open):
            stack.append([])
        elif isinstance(s, Close):
            inner = stack.pop()
            stack[-1].append((inner, s))
        else:
            stack[-1].append(s)
    if len(stack) != 1:
        raise ValueError("an Open without its Close")
    return out


Moments = Callable[[LayerRole], theory.LayerMoments]


def predict(steps: Sequence[Step], moments: Moments, alpha: Callable[[int], float], dim: int
            ) -> tuple[list[float] | None, list[float]]:
    """ln RMS ratios at every Record: forward ||h||/||x||, backward ||dl/d(state)|| relative to
    the last Record's, by composing the steps' moment maps.

    Forward: the state is (A, C) with E||h||^2 = A ||x||^2 + C (``theory._affine`` per Linear;
    a Close adds the skip's and alpha^2 times the branch's second moments: the cross term
    vanishes in expectation), read as E[||h||^2/||x||^2] = A + C/(d - 2) for x ~ N(0, I_d).
    Backward (walking the steps in reverse): a Linear multiplies E||d||^2 by its row second
    moment r, a ReLU's mask by 1/2 -- applied where the walk passes the ReLU; a block by
    r_S + alpha^2 (its branch's factor; the two paths' cross term vanishes).  A pre-activation
    Record (the MLP's dl/da^l) is read behind its layer's mask; the top Record is the
    reference (the error vector is given there).
    Forward is None where C/(d - 2) diverges (d <= 2 with a bias)."""
    if any(isinstance(s, BatchNorm) for s in steps):
        raise ValueError("a BatchNorm step has no per-sample moment map (theory.bn_resnet_prediction predicts the BN net)")
    if any(isinstance(s, Conv) for s in steps):
        raise ValueError("a Conv step's moment map is spatial (theory.cnn_rms_prediction predicts conv nets)")
    tree = _blocks(steps)
    log_inv_x2 = -math.log(dim - 2) if dim > 2 else math.inf
    lae, ln = theory._lae, theory._ln

    def layer(la: float, lc: float, role: LayerRole, relu: bool) -> tuple[float, float]:
        """A layer's moment map (``theory._affine``) on (log A, log C): A' = k A, C' = k C + bias."""
        m = moments(role)
        k, bias = theory._affine(1.0, 0.0, theory.LinearMoments(role.fan_in, role.fan_out, m.row_sq, m.bias_var), relu)
        return la + ln(k), lae(lc + ln(k), ln(bias))

    # forward, in logs: (log A, log C)
    fwd: list[float] = []

    def forward(items, la: float, lc: float) -> tuple[float, float]:
        for it in items:
            if isinstance(it, Linear):
                la, lc = layer(la, lc, it.role, it.relu)
            elif isinstance(it, Record):
                fwd.append(0.5 * (la if lc == -math.inf else lae(la, lc + log_inv_x2)))
            else:
                inner, close = it
                fa, fc = forward(inner, la, lc)  # the branch (its Records, if any, are not block outputs)
                sa, sc = (la, lc) if close.projection is None else layer(la, lc, close.projection, relu=False)
                a2 = ln(alpha(close.blocks_in_stage) ** 2)
                la, lc = lae(sa, fa + a2), lae(sc, fc + a2)
        return la, lc

    forward(tree, 0.0, -math.inf)
    # backward, walking in reverse: ln E||d||^2 relative to the top Record
    def branch_factor(items) -> float:
        """ln of E||J^T d||^2 / E||d||^2 through a branch's layers (no Records inside)."""
        lf = 0.0
        for it in reversed(items):
            if isinstance(it, Linear):
                lf += (ln(0.5) if it.relu else 0.0) + ln(moments(it.role).row_sq)
        return lf

    bwd: list[float] = []
    lb, top, mask_done = 0.0, True, False
    for it in reversed(tree):
        if isinstance(it, Record):
            if it.pre_activation:
                if not top:
                    lb += ln(0.5)  # the mask of the ReLU this Record stands behind
                mask_done = True
            bwd.append(0.5 * lb)
            top = False
        elif isinstance(it, Linear):
            if it.relu and not mask_done:
                lb += ln(0.5)
            lb += ln(moments(it.role).row_sq)
            mask_done = False
        else:
            inner, close = it
            r_s = 1.0 if close.projection is None else moments(close.projection).row_sq
            lb += lae(ln(r_s), ln(alpha(close.blocks_in_stage) ** 2) + branch_factor(inner))
            mask_done = False
    bwd.reverse()
    out_fwd = None if any(not math.isfinite(v) for v in fwd) else fwd
    return out_fwd, bwd

