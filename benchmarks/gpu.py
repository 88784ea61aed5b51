"""Issue 4's GPU targets, measured in one process on one device (prints; never asserts).

1. L = 10,000, n = 1024, N = 1000, float32: sigprop's engine (proposed, stored weights when they
   fit, else streamed), with CUDA graphs (the default) and with --no-graphs, against the floor
   (benchmarks/floor.py) on the same shapes and device;
2. L = 10,000, n = 4096, N = 256, ``--stream``: completes? time and peak device memory;
3. the default ``sigprop mlp`` / ``sigprop resnet`` split into import, setup and compute
   (benchmarks/phases.py --device cuda).
Usage: python benchmarks/gpu.py [--device cuda] [--quick]   (--quick: small shapes, any device)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch

from sigprop import engine, specs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from floor import floor  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak(device: str) -> str:
    return f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device.startswith("cuda") else "n/a (cpu)"


def probe(L: int, n: int, N: int, device: str, stream: bool | None, graphs: bool | None = None) -> tuple[float, dict]:
    spec = specs.MLPSpec(depth=L, input_dim=n, width=specs.WidthSpec(n, n), inits=("proposed",))
    t0 = time.perf_counter()
    _, _, env = engine.run_mlp(spec, specs.ProbeSpec(samples=N, device=device, stream=stream, graphs=graphs))
    sync(device)
    return time.perf_counter() - t0, env


def main() -> None:
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    quick = "--quick" in sys.argv
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"device {device} ({name}), torch {torch.__version__}")
    L1, n1, N1 = (200, 128, 100) if quick else (10_000, 1024, 1000)
    probe(10, n1, N1, device, None)  # warm-up: CUDA context, cuBLAS/cuSOLVER handles
    floor(10, n1, N1, 1, device)
    peak_reset(device)
    t_s, env = probe(L1, n1, N1, device, None)
    p_s = peak(device)
    peak_reset(device)
    t_e, _ = probe(L1, n1, N1, device, None, graphs=False) if device.startswith("cuda") else (t_s, None)
    peak_reset(device)
    t_f = floor(L1, n1, N1, 1, device)
    p_f = peak(device)
    print(f"1. L={L1} n={n1} N={N1}: sigprop {t_s:.2f} s (peak {p_s}, stream {env['stream']}, graphs {env['graphs']}), "
          f"--no-graphs {t_e:.2f} s, floor {t_f:.2f} s (peak {p_f}): ratio {t_s / t_f:.2f} (target <= 1.5), "
          f"--no-graphs {t_e / t_f:.2f}")
    L2, n2, N2 = (100, 256, 64) if quick else (10_000, 4096, 256)
    peak_reset(device)
    try:
        t2, env2 = probe(L2, n2, N2, device, True)
        print(f"2. L={L2} n={n2} N={N2} --stream: completed in {t2:.1f} s, peak {peak(device)}")
    except Exception as exc:  # report, do not hide
        print(f"2. L={L2} n={n2} N={N2} --stream: FAILED: {type(exc).__name__}: {exc}")
    print("3. default runs, phases:")
    out = subprocess.run([sys.executable, str(HERE / "phases.py"), "--device", device], capture_output=True, text=True)
    print(out.stdout.strip() or out.stderr.strip())


if __name__ == "__main__":
    main()
