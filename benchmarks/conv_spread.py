"""The finite-width spread of a plain CNN's log ratios, measured (docs/theory.md §11, "Finite-width
spread of conv nets"; issue 27, item 8).

For every cell (channels c, depth L, init) it probes S weight draws and prints, per direction, the
variance of the per-draw mean ln ratio at the end of the net divided by the model's
sum_j 1/(4 c_j) over the layers that add spread -- forward: every conv after the first (the first
reads the i.i.d. input, whose patches are isotropic: its spread is ~0); backward: every mask step
from the top down to layer 1 -- i.e. the fitted per-layer constant of ``theory.conv_log_ratio_variance``.
The constants sigprop uses (``theory.CONV_SPREAD``) are upper envelopes of these numbers.
Usage: python benchmarks/conv_spread.py [--draws S] [--samples N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sigprop import engine, specs

INITS = ("proposed", "proposed-gaussian", "delta-orthogonal", "he", "pytorch", "pytorch-he")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--samples", type=int, default=16)
    args = ap.parse_args()
    print(f"{'channels':>8s} {'depth':>5s} {'init':18s} {'fwd c':>7s} {'bwd c':>7s}   (variance of the per-draw mean ln ratio "
          f"x 4c / layers; {args.draws} draws x {args.samples} samples)")
    for channels in (16, 32, 64):
        for depth in (10, 30):
            t0 = time.perf_counter()
            spec = specs.CNNSpec(depth=depth, channels=channels, image=(3, 32, 32), strided=2, inits=INITS)
            probe = specs.ProbeSpec(samples=args.samples, seeds=args.draws, device="cpu", threads=1)
            _, out, _ = engine.run_conv(spec, probe)
            for name in INITS:
                f = out[name]["fwd"].mean(axis=2)  # [S, L]: per-draw mean ln ratio
                b = out[name]["bwd"].mean(axis=2)
                cf = f[:, -1].var(ddof=1) * 4 * channels / (depth - 1)
                cb = b[:, 0].var(ddof=1) * 4 * channels / (depth - 1)
                print(f"{channels:8d} {depth:5d} {name:18s} {cf:7.2f} {cb:7.2f}", flush=True)
            print(f"{'':8s} ({time.perf_counter() - t0:.0f} s)", flush=True)
    # the sampling error of one cell's constant: a variance from S draws has relative sd sqrt(2/(S-1))
    print(f"relative sd of each number from {args.draws} draws: {np.sqrt(2 / (args.draws - 1)):.2f}")


if __name__ == "__main__":
    main()
