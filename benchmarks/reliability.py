"""How often does ``--check`` cry wolf, and how often does it miss? (issue 6, docs/reliability.md)

For every cell of the grid (MLP: width x depth; ResNet: width x blocks) it runs the probe with
seeds 0..S-1 -- each seed a new network *and* new inputs -- for the inits proposed, he, pytorch
and datadep (one probe per seed, all inits sharing its draws), and counts:

* false alarms: runs of ``proposed`` whose check fails (target <= 0.5%);
* misses: runs of he / pytorch / datadep whose check passes, at depth (blocks) >= 20 (target 0%).

Since 0.4.0 every run carries two verdicts (docs/cli.md): ``preserved`` (the default gate: the
typical ratio lies in the absolute band) is counted in ``failed``, ``theory`` (agreement with the
init's own finite-width prediction) in ``failed_theory``.  Where the theory predicts a typical
ratio outside the band (depth >> width), ``proposed`` failing ``preserved`` is the right answer,
not a false alarm: docs/reliability.md derives which cells those are.

Each finished cell is appended to a JSON-lines file (resumable, like ``sigprop sweep``) and the
table is printed at the end.  Slow: the full grid (200 seeds, widths up to 1024, depth 200, 1000
blocks) takes many CPU hours; ``--seeds``, ``--samples``, ``--widths``, ``--max-cost`` trim it
and the table says what ran.

Usage: python benchmarks/reliability.py [--seeds 200] [--samples 200] [--widths 64,256,1024]
       [--max-cost 2e12] [--arch mlp|resnet|both] [--out reliability.jsonl] [--quick]
       [--seed-start 0] [--sizes 50,200]  (seeds seed_start..seed_start+seeds-1; the table sums a
       cell's disjoint seed ranges)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from sigprop import api, specs
from sigprop.kinds.mlp import MLPSpec
from sigprop.kinds.resnet import ResNetSpec
from sigprop.version import __version__

INITS = ("proposed", "he", "pytorch", "datadep")
MLP_DEPTHS = (10, 50, 200)
RESNET_BLOCKS = (10, 100, 1000)


def cost(arch: str, width: int, size: int, samples: int) -> float:
    """Rough flops of one probe of one init: matmuls both ways and one QR per layer."""
    layers = size if arch == "mlp" else 2 * size
    return layers * (4.0 * samples * width * width + 3.0 * width**3)


def run_cell(arch: str, width: int, size: int, seeds: int, samples: int, seed_start: int = 0) -> dict:
    fails = {name: 0 for name in INITS}
    fails_theory = {name: 0 for name in INITS}
    t0 = time.perf_counter()
    for seed in range(seed_start, seed_start + seeds):
        if arch == "mlp":
            spec = MLPSpec(depth=size, input_dim=width, width=specs.WidthSpec(width, width), inits=INITS)
        else:
            spec = ResNetSpec(blocks=size, dim=width, width=specs.WidthSpec(width, width), inits=INITS)
        result = api.probe(spec, specs.ProbeSpec(samples=samples, seed=seed, device="cpu"))
        for run in result.runs:
            fails[run.init] += 0 if run.preserved else 1
            fails_theory[run.init] += 0 if run.agrees_with_theory else 1
    return {
        "arch": arch,
        "width": width,
        "size": size,
        "seeds": seeds,
        "seed_start": seed_start,
        "sigprop": __version__,
        "samples": samples,
        "gate": "preserved",
        "failed": fails,
        "failed_theory": fails_theory,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def merge(rows: list[dict]) -> list[dict]:
    """Cells of the same (arch, width, size, samples, gate) run over disjoint seed ranges, summed
    (a range overlapping one already counted -- the same seeds run twice -- is left out).  Rows
    without a ``gate`` are from before 0.4.0 (the single check, docs/reliability.md)."""
    out: dict = {}
    spans: dict = {}
    for r in sorted(rows, key=lambda r: -r["seeds"]):
        key = (r["arch"], r["width"], r["size"], r["samples"], r.get("gate", "pre-0.4"))
        lo = r.get("seed_start", 0)
        hi = lo + r["seeds"]
        if any(lo < b and a < hi for a, b in spans.get(key, [])):
            continue
        spans.setdefault(key, []).append((lo, hi))
        if key not in out:
            out[key] = dict(
                r,
                failed=dict(r["failed"]),
                **({"failed_theory": dict(r["failed_theory"])} if "failed_theory" in r else {}),
            )
            continue
        m = out[key]
        m["seeds"] += r["seeds"]
        m["seconds"] = round(m["seconds"] + r["seconds"], 1)
        for field in ("failed", "failed_theory"):
            if field in m and field in r:
                for k in INITS:
                    m[field][k] += r[field][k]
    return list(out.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--seed-start", type=int, default=0, help="first seed (to extend a cell over new seeds)")
    ap.add_argument("--sizes", default=None, help="only these depths/blocks, e.g. 50,200")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--widths", default="64,256,1024")
    ap.add_argument(
        "--max-cost", type=float, default=float("inf"), help="skip cells whose seeds x inits cost more flops"
    )
    ap.add_argument("--out", default="reliability.jsonl")
    ap.add_argument("--arch", choices=("mlp", "resnet", "both"), default="both")
    ap.add_argument("--quick", action="store_true", help="20 seeds, widths 64 and 256, 100 samples")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.samples, args.widths = 20, 100, "64,256"
    widths = [int(w) for w in args.widths.split(",")]
    out = Path(args.out)
    done = {}
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            if r.get("gate") == "preserved":
                done[(r["arch"], r["width"], r["size"], r["seeds"], r["samples"], r.get("seed_start", 0))] = r
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else None
    cells = [("mlp", w, d) for w in widths for d in sizes or MLP_DEPTHS] + [
        ("resnet", w, b) for w in widths for b in sizes or RESNET_BLOCKS
    ]
    cells = [c for c in cells if args.arch in ("both", c[0])]
    cells.sort(key=lambda c: cost(c[0], c[1], c[2], args.samples))
    rows = []
    for arch, width, size in cells:
        key = (arch, width, size, args.seeds, args.samples, args.seed_start)
        total = cost(arch, width, size, args.samples) * args.seeds * len(INITS)
        if key in done:
            rows.append(done[key])
            continue
        if total > args.max_cost:
            print(f"skip {arch} width {width} size {size}: {total:.1e} flops > --max-cost", flush=True)
            continue
        r = run_cell(arch, width, size, args.seeds, args.samples, args.seed_start)
        with open(out, "a") as fh:
            fh.write(json.dumps(r) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        print(
            f"{arch} width {width} size {size}: {r['failed']} of {r['seeds']} failed ({r['seconds']} s)",
            flush=True,
        )
        rows.append(r)
    print()
    print(
        f"{'net':7s} {'width':>5s} {'depth':>5s} {'seeds':>5s} {'N':>5s}  {'proposed fails':>14s}  "
        f"{'he passes':>9s} {'pytorch':>8s} {'datadep':>8s}"
        f"  (verdict 'preserved'; proposed disagreeing with theory)"
    )
    shown = {(r["arch"], r["width"], r["size"]) for r in rows}
    rows += [r for r in done.values() if (r["arch"], r["width"], r["size"]) in shown and r not in rows]
    for r in sorted(merge(rows), key=lambda r: (r["arch"], r["width"], r["size"])):
        n, f = r["seeds"], r["failed"]
        passes = {k: n - f[k] for k in INITS}
        print(
            f"{r['arch']:7s} {r['width']:5d} {r['size']:5d} {n:5d} {r['samples']:5d}  "
            f"{f['proposed']:4d} ({100 * f['proposed'] / n:4.1f}%)  {passes['he']:9d} {passes['pytorch']:8d} "
            f"{passes['datadep']:8d}"
            f"  {r.get('failed_theory', {}).get('proposed', '-')}"
        )


if __name__ == "__main__":
    main()
