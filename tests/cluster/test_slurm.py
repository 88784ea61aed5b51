"""docs/cluster.md's SLURM driver (python -m sigprop.examples.slurm_sweep) end to end on a fake queue
(benchmarks/fake_slurm.py: ``sbatch``/``squeue``/``scancel`` that start each job late and kill
it at its walltime).  One job at a time; the first job ends (killed, as a walltime or a
preemption ends it) once its worker has written a point: ``adapt`` submits the next job, the
sweep waits for it (saying so) and the file equals the serial sweep's, each point once.  0.14.x's
recipe (``scale(jobs=8)``, a 10 s wait for the first worker) stopped at the first job's end.
The job is ended by the test, not by a lifetime, so that no timing of the machine decides
whether it ends mid-sweep; the longer run with two jobs, 24 points, workers that leave at their
``--lifetime`` and jobs that expire mid-point is benchmarks/slurm_recipe.py."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sigprop import api, specs
from sigprop.sweeps import read_rows

ROOT = Path(__file__).resolve().parents[2]
GRID = {"depth": [200, 201, 202, 203, 204, 205], "width": [256], "init": "proposed"}
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


def _points(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_the_slurm_recipe_survives_a_job_that_ends(tmp_path):
    fake = _fake_slurm()
    serial, out, queue = tmp_path / "serial.jsonl", tmp_path / "r.jsonl", tmp_path / "queue"
    api.sweep("mlp", serial, probe_spec=specs.ProbeSpec(**PROBE, threads=1), **GRID)
    env = {
        **os.environ,
        **fake.install(queue),
        "FAKE_SLURM_DELAY": "3",  # a job starts 3 s after its submission: longer than the 2 s
        # the sweep waits quietly, so that it says it waits, at the start and once the job ended
        "SIGPROP_JOBS": "1",
        "SIGPROP_CPUS": "1",
        "SIGPROP_GPU": "0",
        "SIGPROP_MEMORY": "2GB",
        "SIGPROP_WALLTIME": "00:10:00",
        "SIGPROP_LIFETIME": "9m",
        "SIGPROP_STAGGER": "1s",
        "SIGPROP_VENV": sys.prefix,
        "SIGPROP_KIND": "mlp",
        "SIGPROP_GRID": json.dumps(GRID),
        "SIGPROP_PROBE": json.dumps(PROBE),
        "SIGPROP_OUT": str(out),
        "SIGPROP_WAIT": "300",
        "OMP_NUM_THREADS": "1",
    }
    driver = subprocess.Popen(
        [sys.executable, "-m", "sigprop.examples.slurm_sweep"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while _points(out) < 1 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _points(out) >= 1, "no point written by the first job"
        os.killpg(int((queue / "state" / "1.pid").read_text()), signal.SIGTERM)  # its walltime
        said, _ = driver.communicate(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if driver.poll() is None:
            driver.kill()
        fake.kill_all(queue)
    assert driver.returncode == 0, said[-3000:]
    assert fake.jobs(queue) >= 2, said  # the first job ended; adapt submitted another
    assert "waiting for workers (0 of 1)" in said, said  # the queue's first job, late
    assert "no worker at tcp://" in said, said  # the first job gone, the next not yet there
    assert _measured(out) == _measured(serial)


def test_the_job_runs_the_workers_environment_and_the_scheduler_is_quiet(monkeypatch, tmp_path):
    """Issue 66, item 5: the job script ran the driver's Python (the prologue's activate ignored),
    the scheduler bound the host's interface with no setting and printed Dask's port-8787
    warning: the job's ``python`` is its environment's, the interface SIGPROP_INTERFACE where set,
    the dashboard on a free port; the driver ships with the package."""
    import importlib
    import warnings

    monkeypatch.setenv("SIGPROP_VENV", "/opt/venvs/workers")
    monkeypatch.setenv("SIGPROP_GPU", "0")
    monkeypatch.setenv("SIGPROP_JOBS", "1")
    from sigprop.examples import slurm_sweep

    slurm_sweep = importlib.reload(slurm_sweep)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cluster = slurm_sweep._cluster()
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "source /opt/venvs/workers/bin/activate" in script
    run = next(line for line in script.splitlines() if "distributed.cli.dask_worker" in line)
    assert run.split()[0] == "python", run  # not this driver's sys.executable
    assert not any("8787" in str(w.message) for w in caught)
