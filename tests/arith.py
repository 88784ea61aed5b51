"""Tolerances from the arithmetic, for comparing two runs of the walker that do the same
operations on the same numbers but not necessarily with the same kernels.

Bit-identity holds only where the same kernel sees the same data *at the same addresses*: a
replayed step reads static copies of its inputs, and BLAS/oneDNN pick their SIMD reduction path
by alignment, so a dot product may be summed in another order (issue: 3 of 126 forward ln ratios
differed by 4.4e-16 on a 2-core AMD EPYC).  A length-n dot product or norm summed in any order
is within gamma_n ~= n u of the exact value, relative to |x||y| (Higham 2002, "Accuracy and
Stability of Numerical Algorithms", eq. 3.5); the walker renormalises every step, so each
step's ln ratio moves by at most a few n u, and these add over the steps a ln ratio accumulates
(forward and backward).  ``reduction_atol`` is that bound with a factor 4 for the matmul, the
norm, the log and the rescale of one step.
"""

import numpy as np
import torch

UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24}


def reduction_atol(width: int, steps: int, dtype=torch.float64) -> float:
    return 4.0 * width * steps * UNIT_ROUNDOFF[dtype]


def assert_same_up_to_order(a: torch.Tensor, b: torch.Tensor, width: int, steps: int) -> None:
    """a and b agree within the reduction-order bound (absolute, for ln ratios of order 1 or
    unit-norm directions); non-finite entries must match exactly."""
    a, b = a.detach().cpu(), b.detach().cpu()
    assert a.shape == b.shape and a.dtype == b.dtype
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    assert torch.equal(fa, fb) and torch.equal(a[~fa], b[~fb])
    np.testing.assert_allclose(
        a[fa].numpy(), b[fb].numpy(), rtol=0, atol=reduction_atol(width, steps, a.dtype)
    )
