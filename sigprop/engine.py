"""The probe engine (torch): hand-written forward and backward through the synthetic nets.

No autograd graph is built.  The forward pass keeps each sample's activation renormalised to
unit norm and accumulates the log of the norm it removed, so ratios stay representable at any
depth (an init that vanishes over 3000 layers reports ln-ratios of -1000, never 0 or nan).  The
backward pass (vector-Jacobian product, 001 eq. 4-5) needs only the weights and the ReLU masks
of the forward pass, stored bit-packed (``pack_mask``: eight units per byte); it is linear in the error
vector, so it is renormalised the same way.  Weight normalisation is a per-row scale of the
matmul output (``LayerParams.scale``), never a materialised g v/||v||.

The engine is checked against torch.autograd on small nets (tests/test_engine.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from sigprop import inits as inits_mod
from sigprop import nets, specs, theory
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
    """Peak memory of one draw: stored weights (+1 temporary for QR), bit-packed masks, a few
    activation buffers, and the float64 log-norm buffers."""
    weights = sum(widths[i] * widths[i - 1] for i in range(1, len(widths))) * itemsize
    qr_tmp = 3 * max(widths[i] * widths[i - 1] for i in range(1, len(widths))) * itemsize
    masks = samples * sum((w + 7) // 8 for w in widths[1:])  # bit-packed
    acts = 6 * samples * max(widths) * itemsize
    logs = 4 * len(widths) * samples * 8
    return weights + qr_tmp + masks + acts + logs


def check_memory(need: int, device: torch.device, options: str = "--depth/--width/--samples") -> None:
    have = available_bytes(device)
    if need > 0.8 * have:
        gib = 2**30
        names = options.split("/")
        raise SigpropError(
            f"this run needs about {need / gib:.1f} GiB on {device} but {have / gib:.1f} GiB is free; "
            f"reduce {', '.join(names[:-1])} or {names[-1]}",
            option=options,
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


_BITS = None


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Bit-pack a bool mask [N, n] into uint8 [N, ceil(n/8)]: 8 ReLU units per byte."""
    global _BITS
    n = mask.shape[1]
    pad = (-n) % 8
    if pad:
        mask = torch.nn.functional.pad(mask, (0, pad))
    if _BITS is None or _BITS.device != mask.device:
        _BITS = (2 ** torch.arange(8, dtype=torch.uint8, device=mask.device))
    return (mask.view(mask.shape[0], -1, 8).to(torch.uint8) * _BITS).sum(dim=2, dtype=torch.uint8)


def unpack_mask(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_mask`: the bool mask [N, n]."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(2) >> shifts) & 1
    return bits.view(packed.shape[0], -1)[:, :n].bool()


def _normalize(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row unit normalisation: returns (y / ||y||, ln ||y|| in float64); zero rows stay zero
    with ln-norm -inf."""
    norm = torch.linalg.vector_norm(y, dim=1)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    return y / safe.unsqueeze(1), torch.log(norm.to(torch.float64))


def _linear(
    p: LayerParams, u: torch.Tensor, c: torch.Tensor, relu: bool, calibrate=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, LayerParams]:
    """One layer in log space: input h = exp(c) * u (unit rows u, ln-norms c in float64), output
    (u', c', ReLU mask or None, params -- calibrated for a data-dependent scheme).

    t = u @ v^T;  a = exp(c) * scale * t + b.  Splitting m = max(c, 0):
    a = exp(m) * (exp(c - m) * scale * t + exp(-m) * b), and ReLU is positively homogeneous, so
    the output is exp(m) * ReLU(a') with both exponents <= 0: nothing overflows, and a vanishing
    signal beside a bias correctly reads as a ~= b.
    """
    dtype = u.dtype
    t = u @ p.v.T
    if calibrate is not None:
        vnorm = torch.linalg.vector_norm(p.v, dim=1)
        t_true = torch.exp(c).to(dtype).unsqueeze(1) * t / vnorm
        p = calibrate(p, t_true)
    a = t * p.scale
    if p.bias is not None:
        m = torch.clamp(c, min=0.0)
        a = torch.exp(c - m).to(dtype).unsqueeze(1) * a + torch.exp(-m).to(dtype).unsqueeze(1) * p.bias
    else:
        m = c
    mask = a > 0 if relu else None
    u, ln_norm = _normalize(torch.relu(a) if relu else a)
    return u, m + ln_norm, mask, p


def mlp_forward_backward(
    scheme: InitScheme,
    widths: list[int],
    x: torch.Tensor,
    e: torch.Tensor,
    seed: int,
    draw: int,
    progress: Callable[[], None] | None = None,
    stream: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, list[LayerParams]]:
    """One draw of one init: returns (ln forward ratios [L, N], ln backward ratios [L, N], params).

    Forward: ``_linear`` layer by layer (log space).
    Backward (001 eq. 5): delta^{l-1} = 1(a^{l-1} > 0) * (v^l^T (scale^l * delta^l)).
    ``stream``: the directions v are not kept; the backward pass redraws them from the layer's
    generator (same seed, same numbers), so memory no longer grows with L n^2.  Only the per-row
    scales (and biases) are kept -- for a data-dependent init they come from the forward pass.
    The returned params then have ``v = None`` (tests compare streamed with stored ratios).
    """
    device = x.device
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
        p = scheme.sample(role, layer_generator(seed, draw, l, device), device, x.dtype)
        u, c, mask, p = _linear(p, u, c, relu=True, calibrate=scheme.calibrate)
        ln_fwd[l - 1] = c - c0
        if stream:
            p = LayerParams(v=None, g=p.g, bias=p.bias, scale=p.scale)
        params.append(p)
        masks.append(pack_mask(mask))
        if progress is not None:
            progress()
    d, dlast = _normalize(e)
    acc = torch.zeros_like(dlast)
    ln_bwd[L - 1] = acc
    for l in range(L, 1, -1):
        p = params[l - 1]
        if stream:
            role = LayerRole(fan_in=widths[l - 1], fan_out=widths[l])
            v = scheme.sample(role, layer_generator(seed, draw, l, device), device, x.dtype).v
            p = params[l - 1] = LayerParams(v=v, g=p.g, bias=p.bias, scale=p.scale)
        y = (d * p.scale) @ p.v
        y = y * unpack_mask(masks[l - 2], widths[l - 1])
        d, ln_norm = _normalize(y)
        acc = acc + ln_norm
        ln_bwd[l - 2] = acc
        if progress is not None:
            progress()
        if stream:
            params[l - 1] = LayerParams(v=None, g=p.g, bias=p.bias, scale=p.scale)
    return ln_fwd, ln_bwd, params


def mlp_weight_bytes(widths: list[int], itemsize: int) -> int:
    return sum(widths[i] * widths[i - 1] for i in range(1, len(widths))) * itemsize


def run_mlp(
    spec: specs.MLPSpec,
    probe: specs.ProbeSpec,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
) -> tuple[list[int], dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    """Probe every init of ``spec``: returns widths, {init: (ln_fwd [S, L, N], ln_bwd [S, L, N])}
    as float64 numpy arrays, and the environment record (device, dtype, torch version, stream).
    ``on_start(env)`` is called once every input has been validated, before any allocation.
    ``probe.stream`` None: stream (redraw the weights in the backward pass) only when storing them
    would not fit in 80% of the free memory."""
    stream = probe.stream
    device = resolve_device(probe.device)
    dtype = DTYPES[probe.dtype]
    itemsize = torch.finfo(dtype).bits // 8
    # upper bound from the widest possible layers, before anything is drawn or allocated
    widest = [spec.input_dim] + [spec.width.hi] * min(spec.depth, 2)
    bound = estimate_mlp_bytes(widest, probe.samples, itemsize)
    per_layer = probe.samples * ((spec.width.hi + 7) // 8) + 4 * probe.samples * 8
    weights_hi = (spec.depth - 1) * spec.width.hi**2 * itemsize
    bound += (spec.depth - 1) * per_layer + (0 if stream else weights_hi)
    if stream is not False and bound > 0.8 * available_bytes(device):
        bound -= 0 if stream else weights_hi  # streaming does not keep the weights
        stream = True
    check_memory(bound, device)
    widths = spec.widths(probe.seed)
    for name in spec.inits:
        if inits_mod.get(name).calibrate is not None and probe.samples < 2:
            raise SigpropError(f"init {name!r} standardises over the probe batch and needs >= 2 samples", option="--samples")
    need = estimate_mlp_bytes(widths, probe.samples, itemsize)
    if stream is None:  # automatic: stream when the stored weights would not fit
        stream = need > 0.8 * available_bytes(device)
    if stream:
        need -= mlp_weight_bytes(widths, itemsize) - 2 * max(widths) ** 2 * itemsize
    check_memory(need, device)
    env = {
        "torch": torch.__version__,
        "device": str(device),
        "device_name": device_name(device),
        "dtype": probe.dtype,
        "threads": torch.get_num_threads(),
        "stream": bool(stream),
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
                f, b, _ = mlp_forward_backward(scheme, widths, x, e, probe.seed, draw, tick, stream=stream)
                fwd_all.append(f.cpu().numpy())
                bwd_all.append(b.cpu().numpy())
            out[name] = (np.stack(fwd_all), np.stack(bwd_all))
            for arr in out[name]:
                if np.isnan(arr).any() or np.isposinf(arr).any():
                    raise SigpropError(f"internal error: init {name!r} produced a non-finite log ratio")
    return widths, out, env


# --------------------------------------------------------------------------------------------
# the ResNet (001 eq. 6), weight-normalized or not
# --------------------------------------------------------------------------------------------
@dataclass
class BlockParams:
    """One residual block as run: branch layers, optional projection, alpha (for the oracle)."""

    branch: list[LayerParams]
    projection: LayerParams | None
    alpha: float


@dataclass
class ResNetDraw:
    """ln ratios of one draw: forward/backward per entry [E, N], branch per block [B, N], and for
    the BN net the statistics of every entry [E, 3] (skip var, moving var, squared moving mean)."""

    ln_fwd: torch.Tensor
    ln_bwd: torch.Tensor
    ln_branch: torch.Tensor
    bn: torch.Tensor | None = None


def _combine(sc, su, fb, fu):
    """exp(sc) su + exp(fb) fu in log space: (unit rows, ln-norms).  Either term may be -inf."""
    M = torch.maximum(sc, fb)
    M = torch.where(torch.isfinite(M), M, torch.zeros_like(M))
    dtype = su.dtype
    y = torch.exp(sc - M).to(dtype).unsqueeze(1) * su + torch.exp(fb - M).to(dtype).unsqueeze(1) * fu
    u, ln_norm = _normalize(y)
    return u, M + ln_norm


def resnet_forward_backward(
    scheme: InitScheme,
    plan: nets.ResNetPlan,
    x: torch.Tensor,
    e: torch.Tensor,
    seed: int,
    draw: int,
    progress: Callable[[], None] | None = None,
) -> tuple[ResNetDraw, list[BlockParams]]:
    """One draw of one init through h^b = S_b h^{b-1} + alpha F_b(h^{b-1}) (001 eq. 6).

    Forward in log space: the branch and the skip each run through ``_linear`` from the same
    (u, c); their sum exp(c_S) s + alpha exp(c_F) f is formed with the larger exponent factored
    out (``_combine``), so 3000 exploding blocks stay finite.
    Backward (001 eq. 54-63): d^{b-1} = S^T d^b + alpha J_F^T d^b, with J_F^T the branch's
    layers transposed and its ReLU masks; linear in d, so renormalised per sample as in the MLP.
    """
    device, dtype = x.device, x.dtype
    nb = len(plan.blocks)
    n = x.shape[0]
    ln_fwd = torch.empty(nb + 1, n, dtype=torch.float64, device=device)
    ln_bwd = torch.empty(nb + 1, n, dtype=torch.float64, device=device)
    ln_branch = torch.empty(nb, n, dtype=torch.float64, device=device)
    u, c = _normalize(x)
    c0 = c.clone()
    ln_fwd[0] = 0.0
    params: list[BlockParams] = []
    all_masks: list[list[torch.Tensor]] = []
    for i, block in enumerate(plan.blocks):
        ids = block.layer_ids()
        alpha = float(scheme.alpha(block.blocks_in_stage))
        bu, bc = u, c
        branch, masks = [], []
        roles = block.branch_roles()
        for j, role in enumerate(roles):
            p = scheme.sample(role, layer_generator(seed, draw, ids[j], device), device, dtype)
            bu, bc, mask, p = _linear(p, bu, bc, relu=j < len(roles) - 1, calibrate=scheme.calibrate)
            branch.append(p)
            if mask is not None:
                masks.append(pack_mask(mask))
        proj = None
        su, sc = u, c
        if block.projection:
            proj = scheme.sample(block.projection_role(), layer_generator(seed, draw, ids[-1], device), device, dtype)
            su, sc, _, proj = _linear(proj, u, c, relu=False, calibrate=scheme.calibrate)
        fb = bc + (math.log(alpha) if alpha > 0 else -math.inf)
        ln_branch[i] = fb - c
        u, c = _combine(sc, su, fb, bu)
        ln_fwd[i + 1] = c - c0
        params.append(BlockParams(branch, proj, alpha))
        all_masks.append(masks)
        if progress is not None:
            progress()
    w, _ = _normalize(e)
    acc = torch.zeros(n, dtype=torch.float64, device=device)
    ln_bwd[nb] = acc
    for i in range(nb - 1, -1, -1):
        bp, masks = params[i], all_masks[i]
        y = w if bp.projection is None else (w * bp.projection.scale) @ bp.projection.v
        if bp.alpha != 0.0:
            z = w
            for j in range(len(bp.branch) - 1, -1, -1):
                p = bp.branch[j]
                z = (z * p.scale) @ p.v
                if j > 0:
                    z = z * unpack_mask(masks[j - 1], z.shape[1])
            y = y + bp.alpha * z
        w, ln_norm = _normalize(y)
        acc = acc + ln_norm
        ln_bwd[i] = acc
        if progress is not None:
            progress()
    return ResNetDraw(ln_fwd, ln_bwd, ln_branch), params


# --------------------------------------------------------------------------------------------
# the batch-normalized ReLU ResNet of 004 appendix C
# --------------------------------------------------------------------------------------------
def _bn(X: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training-mode batch norm with gamma = 1, beta = 0 (004 appendix A): per channel over the
    batch, biased variance.  Returns (Y, s = sqrt(var + eps), mean, var)."""
    mu = X.mean(dim=0)
    var = X.var(dim=0, unbiased=False)
    s = torch.sqrt(var + eps)
    return (X - mu) / s, s, mu, var


def _bn_backward(dY: torch.Tensor, Y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Vector-Jacobian product of ``_bn``: dX = (dY - mean(dY) - Y mean(dY * Y)) / s."""
    return (dY - dY.mean(dim=0) - Y * (dY * Y).mean(dim=0)) / s


def bn_forward_backward(
    plan: nets.ResNetPlan,
    x: torch.Tensor,
    e: torch.Tensor,
    seed: int,
    draw: int,
    progress: Callable[[], None] | None = None,
    eps: float = theory.BN_EPS,
) -> tuple[ResNetDraw, list[LayerParams]]:
    """x^1 = W^0 BN(x^0)^+, x^{l+1} = x^l + W^l BN(x^l)^+ with W ~ N(0, 2/w) (004 appendix C).

    BN couples the samples of the batch, so there is no per-sample renormalisation: the forward
    pass runs in plain floats (the skip variance grows only linearly, l) and the backward pass,
    linear in the whole error matrix, is renormalised by one scalar per step.  Also records per
    entry the batch statistics of x^l (004 appendix B: momentum 0, one update): the variance over
    channels and examples, the mean over channels of the per-channel batch variance, and of the
    squared per-channel batch mean.
    """
    device, dtype = x.device, x.dtype
    scheme = inits_mod.get("unnormalized-he")
    E = len(plan.blocks) + 2
    n = x.shape[0]
    ln_fwd = torch.empty(E, n, dtype=torch.float64, device=device)
    ln_bwd = torch.empty(E, n, dtype=torch.float64, device=device)
    ln_branch = torch.empty(E - 2, n, dtype=torch.float64, device=device)
    bn_stats = torch.empty(E, 3, dtype=torch.float64, device=device)
    ln_x0 = torch.log(torch.linalg.vector_norm(x, dim=1).to(torch.float64))
    X = x
    saved = []
    params: list[LayerParams] = []
    for l in range(E - 1):  # layer l maps x^l -> x^{l+1}; l = 0 is the stem
        Y, s, mu, var = _bn(X, eps)
        bn_stats[l, 0] = X.to(torch.float64).var(unbiased=False)
        bn_stats[l, 1] = var.to(torch.float64).mean()
        bn_stats[l, 2] = (mu.to(torch.float64) ** 2).mean()
        ln_fwd[l] = torch.log(torch.linalg.vector_norm(X, dim=1).to(torch.float64)) - ln_x0
        role = LayerRole(plan.dim, plan.dim, "relu" if l == 0 else "block_last", len(plan.blocks), max(l - 1, 0))
        p = scheme.sample(role, layer_generator(seed, draw, l, device), device, dtype)
        mask = pack_mask(Y > 0)
        F = torch.relu(Y) @ p.v.T
        if l == 0:
            X = F
        else:
            ln_branch[l - 1] = torch.log(torch.linalg.vector_norm(F, dim=1).to(torch.float64)) - torch.log(
                torch.linalg.vector_norm(X, dim=1).to(torch.float64)
            )
            X = X + F
        saved.append((Y, s, mask))
        params.append(p)
        if progress is not None:
            progress()
    Y, s, mu, var = _bn(X, eps)
    bn_stats[E - 1, 0] = X.to(torch.float64).var(unbiased=False)
    bn_stats[E - 1, 1] = var.to(torch.float64).mean()
    bn_stats[E - 1, 2] = (mu.to(torch.float64) ** 2).mean()
    ln_fwd[E - 1] = torch.log(torch.linalg.vector_norm(X, dim=1).to(torch.float64)) - ln_x0
    ln_e = torch.log(torch.linalg.vector_norm(e, dim=1).to(torch.float64))
    scale = torch.linalg.vector_norm(e) / math.sqrt(n)
    G = e / scale
    acc = torch.log(scale.to(torch.float64))
    ln_bwd[E - 1] = 0.0
    for l in range(E - 2, -1, -1):
        Y, s, mask = saved[l]
        dX = _bn_backward(((G @ params[l].v) * unpack_mask(mask, plan.dim)), Y, s)
        G = dX if l == 0 else G + dX
        scale = torch.linalg.vector_norm(G) / math.sqrt(n)
        G = G / scale
        acc = acc + torch.log(scale.to(torch.float64))
        ln_bwd[l] = acc + torch.log(torch.linalg.vector_norm(G, dim=1).to(torch.float64)) - ln_e
        if progress is not None:
            progress()
    return ResNetDraw(ln_fwd, ln_bwd, ln_branch, bn_stats), params


def estimate_resnet_bytes(plan: nets.ResNetPlan, samples: int, itemsize: int, bn: bool) -> int:
    """Peak memory of one draw: stored weights (+ a QR temporary), bit-packed masks, activations,
    and for BN the saved normalised inputs of every layer."""
    weights = 0
    masks = 0
    widest = max(plan.entry_dims())
    biggest = 0
    for b in plan.blocks:
        w = b.widths
        for j in range(1, len(w)):
            weights += w[j] * w[j - 1]
            biggest = max(biggest, w[j] * w[j - 1])
            widest = max(widest, w[j])
        if b.projection:
            weights += b.d_in * b.d_out
        masks += samples * sum((v + 7) // 8 for v in w[1:-1])
    if bn:
        weights += plan.dim**2  # the stem
        masks += len(plan.entry_dims()) * samples * (plan.dim * itemsize + (plan.dim + 7) // 8)
    entries = len(plan.entry_dims())
    return weights * itemsize + 3 * biggest * itemsize + masks + 8 * samples * widest * itemsize + 4 * entries * samples * 8


def run_resnet(
    spec: specs.ResNetSpec,
    probe: specs.ProbeSpec,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
) -> tuple[nets.ResNetPlan, dict[str, dict[str, np.ndarray]], dict]:
    """Probe every init of ``spec``: returns the plan, {init: {"fwd", "bwd" [S, E, N], "branch"
    [S, B, N], "bn" [S, E, 3] or absent}} as float64 numpy arrays, and the environment."""
    device = resolve_device(probe.device)
    dtype = DTYPES[probe.dtype]
    itemsize = torch.finfo(dtype).bits // 8
    names = spec.resolved_inits()
    bn = spec.norm == "bn"
    # upper bound with every hidden width at HI, before anything is drawn or allocated
    hi = nets.resnet_plan(spec.dim, spec.stages, spec.blocks, 0 if bn else spec.block_depth,
                          [] if bn else [spec.width.hi] * (spec.stages * spec.blocks * spec.block_depth), stem=bn)
    options = "--blocks/--stages/--dim/--width/--samples"
    check_memory(estimate_resnet_bytes(hi, probe.samples, itemsize, bn), device, options)
    plan = spec.plan(probe.seed)
    for name in names:
        if inits_mod.get(name).calibrate is not None and probe.samples < 2:
            raise SigpropError(f"init {name!r} standardises over the probe batch and needs >= 2 samples", option="--samples")
    if bn and probe.samples < 2:
        raise SigpropError("batch normalization needs >= 2 samples in the batch", option="--samples")
    env = {
        "torch": torch.__version__,
        "device": str(device),
        "device_name": device_name(device),
        "dtype": probe.dtype,
        "threads": torch.get_num_threads(),
    }
    if on_start is not None:
        on_start(env)
    dims = plan.entry_dims()
    x, e = probe_inputs(probe.seed, probe.samples, dims[0], dims[-1], device, dtype)
    steps = len(dims) - 1
    total = len(names) * probe.seeds * 2 * steps
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    out: dict[str, dict[str, np.ndarray]] = {}
    with torch.no_grad():
        for name in names:
            draws = []
            for draw in range(probe.seeds):
                if bn:
                    r, _ = bn_forward_backward(plan, x, e, probe.seed, draw, tick)
                else:
                    r, _ = resnet_forward_backward(inits_mod.get(name), plan, x, e, probe.seed, draw, tick)
                draws.append(r)
            arrays = {
                "fwd": np.stack([d.ln_fwd.cpu().numpy() for d in draws]),
                "bwd": np.stack([d.ln_bwd.cpu().numpy() for d in draws]),
                "branch": np.stack([d.ln_branch.cpu().numpy() for d in draws]),
            }
            if bn:
                arrays["bn"] = np.stack([d.bn.cpu().numpy() for d in draws])
            for key in ("fwd", "bwd"):
                arr = arrays[key]
                if np.isnan(arr).any() or np.isposinf(arr).any():
                    raise SigpropError(f"internal error: init {name!r} produced a non-finite log ratio")
            out[name] = arrays
    return plan, out, env
