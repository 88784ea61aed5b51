"""The probe engine (torch): the kernels the walker's units use (sigprop/walker.py) and the
drivers that plan memory and run every init of a spec through the walker (``run_mlp``,
``run_resnet``, ``run_conv``: forward and backward written out, no autograd).

No autograd graph is built.  The forward pass keeps each sample's activation renormalised to
unit norm and accumulates the log of the norm it removed, so ratios stay representable at any
depth (an init that vanishes over 3000 layers reports ln-ratios of -1000, never 0 or nan).  The
backward pass (vector-Jacobian product, Arpit et al. 2019, eq. 4-5) needs only the weights and the ReLU masks
of the forward pass, stored bit-packed (``pack_mask``: eight units per byte); it is linear in the error
vector, so it is renormalised the same way.  Weight normalisation is a per-row scale of the
matmul output (``LayerParams.scale``), never a materialised g v/||v||.

The engine is checked against torch.autograd on small nets (tests/engine/test_engine.py).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from sigprop import inits as inits_mod
from sigprop import nets, plans, replay, specs, theory
from sigprop.errors import SigpropError
from sigprop.inits import InitScheme, LayerParams, LayerRole

DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: progress(done, total, label): steps done of the run's total, and what runs now ("he: forward")
ProgressFn = Callable[[int, int, str], None]


# --------------------------------------------------------------------------------------------
# device, memory
# --------------------------------------------------------------------------------------------
def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU.  Unavailable devices raise SigpropError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SigpropError(f"{name} requested but CUDA is not available on this machine", field="device")
        idx = int(name.split(":")[1]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            raise SigpropError(f"{name} requested but only {torch.cuda.device_count()} CUDA device(s) exist", field="device")
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


#: peak temporaries of drawing one layer, in units of its weight matrix (sigprop/haar.py: G, its
#: flipped square, the float64 cumulative sum (two units) -- then G, v, Q, Q diag(sign beta))
HAAR_TEMPORARIES = 4


def estimate_mlp_bytes(widths: list[int], samples: int, itemsize: int) -> int:
    """Peak memory of one draw: stored weights, the temporaries of one layer's draw (G and, for
    Haar directions, a flipped copy and a float64 cumulative sum, then v, Q and Q diag(sign):
    ``HAAR_TEMPORARIES`` of the largest layer), bit-packed masks, a few activation buffers, and
    the float64 log-norm buffers."""
    weights = sum(widths[i] * widths[i - 1] for i in range(1, len(widths))) * itemsize
    qr_tmp = HAAR_TEMPORARIES * max(widths[i] * widths[i - 1] for i in range(1, len(widths))) * itemsize
    masks = samples * sum((w + 7) // 8 for w in widths[1:])  # bit-packed
    acts = 6 * samples * max(widths) * itemsize
    logs = 4 * len(widths) * samples * 8
    return weights + qr_tmp + masks + acts + logs


def estimate_cnn_bytes(steps, samples: int, itemsize: int) -> int:
    """Peak memory of one draw of a conv net (``plans.cnn_steps``, ``plans.wrn_steps``): stored
    kernels, one layer's draw temporaries, bit-packed masks of the units of every conv with a
    ReLU, a few activation buffers of the widest layer (the grouped conv's input, output and
    gradient; a residual block's skip and branch), the float64 log-norm buffers."""
    convs = plans.convs(steps)
    kernels = [s.role.fan_in * s.role.fan_out for s in convs]
    units = [math.prod(s.shape_in) for s in convs] + [math.prod(convs[-1].shape_out)]
    masks = samples * sum((math.prod(s.shape_out) + 7) // 8 for s in convs if s.relu)
    return (sum(kernels) + HAAR_TEMPORARIES * max(kernels)) * itemsize + masks + 8 * samples * max(units) * itemsize \
        + 4 * len(convs) * samples * 8


def estimate_bn_conv_bytes(steps, samples: int, itemsize: int) -> int:
    """``estimate_cnn_bytes`` plus what the BN WRN keeps per conv for its backward pass: the BN
    output of every unit (samples x channels x positions) in the compute dtype."""
    kept = samples * sum(math.prod(s.shape_out) for s in plans.convs(steps)) * itemsize
    return estimate_cnn_bytes(steps, samples, itemsize) + kept


def check_memory(need: int, device: torch.device, fields: str = "depth/width/samples", hint: str = "") -> None:
    """Refuse, before allocating, a run whose estimate exceeds 80% of the free memory."""
    have = available_bytes(device)
    if need > 0.8 * have:
        gib = 2**30
        names = [n.replace("_", " ") for n in fields.split("/")]  # block_depth -> block depth
        raise SigpropError(
            f"this run needs about {need / gib:.1f} GiB on {device} but {have / gib:.1f} GiB is free; "
            f"reduce {', '.join(names[:-1])} or {names[-1]}{hint}",
            field=fields,
        )


STREAM_HINT = ", or stream the weights (--stream; stream=True in the API: redrawn, not stored)"


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


def pair_inputs(seed: int, pairs: int, dim: int, c0: float, device, dtype) -> torch.Tensor:
    """P input pairs of cosine exactly ``c0`` and equal norms, as rows i and P + i of [2P, dim]:
    a, b ~ N(0, I) (one stream, the same for every c0 and init); the second input is
    ||a|| (c0 a^ + sqrt(1 - c0^2) b_perp^), b_perp^ the unit part of b orthogonal to a."""
    gen = torch.Generator(device=device)
    gen.manual_seed(specs.derive_seed(seed, specs.STREAM_PAIRS))
    ab = torch.randn(2, pairs, dim, generator=gen, device=device, dtype=torch.float64)
    a, b = ab[0], ab[1]
    norm = torch.linalg.vector_norm(a, dim=-1, keepdim=True)
    a_hat = a / norm
    perp = b - (b * a_hat).sum(-1, keepdim=True) * a_hat
    p_norm = torch.linalg.vector_norm(perp, dim=-1, keepdim=True)
    perp = perp / torch.where(p_norm > 0, p_norm, torch.ones_like(p_norm))
    second = norm * (c0 * a_hat + math.sqrt(max(0.0, 1.0 - c0 * c0)) * perp)
    return torch.cat([a, second]).to(dtype)


_BITS: dict = {}


#: x * _GATHER >> 56 collects the low bit of each of the 8 bytes of x (little-endian: byte k
#: holds unit k) into one byte with unit k at bit k -- the layout of the fallback below
_GATHER = 0x0102040810204080


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Bit-pack a bool mask [..., n] into uint8 [..., ceil(n/8)]: 8 ReLU units per byte, unit k
    of a group at bit k.  One int64 multiply per 8 units (6x faster than a weighted sum)."""
    n = mask.shape[-1]
    pad = (-n) % 8
    if pad:
        mask = torch.nn.functional.pad(mask, (0, pad))
    mask = mask.contiguous()
    if sys.byteorder == "little":
        words = mask.view(torch.uint8).view(torch.int64)
        return ((words * _GATHER) >> 56).to(torch.uint8)
    bits = _BITS.get(mask.device)
    if bits is None:
        bits = _BITS[mask.device] = 2 ** torch.arange(8, dtype=torch.uint8, device=mask.device)
    return (mask.reshape(*mask.shape[:-1], -1, 8).to(torch.uint8) * bits).sum(dim=-1, dtype=torch.uint8)


def unpack_mask(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_mask`: the bool mask [..., n]."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(*packed.shape[:-1], -1)[..., :n].bool()


class Arena:
    """One flat preallocated buffer handed out as views.  Storing thousands of per-layer weights
    (or masks) as separate allocations fragments the host heap around the draw temporaries: 2000
    stored 256 x 256 weights cost 846 MiB of RSS for 500 MiB of data; in one arena, 515 MiB."""

    def __init__(self, numel: int, device, dtype) -> None:
        self.buf = torch.empty(numel, device=device, dtype=dtype)
        self.used = 0

    def alloc(self, *shape: int) -> torch.Tensor:
        """An uninitialised view of the given shape."""
        k = math.prod(shape)
        view = self.buf[self.used:self.used + k].view(shape)
        self.used += k
        return view

    def take(self, src: torch.Tensor) -> torch.Tensor:
        """A copy of ``src`` living in the arena."""
        return self.alloc(*src.shape).copy_(src)


def _normalize(y: torch.Tensor, inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row unit normalisation over the last dim: returns (y / ||y||, ln ||y|| in float64);
    zero rows stay zero with ln-norm -inf.  ``inplace``: y is a temporary and is overwritten."""
    norm = torch.linalg.vector_norm(y, dim=-1)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm)).unsqueeze(-1)
    return (y.div_(safe) if inplace else y / safe), torch.log(norm.to(torch.float64))


def _col(c: torch.Tensor, dtype) -> torch.Tensor:
    """exp of per-row log factors [..., N] as a column [..., N, 1] in the compute dtype."""
    return torch.exp(c).to(dtype).unsqueeze(-1)


def _t(v: torch.Tensor) -> torch.Tensor:
    return v.transpose(-1, -2)


#: the matmul of every WN/MLP layer, forward and backward: one seam, so that
#: benchmarks/tf32_bias.py can emulate reduced-precision operands on a CPU
_mm = torch.matmul


#: where Haar directions of many draws (and chunks of layers) are orthogonalized in one batched
#: UT-transform call (haar.orthogonalize_batched) instead of one orgqr each: "cuda" (GEMM speed
#: there; on a CPU LAPACK's orgqr is as fast -- docs/benchmarks.md), "always", "never" (tests)
BATCHED_HAAR = "cuda"


def batched_haar(scheme: InitScheme, device) -> bool:
    return scheme.haar_gain_sq is not None and (BATCHED_HAAR == "always" or (BATCHED_HAAR == "cuda" and torch.device(device).type == "cuda"))


def haar_params(scheme: InitScheme, role: LayerRole, g: torch.Tensor, v_out: torch.Tensor | None = None) -> LayerParams:
    """The parameters of layers whose scheme has ``haar_gain_sq``, from their Gaussians g
    [..., fan_out, fan_in] (any leading batch dims): one batched UT-transform Haar call, then
    the constant gain and the WN scale g / ||v|| -- what ``scheme.sample`` computes per layer."""
    from sigprop import haar

    lead = g.shape[:-2]
    q = haar.orthogonalize_batched(g.reshape(-1, *g.shape[-2:])).reshape(g.shape)
    v = q if v_out is None else v_out.copy_(q)
    gain = torch.full((*lead, role.fan_out), math.sqrt(scheme.haar_gain_sq(role)), device=g.device, dtype=g.dtype)
    return LayerParams(v=v, g=gain, bias=None, scale=gain / torch.linalg.vector_norm(v, dim=-1))


def sample_layer(scheme: InitScheme, role: LayerRole, gens, device, dtype, v_out: torch.Tensor | None = None) -> LayerParams:
    """One layer's parameters for a batch of draws, draw s from generator ``gens[s]`` (the same
    numbers as drawing it alone), stacked along a leading draw dim [S, ...].  The directions go
    into ``v_out`` when given (an arena slot: no stacked temporary), else a new tensor.  Haar
    directions on CUDA: the Gaussians of all draws are orthogonalized in one batched call."""
    if batched_haar(scheme, device):
        g = torch.stack([inits_mod.gaussian(role, gen, device, dtype) for gen in gens])
        return haar_params(scheme, role, g, v_out)
    v = torch.empty(len(gens), role.fan_out, role.fan_in, device=device, dtype=dtype) if v_out is None else v_out
    ps = []
    for s, gen in enumerate(gens):
        p = scheme.sample(role, gen, device, dtype)
        v[s].copy_(p.v)
        p.v = None
        ps.append(p)
    stack = lambda xs: None if xs[0] is None else torch.stack(xs)
    return LayerParams(v=v, g=stack([p.g for p in ps]), bias=stack([p.bias for p in ps]), scale=stack([p.scale for p in ps]))


class LayerGenerators:
    """One generator per draw, reseeded for each layer: ``reseeder(layer)`` gives the numbers of
    ``layer_generator(seed, draw, layer)``.  Reused (not new per layer) because a CUDA graph
    replays its random kernels on the generators it was captured with (sigprop/replay.py)."""

    def __init__(self, seed: int, draws, device) -> None:
        self.seed, self.draws = seed, list(draws)
        self.gens = [torch.Generator(device=device) for _ in self.draws]

    def reseeder(self, layer: int) -> Callable[[], None]:
        seeds = [specs.derive_seed(self.seed, specs.STREAM_WEIGHTS, d, layer) for d in self.draws]

        def reseed() -> None:
            for gen, s in zip(self.gens, seeds):
                gen.manual_seed(s)

        return reseed


def chunk_reseeder(rows: list[LayerGenerators], first: int, count: int) -> Callable[[], None]:
    """Reseed row k of a chunk's generators (``haar_chunk``: one ``LayerGenerators`` per layer
    of the chunk) for layer first + k: the numbers of ``layer_generator``."""
    reseeds = [row.reseeder(first + k) for k, row in enumerate(rows[:count])]

    def reseed() -> None:
        for r in reseeds:
            r()

    return reseed


#: at most this many layers are orthogonalized in one batched call (measured on the H100 in
#: issue 16: 32 layers of 1024^2, 0.21 ms per matrix against 1.1-1.6 ms for orgqr)
CHUNK_MAX = 32


def haar_chunk(scheme: InitScheme, widths: list[int], draws: int, device, itemsize: int) -> int:
    """How many layers ``mlp_batch`` draws per batched Haar call: 0 (per layer, as ever) unless the
    scheme's directions are Haar with a constant gain, batched Haar is on for the device
    (``BATCHED_HAAR``), the init is not data-dependent and layers 2..L share one shape; then up
    to CHUNK_MAX, as many as fit (with ~6 matrices of temporaries each) in a tenth of the free
    memory, at least 2."""
    L = len(widths) - 1
    if not batched_haar(scheme, device) or scheme.calibrate is not None or L < 3 or len(set(widths[1:])) != 1:
        return 0
    per_layer = 6 * draws * widths[1] * widths[1] * itemsize
    k = min(CHUNK_MAX, L - 1, int(0.1 * available_bytes(torch.device(device)) // max(per_layer, 1)))
    return k if k >= 2 else 0


def _calibrate_batch(calibrate, p: LayerParams, t_true: torch.Tensor) -> LayerParams:
    """A data-dependent init standardises each draw on its own pre-activations [S, N, out]."""
    ps = [calibrate(LayerParams(v=p.v[s], g=p.g[s], bias=p.bias[s], scale=p.scale[s]), t_true[s])
          for s in range(p.v.shape[0])]
    stack = lambda xs: None if xs[0] is None else torch.stack(xs)
    return LayerParams(v=p.v, g=stack([q.g for q in ps]), bias=stack([q.bias for q in ps]), scale=stack([q.scale for q in ps]))


def _linear(
    p: LayerParams, u: torch.Tensor, c: torch.Tensor, relu: bool, calibrate=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, LayerParams]:
    """One layer for a batch of draws in log space: input h = exp(c) * u (unit rows u [S, N, in],
    ln-norms c [S, N] in float64), params stacked [S, ...]; output (u', c', ReLU mask or None,
    params -- calibrated for a data-dependent scheme).

    t = u @ v^T (one batched matmul);  a = exp(c) * scale * t + b.  Splitting m = max(c, 0):
    a = exp(m) * (exp(c - m) * scale * t + exp(-m) * b), and ReLU is positively homogeneous, so
    the output is exp(m) * ReLU(a') with both exponents <= 0: nothing overflows, and a vanishing
    signal beside a bias correctly reads as a ~= b.
    """
    dtype = u.dtype
    t = _mm(u, _t(p.v))
    if calibrate is not None:
        vnorm = torch.linalg.vector_norm(p.v, dim=-1)
        p = _calibrate_batch(calibrate, p, _col(c, dtype) * t / vnorm.unsqueeze(-2))
    a = t.mul_(p.scale.unsqueeze(-2))  # t is this layer's own temporary: in place from here on
    if p.bias is not None:
        m = torch.clamp(c, min=0.0)
        a = a.mul_(_col(c - m, dtype)).add_(_col(-m, dtype) * p.bias.unsqueeze(-2))
    else:
        m = c
    mask = a > 0 if relu else None
    u, ln_norm = _normalize(torch.relu_(a) if relu else a, inplace=True)
    return u, m + ln_norm, mask, p


def _vjp(p: LayerParams, d: torch.Tensor) -> torch.Tensor:
    """d (scale * v): the layer's transpose applied to error rows d [S, N, out]."""
    return _mm(d * p.scale.unsqueeze(-2), p.v)


def _keep(p: LayerParams, rows: "Arena", stream: bool) -> LayerParams:
    """What a layer keeps for the backward pass: its directions unless streaming, and its
    per-row gains, biases and scales copied into the ``rows`` arena (thousands of small tensors
    scattered between the per-layer temporaries pin heap pages: streaming 2000 layers of width
    256 kept 721 MiB of RSS that way, 358 MiB with the arena)."""
    take = lambda t: None if t is None else rows.take(t)
    return LayerParams(v=None if stream else p.v, g=take(p.g), bias=take(p.bias), scale=take(p.scale))


def _rows_arena(S: int, row_widths, device, dtype) -> "Arena":
    return Arena(3 * S * sum(row_widths), device, dtype)


def unstack(p: LayerParams | None, s: int) -> LayerParams | None:
    """Draw ``s`` of stacked parameters (for the oracle in the tests)."""
    if p is None:
        return None
    pick = lambda t: None if t is None else t[s]
    return LayerParams(v=pick(p.v), g=pick(p.g), bias=pick(p.bias), scale=pick(p.scale))


def mlp_batch(
    scheme: InitScheme,
    widths: list[int],
    x: torch.Tensor,
    e: torch.Tensor,
    seed: int,
    draws,
    progress: Callable[[], None] | None = None,
    stream: bool = False,
    runner: replay.Eager | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[LayerParams]]:
    """S = len(draws) draws of one init through the MLP of ``widths`` (``plans.mlp_steps``, run by
    ``walker.walk``): returns (ln forward ratios [S, L, N], ln backward ratios [S, L, N], params
    per layer stacked [S, ...]; ``v = None`` when streamed).  ``stream``: the directions are not
    kept; the backward pass redraws them from the layer's generator (same seed, same numbers).
    Each layer, each way, is one step run by ``runner`` (sigprop/replay.py)."""
    from sigprop.walker import NET_KINDS

    r = NET_KINDS["mlp"].walk(widths, scheme, x, e, seed, draws, progress=progress, stream=stream, runner=runner)
    return r.observed["fwd"], r.observed["bwd"], [k.params for k in r.kept]


def mlp_forward_backward(scheme, widths, x, e, seed, draw, progress=None, stream=False):
    """One draw: (ln forward ratios [L, N], ln backward ratios [L, N], params per layer)."""
    f, b, params = mlp_batch(scheme, widths, x, e, seed, [draw], progress, stream)
    return f[0], b[0], [unstack(p, 0) for p in params]


def mlp_weight_bytes(widths: list[int], itemsize: int) -> int:
    return sum(widths[i] * widths[i - 1] for i in range(1, len(widths))) * itemsize


def plan_batches(per_draw: int, seeds: int, device: torch.device, fields: str) -> int:
    """How many draws run batched at once: all S when they fit in half the free memory, else as
    many as do (at least one, which must fit in 80%: ``check_memory``)."""
    check_memory(per_draw, device, fields)
    return max(1, min(seeds, int(0.5 * available_bytes(device) // max(per_draw, 1))))


def step_runner(graphs: bool) -> replay.Eager:
    """A fresh runner for one batch call: CUDA graphs when ``graphs`` (``use_graphs`` checked it)."""
    return replay.CudaGraphs() if graphs else replay.Eager()


def use_graphs(graphs: bool | None, device: torch.device) -> bool:
    """``--graphs``: None means on with CUDA; on another device it is refused."""
    if graphs and device.type != "cuda":
        raise SigpropError(f"CUDA graphs need a CUDA device; the device is {device}", field="graphs")
    return device.type == "cuda" if graphs is None else graphs


def graph_pool_bytes(biggest: int, widest: int, samples: int, itemsize: int, layers: int = 1) -> int:
    """What the captured steps of one draw keep in their private memory pools: per step (at most
    ``replay.MAX_GRAPHS``) one layer's draw temporaries, the step's ``layers`` static weight
    buffers and a few activation buffers."""
    return replay.MAX_GRAPHS * ((HAAR_TEMPORARIES + layers) * biggest + 6 * samples * widest) * itemsize


def graphs_status(runners) -> str:
    """One line for the environment record: ``off`` (eager runners only), the first fallback's
    reason, or ``on (K captured steps)`` -- K = 0 when no step shape repeated (random widths)."""
    runners = [r for r in runners if isinstance(r, replay.Replayed)]
    if not runners:
        return "off"
    for r in runners:
        if r.status.startswith("fell back"):
            return r.status
    return f"on ({sum(r.captured for r in runners)} captured steps)"


class using_threads:
    """Context: torch's CPU threads for one run -- ``requested``, else the one default
    (``environment.probe_threads``) -- restored afterwards, so that a library call leaves the
    caller's setting as it found it."""

    def __init__(self, requested: int | None) -> None:
        from sigprop import environment

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


class Ticker:
    """The engine's progress: called once per step of every pass (one init, one batch of draws),
    it reports ``progress(done, total, "init: phase")``; a pass is its phases in order, each
    (name, steps): forward, backward, then one forward walk per input cosine ("correlation")."""

    def __init__(self, progress: ProgressFn | None, passes: int, phases: list[tuple[str, int]]) -> None:
        self.progress, self.phases = progress, [p for p in phases if p[1] > 0]
        self.per_pass = sum(n for _, n in self.phases)
        self.total, self.done, self.name = passes * self.per_pass, 0, ""

    def __call__(self) -> None:
        self.done += 1
        if self.progress is not None:
            at, phase = (self.done - 1) % self.per_pass, self.phases[-1][0]
            for name, n in self.phases:
                if at < n:
                    phase = name
                    break
                at -= n
            self.progress(self.done, self.total, f"{self.name}: {phase}")


def _environment(device: torch.device, probe: specs.ProbeSpec, stream: bool, batch: int) -> dict:
    return {
        "torch": torch.__version__,
        "device": str(device),
        "device_name": device_name(device),
        "dtype": probe.dtype,
        "precision": probe.precision,
        "threads": torch.get_num_threads(),
        "stream": bool(stream),
        "batch": batch,
        "graphs": "off",
    }


def _check_finite(name: str, arrays) -> None:
    for arr in arrays:
        if np.isnan(arr).any() or np.isposinf(arr).any():
            raise SigpropError(f"internal error: init {name!r} produced a non-finite log ratio")


def check_pairs(probe: specs.ProbeSpec, dim: int) -> None:
    """Refuse, before anything runs, an input cosine the input dimension cannot hold."""
    for c0 in probe.correlations:
        if dim < 2 and abs(c0) < 1:
            raise SigpropError(f"an input cosine of {c0:g} needs inputs of dimension >= 2 (the input has {dim})", field="correlation")


def correlation_bytes(probe: specs.ProbeSpec, widest: int, itemsize: int) -> int:
    """The correlation walks' extra memory (forward only, nothing stored): the pair inputs and a
    few activation buffers of 2P rows, and the float64 cosines."""
    if not probe.correlations:
        return 0
    return 8 * 2 * probe.pairs * widest * itemsize


def _net_kind(name: str):
    from sigprop import walker

    return walker.NET_KINDS[name]


def kind_of(spec) -> tuple[str, tuple[str, ...]]:
    """The registered net kind (``walker.NET_KINDS``) a spec runs as, and the init names that run
    (a ResNet's and the WRN's resolved for their --norm)."""
    if isinstance(spec, specs.MLPSpec):
        return "mlp", tuple(spec.inits)
    if isinstance(spec, specs.CNNSpec):
        return "cnn", tuple(spec.inits)
    if isinstance(spec, specs.ResNetSpec):
        return ("bn-resnet" if spec.norm == "bn" else "resnet"), spec.resolved_inits()
    return ("wrn-bn" if spec.norm == "bn" else "wrn"), spec.resolved_inits()


def _drive(kind: str, net, names, probe: specs.ProbeSpec, dims: tuple[int, int], need: int, fields: str, stream: bool,
           graphs: bool, device: torch.device, precision: "matmul_precision", progress: ProgressFn | None,
           on_start: Callable[[dict], None] | None) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
    """The end every ``run_*`` shares once its memory is planned (``need`` bytes per draw): how
    many draws run at once, the environment record (``on_start`` sees it before anything is
    drawn), the inputs x [N, dims[0]] and errors e [N, dims[1]], then every init walked batch of
    draws by batch: {init: {observer: float64 array with the draws first}}.  Per batch, the
    probe's observers on (x, e), then for each input cosine a forward walk of its pairs
    (``pair_inputs``) with the ``Correlation`` observer: "correlation" [S, C, E, P].  Only the
    observations are kept: each walk's weights are freed before the next one allocates its own
    (holding them doubled the peak memory)."""
    from sigprop import walker

    batch = plan_batches(need, probe.seeds, device, fields) if probe.batch is None else min(probe.batch, probe.seeds)
    env = _environment(device, probe, stream, batch)
    if on_start is not None:
        on_start(env)
    dtype = DTYPES[probe.dtype]
    x, e = probe_inputs(probe.seed, probe.samples, dims[0], dims[1], device, dtype)
    with torch.no_grad(), precision:
        net_kind = _net_kind(kind)
        pairs = [pair_inputs(probe.seed, probe.pairs, x.shape[1], c0, device, dtype) for c0 in probe.correlations]
        chunks = [list(range(s, min(s + batch, probe.seeds))) for s in range(0, probe.seeds, batch)]
        runners: list[replay.Eager] = []
        out: dict[str, dict[str, np.ndarray]] = {}
        tick = None
        for name in names:
            scheme = net_kind.scheme(name)
            units, record_input = net_kind.units(net, scheme)
            if tick is None:
                steps = len(units)
                tick = Ticker(progress, len(names) * len(chunks), [("forward", steps), ("backward", steps - 1 + record_input),
                                                                 ("correlation", steps * len(pairs))])
            tick.name = name

            def run(inputs, errors, observers, draws):
                runners.append(step_runner(graphs))
                r = walker.walk(units, scheme, inputs, errors, probe.seed, draws, observers, record_input, space=net_kind.space(),
                                progress=tick, stream=stream, runner=runners[-1])
                runners[-1].release()
                return {k: v.cpu().numpy() for k, v in r.observed.items()}

            parts = []
            for draws in chunks:
                got = run(x, e, net_kind.observers(), draws)
                if pairs:
                    got["correlation"] = np.stack([run(xp, None, [walker.Correlation()], draws)["correlation"] for xp in pairs], axis=1)
                parts.append(got)
            out[name] = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            _check_finite(name, (out[name]["fwd"], out[name]["bwd"]))
    env["graphs"] = graphs_status(runners)
    return out, env


def run_mlp(
    spec: specs.MLPSpec,
    probe: specs.ProbeSpec,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
) -> tuple[list[int], dict[str, dict[str, np.ndarray]], dict]:
    """Probe every init of ``spec``: returns widths, {init: {"fwd", "bwd" [S, L, N], and with
    ``probe.correlations`` "correlation" [S, C, L, P]}} as float64 numpy arrays, and the environment record (device, dtype, torch version, stream,
    draws per batch).  ``on_start(env)`` is called once every input has been validated, before
    any allocation.  ``probe.stream`` None: stream (redraw the weights in the backward pass) only
    when storing them would not fit in 80% of the free memory.  The S draws run batched
    (``mlp_batch``), as many at once as fit in half the free memory (``plan_batches``)."""
    stream = probe.stream
    device = resolve_device(probe.device)
    precision = matmul_precision(probe.precision, device)
    dtype = DTYPES[probe.dtype]
    itemsize = torch.finfo(dtype).bits // 8
    # upper bound from the widest possible layers, before anything is drawn or allocated
    widest = [spec.input_dim] + [spec.width.hi] * min(spec.depth, 2)
    estimate = _net_kind("mlp").estimate
    bound = estimate(widest, probe.samples, itemsize)
    per_layer = probe.samples * ((spec.width.hi + 7) // 8) + 4 * probe.samples * 8
    weights_hi = (spec.depth - 1) * spec.width.hi**2 * itemsize
    bound += (spec.depth - 1) * per_layer + (0 if stream else weights_hi)
    if stream is not False and bound > 0.8 * available_bytes(device):
        bound -= 0 if stream else weights_hi  # streaming does not keep the weights
        stream = True
    check_memory(bound, device, hint=STREAM_HINT if stream is False else "")
    widths = spec.widths(probe.seed)
    for name in spec.inits:
        if inits_mod.get(name).calibrate is not None and probe.samples < 2:
            raise SigpropError(f"init {name!r} standardises over the probe batch and needs >= 2 samples", field="samples")
    need = estimate(widths, probe.samples, itemsize)
    if stream is None:  # automatic: stream when the stored weights would not fit
        stream = need > 0.8 * available_bytes(device)
    if stream:
        need -= mlp_weight_bytes(widths, itemsize) - 2 * max(widths) ** 2 * itemsize
    graphs = use_graphs(probe.graphs, device)
    if graphs:
        biggest = max(widths[i] * widths[i - 1] for i in range(1, len(widths)))
        need += graph_pool_bytes(biggest, max(widths), probe.samples, itemsize)
    check_pairs(probe, widths[0])
    need += correlation_bytes(probe, max(widths), itemsize)
    out, env = _drive("mlp", widths, spec.inits, probe, (widths[0], widths[-1]), need, "depth/width/samples", stream, graphs,
                      device, precision, progress, on_start)
    return widths, out, env


def run_conv(
    spec: "specs.CNNSpec | specs.WRNSpec",
    probe: specs.ProbeSpec,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
) -> tuple[tuple, dict[str, dict[str, np.ndarray]], dict]:
    """Probe every init of a conv net -- the plain CNN (``walker.ConvLayer``s) or the WRN
    (a ConvLayer stem and ``walker.ResidualBlock``s of ``ConvOp``s) -- from ``spec.steps()``:
    returns the steps, {init: {"fwd", "bwd" [S, E, N], "branch" (WRN), "correlation" with
    cosines}} and the environment.  Memory, streaming, batching and graphs as ``run_mlp``."""
    wrn = isinstance(spec, specs.WRNSpec)
    kind, names = kind_of(spec)
    if kind == "wrn-bn" and probe.samples < 2:
        raise SigpropError("batch normalization needs >= 2 samples in the batch", field="samples")
    fields = "blocks/widen/image/samples" if wrn else "depth/channels/image/samples"
    stream = probe.stream
    device = resolve_device(probe.device)
    precision = matmul_precision(probe.precision, device)
    dtype = DTYPES[probe.dtype]
    itemsize = torch.finfo(dtype).bits // 8
    # a lower bound that needs no plan (10^9 layers of steps would themselves exhaust memory): the
    # bit-packed masks of the layers at the smallest map and the float64 ln-ratio buffers
    C, H, W = spec.image
    if wrn:
        layers, small = 3 * spec.blocks, plans.WRN_BASE * spec.widen * max(1, H >> 2) * max(1, W >> 2)
    else:
        layers, small = spec.depth, spec.channels * max(1, H >> spec.strided) * max(1, W >> spec.strided)
    check_memory(layers * probe.samples * ((small + 7) // 8 + 16), device, fields)
    steps = spec.steps()
    convs = plans.convs(steps)
    for name in names:
        if inits_mod.get(name).calibrate is not None and probe.samples < 2:
            raise SigpropError(f"init {name!r} standardises over the probe batch and needs >= 2 samples", field="samples")
    estimate = _net_kind(kind).estimate
    need = estimate(steps, probe.samples, itemsize)
    weights = sum(s.role.fan_in * s.role.fan_out for s in convs) * itemsize
    if stream is None:
        stream = need > 0.8 * available_bytes(device)
    if stream:
        need -= weights - 2 * max(s.role.fan_in * s.role.fan_out for s in convs) * itemsize
    check_memory(need, device, fields, STREAM_HINT if stream is False else "")
    graphs = use_graphs(probe.graphs, device) and kind != "wrn-bn"  # the BN net runs eagerly
    if graphs:
        units = max(math.prod(s.shape_in) for s in convs)
        need += graph_pool_bytes(max(s.role.fan_in * s.role.fan_out for s in convs), units, probe.samples, itemsize,
                                 layers=4 if wrn else 1)
    check_pairs(probe, math.prod(spec.image))
    need += correlation_bytes(probe, max(math.prod(s.shape_in) for s in convs), itemsize)
    out, env = _drive(kind, steps, names, probe, (math.prod(spec.image), math.prod(convs[-1].shape_out)), need,
                      fields, stream, graphs, device, precision, progress, on_start)
    return steps, out, env


# --------------------------------------------------------------------------------------------
# the ResNet (Arpit et al. 2019, eq. 6), weight-normalized or not
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
    y = _col(sc - M, su.dtype) * su + _col(fb - M, su.dtype) * fu
    u, ln_norm = _normalize(y)
    return u, M + ln_norm


def resnet_batch(
    scheme: InitScheme,
    plan: nets.ResNetPlan,
    x: torch.Tensor,
    e: torch.Tensor,
    seed: int,
    draws,
    progress: Callable[[], None] | None = None,
    stream: bool = False,
    runner: replay.Eager | None = None,
) -> tuple[ResNetDraw, list[BlockParams]]:
    """S = len(draws) draws of one init through h^b = S_b h^{b-1} + alpha F_b(h^{b-1}) (Arpit et
    al. 2019, eq. 6; ``plans.resnet_steps`` run by ``walker.walk``): ratios [S, E, N] and branch
    ratios [S, B, N], params stacked [S, ...] per block."""
    from sigprop.walker import NET_KINDS

    r = NET_KINDS["resnet"].walk(plan, scheme, x, e, seed, draws, progress=progress, stream=stream, runner=runner)
    return ResNetDraw(r.observed["fwd"], r.observed["bwd"], r.observed["branch"]), [k.params for k in r.kept]


def resnet_forward_backward(scheme, plan, x, e, seed, draw, progress=None, stream=False):
    """One draw: ratios [E, N] (``ResNetDraw``) and the blocks' params (unstacked)."""
    r, params = resnet_batch(scheme, plan, x, e, seed, [draw], progress, stream)
    one = [BlockParams([unstack(p, 0) for p in b.branch], unstack(b.projection, 0), b.alpha) for b in params]
    return ResNetDraw(r.ln_fwd[0], r.ln_bwd[0], r.ln_branch[0]), one


def resnet_weight_count(plan: nets.ResNetPlan) -> int:
    """Elements of the stored directions of one draw (branches and projections)."""
    total = 0
    for b in plan.blocks:
        total += sum(b.widths[j] * b.widths[j - 1] for j in range(1, len(b.widths)))
        total += b.d_in * b.d_out if b.projection else 0
    return total


# --------------------------------------------------------------------------------------------
# the batch-normalized ReLU ResNet of De & Smith 2020, appendix C
# --------------------------------------------------------------------------------------------
def _bn(X: torch.Tensor, eps: float, dims=-2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training-mode batch norm with gamma = 1, beta = 0 (De & Smith 2020, appendix A): per channel over the
    batch (``dims``: -2, or for conv outputs [S, N, c, P] the batch and the positions, (1, 3)),
    biased variance.  Returns (Y, s = sqrt(var + eps), mean, var)."""
    mu = X.mean(dim=dims, keepdim=True)
    var = X.var(dim=dims, unbiased=False, keepdim=True)
    s = torch.sqrt(var + eps)
    return (X - mu) / s, s, mu, var


def _bn_backward(dY: torch.Tensor, Y: torch.Tensor, s: torch.Tensor, dims=-2) -> torch.Tensor:
    """Vector-Jacobian product of ``_bn``: dX = (dY - mean(dY) - Y mean(dY * Y)) / s."""
    return (dY - dY.mean(dim=dims, keepdim=True) - Y * (dY * Y).mean(dim=dims, keepdim=True)) / s


def _ln_rows(X: torch.Tensor) -> torch.Tensor:
    return torch.log(torch.linalg.vector_norm(X, dim=-1).to(torch.float64))


def _bn_record(X, mu, var) -> torch.Tensor:
    """Per draw: variance of x over channels and examples, mean per-channel batch variance, mean
    squared per-channel batch mean -> [S, 3]."""
    X64 = X.to(torch.float64)
    return torch.stack([
        X64.reshape(X.shape[0], -1).var(dim=1, unbiased=False),
        var.to(torch.float64).mean(dim=(-2, -1)),
        (mu.to(torch.float64) ** 2).mean(dim=(-2, -1)),
    ], dim=1)


def bn_batch(
    plan: nets.ResNetPlan,
    x: torch.Tensor,
    e: torch.Tensor,
    seed: int,
    draws,
    progress: Callable[[], None] | None = None,
    eps: float = theory.BN_EPS,
    stream: bool = False,
) -> tuple[ResNetDraw, list[LayerParams]]:
    """x^1 = W^0 BN(x^0)^+, x^{l+1} = x^l + W^l BN(x^l)^+ with W ~ N(0, 2/w) (De & Smith 2020,
    appendix C; ``plans.bn_resnet_steps`` run by ``walker.walk`` in plain floats), for S draws at
    once (BN statistics per draw over its batch): ratios [S, E, N], branch ratios, and the batch
    statistics of every entry [S, E, 3] (``walker.BNStatistics``).  ``stream``: W^l is redrawn in
    the backward pass instead of stored."""
    from sigprop import walker

    kind = walker.NET_KINDS["bn-resnet"]
    scheme = kind.scheme("unnormalized-he")
    units, record_input = walker.compile_plan(plans.bn_resnet_steps(plan, eps), scheme)
    r = walker.walk(units, scheme, x, e, seed, draws, kind.observers(), record_input, space=walker.PlainSpace(), progress=progress,
                    stream=stream)
    o = r.observed
    return ResNetDraw(o["fwd"], o["bwd"], o["branch"], o["bn"]), [k.params for k in r.kept]


def bn_forward_backward(plan, x, e, seed, draw, progress=None, eps=theory.BN_EPS, stream=False):
    """One draw of the BN net: ratios [E, N], statistics [E, 3] and the layers' params."""
    r, params = bn_batch(plan, x, e, seed, [draw], progress, eps, stream)
    return ResNetDraw(r.ln_fwd[0], r.ln_bwd[0], r.ln_branch[0], r.bn[0]), [unstack(p, 0) for p in params]


def estimate_resnet_bytes(plan: nets.ResNetPlan, samples: int, itemsize: int, bn: bool) -> int:
    """Peak memory of one draw: stored weights (+ one layer's draw temporaries), bit-packed masks, activations,
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
    return weights * itemsize + HAAR_TEMPORARIES * biggest * itemsize + masks + 8 * samples * widest * itemsize + 4 * entries * samples * 8


def run_resnet(
    spec: specs.ResNetSpec,
    probe: specs.ProbeSpec,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
) -> tuple[nets.ResNetPlan, dict[str, dict[str, np.ndarray]], dict]:
    """Probe every init of ``spec``: returns the plan, {init: {"fwd", "bwd" [S, E, N], "branch"
    [S, B, N], "bn" [S, E, 3] or absent, "correlation" [S, C, E, P] with ``probe.correlations``}}
    as float64 numpy arrays, and the environment.
    Streaming and batching of draws as in ``run_mlp``."""
    device = resolve_device(probe.device)
    precision = matmul_precision(probe.precision, device)
    dtype = DTYPES[probe.dtype]
    itemsize = torch.finfo(dtype).bits // 8
    kind, names = kind_of(spec)
    bn = spec.norm == "bn"
    # a lower bound that needs no plan (a plan of 10^9 blocks would itself exhaust memory): the
    # bit-packed masks, BN's saved inputs and the float64 ln-ratio buffers, with widths at LO
    layers = spec.stages * spec.blocks * (1 if bn else spec.block_depth)
    per_layer = probe.samples * ((spec.dim * itemsize + spec.dim // 8) if bn else (spec.width.lo + 7) // 8)
    check_memory(layers * per_layer + 3 * spec.stages * spec.blocks * probe.samples * 8,
                 device, "blocks/stages/dim/width/samples")
    # upper bound with every hidden width at HI, before anything is drawn or allocated
    hi = nets.resnet_plan(spec.dim, spec.stages, spec.blocks, 0 if bn else spec.block_depth,
                          [] if bn else [spec.width.hi] * (spec.stages * spec.blocks * spec.block_depth), stem=bn)
    fields = "blocks/stages/dim/width/samples"
    stream = probe.stream
    weights_hi = itemsize * (resnet_weight_count(hi) + (len(hi.blocks) + 1) * hi.dim**2 * bn)
    estimate = _net_kind(kind).estimate
    bound = estimate(hi, probe.samples, itemsize)
    if stream is None and bound > 0.8 * available_bytes(device):
        stream = True
    check_memory(bound - (weights_hi if stream else 0), device, fields, STREAM_HINT if stream is False else "")
    plan = spec.plan(probe.seed)
    for name in names:
        if inits_mod.get(name).calibrate is not None and probe.samples < 2:
            raise SigpropError(f"init {name!r} standardises over the probe batch and needs >= 2 samples", field="samples")
    if bn and probe.samples < 2:
        raise SigpropError("batch normalization needs >= 2 samples in the batch", field="samples")
    need = estimate(plan, probe.samples, itemsize)
    if stream is None:
        stream = need > 0.8 * available_bytes(device)
    if stream:
        need -= itemsize * (resnet_weight_count(plan) + (len(plan.blocks) + 1) * plan.dim**2 * bn)
    graphs = use_graphs(probe.graphs, device) and not bn  # the BN net runs eagerly
    if graphs:
        sizes = [b.widths[j] * b.widths[j - 1] for b in plan.blocks for j in range(1, len(b.widths))]
        widest = max([plan.dim] + [w for b in plan.blocks for w in b.widths])
        need += graph_pool_bytes(max(sizes + [b.d_in * b.d_out for b in plan.blocks]), widest, probe.samples, itemsize,
                                 layers=max(len(b.layer_ids()) for b in plan.blocks))
    check_pairs(probe, plan.dim)
    need += correlation_bytes(probe, max(max(b.widths) for b in plan.blocks), itemsize)
    dims = plan.entry_dims()
    out, env = _drive(kind, plan, names, probe, (dims[0], dims[-1]), need, fields, stream, graphs,
                      device, precision, progress, on_start)
    return plan, out, env
