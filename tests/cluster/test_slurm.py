"""docs/cluster.md's SLURM driver (examples/slurm_sweep.py) end to end on a fake queue
(benchmarks/fake_slurm.py: ``sbatch``/``squeue``/``scancel`` that start each job late and kill
it at its walltime), with seconds for hours.  One job at a time whose worker leaves at its
``--lifetime`` (its start and two points' time) before the twelve points ran: ``adapt`` submits the
next job, the sweep waits for it (saying so), and the file equals the serial sweep's, each point
once.  0.14.x's recipe (``scale(jobs=8)``, a 10 s wait for the first worker) stopped at the
first job's end.  The longer run with two jobs, 24 points and jobs that expire mid-point is
benchmarks/slurm_recipe.py."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sigprop import api, specs
from sigprop.sweeps import read_rows

ROOT = Path(__file__).resolve().parents[2]
GRID = {"depth": list(range(200, 212)), "width": [256], "init": "proposed"}
PROBE = {"samples": 500, "device": "cpu"}

pytest.importorskip("dask_jobqueue")


def _fake_slurm():
    spec = importlib.util.spec_from_file_location("fake_slurm", ROOT / "benchmarks" / "fake_slurm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _measured(path: Path) -> dict[str, dict]:
    rows = {}
    for line in read_rows(path):
        key = json.dumps(line["config"], sort_keys=True)
        assert key not in rows, f"a point written twice: {key}"
        rows[key] = {k: v for k, v in line.items() if k not in ("seconds", "environment")}
    return rows


def _lifetime(serial: Path) -> str:
    """A worker's --lifetime that ends its job mid-sweep on any machine: its start (a worker
    process loading Dask and sigprop's API, timed here) and two of the serial sweep's points, of
    the twelve: on any machine fewer than the twelve fit in one job, and at least one."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import distributed, sigprop.api"], check=True)
    start = time.perf_counter() - t0
    point = max(line["seconds"] for line in read_rows(serial))
    return f"{math.ceil(start + 2 * point + 1)}s"


def test_the_slurm_recipe_survives_a_worker_that_leaves(tmp_path):
    fake = _fake_slurm()
    serial, out, queue = tmp_path / "serial.jsonl", tmp_path / "r.jsonl", tmp_path / "queue"
    api.sweep("mlp", serial, probe_spec=specs.ProbeSpec(**PROBE, threads=1), **GRID)
    lifetime = _lifetime(serial)
    env = {
        **os.environ,
        **fake.install(queue),
        "FAKE_SLURM_DELAY": "2",  # a job starts 2 s after its submission
        "SIGPROP_JOBS": "1",
        "SIGPROP_CPUS": "1",
        "SIGPROP_GPU": "0",
        "SIGPROP_MEMORY": "2GB",
        "SIGPROP_WALLTIME": "00:02:00",
        "SIGPROP_LIFETIME": lifetime,  # shorter than the twelve points: the job ends mid-sweep
        "SIGPROP_STAGGER": "1s",
        "SIGPROP_VENV": sys.prefix,
        "SIGPROP_KIND": "mlp",
        "SIGPROP_GRID": json.dumps(GRID),
        "SIGPROP_PROBE": json.dumps(PROBE),
        "SIGPROP_OUT": str(out),
        "SIGPROP_WAIT": "120",
        "OMP_NUM_THREADS": "1",
    }
    try:
        r = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "slurm_sweep.py")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        fake.kill_all(queue)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert fake.jobs(queue) >= 2, (
        f"lifetime {lifetime}: {r.stdout}"
    )  # the first job's worker left; adapt submitted another
    assert "waiting for workers (0 of 1)" in r.stdout, r.stdout
    assert _measured(out) == _measured(serial)
