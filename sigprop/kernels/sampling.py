"""Random numbers of a run (torch): the probe's inputs and error vectors, the input pairs of the
correlation walks, the per-layer weight generators, and one sampler per init scheme
(sigprop/inits.py declares the schemes; this module draws them).

A sampler draws one layer's parameters from its role and a ``torch.Generator``; a data-dependent
scheme also has a calibration, which sets g and b from the layer's pre-activations on the probe
batch.  Every sampler reads its Gaussian matrix G first from the layer's generator (common random
numbers across schemes, sigprop/inits.py).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from sigprop import inits, specs
from sigprop.errors import SigpropError
from sigprop.inits import InitScheme, LayerRole
from sigprop.kernels import haar
from sigprop.kernels.logspace import LayerParams, wn
from sigprop.registry import Registry

Sampler = Callable[[LayerRole, torch.Generator, torch.device, torch.dtype], LayerParams]
SAMPLERS: Registry[Sampler] = Registry("sampler", field="init", skip=(__name__,))
#: data-dependent schemes: (params, pre-activations [N, out]) -> params with g and b set (the
#: one registry idiom: a name taken twice is refused naming both)
CALIBRATIONS: Registry[Callable[[LayerParams, torch.Tensor], LayerParams]] = Registry(
    "calibration", field="init"
)


def sampler(name: str):
    """Register the sampler of the init scheme ``name`` (a decorator)."""

    def deco(fn: Sampler) -> Sampler:
        return SAMPLERS.add(name, fn)

    return deco


def sample(scheme: InitScheme, role: LayerRole, gen, device, dtype) -> LayerParams:
    """One layer's draw of ``scheme``: its registered sampler (an init added from outside
    registers its ``inits.InitScheme`` and its sampler, ``@sampler(name)``)."""
    fn = SAMPLERS.get(scheme.name)
    if fn is None:
        raise SigpropError(
            f"init {scheme.name!r} has no sampler: register one with sigprop.kernels.sampling.sampler"
            f"({scheme.name!r})",
            field="init",
        )
    return fn(role, gen, device, dtype)


def calibration(scheme: InitScheme):
    """The scheme's calibration, or None (not data-dependent)."""
    return CALIBRATIONS.get(scheme.name)


# --------------------------------------------------------------------------------------------
# generators and inputs
# --------------------------------------------------------------------------------------------
def layer_generator(seed: int, draw: int, layer: int, device: torch.device) -> torch.Generator:
    """The generator of one layer's weights: the same for every init (common random numbers)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(specs.derive_seed(seed, specs.STREAM_WEIGHTS, draw, layer))
    return gen


class LayerGenerators:
    """One generator per draw, reseeded for each layer: ``reseeder(layer)`` gives the numbers of
    ``layer_generator(seed, draw, layer)``.  Reused (not new per layer) because a CUDA graph
    replays its random kernels on the generators it was captured with (kernels/replay.py)."""

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
    perp = perp / torch.where(p_norm > 0, p_norm, 1.0)
    second = norm * (c0 * a_hat + math.sqrt(max(0.0, 1.0 - c0 * c0)) * perp)
    return torch.cat([a, second]).to(dtype)


def labels(seed: int, samples: int, classes: int, device) -> torch.Tensor:
    """Synthetic labels uniform over ``classes`` from their own stream (``sigprop hessian``)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(specs.derive_seed(seed, specs.STREAM_LABELS))
    return torch.randint(0, classes, (samples,), generator=gen, device=device)


# --------------------------------------------------------------------------------------------
# the samplers
# --------------------------------------------------------------------------------------------
def gaussian(role: LayerRole, gen, device, dtype):
    """The shared Gaussian draw G ~ N(0, 1), shape [fan_out, fan_in]."""
    return torch.randn(role.fan_out, role.fan_in, generator=gen, device=device, dtype=dtype)


def _weight_norm_default(v, bias=None) -> LayerParams:
    """torch.nn.utils.weight_norm's initial g = ||v|| (per row): w = v exactly; bias None = 0.
    ``v`` [out, in], or [S, out, in] for S draws at once."""
    if bias is None:
        bias = torch.zeros(v.shape[:-1], device=v.device, dtype=v.dtype)
    return wn(v, torch.linalg.vector_norm(v, dim=-1), bias)


def _const_gain(v, value: float) -> LayerParams:
    return wn(v, torch.full(v.shape[:-1], value, device=v.device, dtype=v.dtype))


#: Gaussian directions times a constant, then their gains from the directions alone: the draws
#: of such a scheme are one randn per draw (its own generator, written in place) and then every
#: other kernel once for all S draws (``sample_layer``); its sampler of one draw is made from the
#: same entry (``_gaussian_sampler``).  {name: role -> (the constant, the gains of directions
#: [..., out, in])}
GAUSSIAN_SCHEMES: dict[str, Callable[[LayerRole], tuple[float, Callable]]] = {
    "he": lambda role: (math.sqrt(2.0 / role.fan_in), lambda v: _const_gain(v, 1.0)),
    "proposed-gaussian": lambda role: (
        1.0,
        lambda v: _const_gain(v, math.sqrt(inits.proposed_gain_sq(role))),
    ),
    # weight_norm's default g = ||v|| over He directions v ~ N(0, 2/fan_in), b = 0: the PyTorch-default
    # baseline of Arpit et al. 2019, section 5.1 ("initializes g_i = ||W_i||") as the authors' released
    # code builds it (kaiming_normal_ weights, zero biases, then weight_norm).  w = v exactly: a He net
    # at init, parameterized by g, v, b (which the curvature sees)
    "pytorch-he": lambda role: (math.sqrt(2.0 / role.fan_in), _weight_norm_default),
}


def _gaussian_sampler(name: str) -> Sampler:
    """The sampler of one draw of a ``GAUSSIAN_SCHEMES`` scheme."""

    def one(role, gen, device, dtype):
        factor, gains = GAUSSIAN_SCHEMES[name](role)
        v = gaussian(role, gen, device, dtype)
        return gains(v.mul_(factor) if factor != 1.0 else v)

    return one


for _name in GAUSSIAN_SCHEMES:
    sampler(_name)(_gaussian_sampler(_name))


def _gaussian_draws(scheme: InitScheme, role: LayerRole, gens, device, dtype, v_out) -> LayerParams:
    """S draws of a ``GAUSSIAN_SCHEMES`` scheme: the numbers of drawing each alone (the same randn
    of its generator; the same row norms, a reduction along each row), in 4 + S kernels rather
    than 6 S."""
    factor, gains = GAUSSIAN_SCHEMES[scheme.name](role)
    v = _directions(len(gens), role, device, dtype, v_out)
    for s, gen in enumerate(gens):
        torch.randn(role.fan_out, role.fan_in, generator=gen, device=device, dtype=dtype, out=v[s])
    if factor != 1.0:
        v.mul_(factor)
    return gains(v)


@sampler("proposed")
def _proposed(role, gen, device, dtype):
    return _const_gain(
        haar.orthogonalize(gaussian(role, gen, device, dtype)), math.sqrt(inits.proposed_gain_sq(role))
    )


@sampler("pytorch")
def _pytorch(role, gen, device, dtype):
    bound = inits.pytorch_linear_bound(role.fan_in)
    v = (torch.rand(role.fan_out, role.fan_in, generator=gen, device=device, dtype=dtype) * 2 - 1) * bound
    b = (torch.rand(role.fan_out, generator=gen, device=device, dtype=dtype) * 2 - 1) * bound
    return _weight_norm_default(v, b)


@sampler("pytorch-orthogonal")
def _pytorch_orthogonal(role, gen, device, dtype):
    """weight_norm's default g = ||v|| over orthogonal_ directions (orthonormal rows when fan_out <= fan_in,
    orthonormal columns otherwise), b = 0: the authors' code's other PyTorch-default variant
    ("orthogonal"); w = v, so row norms are 1 except in expanding layers."""
    return _weight_norm_default(haar.orthogonalize(gaussian(role, gen, device, dtype)))


@sampler("datadep")
def _datadep(role, gen, device, dtype):
    v = gaussian(role, gen, device, dtype) * 0.05  # Salimans & Kingma 2016, section 3: v ~ N(0, 0.05^2)
    ones = torch.ones(role.fan_out, device=device, dtype=dtype)
    return wn(v, ones, torch.zeros(role.fan_out, device=device, dtype=dtype))


def _calibrate_datadep(params: LayerParams, t) -> LayerParams:
    """Salimans & Kingma 2016, eq. 5-6: t = v.x/||v|| over the minibatch; g <- 1/sigma[t], b <-
    -mu[t]/sigma[t]."""
    mu = t.mean(dim=0)
    sigma = t.std(dim=0, unbiased=False)
    if not bool((sigma > 0).all()):
        raise SigpropError(
            "datadep: a unit's pre-activation has zero variance over the probe batch; use more samples",
            field="samples",
        )
    g = 1.0 / sigma
    return wn(params.v, g, -mu / sigma)


CALIBRATIONS.add("datadep", _calibrate_datadep)


def _unnormalized_he(role, gen, device, dtype):
    """He init for every layer, W ~ N(0, 2/fan_in), b = 0, as De & Smith 2020 use for all its layers (also the
    last layer of a branch and the projection shortcut: docs/theory.md explains what that implies)."""
    w = gaussian(role, gen, device, dtype) * math.sqrt(2.0 / role.fan_in)
    return LayerParams(v=w, g=None, bias=None, scale=torch.ones(role.fan_out, device=device, dtype=dtype))


for _name in ("unnormalized-he", "skipinit", "skipinit-sqrt"):
    sampler(_name)(_unnormalized_he)


@sampler("gpt2")
def _gpt2(role, gen, device, dtype):
    """GPT-2's init (``inits.gpt2_std``): W ~ N(0, std^2) with std 0.02, or 0.02/sqrt(B) for a
    residual branch's last layer; b = 0; no weight normalization."""
    w = gaussian(role, gen, device, dtype) * inits.gpt2_std(role)
    return LayerParams(v=w, g=None, bias=None, scale=torch.ones(role.fan_out, device=device, dtype=dtype))


@sampler("neox")
def _neox(role, gen, device, dtype):
    """GPT-NeoX's init (``inits.neox_std``): small init, Wang's at a branch's last layer; b = 0."""
    w = gaussian(role, gen, device, dtype) * inits.neox_std(role)
    return LayerParams(v=w, g=None, bias=None, scale=torch.ones(role.fan_out, device=device, dtype=dtype))


@sampler("delta-orthogonal")
def _delta_orthogonal(role, gen, device, dtype):
    """Xiao et al. 2018: an orthogonal c_out x c_in matrix at the kernel's centre tap, zeros at the
    other taps; WN with the proposed gain sqrt(2 c_in / c_out).  The orthogonal matrix comes from
    the centre-tap columns of the shared Gaussian G (common random numbers with the other
    schemes), orthogonalized as ``proposed`` does (kernels/haar.py)."""
    k = math.isqrt(role.taps)
    centre = (k // 2) * k + k // 2
    g = gaussian(role, gen, device, dtype)
    v = torch.zeros_like(g)
    v[:, centre :: role.taps] = haar.orthogonalize(g[:, centre :: role.taps].contiguous())
    return _const_gain(v, math.sqrt(inits.proposed_gain_sq(role)))


@sampler("as-is")
def _as_is(role, gen, device, dtype):
    raise SigpropError("init 'as-is' keeps a model's own weights: there is nothing to draw", field="init")


@sampler("stage-hanin")
def _stage_hanin(role, gen, device, dtype):
    return _const_gain(
        haar.orthogonalize(gaussian(role, gen, device, dtype)), math.sqrt(inits.stage_hanin_gain_sq(role))
    )


# --------------------------------------------------------------------------------------------
# many draws (and layers) at once
# --------------------------------------------------------------------------------------------
#: where Haar directions of many draws (and chunks of layers) are orthogonalized in one batched
#: UT-transform call (haar.orthogonalize_batched) instead of one orgqr each: "cuda" (GEMM speed
#: there; on a CPU LAPACK's orgqr is as fast -- docs/benchmarks.md), "always", "never" (tests)
BATCHED_HAAR = "cuda"
#: at most this many layers are orthogonalized in one batched call (measured on the H100 in
#: issue 16: 32 layers of 1024^2, 0.21 ms per matrix against 1.1-1.6 ms for orgqr)
CHUNK_MAX = 32
#: peak temporaries of drawing one layer, in units of its weight matrix (haar.py: G, its
#: flipped square, the float64 cumulative sum (two units) -- then G, v, Q, Q diag(sign beta))
HAAR_TEMPORARIES = 4


def batched_haar(scheme: InitScheme, device) -> bool:
    return scheme.haar_gain_sq is not None and (
        BATCHED_HAAR == "always" or (BATCHED_HAAR == "cuda" and torch.device(device).type == "cuda")
    )


def haar_params(
    scheme: InitScheme, role: LayerRole, g: torch.Tensor, v_out: torch.Tensor | None = None
) -> LayerParams:
    """The parameters of layers whose scheme has ``haar_gain_sq``, from their Gaussians g
    [..., fan_out, fan_in] (any leading batch dims): one batched UT-transform Haar call, then
    the constant gain and the WN scale g / ||v|| -- what the scheme's sampler computes per layer."""
    lead = g.shape[:-2]
    q = haar.orthogonalize_batched(g.reshape(-1, *g.shape[-2:])).reshape(g.shape)
    v = q if v_out is None else v_out.copy_(q)
    gain = torch.full(
        (*lead, role.fan_out), math.sqrt(scheme.haar_gain_sq(role)), device=g.device, dtype=g.dtype
    )
    return LayerParams(v=v, g=gain, bias=None, scale=gain / torch.linalg.vector_norm(v, dim=-1))


def sample_layer(
    scheme: InitScheme, role: LayerRole, gens, device, dtype, v_out: torch.Tensor | None = None
) -> LayerParams:
    """One layer's parameters for a batch of draws, draw s from generator ``gens[s]`` (the same
    numbers as drawing it alone), stacked along a leading draw dim [S, ...].  The directions go
    into ``v_out`` when given (an arena slot: no stacked temporary), else a new tensor.  Haar
    directions on CUDA: the Gaussians of all draws are orthogonalized in one batched call."""
    if batched_haar(scheme, device):
        g = torch.stack([gaussian(role, gen, device, dtype) for gen in gens])
        return haar_params(scheme, role, g, v_out)
    if scheme.name in GAUSSIAN_SCHEMES:
        return _gaussian_draws(scheme, role, gens, device, dtype, v_out)
    v = _directions(len(gens), role, device, dtype, v_out)
    ps = []
    for s, gen in enumerate(gens):
        p = sample(scheme, role, gen, device, dtype)
        v[s].copy_(p.v)
        p.v = None
        ps.append(p)
    return LayerParams(
        v=v,
        g=_stack([p.g for p in ps]),
        bias=_stack([p.bias for p in ps]),
        scale=_stack([p.scale for p in ps]),
    )


def _directions(S: int, role: LayerRole, device, dtype, v_out) -> torch.Tensor:
    """Where S draws' directions [S, fan_out, fan_in] are written: ``v_out`` (their arena slot)
    or a new tensor."""
    if v_out is not None:
        return v_out
    return torch.empty(S, role.fan_out, role.fan_in, device=device, dtype=dtype)


def _stack(xs: list) -> torch.Tensor | None:
    """Per-draw tensors along a leading draw dim; one draw's as a view (a stack is a copy: one
    kernel per parameter and layer)."""
    if xs[0] is None:
        return None
    return xs[0].unsqueeze(0) if len(xs) == 1 else torch.stack(xs)


def calibrate_batch(calibrate, p: LayerParams, t_true: torch.Tensor) -> LayerParams:
    """A data-dependent init standardises each draw on its own pre-activations [S, N, out]."""
    ps = [
        calibrate(LayerParams(v=p.v[s], g=p.g[s], bias=p.bias[s], scale=p.scale[s]), t_true[s])
        for s in range(p.v.shape[0])
    ]
    stack = lambda xs: None if xs[0] is None else torch.stack(xs)
    return LayerParams(
        v=p.v,
        g=stack([q.g for q in ps]),
        bias=stack([q.bias for q in ps]),
        scale=stack([q.scale for q in ps]),
    )


def haar_chunk(scheme: InitScheme, widths: list[int], draws: int, device, itemsize: int, free: int) -> int:
    """How many dense layers are drawn per batched Haar call: 0 (per layer, as ever) unless the
    scheme's directions are Haar with a constant gain, batched Haar is on for the device
    (``BATCHED_HAAR``), the init is not data-dependent and layers 2..L share one shape; then up
    to CHUNK_MAX, as many as fit (with ~6 matrices of temporaries each) in a tenth of the
    ``free`` bytes, at least 2."""
    L = len(widths) - 1
    if not batched_haar(scheme, device) or scheme.standardizes or L < 3 or len(set(widths[1:])) != 1:
        return 0
    per_layer = 6 * draws * widths[1] * widths[1] * itemsize
    k = min(CHUNK_MAX, L - 1, int(0.1 * free // max(per_layer, 1)))
    return k if k >= 2 else 0
