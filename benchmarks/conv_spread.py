"""The finite-width spread of a plain CNN's log ratios, measured (docs/theory.md §11, "Finite-width
spread of conv nets"; issue 27, item 8).

For every cell (channels c, depth L, init) it probes S weight draws and prints, per direction, the
variance of the per-draw mean ln ratio at the end of the net divided by the model's
sum_j 1/(4 c_j) over the layers that add spread -- forward: every conv after the first (the first
reads the i.i.d. input, whose patches are isotropic: its spread is ~0); backward: every mask step
from the top down to layer 1 -- i.e. the fitted per-layer constant of
``plans.spread``.
sigprop's constant (``plans.spread``: 5, the MLP's for i.i.d. rows) is an upper
envelope of these numbers.  ``--verdicts``: instead, the false alarms of the conv nets' ``theory``
verdict over 12 seeds (docs/reliability.md §1e).
Usage: python benchmarks/conv_spread.py [--draws S] [--samples N] [--verdicts]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sigprop import api, run, specs
from sigprop.kinds.cnn import CNNSpec
from sigprop.kinds.wrn import WRNSpec

INITS = ("proposed", "proposed-gaussian", "delta-orthogonal", "he", "pytorch", "pytorch-he")


def verdicts(seeds: int = 12) -> None:
    """Per cell and init: runs whose theory verdict failed, layers marked disagreeing."""
    cells = [
        (
            "CNN 64 x 20",
            CNNSpec(
                inits=("proposed", "delta-orthogonal", "he", "pytorch", "pytorch-he", "proposed-gaussian")
            ),
            100,
        ),
        (
            "CNN 16 x 40",
            CNNSpec(depth=40, channels=16, inits=("proposed", "delta-orthogonal", "he", "pytorch")),
            100,
        ),
        (
            "WRN N = 8",
            WRNSpec(
                blocks=8,
                inits=("proposed", "pytorch", "stage-hanin", "he", "pytorch-he", "proposed-gaussian"),
            ),
            32,
        ),
    ]
    for label, spec, samples in cells:
        failed, layers, compared, runs = 0, 0, 0, 0
        for seed in range(seeds):
            for r in api.probe(spec, specs.ProbeSpec(samples=samples, seed=seed, device="cpu")).runs:
                runs += 1
                failed += any(c.has_band and not c.passed for c in r.verdict_checks("theory"))
                for v in r.agreement().values():
                    layers += v["layers_compared"] - v["layers_agreeing"]
                    compared += v["layers_compared"]
        print(
            f"{label}: theory verdict failed in {failed}/{runs} runs; layers marked disagreeing "
            f"{layers}/{compared}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--verdicts", action="store_true")
    args = ap.parse_args()
    if args.verdicts:
        verdicts()
        return
    print(
        f"{'channels':>8s} {'depth':>5s} {'init':18s} {'fwd c':>7s} {'bwd c':>7s}   (variance of the "
        f"per-draw mean ln ratio "
        f"x 4c / layers; {args.draws} draws x {args.samples} samples)"
    )
    for channels in (16, 32, 64):
        for depth in (10, 30):
            t0 = time.perf_counter()
            spec = CNNSpec(depth=depth, channels=channels, image=(3, 32, 32), strided=2, inits=INITS)
            probe = specs.ProbeSpec(samples=args.samples, seeds=args.draws, device="cpu", threads=1)
            out = run.measure(spec, probe).arrays
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
