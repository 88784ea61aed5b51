"""Where the time of a default run goes: import, setup, compute, statistics + rendering.

Runs ``sigprop mlp`` / ``sigprop resnet`` with their defaults (or the given device) in this
process and prints wall times of: importing sigprop's core (torch included); setup (specs,
widths, memory estimate, up to the engine's ``on_start``); compute (the engine: every draw of
every init, until the arrays are on the host); statistics and theory (stats.py); rendering the
JSON.  On CUDA the compute phase ends with a device synchronisation.
Usage: python benchmarks/phases.py [--device cpu|cuda] [--repeat 1]  (1: the cold first call a CLI user sees)
"""

from __future__ import annotations

import sys
import time

t0 = time.perf_counter()
from sigprop import engine, inits, report, specs, stats  # noqa: E402  (torch is imported here)

T_IMPORT = time.perf_counter() - t0


def phases(kind: str, device: str) -> dict[str, float]:
    import torch

    marks = {"start": time.perf_counter()}
    if kind == "mlp":
        spec = MLPSpec(inits=("he", "proposed", "proposed-gaussian"))
    else:
        spec = ResNetSpec()
    probe = specs.ProbeSpec(device=device)
    run = engine.run_mlp if kind == "mlp" else engine.run_resnet
    out = run(spec, probe, on_start=lambda env: marks.setdefault("setup", time.perf_counter()))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    marks["compute"] = time.perf_counter()
    if kind == "mlp":
        widths, arrays, env = out
        runs = [walks.mlp_run(inits.get(n), widths, *arrays[n]) for n in spec.inits]
    else:
        plan, arrays, env = out
        runs = [
            stats.resnet_run(inits.get(n), plan, arrays[n], probe.samples, probe.dtype)
            for n in spec.resolved_inits()
        ]
    marks["stats"] = time.perf_counter()
    from sigprop.results import ProbeResult

    report.to_json(ProbeResult(command=kind, config={}, environment=env, runs=runs))
    marks["render"] = time.perf_counter()
    return {
        "setup": marks["setup"] - marks["start"],
        "compute": marks["compute"] - marks["setup"],
        "stats": marks["stats"] - marks["compute"],
        "render": marks["render"] - marks["stats"],
    }


def main() -> None:
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    print(f"import (sigprop core + torch): {T_IMPORT:.2f} s; device {device}; best of {repeat}")
    for kind in ("mlp", "resnet"):
        best = None
        for _ in range(repeat):
            p = phases(kind, device)
            best = p if best is None or sum(p.values()) < sum(best.values()) else best
        print(
            f"sigprop {kind:6s} defaults: "
            + ", ".join(f"{k} {v:.3f} s" for k, v in best.items())
            + f"  (total after import {sum(best.values()):.2f} s)"
        )


if __name__ == "__main__":
    main()
