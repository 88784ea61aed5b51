"""The SLURM driver of docs/cluster.md, ``python -m sigprop.examples.slurm_sweep`` (shipped in the
package: pip installs it): dask-jobqueue submits the workers as jobs and the sweep sends them
points; this process is the client and the one writer (run it on a login node, or in a small
long job of its own).  ``pip install 'sigprop[cluster]'`` in the environment every job activates
(``SIGPROP_VENV``): the jobs run that environment's ``python``, not this driver's.

A queue starts jobs late and ends them at their walltime, and dask-jobqueue does not resubmit a
job that ended: ``adapt`` keeps JOBS jobs, submitting a new one for each that ends, and each
worker leaves by itself before its job's walltime (``--lifetime``, staggered so that they do not
all leave at once), its point then finishing on another.  The sweep waits up to WAIT seconds for
its JOBS workers (the queue's delay), saying how many have joined, then runs on those there.
The scheduler listens on ``SIGPROP_INTERFACE`` where set (a cluster's fast network, ib0), else
on the host's own address; its dashboard on a free port (``SIGPROP_DASHBOARD``: a fixed one, as
":8787"), so a busy 8787 does not print Dask's warning.
Every number below is the environment's ``SIGPROP_*`` where set:
benchmarks/slurm_recipe.py runs this file on a fake queue, with seconds for hours.
"""

import json
import os
import sys

from dask_jobqueue import SLURMCluster

import sigprop

env = os.environ.get
JOBS = int(env("SIGPROP_JOBS", "8"))  # workers at a time, one job each
CPUS = int(env("SIGPROP_CPUS", "8"))  # a job's cores: the torch threads of its point
GPU = env("SIGPROP_GPU", "1") == "1"  # one GPU a job, one point per GPU
WALLTIME = env("SIGPROP_WALLTIME", "04:00:00")
LIFETIME, STAGGER = env("SIGPROP_LIFETIME", "3h45m"), env("SIGPROP_STAGGER", "10m")
# the net and its grid, named by the job as on a command line (docs/cluster.md's job script:
# SIGPROP_KIND=wrn SIGPROP_GRID='{"blocks": "16,40,100", "init": "proposed,pytorch,he"}')
KIND = env("SIGPROP_KIND")
GRID = json.loads(env("SIGPROP_GRID", "{}"))
PROBE = json.loads(env("SIGPROP_PROBE", '{"samples": 100, "seeds": 3, "device": "cuda"}'))

VENV = env("SIGPROP_VENV", os.path.expanduser("~/venvs/sigprop"))
INTERFACE = env("SIGPROP_INTERFACE")  # the scheduler's and the workers' network interface, if set


def main() -> None:
    if not KIND:
        sys.exit(
            "sigprop.examples.slurm_sweep: set SIGPROP_KIND (the net: sigprop sweep --help lists them) and "
            "SIGPROP_GRID (its grid, as JSON)"
        )
    cluster = _cluster()
    cluster.adapt(minimum_jobs=JOBS, maximum_jobs=JOBS)  # a job that ends is replaced
    try:
        sigprop.sweep(
            KIND,
            env("SIGPROP_OUT", f"{KIND}.jsonl"),  # written here, by this driver only
            probe_spec=sigprop.specs.ProbeSpec(**{"threads": CPUS, **PROBE}),
            executor="dask",
            scheduler=cluster.scheduler_address,
            resources={"GPU": 1} if GPU else None,
            worker_wait=float(env("SIGPROP_WAIT", "3600")),  # the queue's delay for a job
            wait_workers=JOBS,  # the points go out once the JOBS workers are there (or WAIT is over)
            on_note=lambda text: print(f"sigprop: {text}", flush=True),  # "waiting for workers (k of N)"
            on_point=lambda i, n, point, line: print(f"[{i}/{n}] {point.label()}", flush=True),
            **GRID,
        )
    finally:
        cluster.close()


def _cluster() -> SLURMCluster:
    return SLURMCluster(
        queue=env("SIGPROP_QUEUE", "gpu"),
        cores=1,  # one Dask thread: one point at a time per worker
        processes=1,
        job_cpu=CPUS,  # --cpus-per-task, once
        memory=env("SIGPROP_MEMORY", "32GB"),
        walltime=WALLTIME,
        job_extra_directives=["--gres=gpu:1"] if GPU else [],
        worker_extra_args=[
            *(["--resources", "GPU=1"] if GPU else []),
            *("--lifetime", LIFETIME, "--lifetime-stagger", STAGGER),  # leave before the walltime
        ],
        # the job's python is the one its prologue's environment puts first (dask-jobqueue's default
        # is this driver's sys.executable, which would ignore the activate below)
        python=env("SIGPROP_PYTHON", "python"),
        interface=INTERFACE,
        scheduler_options={
            "dashboard_address": env("SIGPROP_DASHBOARD", ":0"),
            **({"interface": INTERFACE} if INTERFACE else {}),
        },
        job_script_prologue=[
            f"source {VENV}/bin/activate",
            # the nanny's environment for its worker: glibc's own trim threshold (Dask's 65536 slows
            # a point up to 1.6x), and one OpenMP thread -- a point sets its torch threads itself
            "export DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON="
            "\"{'MALLOC_TRIM_THRESHOLD_': None, 'OMP_NUM_THREADS': 1}\"",
        ],
    )


if __name__ == "__main__":
    main()
