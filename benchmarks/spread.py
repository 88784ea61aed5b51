"""Is the MLP tolerance model's spread right?  (issue 6; docs/reliability.md, docs/theory.md §4)

For one init at one (width, depth) cell, runs seeds s0..s0+K-1 (each a new network and new
inputs, N samples each) and compares, with bootstrap standard errors over the seeds:

* the per-sample ln(ratio) at the checked layers (forward at layer L, backward at layer 1),
  pooled over seeds: its mean (below ln RMS: the drift) and variance against the exact model
  ``plans.spread`` (drift, sigma^2, skewness);
* how that variance splits: across draws (the variance of each draw's sample mean -- this is
  the spread of the ``--check`` statistic) and within a draw (between samples);
* the check statistic's measured sd against sigma (the band's width is z sigma).

For ``--arch resnet`` (one stage of ``--depth`` blocks, d = hidden = width) the checked
quantity is ||h^B||/||h^0|| forward and ||dl/dh^0||/||dl/dh^B|| backward, and the model is the
leading-order ResNet spread (plans.spread, docs/theory.md §7) with the lognormal
drift -sigma^2 -- both for the init itself and for the reference the ResNet check's band uses
(proposed-gaussian's spread on the same plan).

Usage: python benchmarks/spread.py [--arch mlp|resnet] [--width 64] [--depth 200] [--seeds 1000]
       [--seed-start 0] [--samples 100] [--init proposed]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from sigprop import inits, plans, run, specs
from sigprop.kinds import mlp, resnet
from sigprop.kinds.mlp import MLPSpec
from sigprop.kinds.resnet import ResNetSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--init", default="proposed")
    ap.add_argument("--arch", choices=("mlp", "resnet"), default="mlp")
    args = ap.parse_args()
    n, L, N = args.width, args.depth, args.samples
    scheme = inits.get(args.init)
    if args.arch == "mlp":
        spec = MLPSpec(depth=L, input_dim=n, width=specs.WidthSpec(n, n), inits=(args.init,))
    else:
        spec = ResNetSpec(blocks=L, dim=n, width=specs.WidthSpec(n, n), inits=(args.init,))
    fwd, bwd = [], []  # [K, N] per-sample ln ratio at the checked layer (forward, backward)
    t0 = time.perf_counter()
    for seed in range(args.seed_start, args.seed_start + args.seeds):
        probe = specs.ProbeSpec(samples=N, seed=seed, device="cpu")
        if args.arch == "mlp":
            a = run.measure(spec, probe).arrays[args.init]
            f, b = a["fwd"], a["bwd"]
            fwd.append(f[0, L - 1])
            bwd.append(b[0, 0])
        else:
            m = run.measure(spec, probe)
            plan, a = m.plan, m.arrays[args.init]
            fwd.append(a["fwd"][0, -1] - a["fwd"][0, 0])
            bwd.append(a["bwd"][0, 0] - a["bwd"][0, -1])
    seconds = time.perf_counter() - t0
    if args.arch == "mlp":
        widths = [n] * (L + 1)
        pred = plans.predict(mlp.steps(widths), scheme)
        spread = plans.spread(mlp.steps(widths), scheme.orthogonal)
        cum_f, cum_b = spread.forward, spread.backward
        models = (
            ("forward, layer L", np.array(fwd), pred.ln_forward[L - 1], cum_f[L - 1]),
            ("backward, layer 1", np.array(bwd), pred.ln_backward[0], cum_b[0]),
        )
        what = "exact cumulants (plans.spread)"
    else:
        pred = resnet.prediction(scheme, plan)
        var_f, var_b = resnet.variances(scheme.orthogonal, plan, pred.gains).variances
        ref = inits.get("proposed-gaussian")
        ref_f, ref_b = resnet.variances(ref.orthogonal, plan, resnet.prediction(ref, plan).gains).variances
        vf, vb = float(var_f[-1] - var_f[0]), float(var_b[0] - var_b[-1])
        models = (
            (
                "forward, ||h^B||/||h^0||",
                np.array(fwd),
                pred.ln_forward[-1] - pred.ln_forward[0],
                (-vf, vf, 0.0),
            ),
            (
                "backward, ||dl/dh^0||/||dl/dh^B||",
                np.array(bwd),
                pred.ln_backward[0] - pred.ln_backward[-1],
                (-vb, vb, 0.0),
            ),
        )
        what = (
            f"leading-order ResNet spread, drift -sigma^2 (the check's reference, proposed-gaussian: "
            f"sigma^2 {float(ref_f[-1] - ref_f[0]):.4f} forward, {float(ref_b[0] - ref_b[-1]):.4f} backward)"
        )
    rng = np.random.default_rng(0)
    print(
        f"{args.init}, {args.arch} width {n}, depth {L}, {args.seeds} seeds from {args.seed_start}, N = {N}, "
        f"CPU float32 ({seconds:.0f} s); model: {what}"
    )
    for name, x, ln_rms, cum in models:
        K = x.shape[0]
        stat = lambda a: (
            a.mean() - ln_rms,
            a.var(),
            a.mean(axis=1).var(ddof=1),
            a.var(axis=1).mean(),
            a.mean(axis=1).std(ddof=1),
        )
        est = np.array(stat(x))
        boot = np.array([stat(x[rng.integers(0, K, K)]) for _ in range(400)])
        se = boot.std(axis=0)
        drift, var, k3 = (float(v) for v in cum)
        labels = (
            "mean - ln RMS (drift)",
            "per-sample variance",
            "  across draws (var of draw means)",
            "  within a draw (mean of var)",
            "sd of the check statistic",
        )
        model = (drift, var, None, None, math.sqrt(var))  # the last: compared as a ratio
        print(
            f"\n{name}: model drift {drift:+.4f}, sigma^2 {var:.4f} (sigma {math.sqrt(var):.4f}), "
            f"skewness {k3 / var**1.5 if var > 0 else 0:+.3f}"
        )
        for i, (lab, e, s, m) in enumerate(zip(labels, est, se, model)):
            if i == 4:  # the statistic averages N samples: its sd is at most sigma, not sigma itself
                dev = f"  ({e / m:.2f} sigma: the band's z sigma is z * {m / e:.2f} of its sd)"
            else:
                dev = f"  ({(e - m) / s:+.1f} SE from the model {m:.4f})" if m is not None and s > 0 else ""
            print(f"  {lab:36s} {e:+.4f} +- {s:.4f}{dev}")


if __name__ == "__main__":
    main()
