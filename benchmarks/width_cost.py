"""What ``sigprop width`` says a check costs, against what it costs (docs/benchmarks.md, "What a
width check costs"; sigprop/width/cost.py):

* memory: the widest point's estimate (weights, gradients, Adam's moments, 3 x one forward's
  activations, on the meta device) beside the peak RSS of the check run in a fresh process, less
  that of the same check at small widths (the interpreter, torch, the small points);
* time: the clock's estimates of the time left, told as the check runs (``progress.remaining``),
  beside the time that was in fact left at each, for sigprop's CNN at its defaults (widths 16-256)
  and with the widths 16-512.

Usage: python benchmarks/width_cost.py [--memory-widths 2048,4096,8192]   (about 3 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

import sigprop
from sigprop.width import cost, points
from sigprop.width.spec import WidthSpec

CHILD = """
import resource, sys, sigprop
w = int(sys.argv[1])
sigprop.width_check("mlp", widths=[64, 128, w], params=["sp"], steps=1, seeds=1, device="cpu")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def peak(width: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(width)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def estimate(width: int) -> int:
    kind = sigprop.kinds.get("mlp")
    net = kind.width_net({"widths": (64, 128, width)})
    spec = WidthSpec(params=("sp",), steps=1, seeds=1)
    x = points.batch(spec, net, 0, torch.device("cpu"))
    model = cost.on_meta(points.factory_of(net), width)
    count, weights = cost.parameters(model)
    return cost.point_bytes(weights, cost.activations(model, x), spec.optimizer)


def memory(widths: list[int]) -> None:
    base = peak(256)
    print("| widest | estimate | peak RSS less the small check's | ratio |\n|---|---|---|---|")
    for w in widths:
        est, got = estimate(w), peak(w) - base
        print(f"| {w} | {est / 2**20:.0f} MiB | {got / 2**20:.0f} MiB | {got / est:.2f} |", flush=True)


class Told:
    """A progress that keeps each estimate of the time left with the time it was told."""

    def __init__(self):
        self.told: list[tuple[float, float]] = []

    def __call__(self, done, total, label=""):
        pass

    def remaining(self, seconds: float) -> None:
        self.told.append((time.perf_counter(), seconds))


def clock(widths: list[int]) -> None:
    told = Told()
    t0 = time.perf_counter()
    sigprop.width_check("cnn", widths=widths, progress=told)
    end = time.perf_counter()
    pairs = [(round(t - t0), s, end - t) for t, s in told.told]
    first = pairs[0]
    picks = [pairs[round(i * (len(pairs) - 1) / 5)] for i in range(6)]
    words = ", ".join(f"{s:.0f} s told at {at} s ({left:.0f} s left)" for at, s, left in picks)
    print(
        f"cnn widths {','.join(map(str, widths))}: {end - t0:.0f} s in all; first estimate at {first[0]} s: "
        f"{first[1] + first[0]:.0f} s in all; {words}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memory-widths", default="2048,4096,8192")
    a = ap.parse_args()
    torch.set_num_threads(2)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}))
    memory([int(w) for w in a.memory_widths.split(",")])
    clock([16, 32, 64, 128, 256])
    clock([16, 32, 64, 128, 256, 512])


if __name__ == "__main__":
    main()
