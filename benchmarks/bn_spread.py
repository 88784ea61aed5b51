"""The BN ResNet's finite-width spread against its measurement (docs/theory.md §7, "Found while
folding them"): the across-sample variance of ln ratio at the last entry (forward) and the first
(backward) over every draw of ``he`` at 128 samples, with the bootstrap se over draws, beside
0.16's law (its blocks' v_F = 2/d, the linear layer alone) and 0.17's (``plans.spread``: the
batch norm's 5/d besides).  About 20 s on a 2-core CPU.

Usage: python benchmarks/bn_spread.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/walks.py
import walks

from sigprop import kinds, plans, specs, theory
from sigprop.kinds import resnet
from sigprop.kinds.resnet import ResNetSpec


def main() -> None:
    rng = np.random.default_rng(0)
    kind = kinds.get("resnet")
    for d, blocks, draws in ((64, 10, 48), (128, 20, 48), (256, 40, 24)):
        spec = ResNetSpec(dim=d, blocks=blocks, norm="bn", inits=("he",))
        plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=128, seeds=draws, seed=3, device="cpu"))
        gains = resnet.prediction(kind.scheme(spec, "he"), plan).gains
        s = plans.spread(plan.steps, False, gains)
        stem = 7 / (4 * d)
        old = [sum(theory.resnet_step_variance(g[i], 2 / d, 0, d) for g in gains) + stem for i in (0, 1)]
        for name, arr, new, was in (
            ("forward", out["he"]["fwd"][:, -1, :], s.forward[-1, 1], old[0]),
            ("backward", out["he"]["bwd"][:, 0, :], s.backward[0, 1], old[1]),
        ):
            v = float(np.var(arr))
            se = float(np.std([np.var(arr[rng.integers(0, draws, draws)]) for _ in range(400)]))
            print(
                f"d {d}, {blocks} blocks, {draws} draws, {name}: measured {v:.4f} ± {se:.4f}; "
                f"0.16's law {was:.4f} ({was / v - 1:+.1%}), 0.17's {new:.4f} ({new / v - 1:+.1%})"
            )


if __name__ == "__main__":
    main()
