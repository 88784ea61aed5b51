"""The BN ResNet's finite-width spread against its measurement (docs/theory.md §7, "The BN
ResNet's spread"): per configuration the across-sample variance of ln ratio at the stem's entry
and at the last entry (forward) and at the first (backward) over every draw of ``he`` at 128
samples, the sum of the measured per-block variances beside the variance of their total (the
blocks' increments are correlated: the law sums them as independent), and the laws: 0.16's
(stem (5 + 2)/(4d), blocks v_F = 2/d) and 0.17's (``plans.spread``: stem (3 + 2)/(4d), blocks
v_F = 2/d + 3/d).  Then ``why``: in a plain-torch Monte Carlo of the blocks alone, what carries
their correlation (the sample's relative power).  About 30 s on a 2-core CPU.

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
    kind = kinds.get("resnet")
    for d, blocks, draws in ((64, 10, 48), (128, 20, 48), (256, 40, 24)):
        spec = ResNetSpec(dim=d, blocks=blocks, norm="bn", inits=("he",))
        plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=128, seeds=draws, seed=3, device="cpu"))
        gains = resnet.prediction(kind.scheme(spec, "he"), plan).gains
        s = plans.spread(plan.steps, False, gains)
        old_stem = 7 / (4 * d)
        old = [old_stem + sum(theory.resnet_step_variance(g[i], 2 / d, 0, d) for g in gains) for i in (0, 1)]
        fwd, bwd = out["he"]["fwd"], out["he"]["bwd"]
        stem = float(np.var(fwd[:, 1, :]))
        print(
            f"d {d}, {blocks} blocks, {draws} draws: stem measured {stem:.4f}, 0.16's {old_stem:.4f} "
            f"({old_stem / stem - 1:+.0%}), 0.17's {s.forward[1, 1]:.4f} ({s.forward[1, 1] / stem - 1:+.0%})"
        )
        for name, arr, new, was in (
            ("forward", fwd[:, -1, :] - fwd[:, 1, :], s.forward[-1, 1] - s.forward[1, 1], old[0] - old_stem),
            ("backward", bwd[:, 1, :] - bwd[:, -1, :], s.backward[1, 1], old[1] - old_stem),
        ):
            v = float(np.var(arr))
            steps = np.diff(fwd if name == "forward" else bwd, axis=1)[:, 1:, :]
            summed = float(np.var(steps, axis=(0, 2)).sum())
            print(
                f"  blocks {name}: measured {v:.4f}, sum of the blocks' own {summed:.4f} "
                f"({v / summed:.2f}x: correlated); 0.16's law {was:.4f} ({was / v - 1:+.0%}), "
                f"0.17's {new:.4f} ({new / v - 1:+.0%}; of the summed {new / summed - 1:+.0%})"
            )
    why()


def _blocks(d: int, batch: int, blocks: int, gen) -> tuple:
    """One draw of the BN blocks alone in plain torch (x + W ReLU(BN(x)), He W, no stem; an
    implementation independent of sigprop's walker): per sample and block the ln increment of
    ||x|| and the sample's relative power ln(||x_i||^2 / mean_j ||x_j||^2) at the block's input."""
    import math

    import torch

    x = torch.randn(batch, d, dtype=torch.float64, generator=gen)
    inc, rel = [], []
    for _ in range(blocks):
        mu, sd = x.mean(0), x.std(0, unbiased=False)
        w = torch.randn(d, d, dtype=torch.float64, generator=gen) * math.sqrt(2.0 / d)
        nxt = x + torch.relu((x - mu) / (sd + 1e-5)) @ w.T
        p = x.pow(2).sum(1)
        rel.append(torch.log(p / p.mean()))
        inc.append(0.5 * torch.log(nxt.pow(2).sum(1) / p))
        x = nxt
    return torch.stack(inc, 1).numpy(), torch.stack(rel, 1).numpy()


def why(d: int = 128, batch: int = 128, blocks: int = 20, draws: int = 64) -> None:
    """What carries the blocks' correlation: each block's increment regressed on the sample's
    relative power at its input; the residuals' total against their summed variances."""
    import torch

    gen = torch.Generator().manual_seed(0)
    inc, rel = (np.concatenate(a) for a in zip(*[_blocks(d, batch, blocks, gen) for _ in range(draws)]))

    def excess(y: np.ndarray) -> float:
        y = y - y.mean(0)
        return float(y.sum(1).var() / y.var(0).sum())

    resid = np.empty_like(inc)
    for b in range(blocks):
        slope, icept = np.polyfit(rel[:, b], inc[:, b], 1)
        resid[:, b] = inc[:, b] - (slope * rel[:, b] + icept)
    share = 1 - resid.var(0).sum() / inc.var(0).sum()
    print(
        f"why (plain torch, d {d}, batch {batch}, {blocks} blocks, {draws} draws): total / summed blocks "
        f"{excess(inc):.2f}x; each block's increment less its regression on the sample's relative power "
        f"(explaining {share:.1%} of its variance): {excess(resid):.2f}x"
    )


if __name__ == "__main__":
    main()
