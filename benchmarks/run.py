"""sigprop against the floor and the naive peer, measured in one run (../shared/STYLE.md habit 13).

Each case runs every program as its own process and records the whole-process wall time and
peak RSS (os.wait4's ru_maxrss), so import and setup count for everyone.  Prints one table of
times, memories and ratios; never asserts.  Every program runs once per round, ``--repeat``
rounds (default 3) interleaved; the table gives median times and per-round ratios with their
spread.  Usage: python benchmarks/run.py [--quick] [--repeat 3]
"""

from __future__ import annotations

import os
import platform
import statistics
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
        raise SystemExit(f"{' '.join(cmd)} failed with {code}: {err.strip().splitlines()[-1:]}")
    return wall, usage.ru_maxrss / 1024.0


def sigprop_cmd(L: int, n: int, N: int, seeds: int = 1, *extra: str) -> list[str]:
    """sigprop on as many threads as torch gives the floor and the peer by default (sigprop's own
    default is half the cores since 0.4.0: the comparison is of the work, not of the threads)."""
    import torch

    return [
        PY,
        "-m",
        "sigprop",
        "mlp",
        "--depth",
        str(L),
        "--width",
        str(n),
        "--input-dim",
        str(n),
        "--samples",
        str(N),
        "--seeds",
        str(seeds),
        "--init",
        "proposed",
        "--device",
        "cpu",
        "--threads",
        str(torch.get_num_threads()),
        "--format",
        "json",
        "--output",
        os.devnull,
        *extra,
    ]


def main() -> None:
    quick = "--quick" in sys.argv
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
    import torch

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch "
        f"{torch.__version__}, "
        f"threads {torch.get_num_threads()}, python {platform.python_version()}; {repeat} interleaved rounds"
    )
    L, n, N = (60, 256, 500) if quick else (300, 512, 1000)
    L2 = 400 if quick else 2000
    programs = {
        "s1": sigprop_cmd(L, n, N),
        "f1": [PY, str(HERE / "floor.py"), str(L), str(n), str(N)],
        "p1": [PY, str(HERE / "peer.py"), str(L), str(n), str(N)],
        "s2": sigprop_cmd(L2, 256, 1000),
        "f2": [PY, str(HERE / "floor.py"), str(L2), "256", "1000"],
        "s3": sigprop_cmd(L2, 256, 1000, 1, "--stream"),
        "one": sigprop_cmd(100, 128, 256, 1),
        "many": sigprop_cmd(100, 128, 256, 16),
    }
    # every program once per round, rounds interleaved: the ratios of one round share the
    # machine's state (this VM's speed drifts by +-20% over minutes), so the ratios are taken
    # per round and their median is reported, with the spread over the rounds
    rounds = [{key: measure(cmd) for key, cmd in programs.items()} for _ in range(repeat)]
    med = lambda xs: statistics.median(xs)
    t = {k: med([r[k][0] for r in rounds]) for k in programs}
    m = {k: max(r[k][1] for r in rounds) for k in programs}
    ratio = lambda a, b: [r[a][0] / r[b][0] for r in rounds]
    spread = lambda xs: f"{med(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"
    print()
    print(
        "time: median over rounds (s); peak RSS: max over rounds (MiB); ratios: median [min-max] of "
        "per-round ratios"
    )
    print(
        f"{'case':20s} {'sigprop':>7s} {'MiB':>6s} {'floor':>6s} {'MiB':>6s} {'peer':>6s} {'MiB':>6s}  "
        f"{'t/floor':>16s} {'t/peer':>16s} {'rss/peer':>8s}  target"
    )
    rows = [
        (f"L={L} n={n} N={N}", "s1", "f1", "p1", "time <= 1.3 floor, <= 0.6 peer; RSS <= 0.4 peer"),
        (f"L={L2} n=256 N=1000", "s2", "f2", None, "RSS <= 1 GB"),
        ("  same, --stream", "s3", "f2", None, "RSS <= 1 GB"),
    ]
    for name, s, f, p, target in rows:
        ps = f"{t[p]:6.2f} {m[p]:6.0f}" if p else f"{'—':>6s} {'—':>6s}"
        tp = f"{spread(ratio(s, p)):>16s}" if p else f"{'—':>16s}"
        rp = f"{m[s] / m[p]:8.2f}" if p else f"{'—':>8s}"
        print(
            f"{name:20s} {t[s]:7.2f} {m[s]:6.0f} {t[f]:6.2f} {m[f]:6.0f} {ps}  {spread(ratio(s, f)):>16s} "
            f"{tp} {rp}  {target}"
        )
    print(
        f"seeds 16 vs 1 (L=100 n=128 N=256): {t['many']:.2f}s vs {t['one']:.2f}s, ratio "
        f"{spread(ratio('many', 'one'))}  (target <= 4)"
    )


if __name__ == "__main__":
    main()
