"""What a traced band can catch (issue 67, item 2; docs/reliability.md §8): (1) at the defaults
(64 samples, one draw) on the known-good transformers of benchmarks/transformer_zoo.py, how many
sites' bands are too wide to catch a 25% miss of the maps in 90% of runs (``log10_power``) and
the --seeds that would narrow them all; (2) the other way, on a post-LN encoder of 48 layers (d
64, T 16, each layer re-drawn), over draws one run each: how many sites where the maps hold in
the mean read "≠", and per depth the spread of the miss across draws beside the band's
half-width; (3) the draw share rho of the measured value and of the miss (measured over the
prediction composed on the same draw), per model, which the band reads as 0.25.

Usage: python benchmarks/band_power.py [--draws 8] [--rho-draws 12]   (about a minute on 2 cores)
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

import numpy as np
import torch
import torch.nn as nn
import transformer_zoo as zoo

import sigprop
from sigprop import theory


def power_table() -> None:
    print("| model | bands | too wide for 25% | widest (site, miss it catches) | --seeds for all |")
    print("|---|---|---|---|---|")
    target = theory.POWER_TARGET / theory.LN10
    for name, make in zoo.GOOD.items():
        run = sigprop.probe_module(model=make, inits="as-is", **zoo.inputs(name)).runs[0]
        rows = [
            (f"{l.name} {d}", getattr(l, d))
            for l in run.layers
            for d in ("forward", "backward")
            if getattr(l, d).log10_power is not None
        ]
        wide = [(n, st) for n, st in rows if st.log10_power > target + 1e-12]
        worst = max(rows, key=lambda t: t[1].log10_power)
        seeds = max((st.draws_for_power or 0 for _, st in wide), default=1)
        print(
            f"| {name} | {len(rows)} | {len(wide)} | {worst[0]} ({10 ** worst[1].log10_power - 1:.0%}) "
            f"| {seeds} |"
        )


def post_ln(layers: int = 48, d: int = 64, T: int = 16):
    layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=False)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    for copy in model.layers:  # re-drawn: nn.TransformerEncoder copies its layer
        for m in copy.modules():
            reset = getattr(m, "reset_parameters", None) or getattr(m, "_reset_parameters", None)
            if m is not copy and reset is not None:
                reset()
    return model


def marks_table(draws: int) -> None:
    res, half, marks = [], [], Counter()
    total = 0
    for seed in range(draws):
        run = sigprop.probe_module(model=post_ln, input_shape=(16, 64), seed=seed).runs[0]
        res.append([math.log(l.backward.rms / l.backward.predicted) for l in run.layers])
        half.append([(l.backward.log10_high - l.backward.log10_low) / 2 * theory.LN10 for l in run.layers])
        for l in run.layers:
            for direction in ("forward", "backward"):
                st = getattr(l, direction)
                total += 1
                if st.agrees is False:
                    marks[direction] += 1
    res, half = np.array(res), np.array(half)
    print(
        f"\npost-LN, 48 layers, d 64, T 16, {draws} draws of 64 samples: '≠' at {sum(marks.values())} of "
        f"{total} marks (forward {marks['forward']}, backward {marks['backward']})"
    )
    print("| site | miss across draws: mean (ln) | sd (ln) | band half-width (ln) | half-width / sd |")
    print("|---|---|---|---|---|")
    for i in (0, 10, 20, 30, 35, 40, 46):
        sd = float(res[:, i].std(ddof=1))
        print(
            f"| layers.{i} | {res[:, i].mean():+.3f} | {sd:.3f} | {half[:, i].mean():.3f} "
            f"| {half[:, i].mean() / sd:.1f} |"
        )


def rho_table(draws: int, samples: int = 64) -> None:
    print("\n| model | sites | rho of the measured value, median (max) | rho of the miss, median (max) |")
    print("|---|---|---|---|")
    models = {
        "llama": (zoo.GOOD["llama"], zoo.inputs("llama")),
        "gpt2": (zoo.GOOD["gpt2"], zoo.inputs("gpt2")),
        "bert": (zoo.GOOD["bert"], zoo.inputs("bert")),
        "post-LN, 48 layers": (post_ln, {"input_shape": (16, 64)}),
    }
    for name, (make, kw) in models.items():
        miss, meas, var = [], [], []
        for seed in range(draws):
            run = sigprop.probe_module(model=make, inits="as-is", seed=seed, samples=samples, **kw).runs[0]
            rows = [l.backward for l in run.layers if l.backward.predicted]
            miss.append([math.log(b.rms / b.predicted) for b in rows])
            meas.append([math.log(b.rms) for b in rows])
            # one sample's variance back from the band: half = z se + accuracy, se^2 = v (1/S + rho)
            half = [(b.log10_high - b.log10_low) / 2 * theory.LN10 for b in rows]
            se = [(h - theory.MAP_ACCURACY_BACKWARD) / theory.Z_CHECK for h in half]
            var.append([x * x / (1 / samples + theory.DRAW_SHARE) for x in se])
        miss, meas, var = map(np.array, (miss, meas, var))
        v = var.mean(0)
        ok = v > 1e-12
        cols = [(a.var(0, ddof=1) - v / samples)[ok] / v[ok] for a in (meas, miss)]
        print(
            f"| {name} | {int(ok.sum())} | "
            + " | ".join(f"{np.median(c):.3f} ({c.max():.3f})" for c in cols)
            + " |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--rho-draws", type=int, default=12)
    a = ap.parse_args()
    torch.set_num_threads(2)
    power_table()
    marks_table(a.draws)
    rho_table(a.rho_draws)


if __name__ == "__main__":
    main()
