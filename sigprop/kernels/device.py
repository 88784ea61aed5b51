"""Where a run happens (torch): the device, its free memory and the refusal before allocating, the
dtype, the CPU threads and the matmul precision of one run."""

from __future__ import annotations

import os

import torch

from sigprop import environment, specs
from sigprop.errors import SigpropError

#: the dtypes a probe takes (``specs.DTYPES``, the one list) as torch's
DTYPES = {name: getattr(torch, name) for name in specs.DTYPES}


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU.  Unavailable devices raise SigpropError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SigpropError(f"{name} requested but CUDA is not available on this machine", field="device")
        idx = int(name.split(":")[1]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            raise SigpropError(
                f"{name} requested but only {torch.cuda.device_count()} CUDA device(s) exist", field="device"
            )
        return torch.device(f"cuda:{idx}")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def itemsize(dtype: str) -> int:
    return torch.finfo(DTYPES[dtype]).bits // 8


def available_bytes(device: torch.device) -> int:
    """Free memory on the device: cudaMemGetInfo for CUDA, MemAvailable for the host."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def check_memory(need: int, device: torch.device, fields: str, hint: str = "") -> None:
    """Refuse, before allocating, a run whose estimate exceeds 80% of the free memory."""
    have = available_bytes(device)
    if need > 0.8 * have:
        gib = 2**30
        names = [n.replace("_", " ") for n in fields.split("/")]  # block_depth -> block depth
        what = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise SigpropError(
            f"this run needs about {need / gib:.1f} GiB on {device} but {have / gib:.1f} GiB is free; "
            f"reduce {what}{hint}",
            field=fields,
        )


def fits(need: int, device: torch.device) -> bool:
    """``need`` within 80% of the free memory (the margin of ``check_memory``)."""
    return need <= 0.8 * available_bytes(device)


def use_graphs(graphs: bool | None, device: torch.device) -> bool:
    """``--graphs``: None means on with CUDA; on another device it is refused."""
    if graphs and device.type != "cuda":
        raise SigpropError(f"CUDA graphs need a CUDA device; the device is {device}", field="graphs")
    return device.type == "cuda" if graphs is None else graphs


class using_threads:
    """Context: torch's CPU threads for one run -- ``requested``, else the one default
    (``environment.probe_threads``) -- restored afterwards, so that a library call leaves the
    caller's setting as it found it."""

    def __init__(self, requested: int | None) -> None:
        self.threads, self.why = environment.probe_threads(requested)

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        return self

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.saved)


class matmul_precision:
    """Context: TF32 tensor-core matmuls for ``--precision tf32`` (CUDA, float32 only)."""

    def __init__(self, precision: str, device: torch.device) -> None:
        if precision == "tf32" and device.type != "cuda":
            raise SigpropError(f"tf32 is a CUDA tensor-core mode; the device is {device}", field="precision")
        self.tf32 = precision == "tf32"

    def __enter__(self):
        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        torch.backends.cudnn.allow_tf32 = self.tf32
        return self

    def __exit__(self, *exc) -> None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved
