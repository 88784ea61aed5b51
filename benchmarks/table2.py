"""Arpit et al. 2019, Table 2 -- the curvature at init -- as sigprop measures it (issue 19):
log10 spectral norm of the loss Hessian (mean +- sd over draws) per init, with time and peak
memory, beside the paper's numbers.  Prints; never asserts.

  python benchmarks/table2.py                 # the paper's nets (WRN-40-10, ResNet-164): a GPU;
                                              # 5000 samples in minibatches of 128 (~15 GiB for WRN-40-10)
  python benchmarks/table2.py --quick         # reduced for a CPU: WRN-40-1 and ResNet-56, 16 x 16
  options: --device cuda|cpu  --samples N  --seeds S  --batch-size B (0: all samples at once)
           --nets wrn-40-10,resnet-164 (which of the two rows)  --inits proposed,datadep,... (a subset)

A 10-way head throughout (the paper's ResNet-164 row is CIFAR-100: 100 classes).  Synthetic data (Gaussian
inputs, uniform labels) unless the paper's CIFAR subset is given with
sigprop hessian --data; docs/reproducing-the-paper.md says which differences that brings.
"""

from __future__ import annotations

import resource
import sys
import time

from sigprop import api, specs
from sigprop.kinds.wrn import WRNSpec

PAPER = {  # Table 2: log10 spectral norm, mean +- sd over runs (CIFAR-10 WRN-40-10, CIFAR-100 ResNet-164).
    # Its "PyTorch default" is weight_norm's g = ||W|| over He-drawn or orthogonal W (the authors' code has
    # both; the paper does not say which): sigprop's pytorch-he and pytorch-orthogonal, each printed beside
    # that column; sigprop's pytorch (nn.Conv2d's own uniform W) is not in the paper.
    "wrn-40-10": {
        "pytorch-he": (4.68, 0.60),
        "pytorch-orthogonal": (4.68, 0.60),
        "datadep": (3.01, 0.02),
        "stage-hanin": (7.14, 0.72),
        "proposed": (1.31, 0.12),
    },
    "resnet-164": {
        "pytorch-he": (9.56, 0.54),
        "pytorch-orthogonal": (9.56, 0.54),
        "datadep": (2.68, 0.09),
        "stage-hanin": None,
        "proposed": (1.56, 0.18),
    },
}
INITS = ("pytorch-he", "pytorch-orthogonal", "pytorch", "datadep", "stage-hanin", "proposed")


def main() -> None:
    arg = lambda name, default: (
        type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default
    )
    quick = "--quick" in sys.argv
    device = arg("--device", "cpu" if quick else "cuda")
    samples = arg("--samples", 128 if quick else 5000)
    seeds = arg("--seeds", 3)
    batch = (
        arg("--batch-size", 0 if quick else 128) or None
    )  # the paper's minibatches (its code: batches of 128)
    inits = tuple(arg("--inits", ",".join(INITS)).split(","))
    unknown = set(inits) - set(INITS)
    if unknown:
        sys.exit(f"--inits: {sorted(unknown)} not among {', '.join(INITS)}")
    nets = (
        [
            ("wrn-40-10", WRNSpec(blocks=6, widen=1, image=(3, 16, 16), inits=inits), "WRN-40-1, 16 x 16"),
            (
                "resnet-164",
                WRNSpec.of_preset("resnet-56", image=(3, 16, 16), inits=inits),
                "ResNet-56, 16 x 16",
            ),
        ]
        if quick
        else [
            ("wrn-40-10", WRNSpec.of_preset("wrn-40-10", inits=inits), "WRN-40-10"),
            ("resnet-164", WRNSpec.of_preset("resnet-164", inits=inits), "ResNet-164"),
        ]
    )
    chosen = arg("--nets", ",".join(name for name, _, _ in nets)).split(",")
    if set(chosen) - {name for name, _, _ in nets}:
        sys.exit(f"--nets: choose among {', '.join(name for name, _, _ in nets)}")
    nets = [net for net in nets if net[0] in chosen]
    print(
        f"device {device}, {samples} synthetic "
        f"samples{'' if batch is None else f' in minibatches of {batch}'}, {seeds} draws"
    )
    for paper_net, spec, label in nets:
        t0 = time.perf_counter()
        result = api.hessian(
            spec, specs.HessianSpec(samples=samples, seeds=seeds, device=device, batch_size=batch)
        )
        dt = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"\n{label} (paper: {paper_net}) -- {dt:.0f} s, peak RSS {rss:.2f} GiB so far")
        for run in result.runs:
            m, sd = run.summary()
            p = PAPER[paper_net].get(run.init, "absent")
            ours = "diverged" if m is None else f"{m:.2f}" + ("" if sd is None else f" +- {sd:.2f}")
            theirs = (
                "-- (not in the paper)"
                if p == "absent"
                else "N/A (diverged)"
                if p is None
                else f"{p[0]:.2f} +- {p[1]:.2f}"
            )
            print(f"  {run.init:18s} sigprop {ours:>16s}   paper {theirs}")


if __name__ == "__main__":
    main()
