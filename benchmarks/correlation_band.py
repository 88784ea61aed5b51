"""How often the correlation agreement band (|mean - predicted| <= 3 sd, sd the spread of one
pair's cosine; docs/theory.md §10) says "disagrees" when the theory is right, across seeds.

For each cell (net, init, width, depth) and input cosine, S independent seeds (one draw each,
P = 256 pairs): the fraction of layers (states) whose mean cosine falls outside the band, and
the worst |mean - predicted| / sd seen.  Usage: python benchmarks/correlation_band.py [--seeds S]
"""

from __future__ import annotations

import argparse
import time

import torch

from sigprop import api, specs
from sigprop.kinds.mlp import MLPSpec
from sigprop.kinds.resnet import ResNetSpec


def cells():
    for width in (64, 256):
        for init in ("proposed", "he", "pytorch", "datadep"):
            yield (
                f"mlp {init} width {width} depth 50",
                MLPSpec(depth=50, input_dim=width, width=specs.WidthSpec(width, width), inits=(init,)),
            )
        for init in ("proposed", "he", "datadep"):
            yield (
                f"resnet {init} width {width} 30 blocks",
                ResNetSpec(blocks=30, dim=width, width=specs.WidthSpec(width, width), inits=(init,)),
            )
        yield f"bn-resnet width {width} 30 blocks", ResNetSpec(blocks=30, dim=width, norm="bn", inits=("he",))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'cell':38s} {'c0':>5s} {'layers outside':>15s} {'worst |d|/sd':>12s}")
    for name, spec in cells():
        t0 = time.perf_counter()
        for c0 in (0.0, 0.5):
            outside, total, worst = 0, 0, 0.0
            for seed in range(args.seeds):
                r = api.probe(
                    spec, specs.ProbeSpec(samples=8, seed=seed, device="cpu", correlations=(c0,), threads=1)
                )
                for rec in r.runs[0].layers:
                    c = rec.correlation[0]
                    if c.agrees is None or c.std == 0:
                        continue
                    total += 1
                    outside += not c.agrees
                    worst = max(worst, abs(c.mean - c.predicted) / c.std)
            print(f"{name:38s} {c0:5.2f} {outside:6d}/{total:<8d} {worst:12.2f}", flush=True)
        print(f"   ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
