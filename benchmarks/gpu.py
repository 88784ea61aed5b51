"""Issue 16's GPU targets, measured in one process on one device (prints ratios; never asserts).

1. L = 10,000, n = 1024, N = 1000, float32, proposed: sigprop (CUDA graphs on, the default, and
   --no-graphs) against the floor (per-layer orgqr Haar + bare matmuls, benchmarks/floor.py) and
   the limit (Haar weights 32 layers at a time by the batched UT transform + bare matmuls, no
   bookkeeping: ``floor.limit``); peak memory against the stored weights + packed masks.
   Targets: <= 4 s, <= 1.3x limit, peak <= 1.15 (weights + masks) + 1 GiB.
2. L = 2000, n = 256 and 1024, N = 1000: sigprop against the naive autograd peer
   (benchmarks/peer.py on the same device): time <= 0.25x, peak memory <= 0.4x.
3. --seeds 16 against --seeds 1 at L = 100, n = 128, N = 256: <= 2x.
4. L = 10,000, n = 4096, N = 256 --stream: completes? time and peak memory; first, Haar matrices of
   that size by orgqr and by the batched UT transform the CUDA chunks use, per matrix.
5. the default ``sigprop mlp`` / ``sigprop resnet`` split into import, setup and compute
   (benchmarks/phases.py --device cuda --profile): compute < 0.1 s; then each under torch.profiler
   (top host ops, top kernels, launches, synchronisations and copies: where the time goes).
6. the memory estimate from the steps (``plans.memory`` plus the graph pools) against the
   device's peak, per net stored and streamed (benchmarks/memory.py --device cuda): estimate /
   peak >= 1 (it decides streaming and refuses what will not fit).
Usage: python benchmarks/gpu.py [--device cuda] [--quick] [--only 1,2,3,4,5,6] [--fuse] [--profile]
(--quick: small shapes, any device; --fuse: sigprop's probes with --fuse, issue 41: the layers'
bookkeeping compiled by torch.compile, its compile included in the first timed probe; --profile:
line 3's two probes under torch.profiler, benchmarks/phases.py's summary)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch

from sigprop import run, specs
from sigprop.kernels import sampling
from sigprop.kinds.mlp import MLPSpec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from floor import floor, limit  # noqa: E402
from peer import peer  # noqa: E402
from phases import profile_summary  # noqa: E402

GIB = 2**30
FUSE = "--fuse" in sys.argv


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak(device: str) -> float:
    return torch.cuda.max_memory_allocated() / GIB if device.startswith("cuda") else float("nan")


def probe(
    L: int, n: int, N: int, device: str, stream: bool | None, graphs: bool | None = None, seeds: int = 1
) -> tuple[float, dict]:
    spec = MLPSpec(depth=L, input_dim=n, width=specs.WidthSpec(n, n), inits=("proposed",))
    t0 = time.perf_counter()
    env = run.measure(
        spec, specs.ProbeSpec(samples=N, device=device, stream=stream, graphs=graphs, seeds=seeds, fuse=FUSE)
    ).environment
    sync(device)
    return time.perf_counter() - t0, env


def timed(device: str, fn, *args) -> tuple[float, float]:
    """(seconds, peak GiB) of one call."""
    peak_reset(device)
    t = fn(*args)
    sync(device)
    return (t[0] if isinstance(t, tuple) else t), peak(device)


def haar_costs(n: int, device: str, count: int) -> None:
    """Line 4's draws: ``count`` Haar matrices of n x n one orgqr each (``haar.orthogonalize``)
    against one batched UT transform (``haar.orthogonalize_batched``, what CUDA chunks use), per
    matrix.  The UT transform spends about 5 n^3 flops where orgqr spends 4/3 n^3, at GEMM speed:
    at n = 1024 it won by far (the orgqr panels' latency); which wins at 4096 is this line's
    question, and the streamed line's time is about 2 L times the faster (drawn forward, redrawn
    backward)."""
    from sigprop.kernels import haar

    g = torch.randn(count, n, n, device=device)
    for fn in (lambda: [haar.orthogonalize(m) for m in g], lambda: haar.orthogonalize_batched(g)):
        fn()  # warm-up: handles, workspaces
    times = []
    for fn in (lambda: [haar.orthogonalize(m) for m in g], lambda: haar.orthogonalize_batched(g)):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) / count)
    print(
        f"4. Haar n={n}, {count} matrices: orgqr {times[0] * 1e3:.1f} ms each, batched UT "
        f"{times[1] * 1e3:.1f} ms each (UT / orgqr {times[1] / times[0]:.2f}); "
        f"UT {5 * n**3 / times[1] / 1e12:.1f} TFLOP/s, orgqr {4 / 3 * n**3 / times[0] / 1e12:.1f} TFLOP/s",
        flush=True,
    )


def main() -> None:
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    quick = "--quick" in sys.argv
    only = (
        {int(x) for x in sys.argv[sys.argv.index("--only") + 1].split(",")}
        if "--only" in sys.argv
        else {1, 2, 3, 4, 5, 6}
    )
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(
        f"device {device} ({name}), torch {torch.__version__}, sigprop chunk {sampling.CHUNK_MAX}, batched "
        f"Haar {sampling.BATCHED_HAAR}",
        flush=True,
    )
    probe(10, 64, 16, device, None)  # warm-up: CUDA context, cuBLAS/cuSOLVER handles
    floor(3, 64, 16, 1, device)
    limit(3, 64, 16, device)
    if 1 in only:
        L, n, N = (200, 128, 100) if quick else (10_000, 1024, 1000)
        box: dict = {}  # the timed probe's own environment (its graphs' status)

        def main_probe() -> float:
            t, box["env"] = probe(L, n, N, device, None)
            return t

        t_s, p_s = timed(device, main_probe)
        env = box["env"]
        t_e, _ = (
            timed(device, lambda: probe(L, n, N, device, None, graphs=False))
            if device.startswith("cuda")
            else (float("nan"), 0)
        )
        t_f, p_f = timed(device, lambda: floor(L, n, N, 1, device))
        t_l, p_l = timed(device, lambda: limit(L, n, N, device))
        w = L * n * n * 4 / GIB
        masks = L * N * n / 8 / GIB
        print(
            f"1. L={L} n={n} N={N}: sigprop {t_s:.2f} s (graphs {env['graphs']}), --no-graphs {t_e:.2f} s, "
            f"floor {t_f:.2f} s, "
            f"limit {t_l:.2f} s: sigprop / limit {t_s / t_l:.2f} (target <= 1.3), sigprop / floor "
            f"{t_s / t_f:.2f}, "
            f"--no-graphs / limit {t_e / t_l:.2f}; peak {p_s:.2f} GiB vs weights {w:.2f} + masks {masks:.2f} "
            f"GiB: "
            f"{p_s / (w + masks):.3f}x (target <= 1.15x + 1 GiB = {1.15 * (w + masks) + 1:.2f} GiB); floor "
            f"peak {p_f:.2f}, limit peak {p_l:.2f} GiB",
            flush=True,
        )
    if 2 in only:
        for n in (64,) if quick else (256, 1024):
            L, N = (100, 100) if quick else (2000, 1000)
            t_s, p_s = timed(device, lambda: probe(L, n, N, device, None))
            t_p, p_p = timed(device, lambda: peer(L, n, N, device))
            print(
                f"2. L={L} n={n} N={N}: sigprop {t_s:.2f} s, {p_s:.2f} GiB; peer {t_p:.2f} s, {p_p:.2f} GiB: "
                f"time {t_s / t_p:.3f}x (target <= 0.25), memory {p_s / p_p:.3f}x (target <= 0.4)",
                flush=True,
            )
    if 3 in only:
        probe(100, 128, 256, device, None, seeds=16)  # warm-up of the 16-draw shapes
        t1 = min(timed(device, lambda: probe(100, 128, 256, device, None, seeds=1))[0] for _ in range(3))
        t16 = min(timed(device, lambda: probe(100, 128, 256, device, None, seeds=16))[0] for _ in range(3))
        print(
            f"3. L=100 n=128 N=256: --seeds 16 {t16:.3f} s vs --seeds 1 {t1:.3f} s: {t16 / t1:.2f}x (target "
            f"<= 2), best of 3",
            flush=True,
        )
        if "--profile" in sys.argv:  # where the 16 draws' time goes
            for seeds in (1, 16):
                print(f"--- line 3, --seeds {seeds}, under the profiler ---", flush=True)
                profile_summary(lambda: probe(100, 128, 256, device, None, seeds=seeds), device)
    if 4 in only:
        L, n, N = (100, 256, 64) if quick else (10_000, 4096, 256)
        haar_costs(n, device, 4 if quick else 8)
        try:
            t, p = timed(device, lambda: probe(L, n, N, device, True))
            print(f"4. L={L} n={n} N={N} --stream: completed in {t:.1f} s, peak {p:.2f} GiB", flush=True)
        except Exception as exc:  # report, do not hide
            print(f"4. L={L} n={n} N={N} --stream: FAILED: {type(exc).__name__}: {exc}", flush=True)
    if 5 in only:
        print("5. default runs, phases:", flush=True)
        out = subprocess.run(
            [sys.executable, str(HERE / "phases.py"), "--device", device, "--profile"],
            capture_output=True,
            text=True,
        )
        print(out.stdout.strip() or out.stderr.strip(), flush=True)
    if 6 in only:
        print("6. memory estimate against the device's peak:", flush=True)
        scale = ["--samples-scale", "0.25"] if quick else []
        out = subprocess.run(
            [sys.executable, str(HERE / "memory.py"), "--device", device, *scale],
            capture_output=True,
            text=True,
        )
        print(out.stdout.strip() or out.stderr.strip(), flush=True)


if __name__ == "__main__":
    main()
