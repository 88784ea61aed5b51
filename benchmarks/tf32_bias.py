"""The bias of reduced-precision matmul operands at depth, against float64, on one machine.

Also bfloat16 and float16 operands (why ``--dtype`` refuses them).
TF32 (``--precision tf32`` on CUDA) rounds both operands of every matmul to 10 mantissa bits
(unit roundoff 2^-11) and accumulates in float32.  Without a GPU this script emulates the part
that matters: the walker runs in float64 on the same draws, and every layer's matmul operands
are first rounded to TF32 (round to nearest on the 13 dropped bits) -- or to float32, for
comparison.  Accumulation stays float64: the float32 accumulation error of a tensor core
(~sqrt(n) 2^-24 relative) is far below the 2^-11 operand rounding, so it is left out.

Prints, per depth, the mean and spread over samples of ln(ratio_emulated) - ln(ratio_float64)
at the last layer (forward) and the first (backward), beside the spread over samples of the
float64 ln-ratio itself (what --check's finite-width tolerance is made of).  Usage: python
benchmarks/tf32_bias.py [--quick]
"""

from __future__ import annotations

import sys

import torch

from sigprop import inits
from sigprop.engines import plan as plan_engine
from sigprop.kernels import logspace, sampling
from sigprop.kinds import mlp


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round float64 values to TF32 (8-bit exponent, 10-bit mantissa), round to nearest."""
    f = x.to(torch.float32).contiguous()
    i = f.view(torch.int32)
    i = (i + 0x1000) & ~0x1FFF
    return i.view(torch.float32).to(x.dtype)


def round_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).to(x.dtype)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


def round_fp16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(x.dtype)


def walk(widths, samples, rounding):
    x, e = sampling.probe_inputs(0, samples, widths[0], widths[-1], torch.device("cpu"), torch.float64)
    saved = logspace.mm
    if rounding is not None:  # the dense layers' one matmul seam (sigprop/kernels/logspace.py)
        logspace.mm = lambda a, b: torch.matmul(rounding(a), rounding(b))
    try:
        o = plan_engine.walk_plan(mlp.steps(widths), inits.get("proposed"), x, e, 0, [0]).observed
    finally:
        logspace.mm = saved
    return o["fwd"][0], o["bwd"][0]


def main() -> None:
    quick = "--quick" in sys.argv
    n, samples = (128, 64) if quick else (256, 256)
    depths = (10, 100) if quick else (10, 100, 1000)
    print(f"proposed init, width {n}, {samples} samples, float64 walker, operands rounded per matmul")
    print(
        f"{'depth':>6s} {'rounding':>8s} {'fwd bias (ln)':>14s} {'fwd sd (ln)':>12s} {'bwd bias (ln)':>14s} "
        f"{'bwd sd (ln)':>12s} {'fwd ratio sd':>12s} {'bwd ratio sd':>12s}"
    )
    for L in depths:
        widths = [n] * (L + 1)
        f64, b64 = walk(widths, samples, None)
        spread = float(f64[-1].std())
        spread_b = float(b64[0].std())
        for name, fn in (
            ("tf32", round_tf32),
            ("fp32", round_fp32),
            ("bf16", round_bf16),
            ("fp16", round_fp16),
        ):
            f, b = walk(widths, samples, fn)
            df, db = f[-1] - f64[-1], b[0] - b64[0]
            print(
                f"{L:6d} {name:>8s} {float(df.mean()):14.2e} {float(df.std()):12.2e} "
                f"{float(db.mean()):14.2e} "
                f"{float(db.std()):12.2e} {spread:12.2e} {spread_b:12.2e}"
            )
    print(f"TF32 unit roundoff 2^-11 = {2**-11:.2e}; float32 2^-24 = {2**-24:.2e}")


if __name__ == "__main__":
    main()
