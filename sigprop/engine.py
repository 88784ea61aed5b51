"""The probe engine (torch): hand-written forward and backward through the synthetic nets.

No autograd graph is built.  The forward pass keeps each sample's activation renormalised to
unit norm and accumulates the log of the norm it removed, so ratios stay representable at any
depth (an init that vanishes over 3000 layers reports ln-ratios of -1000, never 0 or nan).  The
backward pass (vector-Jacobian product, 001 eq. 4-5) needs only the weights and the ReLU masks
of the forward pass, stored as ``torch.bool`` (one byte per unit); it is linear in the error
vector, so it is renormalised the same way.  Weight normalisation is a per-row scale of the
matmul output (``LayerParams.scale``), never a materialised g v/||v||.

The engine is checked against torch.autograd on small nets (tests/test_engine.py).
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np
import torch

from sigprop import inits as inits_mod
from sigprop import specs
from sigprop.errors import SigpropError
from sigprop.inits import InitScheme, LayerParams, LayerRole

DTYPES = {"float32": torch.float32, "float64": torch.float64}
ProgressFn = Callable[[int, int], None]


# --------------------------------------------------------------------------------------------
# device, memory
# --------------------------------------------------------------------------------------------
def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU.  Unavailable devices raise SigpropError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SigpropError(f"{name} requested but CUDA is not available on this machine", option="--device")
        idx = int(name.split(":")[1]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            raise SigpropError(f"{name} requested but only {torch.cuda.device_count()} CUDA device(s) exist", option="--device")
        return torch.device(f"cuda:{idx}")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


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


def estimate_mlp_bytes(widths: list[int], samples: int, itemsize: int) -> int:
    """Peak memory of one draw: stored weights (+1 temporary for QR), bool masks, a few
    activation buffers, and the float64 log-norm buffers."""
    weights = sum(widths[i] * widths[i - 1] for i in range(1, len(widths))) * itemsize
    qr_tmp = 3 * max(widths[i] * widths[i - 1] for i in range(1, len(widths))) * itemsize
    masks = samples * sum(widths[1:])
    acts = 6 * samples * max(widths) * itemsize
    logs = 4 * len(widths) * samples * 8
    return weights + qr_tmp + masks + acts + logs


def check_memory(need: int, device: torch.device) -> None:
    have = available_bytes(device)
    if need > 0.8 * have:
        gib = 2**30
        raise SigpropError(
            f"this run needs about {need / gib:.1f} GiB on {device} but {have / gib:.1f} GiB is free; "
            "reduce --samples, --depth or --width",
            option="--depth/--width/--samples",
        )


# --------------------------------------------------------------------------------------------
# the MLP
# --------------------------------------------------------------------------------------------
def layer_generator(seed: int, draw: int, layer: int, device: torch.device) -> torch.Generator:
    """The generator of one layer's weights: the same for every init (common random numbers)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(specs.derive_seed(seed, specs.STREAM_WEIGHTS, draw, layer))
    return gen


def probe_inputs(seed: int, samples: int, input_dim: int, output_dim: int, device, dtype):
    """x ~ N(0, I_{n_0}) and e ~ N(0, I_{n_L}), shared by every init and draw of a run."""
    gx = torch.Generator(device=device)
    gx.manual_seed(specs.derive_seed(seed, specs.STREAM_INPUTS))
    ge = torch.Generator(device=device)
    ge.manual_seed(specs.derive_seed(seed, specs.STREAM_ERRORS))
    x = torch.randn(samples, input_dim, generator=gx, device=device, dtype=dtype)
    e = torch.randn(samples, output_dim, generator=ge, device=device, dtype=dtype)
    return x, e


def _normalize(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row unit normalisation: returns (y / ||y||, ln ||y|| in float64); zero rows stay zero
    with ln-norm -inf."""
    norm = torch.linalg.vector_norm(y, dim=1)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    return y / safe.unsqueeze(1), torch.log(norm.to(torch.float64))


def mlp_forward_backward(
    scheme: InitScheme,
    widths: list[int],
    x: torch.Tensor,
    e: torch.Tensor,
    seed: int,
    draw: int,
    progress: Callable[[], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[LayerParams]]:
    """One draw of one init: returns (ln forward ratios [L, N], ln backward ratios [L, N], params).

    Forward, with h^{l-1} = exp(c) * u (u unit rows, c = ln-norm in float64):
        t = u @ v^T;  a = exp(c) * scale * t + b.
    Splitting m = max(c, 0): a = exp(m) * (exp(c - m) * scale * t + exp(-m) * b), and ReLU is
    positively homogeneous, so h^l = exp(m) * ReLU(a') with both exponents <= 0: nothing
    overflows, and a vanishing signal beside a bias correctly reads as a ~= b.
    Backward (001 eq. 5): delta^{l-1} = 1(a^{l-1} > 0) * (v^l^T (scale^l * delta^l)).
    """
    device, dtype = x.device, x.dtype
    L = len(widths) - 1
    n = x.shape[0]
    ln_fwd = torch.empty(L, n, dtype=torch.float64, device=device)
    ln_bwd = torch.empty(L, n, dtype=torch.float64, device=device)
    u, c = _normalize(x)
    c0 = c.clone()
    params: list[LayerParams] = []
    masks: list[torch.Tensor] = []
    for l in range(1, L + 1):
        role = LayerRole(fan_in=widths[l - 1], fan_out=widths[l])
        p = scheme.sample(role, layer_generator(seed, draw, l, device), device, dtype)
        t = u @ p.v.T
        if scheme.calibrate is not None:
            vnorm = torch.linalg.vector_norm(p.v, dim=1)
            t_true = torch.exp(c).to(dtype).unsqueeze(1) * t / vnorm
            p = scheme.calibrate(p, t_true)
        a = t * p.scale
        if p.bias is not None:
            m = torch.clamp(c, min=0.0)
            a = torch.exp(c - m).to(dtype).unsqueeze(1) * a + torch.exp(-m).to(dtype).unsqueeze(1) * p.bias
        else:
            m = c
        mask = a > 0
        u, ln_norm = _normalize(torch.relu(a))
        c = m + ln_norm
        ln_fwd[l - 1] = c - c0
        params.append(p)
        masks.append(mask)
        if progress is not None:
            progress()
    d, dlast = _normalize(e)
    acc = torch.zeros_like(dlast)
    ln_bwd[L - 1] = acc
    for l in range(L, 1, -1):
        p = params[l - 1]
        y = (d * p.scale) @ p.v
        y = y * masks[l - 2]
        d, ln_norm = _normalize(y)
        acc = acc + ln_norm
        ln_bwd[l - 2] = acc
        if progress is not None:
            progress()
    return ln_fwd, ln_bwd, params


def run_mlp(
    spec: specs.MLPSpec,
    probe: specs.ProbeSpec,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
) -> tuple[list[int], dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    """Probe every init of ``spec``: returns widths, {init: (ln_fwd [S, L, N], ln_bwd [S, L, N])}
    as float64 numpy arrays, and the environment record (device, dtype, torch version).
    ``on_start(env)`` is called once every input has been validated, before any allocation."""
    device = resolve_device(probe.device)
    dtype = DTYPES[probe.dtype]
    itemsize = torch.finfo(dtype).bits // 8
    # upper bound from the widest possible layers, before anything is drawn or allocated
    widest = [spec.input_dim] + [spec.width.hi] * min(spec.depth, 2)
    bound = estimate_mlp_bytes(widest, probe.samples, itemsize)
    bound += (spec.depth - 1) * (spec.width.hi**2 * itemsize + probe.samples * spec.width.hi + 4 * probe.samples * 8)
    check_memory(bound, device)
    widths = spec.widths(probe.seed)
    for name in spec.inits:
        if inits_mod.get(name).calibrate is not None and probe.samples < 2:
            raise SigpropError(f"init {name!r} standardises over the probe batch and needs >= 2 samples", option="--samples")
    check_memory(estimate_mlp_bytes(widths, probe.samples, itemsize), device)
    env = {
        "torch": torch.__version__,
        "device": str(device),
        "device_name": device_name(device),
        "dtype": probe.dtype,
        "threads": torch.get_num_threads(),
    }
    if on_start is not None:
        on_start(env)

    x, e = probe_inputs(probe.seed, probe.samples, widths[0], widths[-1], device, dtype)
    total = len(spec.inits) * probe.seeds * 2 * spec.depth
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    with torch.no_grad():
        for name in spec.inits:
            scheme = inits_mod.get(name)
            fwd_all, bwd_all = [], []
            for draw in range(probe.seeds):
                f, b, _ = mlp_forward_backward(scheme, widths, x, e, probe.seed, draw, tick)
                fwd_all.append(f.cpu().numpy())
                bwd_all.append(b.cpu().numpy())
            out[name] = (np.stack(fwd_all), np.stack(bwd_all))
            for arr in out[name]:
                if np.isnan(arr).any() or np.isposinf(arr).any():
                    raise SigpropError(f"internal error: init {name!r} produced a non-finite log ratio")
    return widths, out, env
