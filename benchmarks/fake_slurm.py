"""A fake SLURM for benchmarks/slurm_recipe.py: ``sbatch``, ``squeue`` and ``scancel`` on PATH
that run each job script on this machine -- late (``FAKE_SLURM_DELAY`` seconds after its
submission, as a queue starts a job when it can) and for no longer than its ``#SBATCH -t``
(the job is killed at its walltime, as SLURM does).  Each job's state is a file in
``FAKE_SLURM_DIR``: its script, its process group, its log."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

SBATCH = r"""
import os, re, shutil, subprocess, sys, time
state = os.environ["FAKE_SLURM_DIR"]
script = sys.argv[-1]
text = open(script).read()
m = re.search(r"^#SBATCH (?:-t|--time)[ =](\d+):(\d+):(\d+)", text, re.M)
wall = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) if m else 3600
for job in range(1, 100000):  # the next free job id
    try:
        fd = os.open(os.path.join(state, f"{job}.id"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)
        break
    except FileExistsError:
        continue
mine = os.path.join(state, f"{job}.sh")
shutil.copy(script, mine)
delay = float(os.environ.get("FAKE_SLURM_DELAY", "0"))
log = open(os.path.join(state, f"{job}.log"), "w")
p = subprocess.Popen(
    ["bash", "-c", f"sleep {delay}; exec timeout -s TERM {wall} bash {mine}"],
    stdout=log, stderr=log, start_new_session=True,
    env={**os.environ, "SLURM_JOB_ID": str(job)},
)
open(os.path.join(state, f"{job}.pid"), "w").write(str(p.pid))
print(f"Submitted batch job {job}")
"""

SCANCEL = r"""
import os, signal, sys
state = os.environ["FAKE_SLURM_DIR"]
for job in sys.argv[1:]:
    try:
        pid = int(open(os.path.join(state, f"{job}.pid")).read())
        os.killpg(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
"""

SQUEUE = r"""
print("JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)")
"""


def install(root: Path) -> dict:
    """The fake commands in ``root/bin``, their state in ``root/state``; the environment that
    puts them first on PATH."""
    bin_, state = root / "bin", root / "state"
    bin_.mkdir(parents=True)
    state.mkdir()
    for name, body in (("sbatch", SBATCH), ("scancel", SCANCEL), ("squeue", SQUEUE)):
        path = bin_ / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return {"PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_DIR": str(state)}


def jobs(root: Path) -> int:
    """How many jobs were submitted."""
    return len(list((root / "state").glob("*.id")))


def kill_all(root: Path) -> None:
    import signal

    for pid_file in (root / "state").glob("*.pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
