"""The curvature's per-product cost against a plain double backward on the same units (issue 28,
item 7).

sigprop's eigenvalue search (``hessian.largest_eigenvalue``: restarted Lanczos with full
reorthogonalisation) spends each iteration on one Hessian-vector product through the kept graph
of the gradient, plus its own bookkeeping: splitting the flat vector into parameter shapes,
flattening the product, the Lanczos basis.  The floor is the product alone: the same HVP's
``torch.autograd.grad(grads, leaves, grad_outputs=v_parts, retain_graph=True)`` on the same
loss, units and parameters, timed back to back.  Peak memory is not compared here: both share
the one graph.

Usage: python benchmarks/hvp.py [blocks] [widen] [samples] [threads]   (default 1 1 32 1)
Prints the seconds per product of each and their ratio (median of ROUNDS = 6 rounds of 10
products, each side first in every other round).
"""

from __future__ import annotations

import sys
import time

import torch

from sigprop import api, hessian
from sigprop.kinds import wrn

ROUNDS = 6


def main() -> None:
    args = (sys.argv[1:] + ["1", "1", "32", "1"][len(sys.argv) - 1 :])[:4]
    blocks, widen, samples, threads = (int(a) for a in args)
    torch.set_num_threads(threads)
    spec = api.spec("wrn", blocks=blocks, widen=widen, inits="proposed")
    kind = wrn.WRN()
    plan = kind.plan(spec, 0)
    dtype = torch.float64
    shape = (3, 32, 32)
    x, y = hessian.data(0, samples, shape, torch.device("cpu"), dtype)
    m = hessian.build(plan.steps, kind.scheme(spec, "proposed"), kind.space(spec), x, 0, 0)
    h = hessian.HVP(m, x, y)
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(h.size, dtype=dtype, generator=gen)
    parts, k = [], 0
    for sh in h.shapes:
        n = sh.numel()
        parts.append(v[k : k + n].reshape(sh))
        k += n

    def sigprop_products() -> tuple[float, int]:
        h.calls = 0
        t0 = time.perf_counter()
        hessian.largest_eigenvalue(h, gen, iters=10, tol=1e-12)  # a tol it never meets: 10 products
        return (time.perf_counter() - t0) / h.calls, h.calls

    def floor_products(calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.autograd.grad(h.grads, h.leaves, grad_outputs=parts, retain_graph=True, allow_unused=True)
        return (time.perf_counter() - t0) / calls

    ratios = []
    for r in range(ROUNDS):  # who goes first alternates: the machine's drift within a round cancels
        if r % 2 == 0:
            per_sigprop, calls = sigprop_products()
            per_floor = floor_products(calls)
        else:
            per_floor = floor_products(calls)  # as many products as the round before
            per_sigprop, calls = sigprop_products()
        ratios.append((per_sigprop / per_floor, per_sigprop, per_floor))
    ratios.sort()
    r, s, f = ratios[len(ratios) // 2]
    print(
        f"WRN N={blocks} k={widen} 3x32x32, {samples} samples, float64, {threads} thread(s), "
        f"{h.size} parameters: sigprop {s * 1e3:.1f} ms per product, plain double backward "
        f"{f * 1e3:.1f} ms: ratio {r:.2f} "
        f"[{ratios[0][0]:.2f}-{ratios[-1][0]:.2f}] over {ROUNDS} rounds"
    )


if __name__ == "__main__":
    main()
