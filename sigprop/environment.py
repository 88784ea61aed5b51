"""What a bug report needs: versions, platform, threads, devices (``sigprop env``).  Imports torch:
it reports on it.  Returns rows; the CLI renders them."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys

from sigprop import __version__


def _version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "not installed"


def gather() -> list[tuple[str, str]]:
    """(label, value) rows; an empty label marks a continuation line (one CUDA device)."""
    import torch

    rows = [
        ("sigprop", __version__),
        ("python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"),
        ("platform", platform.platform()),
        ("cpus", str(os.cpu_count())),
    ]
    rows += [(pkg, _version(pkg)) for pkg in ("torch", "numpy", "scipy", "typer", "rich", "matplotlib")]
    cuda = torch.cuda.is_available()
    rows += [
        ("torch threads", f"{torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} inter-op"),
        ("default dtype", f"{str(torch.get_default_dtype()).replace('torch.', '')} (sigprop probes in float32 unless --dtype)"),
        ("cuda", ("available" if cuda else "not available")
         + (f", {torch.cuda.device_count()} device(s), CUDA {torch.version.cuda}" if cuda else "")),
    ]
    if cuda:
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            rows.append(("", f"  cuda:{i}     {torch.cuda.get_device_name(i)}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} free)"))
    rows.append(("--device auto", "cuda" if cuda else "cpu"))
    rows += [(k, os.environ[k]) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NO_COLOR") if k in os.environ]
    return rows
