"""Where the time of a default run goes: import, setup, compute, statistics + rendering.

Runs ``sigprop mlp`` / ``sigprop resnet`` with their defaults (or the given device) in this
process and prints wall times of: importing sigprop's core (torch included); setup (specs,
widths, memory estimate, up to the driver's ``on_start``); compute (sigprop/run.py's walks: every
draw of every init, until the arrays are on the host); statistics and theory (the engine's
``assemble`` of each init's record); rendering the JSON.  On CUDA the compute phase ends with a
device synchronisation.
Usage: python benchmarks/phases.py [--device cpu|cuda] [--repeat 1] [--profile]  (1: the cold first
call a CLI user sees; --profile: after the timed calls, one more call of each under torch.profiler,
printing the compute phase's top host ops and device kernels, and the counts of kernel launches,
synchronisations and host<->device copies -- where a GPU's short run spends its time, issue 41)
"""

from __future__ import annotations

import sys
import time

t0 = time.perf_counter()
from sigprop import engines, report, run, specs  # noqa: E402  (torch is imported here)
from sigprop.kinds.mlp import MLPSpec  # noqa: E402
from sigprop.kinds.resnet import ResNetSpec  # noqa: E402
from sigprop.results import ProbeResult  # noqa: E402

T_IMPORT = time.perf_counter() - t0


def phases(kind: str, device: str) -> dict[str, float]:
    import torch

    marks = {"start": time.perf_counter()}
    if kind == "mlp":
        spec = MLPSpec(inits=("he", "proposed", "proposed-gaussian"))
    else:
        spec = ResNetSpec()
    probe = specs.ProbeSpec(device=device)
    m = run.measure(spec, probe, on_start=lambda env: marks.setdefault("setup", time.perf_counter()))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    marks["compute"] = time.perf_counter()
    gate = specs.GateSpec()
    engine = engines.of(m.kind)
    runs = [
        engine.assemble(m.kind, n, s, spec, m.plan, m.arrays[n], probe, gate)
        for n, s in zip(m.names, m.schemes)
    ]
    marks["stats"] = time.perf_counter()
    report.to_json(ProbeResult(command=kind, config={}, environment=m.environment, runs=runs))
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
    if "--profile" in sys.argv:
        for kind in ("mlp", "resnet"):
            profiled(kind, device)


def profiled(kind: str, device: str) -> None:
    """One more default call under torch.profiler, summarised by ``summary``."""
    print(f"--- sigprop {kind} under the profiler ---")
    profile_summary(lambda: phases(kind, device), device)


def profile_summary(fn, device: str) -> None:
    """``fn()`` under torch.profiler: the top 12 ops by host time (self), the top 12 device
    kernels, and the runtime calls that stall a short run (launches, synchronisations, copies,
    graph launches, allocations)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    try:
        with profile(activities=acts) as prof:
            fn()
        table = prof.key_averages()
    except Exception as exc:  # a profiler that cannot start (no CUPTI) must not cost the timed lines
        print(f"profile failed: {type(exc).__name__}: {exc}", flush=True)
        return
    print(table.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=48))
    if device.startswith("cuda"):
        print(table.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=48))
    stalls = (
        "cudaLaunchKernel",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaMemcpyAsync",
        "cudaGraphLaunch",
        "cudaGraphInstantiate",
        "cudaMalloc",
        "cudaMemGetInfo",
    )
    counts = {e.key: (e.count, e.self_cpu_time_total / 1e3) for e in table if e.key in stalls}
    ops = sum(e.count for e in table if e.key.startswith("aten::"))
    print(f"aten ops {ops}; " + "; ".join(f"{k} {n} ({ms:.1f} ms)" for k, (n, ms) in sorted(counts.items())))


if __name__ == "__main__":
    main()
