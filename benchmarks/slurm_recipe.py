"""docs/cluster.md's SLURM driver (python -m sigprop.examples.slurm_sweep) end to end on a fake queue
(benchmarks/fake_slurm.py: ``sbatch``, ``squeue``, ``scancel`` on PATH that start each job
``--delay`` seconds late and kill it at its walltime), with seconds for hours: workers that leave
at their ``--lifetime``, or jobs that expire mid-point (``--expire``), and the jobs
dask-jobqueue's ``adapt`` submits in their place.  Prints the jobs submitted, the points written
and whether the file equals the serial sweep's (each point once).  Not a test: on 2 cores a
generation of fake jobs spends most of its life starting (a worker process, torch), so a run
takes minutes.

    python benchmarks/slurm_recipe.py [--expire] [--lifetime 10s] [--walltime 00:01:00]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fake_slurm

from sigprop import api, specs

ROOT = Path(__file__).resolve().parents[1]
GRID = {"depth": list(range(200, 224)), "width": [256], "init": "proposed"}
PROBE = {"samples": 500, "device": "cpu"}


def rows(path: Path) -> dict[str, dict]:
    out = {}
    for text in path.read_text().splitlines():
        line = json.loads(text)
        if line.get("schema") == "sigprop.sweep.v1":
            key = json.dumps(line["config"], sort_keys=True)
            assert key not in out, "a point written twice"
            out[key] = {k: v for k, v in line.items() if k not in ("seconds", "environment")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--expire", action="store_true", help="jobs killed at a short walltime, mid-point")
    ap.add_argument("--lifetime", default=None)
    ap.add_argument("--walltime", default=None)
    ap.add_argument("--delay", default="2")
    a = ap.parse_args(argv)
    walltime = a.walltime or ("00:00:12" if a.expire else "00:01:00")
    lifetime = a.lifetime or ("10m" if a.expire else "10s")
    tmp = Path(tempfile.mkdtemp(prefix="sigprop-slurm-"))
    serial, out = tmp / "serial.jsonl", tmp / "r.jsonl"
    api.sweep("mlp", serial, probe_spec=specs.ProbeSpec(**PROBE, threads=1), **GRID)
    queue = tmp / "queue"
    env = {
        **os.environ,
        **fake_slurm.install(queue),
        "FAKE_SLURM_DELAY": a.delay,
        "SIGPROP_JOBS": "2",
        "SIGPROP_CPUS": "1",
        "SIGPROP_GPU": "0",
        "SIGPROP_MEMORY": "2GB",
        "SIGPROP_WALLTIME": walltime,
        "SIGPROP_LIFETIME": lifetime,
        "SIGPROP_STAGGER": "2s",
        "SIGPROP_VENV": sys.prefix,
        "SIGPROP_KIND": "mlp",
        "SIGPROP_GRID": json.dumps(GRID),
        "SIGPROP_PROBE": json.dumps(PROBE),
        "SIGPROP_OUT": str(out),
        "SIGPROP_WAIT": "120",
        "OMP_NUM_THREADS": "1",
    }
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "sigprop.examples.slurm_sweep"], env=env, cwd=tmp)
    finally:
        fake_slurm.kill_all(queue)
    got = rows(out) if out.exists() else {}
    same = got == rows(serial)
    print(
        f"walltime {walltime}, lifetime {lifetime}: rc {r.returncode}, {fake_slurm.jobs(queue)} jobs, "
        f"{len(got)} of {len(GRID['depth'])} points, equal to the serial sweep: {same}, "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return 0 if r.returncode == 0 and same else 1


if __name__ == "__main__":
    sys.exit(main())
