"""A dense or conv layer's bookkeeping around its matmul, compiled by ``torch.compile``
(``--fuse``; issue 41): the same arithmetic as the eager step (kernels/ops.py ``_activate`` and
the walker's backward, from kernels/logspace.py's own functions, out of place), gathered into
one function each way so that Inductor can emit few kernels -- Triton on a GPU, C++ on a CPU.

Forward, from the pre-activations a (scale and bias applied, kernels/ops.py) at ln-scale m: the
ReLU, its mask packed 8 units a byte, and the rows normalised in log space (ln-norms in float64).
Backward, after the transposed product y: the ReLU mask of the layer below, then the same
normalisation.  A residual block's (kernels/logspace.py ``combine_``): the branch's ln-norm,
the sum of the skip and the branch with the larger ln-norm factored out, and its
normalisation, forward; the sum of the two error paths and its normalisation, backward.
Compiled with dynamic shapes: a net of drawn widths compiles each function for widths that are
multiples of 8 and for those that are not (the mask's padding), not per width.

Numbers: the mask and every elementwise result are the eager ones; the row norm's sum may be
reordered by the compiler, so unit rows differ from eager by about one float32 ulp and each
layer's ln-norm by a few (measured on a CPU: 6e-8 and 1.6e-7 at widths 200-256);
tests/kernels/test_fused.py holds whole probes within a bound argued from that.  A ReLU unit
whose pre-activation lies within that rounding of zero may take the other side, and a sample's
backward ratio then crosses a different mask (docs/theory.md section 8; one such unit in
benchmarks/golden.py's grid, docs/benchmarks.md).  Measured on a
2-core CPU the compiled forward ran 8-13x slower than the eager one after a compile of seconds:
the default stays eager; the GPU's figures are for its first measurement (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Callable

import torch

from sigprop.kernels import logspace as ls

_COMPILED: dict[str, Callable] = {}


def _activate(a, m, relu: bool, normalized: bool):
    packed = None
    if relu:
        a = torch.relu(a)
        packed = ls.pack_mask(a > 0)
    # ``ls.normalize`` written out: called here, the same ops compile into kernels that round
    # otherwise (2e-6 in a CNN's statistics), and --fuse keeps its numbers
    if normalized:
        norm = torch.linalg.vector_norm(a, dim=-1)
        a = a / ls.safe(norm).unsqueeze(-1)
        m = m + torch.log(norm.to(torch.float64))
    return a, m, packed


def _backward(y, table, packed, n: int):
    return ls.normalize(y if packed is None else y * ls.unpack(packed, table, n))


def _combine(sc, su, fc, bu):
    fb = fc + ls.ln_rows(bu)
    M = torch.nan_to_num(torch.maximum(sc, fb), nan=0.0, posinf=0.0, neginf=0.0)
    u, ln_norm = ls.normalize(bu * ls.col(fc - M, bu.dtype) + su * ls.col(sc - M, bu.dtype))
    return u, M + ln_norm, fb


def _sum_normalize(z, y):
    return ls.normalize(z + y)


#: the variants one function may compile: float32 and float64, widths that are multiples of 8
#: or not, with or without a mask, a mask at the start of its arena or further in (the
#: compiler's 0/1 specialisation of the storage offset) -- 16 for the backward, over torch's
#: default of 8, after which it would silently run eagerly.  Never one per layer: the widths and
#: the offsets are symbolic (tests/kernels/test_fused.py)
RECOMPILE_LIMIT = 32


def _compiled(name: str, fn: Callable) -> Callable:
    if name not in _COMPILED:
        compiled = torch.compile(fn, dynamic=True)

        def call(*args):
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                return compiled(*args)

        _COMPILED[name] = call
    return _COMPILED[name]


def activate(a, m, relu: bool, normalized: bool = True):
    """(rows, ln-scale, packed ReLU mask or None) of a layer from its pre-activations ``a``
    [S, N, out] at ln-scale ``m`` [S, N] (float64), as ``ops._activate``."""
    return _compiled("activate", _activate)(a, m, relu, normalized)


def backward(y, packed):
    """(unit rows, ln-norms) of the error rows ``y`` [S, N, n] times the packed ReLU mask (None:
    none below)."""
    table = ls.mask_table(y.device, y.dtype)
    return _compiled("backward", _backward)(y, table, packed, y.shape[-1])


def combine(sc, su, fc, bu):
    """A residual block's sum in log space, as ``logspace.combine_`` after ``fb = fc +
    ln_rows(bu)``: (unit rows, ln-norms, fb) of exp(sc) su + exp(fc) bu, the larger ln-norm
    factored out (the branch's ln-norm ``fb`` is the block's branch record)."""
    return _compiled("combine", _combine)(sc, su, fc, bu)


def sum_normalize(z, y):
    """(unit rows, ln-norms) of z + y: a residual block's backward, the branch's and the skip's
    error rows summed and normalised."""
    return _compiled("sum_normalize", _sum_normalize)(z, y)
