"""What a bug report needs: versions, platform, threads, devices (``sigprop env``; ``gather``
imports torch: it reports on it; returns rows, the CLI renders them) -- and the one default of
the CPU threads a run uses (``probe_threads``), which the API, the CLI and ``sigprop env`` all
read."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys

import torch

from sigprop import specs
from sigprop.version import __version__


def default_threads() -> int:
    """Half the cores this process may run on (at least 1).  Measured on a 2-core x86-64 AMD
    EPYC (docs/cli.md): unloaded, 1 vs 2 threads cost 3.3 vs 3.7 s (mlp defaults) and 5.1 vs
    4.4 s (resnet --blocks 40); with another process busy, 2 threads took 45.6 s against 6.2 s
    for one -- oversubscription costs far more than an idle core."""
    return max(1, specs.available_cores() // 2)


def probe_threads(requested: int | None = None) -> tuple[int, str]:
    """The CPU threads a run uses and why: ``requested`` (``--threads``, ``threads=``), else
    OMP_NUM_THREADS where it is set to a positive integer, else ``default_threads()``."""
    if requested is not None:
        return int(requested), "--threads"
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp), "OMP_NUM_THREADS"
    return default_threads(), "half the cores this process may run on"


def _version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "not installed"


def gather() -> list[tuple[str, str]]:
    """(label, value) rows; an empty label marks a continuation line (one CUDA device)."""
    rows = [
        ("sigprop", __version__),
        ("python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"),
        ("platform", platform.platform()),
        ("cpus", str(os.cpu_count())),
    ]
    rows += [(pkg, _version(pkg)) for pkg in ("torch", "numpy", "scipy", "typer", "rich", "matplotlib")]
    cuda = torch.cuda.is_available()
    rows += [
        (
            "run threads",
            "{} (what mlp/resnet/cnn/wrn/hessian and sigprop.probe_* use unless --threads: {})".format(
                *probe_threads()
            ),
        ),
        (
            "torch threads",
            f"{torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} inter-op (torch's own "
            f"default, "
            "before a run sets its own)",
        ),
        (
            "default dtype",
            f"{str(torch.get_default_dtype()).replace('torch.', '')} (sigprop probes in float32 unless "
            f"--dtype)",
        ),
        (
            "cuda",
            ("available" if cuda else "not available")
            + (f", {torch.cuda.device_count()} device(s), CUDA {torch.version.cuda}" if cuda else ""),
        ),
    ]
    if cuda:
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            rows.append(
                (
                    "",
                    f"  cuda:{i}     {torch.cuda.get_device_name(i)}, {total / 2**30:.1f} GiB "
                    f"({free / 2**30:.1f} free)",
                )
            )
    rows.append(("--device auto", "cuda" if cuda else "cpu"))
    rows += [
        (k, os.environ[k])
        for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NO_COLOR")
        if k in os.environ
    ]
    return rows
