"""The walker's arithmetic (torch): states held in log space, the affine map of a layer and its
transpose, bit-packed ReLU masks, batch norm and its vector-Jacobian product, arenas.

A state is unit rows u and float64 ln-norms c, h = exp(c) u, so that nothing under- or overflows
at any depth (an init that vanishes over 3000 layers reports ln-ratios of -1000, never 0 or nan);
the backward pass is linear in the error vector and renormalised the same way.  Weight
normalisation is a per-row scale of the matmul output (``LayerParams.scale``), never a
materialised g v/||v||.  No autograd graph is built.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch


@dataclass
class LayerParams:
    """One layer's parameters as the walker uses them: a = scale * (v @ h) + bias.

    For a WN layer scale = g / ||v_i|| (Arpit et al. 2019, eq. 1-2; Salimans & Kingma 2016,
    eq. 2): the normalisation is a per-row scale of the matmul output.  ``g`` is kept for the
    oracle and the curvature (which differentiate g v/||v||); None for an unnormalised layer.
    Every tensor may carry a leading draw dim [S, ...]."""

    v: torch.Tensor | None  # [fan_out, fan_in]; None once streamed away
    g: torch.Tensor | None  # [fan_out] WN gains, None for an unnormalised layer
    bias: torch.Tensor | None  # [fan_out] or None (zero)
    scale: torch.Tensor  # [fan_out]


def wn(v: torch.Tensor, g: torch.Tensor, bias: torch.Tensor | None = None) -> LayerParams:
    """A WN layer from its directions and gains: scale = g / ||v_i||."""
    norms = torch.linalg.vector_norm(v, dim=-1)
    return LayerParams(v=v, g=g, bias=bias, scale=g / norms)


def unstack(p: LayerParams | None, s: int) -> LayerParams | None:
    """Draw ``s`` of stacked parameters."""
    if p is None:
        return None
    pick = lambda t: None if t is None else t[s]
    return LayerParams(v=pick(p.v), g=pick(p.g), bias=pick(p.bias), scale=pick(p.scale))


# --------------------------------------------------------------------------------------------
# masks and arenas
# --------------------------------------------------------------------------------------------
_BITS: dict = {}
#: x * _GATHER >> 56 collects the low bit of each of the 8 bytes of x (little-endian: byte k
#: holds unit k) into one byte with unit k at bit k -- the layout of the fallback below
_GATHER = 0x0102040810204080


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Bit-pack a bool mask [..., n] into uint8 [..., ceil(n/8)]: 8 ReLU units per byte, unit k
    of a group at bit k.  One int64 multiply per 8 units (6x faster than a weighted sum); its top
    byte is the packed byte, read as a strided view of the product (the shift and the conversion
    were two more kernels per layer: issue 41's launch count).  The view is not contiguous: its
    users copy it (the mask arena) or gather from it (``mask_of``)."""
    n = mask.shape[-1]
    pad = (-n) % 8
    # bytes 0/1 (a bool's storage): a free view in eager; under torch.compile a conversion, since
    # torch 2.11's inductor cannot lower the bitcast of a bool (--fuse failed there on CPU and CUDA)
    mask = mask.to(torch.uint8) if torch.compiler.is_compiling() else mask.view(torch.uint8)
    if pad:
        mask = torch.nn.functional.pad(mask, (0, pad))
    mask = mask.contiguous()
    if sys.byteorder == "little":
        words = mask.view(torch.int64)
        return (words * _GATHER).view(torch.uint8)[..., 7::8]  # byte 7 of each word: bits 56-63
    bits = _BITS.get(mask.device)
    if bits is None:
        bits = _BITS[mask.device] = 2 ** torch.arange(8, dtype=torch.uint8, device=mask.device)
    return (mask.reshape(*mask.shape[:-1], -1, 8).to(torch.uint8) * bits).sum(dim=-1, dtype=torch.uint8)


#: per (device, dtype) the 256 x 8 table of the bits of every byte (unit k at bit k)
_TABLES: dict = {}


def mask_table(device, dtype) -> torch.Tensor:
    """The 256 x 8 table of the bits of every byte (unit k at bit k) in ``dtype``, made once."""
    key = (device, dtype)
    table = _TABLES.get(key)
    if table is None:
        bits = (torch.arange(256, device=device).unsqueeze(-1) >> torch.arange(8, device=device)) & 1
        table = _TABLES[key] = bits.to(dtype)
    return table


def mask_of(packed: torch.Tensor, n: int, dtype) -> torch.Tensor:
    """The ReLU mask [..., n] as 0/1 in ``dtype``: each byte looked up in the table of its 8 bits
    (one gather; shifting and masking every byte cost 9x as much on a CPU)."""
    return unpack(packed, mask_table(packed.device, dtype), n)


def unpack(packed: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """``mask_of`` with its table given (a compiled caller takes the table as an input)."""
    return torch.nn.functional.embedding(packed.long(), table).reshape(*packed.shape[:-1], -1)[..., :n]


def unpack_mask(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_mask`: the bool mask [..., n]."""
    return mask_of(packed, n, torch.uint8).bool()


def masked(y: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """y times the unpacked ReLU mask (none: no ReLU there, or the net's input)."""
    return y if packed is None else y.mul_(mask_of(packed, y.shape[-1], y.dtype))


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
        view = self.buf[self.used : self.used + k].view(shape)
        self.used += k
        return view

    def take(self, src: torch.Tensor) -> torch.Tensor:
        """A copy of ``src`` living in the arena."""
        return self.alloc(*src.shape).copy_(src)


def rows_arena(S: int, row_widths, device, dtype) -> Arena:
    """Room for every layer's per-row gains, biases and scales of S draws."""
    return Arena(3 * S * sum(row_widths), device, dtype)


def keep(p: LayerParams, rows: Arena, stream: bool) -> LayerParams:
    """What a layer keeps for the backward pass: its directions unless streaming, and its
    per-row gains, biases and scales copied into the ``rows`` arena (thousands of small tensors
    scattered between the per-layer temporaries pin heap pages: streaming 2000 layers of width
    256 kept 721 MiB of RSS that way, 358 MiB with the arena)."""
    take = lambda t: None if t is None else rows.take(t)
    return LayerParams(v=None if stream else p.v, g=take(p.g), bias=take(p.bias), scale=take(p.scale))


# --------------------------------------------------------------------------------------------
# log space
# --------------------------------------------------------------------------------------------
def normalize(y: torch.Tensor, inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row unit normalisation over the last dim: returns (y / ||y||, ln ||y|| in float64);
    zero rows stay zero with ln-norm -inf.  ``inplace``: y is a temporary and is overwritten.
    The divisor is the norm raised to the dtype's smallest normal number (``safe``): one kernel
    where ``where(norm > 0, norm, 1)`` took two, the same quotient for every norm but a subnormal
    one (a row whose entries are all below 1e-38 and not all zero, which unit rows times a layer
    do not produce), a zero row 0 either way."""
    norm = torch.linalg.vector_norm(y, dim=-1)
    s = safe(norm).unsqueeze(-1)
    return (y.div_(s) if inplace else y / s), torch.log(norm.to(torch.float64))


def safe(norm: torch.Tensor) -> torch.Tensor:
    """A divisor for rows of these norms: the norm, or the smallest normal number of its dtype
    where it is smaller (0: a zero row, which stays 0).  A normal bound, not the smallest
    subnormal: hardware that flushes subnormals to zero would read that as 0."""
    return norm.clamp_min(torch.finfo(norm.dtype).tiny)


def col(c: torch.Tensor, dtype) -> torch.Tensor:
    """exp of per-row log factors [..., N] as a column [..., N, 1] in the compute dtype."""
    return torch.exp(c).to(dtype).unsqueeze(-1)


def transpose(v: torch.Tensor) -> torch.Tensor:
    return v.transpose(-1, -2)


#: the matmul of every dense layer, forward and backward: one seam, so that
#: benchmarks/tf32_bias.py can emulate reduced-precision operands on a CPU
mm = torch.matmul


def combine_(sc, su, fc, fu, fb):
    """exp(sc) su + exp(fc) fu in log space, written into ``fu`` (a temporary): (unit rows,
    ln-norms).  su: unit rows (or zero); fu: any rows, exp(fc) fu of ln-norm ``fb``.  The larger
    ln-norm M = max(sc, fb) is factored out, so both coefficients applied are <= 1 relative to
    their rows' norms: nothing overflows.  Either term may be -inf.  Two passes over the rows and
    the normalisation's two, no allocation of their size."""
    # a non-finite M (both terms -inf: a zero row) factors out nothing: one kernel, where
    # ``where(isfinite(M), M, 0)`` took six (isfinite's abs, ne, eq, and; zeros; where)
    M = torch.nan_to_num(torch.maximum(sc, fb), nan=0.0, posinf=0.0, neginf=0.0)
    y = fu.mul_(col(fc - M, fu.dtype)).addcmul_(su, col(sc - M, fu.dtype))
    u, ln_norm = normalize(y, inplace=True)
    return u, M + ln_norm


def rescale(G: torch.Tensor, acc: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """G divided by its RMS row norm per draw, the log of that scale accumulated in ``acc``
    (plain-float states: the batch-normalized nets)."""
    S, n = G.shape[0], G.shape[-2]
    scale = torch.linalg.vector_norm(G, dim=(-2, -1), keepdim=True) / math.sqrt(n)
    ln = torch.log(scale.to(torch.float64)).reshape(S, 1)
    return G / scale, ln if acc is None else acc + ln


def ln_rows(X: torch.Tensor) -> torch.Tensor:
    return torch.log(torch.linalg.vector_norm(X, dim=-1).to(torch.float64))


# --------------------------------------------------------------------------------------------
# batch norm (De & Smith 2020, appendix A): training mode, gamma = 1, beta = 0
# --------------------------------------------------------------------------------------------
def bn(X: torch.Tensor, eps: float, dims=-2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per channel over the batch (``dims``: -2, or for conv outputs [S, N, c, P] the batch and
    the positions, (1, 3)), biased variance.  Returns (Y, s = sqrt(var + eps), mean, var)."""
    mu = X.mean(dim=dims, keepdim=True)
    var = X.var(dim=dims, unbiased=False, keepdim=True)
    s = torch.sqrt(var + eps)
    return (X - mu) / s, s, mu, var


def bn_backward(dY: torch.Tensor, Y: torch.Tensor, s: torch.Tensor, dims=-2) -> torch.Tensor:
    """Vector-Jacobian product of ``bn``: dX = (dY - mean(dY) - Y mean(dY * Y)) / s."""
    return (dY - dY.mean(dim=dims, keepdim=True) - Y * (dY * Y).mean(dim=dims, keepdim=True)) / s


def bn_record(X, mu, var) -> torch.Tensor:
    """Per draw: variance of x over channels and examples, mean per-channel batch variance, mean
    squared per-channel batch mean -> [S, 3]."""
    X64 = X.to(torch.float64)
    return torch.stack(
        [
            X64.reshape(X.shape[0], -1).var(dim=1, unbiased=False),
            var.to(torch.float64).mean(dim=(-2, -1)),
            (mu.to(torch.float64) ** 2).mean(dim=(-2, -1)),
        ],
        dim=1,
    )
