"""When is the ``theory`` verdict a test, and how often does it cry wolf or miss? (issue 37, item 3;
docs/reliability.md §1f)

Since 0.10.2 a ``theory`` band is a test only where it leaves out the prediction of the same net
with every weight layer's variance halved and doubled (docs/theory.md §4, "Which bands are a
test"); elsewhere the verdict reads "not testable".  Per cell and seed (a new net and new inputs)
this runs ``proposed`` and ``he`` -- in an equal-width ReLU MLP or CNN, He's g = 1 is exactly
the proposed net with every layer's variance halved (g^2 = 1 against 2 n_in/n_out = 2) -- and
counts:

* ``testable``: runs of ``proposed`` whose theory verdict is a test (both checked ratios);
* ``false alarms``: runs of ``proposed`` whose theory verdict is testable and fails;
* ``misses``: runs where ``proposed``'s verdict is testable and ``he``'s measured typical ratios,
  held against ``proposed``'s bands, fall inside both (the alternative the rule must reject);
* ``old false alarms`` / ``old misses``: the same under 0.10.1's rule (every band a test).

The ResNet cells count testable and false alarms only (He's g = 1 on the branch's last layer is
not a factor-two alternative there).  Usage: python benchmarks/theory_power.py [--seeds 50]
[--samples 100] [--quick] [--only mlp,cnn,resnet]; prints one line per cell and a table in
Markdown (the numbers of docs/reliability.md §1f: --seeds 200, about 4 minutes on one core).
"""

from __future__ import annotations

import argparse
import math
import time

from sigprop import api

CELLS = (
    ("mlp", {"width": "32", "input_dim": 32, "depth": 10}),
    ("mlp", {"width": "32", "input_dim": 32, "depth": 50}),
    ("mlp", {"width": "64", "input_dim": 64, "depth": 10}),
    ("mlp", {"width": "64", "input_dim": 64, "depth": 50}),
    ("mlp", {"width": "256", "input_dim": 256, "depth": 10}),
    ("mlp", {"width": "256", "input_dim": 256, "depth": 50}),
    ("cnn", {"channels": 16, "depth": 10, "image": "3x16x16"}),
    ("cnn", {"channels": 64, "depth": 10, "image": "3x16x16"}),
    ("cnn", {"channels": 64, "depth": 20, "image": "3x16x16"}),
    ("resnet", {"blocks": 10, "dim": 64, "width": "64"}),
    ("resnet", {"blocks": 40, "dim": 64, "width": "64"}),
    ("resnet", {"blocks": 10, "dim": 256, "width": "256"}),
    ("resnet", {"blocks": 40, "dim": 256, "width": "256"}),
    ("resnet", {"blocks": 10, "dim": 1024, "width": "1024"}),
)


def _inside(c, log10_measured) -> bool:
    return log10_measured is not None and c.log10_low <= log10_measured <= c.log10_high


def run_cell(kind: str, options: dict, seeds: int, samples: int) -> dict:
    counts = dict(runs=0, testable=0, false_alarms=0, misses=0, old_false_alarms=0, old_misses=0)
    t0 = time.perf_counter()
    pair = kind in ("mlp", "cnn")
    for seed in range(seeds):
        r = getattr(api, f"probe_{kind}")(
            **options,
            inits=["proposed", "he"] if pair else "proposed",
            samples=samples,
            seed=seed,
            device="cpu",
            threads=1,
        )
        prop = r.run("proposed")
        checks = prop.verdict_checks("theory")
        counts["runs"] += 1
        # 0.10.1's rule: every band a test -- rebuilt from the measured values and the bands
        old = [c.passed if c.has_band else _old_passed(c, prop) for c in checks]
        counts["old_false_alarms"] += not all(old)
        testable = all(c.has_band for c in checks)
        counts["testable"] += testable
        counts["false_alarms"] += testable and not all(c.passed for c in checks)
        if pair:
            he = r.run("he").verdict_checks("theory")
            bands = [_band(c, prop) for c in checks]
            inside = all(lo <= h.log10_measured <= hi for (lo, hi), h in zip(bands, he))
            counts["old_misses"] += inside
            counts["misses"] += testable and inside
    counts["seconds"] = round(time.perf_counter() - t0, 1)
    return counts


def _band(c, run) -> tuple[float, float]:
    """A theory check's band (log10), also where the rule made it 'not a test' (read back from its
    note, printed to 3 significant digits: the old rule's counts are exact to that rounding)."""
    if c.has_band:
        return c.log10_low, c.log10_high
    edges = c.note.split("the band [")[1].split("]")[0].split(", ")
    return tuple(float(e[3:]) if e.startswith("10^") else math.log10(float(e)) for e in edges)


def _old_passed(c, run) -> bool:
    lo, hi = _band(c, run)
    return c.log10_measured is not None and lo <= c.log10_measured <= hi


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="3 seeds, the first two cells")
    ap.add_argument("--only", default="", help="the cells of these kinds only (mlp,cnn,resnet)")
    a = ap.parse_args()
    cells = CELLS[:2] if a.quick else [c for c in CELLS if not a.only or c[0] in a.only.split(",")]
    seeds = 3 if a.quick else a.seeds
    rows = []
    for kind, options in cells:
        got = run_cell(kind, options, seeds, a.samples)
        label = f"{kind} " + " ".join(f"{k}={v}" for k, v in options.items())
        print(label, got, flush=True)
        rows.append((label, got))
    print(
        "\n| cell | seeds | testable | false alarms | misses (he in proposed's band) | 0.10.1 false alarms "
        "| 0.10.1 misses | time |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, g in rows:
        pair = not label.startswith("resnet")
        miss, old_miss = (g["misses"], g["old_misses"]) if pair else ("—", "—")
        print(
            f"| {label} | {g['runs']} | {g['testable']} | {g['false_alarms']} | {miss} | "
            f"{g['old_false_alarms']} | {old_miss} | {g['seconds']} s |"
        )


if __name__ == "__main__":
    main()
