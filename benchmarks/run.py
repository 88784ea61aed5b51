"""sigprop against the floor and the naive peer, measured in one run (STYLE.md habit 13).

Each case runs every program as its own process and records the whole-process wall time and
peak RSS (os.wait4's ru_maxrss), so import and setup count for everyone.  Prints one table of
times, memories and ratios; never asserts.  Usage: python benchmarks/run.py [--quick]
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable


def measure(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with {code}: {err.strip().splitlines()[-1:] }")
    return wall, usage.ru_maxrss / 1024.0


def sigprop_cmd(L: int, n: int, N: int, seeds: int = 1, *extra: str) -> list[str]:
    return [PY, "-m", "sigprop", "mlp", "--depth", str(L), "--width", str(n), "--input-dim", str(n),
            "--samples", str(N), "--seeds", str(seeds), "--init", "proposed", "--device", "cpu",
            "--format", "json", "--output", os.devnull, *extra]


def main() -> None:
    quick = "--quick" in sys.argv
    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, python {platform.python_version()}")
    rows = []
    L, n, N = (60, 256, 500) if quick else (300, 512, 1000)
    s = measure(sigprop_cmd(L, n, N))
    f = measure([PY, str(HERE / "floor.py"), str(L), str(n), str(N)])
    p = measure([PY, str(HERE / "peer.py"), str(L), str(n), str(N)])
    rows.append((f"L={L} n={n} N={N}", s, f, p, "time <= 1.3 floor, <= 0.6 peer; RSS <= 0.4 peer"))
    L2 = 400 if quick else 2000
    s2 = measure(sigprop_cmd(L2, 256, 1000))
    f2 = measure([PY, str(HERE / "floor.py"), str(L2), "256", "1000"])
    rows.append((f"L={L2} n=256 N=1000", s2, f2, None, "RSS <= 1 GB"))
    s3 = measure(sigprop_cmd(L2, 256, 1000, 1, "--stream"))
    rows.append((f"  same, --stream", s3, f2, None, "RSS <= 1 GB"))
    one = measure(sigprop_cmd(100, 128, 256, 1))
    many = measure(sigprop_cmd(100, 128, 256, 16))
    print()
    print(f"{'case':24s} {'sigprop s':>9s} {'MiB':>7s} {'floor s':>8s} {'MiB':>7s} {'peer s':>8s} {'MiB':>7s}  "
          f"{'t/floor':>7s} {'t/peer':>6s} {'rss/peer':>8s}  target")
    for name, s, f, p, target in rows:
        ps = f"{p[0]:8.2f} {p[1]:7.0f}" if p else f"{'—':>8s} {'—':>7s}"
        tp = f"{s[0] / p[0]:6.2f}" if p else f"{'—':>6s}"
        rp = f"{s[1] / p[1]:8.2f}" if p else f"{'—':>8s}"
        print(f"{name:24s} {s[0]:9.2f} {s[1]:7.0f} {f[0]:8.2f} {f[1]:7.0f} {ps}  {s[0] / f[0]:7.2f} {tp} {rp}  {target}")
    print(f"{'seeds 16 vs 1 (L=100 n=128 N=256)':24s} {many[0]:.2f}s vs {one[0]:.2f}s: ratio {many[0] / one[0]:.2f}  (target <= 4)")


if __name__ == "__main__":
    main()
