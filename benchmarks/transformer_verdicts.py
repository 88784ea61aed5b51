"""How often the preservation verdict reads right on transformers (issue 67, item 1;
docs/reliability.md §7): every model of benchmarks/transformer_zoo.py, known good (their own
inits) and known bad, over sixteen draws (``--seed 0..15``, one draw each, 32 samples of 16
tokens), counting the draws that read "preserved" -- and which check failed where one did.

Usage: python benchmarks/transformer_verdicts.py [--draws 16] [--samples 32]   (minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
import transformer_zoo as zoo

import sigprop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=16)
    ap.add_argument("--samples", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(2)
    head = "| model | set | preserved | theory agrees | what failed (draws) | across the layers (draw 0) |"
    print(head)
    print("|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    for group, models in (("good", zoo.GOOD), ("bad", zoo.BAD)):
        for name, make in models.items():
            kept = agrees = 0
            failed: Counter = Counter()
            first = ""
            for seed in range(a.draws):
                r = sigprop.probe_module(
                    model=make, inits="as-is", samples=a.samples, seed=seed, **zoo.inputs(name)
                )
                run = r.runs[0]
                kept += run.preserved
                agrees += run.agrees_with_theory
                checks = run.verdict_checks("preserved")
                for c in checks:
                    if not c.passed:
                        failed[c.name.split(" (")[0].split(",")[0]] += 1
                if seed == 0:
                    first = ", ".join(
                        f"{10**c.log10_measured:.3g}" for c in checks if c.log10_measured is not None
                    )
            why = "; ".join(f"{k} {v}" for k, v in failed.items()) or "—"
            print(
                f"| {name} | {group} | {kept} / {a.draws} | {agrees} / {a.draws} | {why} | {first} |",
                flush=True,
            )
    print(f"\n{time.perf_counter() - t0:.0f} s, torch {torch.__version__}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
