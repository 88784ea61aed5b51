"""One draw of a model measured at its sites (docs/theory.md §13): per sample the forward ratio
rms(h_site)/rms(x) and the backward ratio rms(dl/dh_site)/rms(dl/dy) for l = <e, y>, by forward
hooks on the site modules and hooks on their outputs' gradients; at a site whose output is a
sequence of tokens, the mean cosine between the tokens of one sample (docs/theory.md §15)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from sigprop.errors import SigpropError
from sigprop.model.attention import AttentionReader
from sigprop.model.build import check_finite, output_tensor
from sigprop.model.forward import call
from sigprop.model.sites import call_name, module_of

#: the chunk over which ``mean_squares`` sums squares in the state's own precision
SQUARES_CHUNK = 1024


def mean_squares(t: torch.Tensor) -> torch.Tensor:
    """Per sample (row) the mean of the squares of ``t``'s elements, float64 [N].  A float32 state
    is summed in chunks of ``SQUARES_CHUNK`` by ``vector_norm`` (one fused pass, no copy) and the
    chunks' squares added in float64: 3e-8 relative against a float64 sum on 4.7M elements, where
    one float32 ``vector_norm`` over the row was 2e-3 off at 19M and ``.double().pow(2)`` a copy
    and 7x the time (the sites of a UNet were a third of a probe).  A row whose mean square leaves
    [1e-30, 1e30] -- squares that could under- or overflow float32 -- is summed in float64."""
    rows = t.reshape(t.shape[0], -1)
    n = rows.shape[1]
    if rows.dtype != torch.float32 or n < SQUARES_CHUNK:
        return rows.double().pow(2).mean(1)
    m = n // SQUARES_CHUNK
    head = torch.linalg.vector_norm(rows[:, : m * SQUARES_CHUNK].reshape(-1, m, SQUARES_CHUNK), dim=2)
    ms = (head.double().pow(2).sum(1) + rows[:, m * SQUARES_CHUNK :].double().pow(2).sum(1)) / n
    bad = ~torch.isfinite(ms) | (ms < 1e-30) | (ms > 1e30)
    if bool(bad.any()):
        ms[bad] = rows[bad].double().pow(2).mean(1)
    return ms


def token_cosine(t: torch.Tensor) -> torch.Tensor:
    """Per sample of a [N, T, d] state the mean cosine between its T tokens (rows), float64 [N]:
    with u_t = h_t/||h_t||, sum_{t != s} u_t . u_s / (T (T - 1)) = (||sum_t u_t||^2 - sum_t
    ||u_t||^2) / (T (T - 1)) -- one pass, no T x T matrix; a zero token counts as cosine 0 with
    every other.  The unit vectors in the state's precision (float32: 1e-7 relative per token),
    their sums in float64."""
    T = t.shape[1]
    t = t.detach()
    u = torch.nn.functional.normalize(t if t.dtype in (torch.float32, torch.float64) else t.float(), dim=-1)
    total = u.sum(1).double().pow(2).sum(-1)
    own = u.double().pow(2).sum((1, 2))
    return (total - own) / (T * (T - 1))


@dataclass
class SiteMeasures:
    """One draw at the sites: ln of the forward and backward per-element RMS ratios per sample
    (float64 [E, N]), each site's units per sample, whether the output's gradient reached each
    site, the mean cosine between the tokens of one sample (float64 [E, N]; nan at a site whose
    output is no token sequence) and the normalised entropy of the attention inside each site
    (float64 [E, N], ``attention.AttentionReader``; nan: no attention read there)."""

    ln_f: np.ndarray
    ln_b: np.ndarray
    units: list[int]
    reached: list[bool]
    cosine: np.ndarray
    entropy: np.ndarray


def measure(
    model: nn.Module,
    x: torch.Tensor,
    e_seed: int,
    sites: list[str],
    batch: int | None = None,
    what: str = "the model",
    tokens: int | None = None,
) -> SiteMeasures:
    """``SiteMeasures``: ln of the forward and backward per-element RMS ratios at every site, per
    sample; each site's units per sample; whether the output's gradient reached each site (a site
    off the output's path -- a side head, BERT's pooler beside ``last_hidden_state`` -- has no
    backward ratio: its ln is -inf here, and the kind marks it); and, with ``tokens`` = T (the
    sequence length of the inputs), the token cosine (``token_cosine``) at every site whose
    output per sample is [T, d] -- tokens first, features last.
    Token ids (an integer ``x``) have no scale: the forward ratios are then relative to the first
    site.  The error e at the output is drawn once for all N samples from ``e_seed`` (the same for
    every init and draw).  ``batch``: the samples run in chunks of that many, each chunk's graph
    freed before the next (the memory of one chunk; a batch norm then normalises each chunk by its
    own statistics)."""
    xs = x if isinstance(x, tuple) else (x,)
    N = xs[0].shape[0]
    step = N if batch is None else max(1, min(batch, N))
    m = _Measurement(model, sites, e_seed, N, what, tokens)
    for lo in range(0, N, step):
        m.chunk(lo, tuple(t[lo : lo + step].detach().requires_grad_(t.is_floating_point()) for t in xs))
    ln_f = torch.stack([torch.cat(m.parts_f[n]) for n in sites])
    ln_b = torch.stack([torch.cat(m.parts_b[n]) for n in sites])
    cos = torch.stack([torch.cat(m.parts_c[n]) for n in sites])
    ent = torch.stack([torch.cat(m.parts_h[n]) for n in sites])
    return SiteMeasures(
        ln_f.cpu().numpy(),
        ln_b.cpu().numpy(),
        [m.numel[n] for n in sites],
        [n in m.reached for n in sites],
        cos.cpu().numpy(),
        ent.cpu().numpy(),
    )


class _Measurement:
    """``measure``'s state over the chunks: the sites' hooks, per site its ln ratios per chunk
    (``parts_f``, ``parts_b``), its units per sample, whether the gradient reached it, and the
    errors of all N samples (drawn once, at the first chunk's output)."""

    def __init__(
        self, model: nn.Module, sites: list[str], e_seed: int, N: int, what: str, tokens: int | None
    ) -> None:
        self.model, self.sites, self.e_seed, self.N, self.what = model, sites, e_seed, N, what
        self.tokens = tokens
        self.parts_c: dict[str, list] = {n: [] for n in sites}
        self.parts_h: dict[str, list] = {n: [] for n in sites}
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.parts_f: dict[str, list] = {n: [] for n in sites}
        self.parts_b: dict[str, list] = {n: [] for n in sites}
        self.numel: dict[str, int] = {}
        self.reached: set[str] = set()
        self.e_all: torch.Tensor | None = None

    def per_sample_ms(self, t: torch.Tensor, where: str = "") -> torch.Tensor:
        ms = mean_squares(t.detach())
        if where and not bool(torch.isfinite(ms).all()):
            raise SigpropError(
                f"{self.what}: {where} is too large to square in float64 (its mean square overflows): "
                "rescale the inputs",
                field="target",
            )
        return ms

    def hook(self, path: str, rows: int, fwd: dict, bwd: dict, cos: dict):
        """The forward hook of module ``path``: at each call that is a site (``sites.call_name``:
        a module the forward calls several times is a site per call), its mean squares per
        sample, and a hook on its output's gradient for the backward ones."""
        calls = [0]

        def fn(mod, args, out):
            name = call_name(path, calls[0])
            calls[0] += 1
            if name not in self.parts_f:
                return
            t = output_tensor(out, f"site {name!r}'s output")
            if t.shape[0] != rows:
                raise SigpropError(
                    f"site {name!r}'s output has {t.shape[0]} rows for {rows} samples: not a "
                    "per-sample state",
                    field="sites",
                )
            fwd[name] = self.per_sample_ms(t, f"site {name!r}'s output")
            T = self.tokens
            if T is not None and T > 1 and t.dim() == 3 and t.shape[1] == T and t.is_floating_point():
                cos[name] = token_cosine(t)
            self.numel[name] = t[0].numel()
            if not t.requires_grad and t.grad_fn is None and t.is_floating_point():
                t.requires_grad_(True)  # token inputs: the graph starts at the first site
            if t.requires_grad:
                t.register_hook(lambda g: bwd.__setitem__(name, self.per_sample_ms(g)))

        return fn

    def chunk(self, lo: int, xc: tuple) -> None:
        """One chunk of samples from row ``lo``: forward with the hooks, backward with its errors,
        and its ln ratios per site."""
        rows = xc[0].shape[0]
        fwd: dict[str, torch.Tensor] = {}
        bwd: dict[str, torch.Tensor] = {}
        cos: dict[str, torch.Tensor] = {}
        paths = dict.fromkeys(module_of(n) for n in self.sites)  # one hook per module, in order
        handles = [self.modules[p].register_forward_hook(self.hook(p, rows, fwd, bwd, cos)) for p in paths]
        # sequences: the attention calls read beside the forward (their weights' entropy)
        reader = AttentionReader(self.model) if self.tokens is not None else None
        try:
            with torch.enable_grad():
                with reader or contextlib.nullcontext():
                    y = output_tensor(call(self.model, xc if len(xc) > 1 else xc[0]))
                check_finite(y.detach(), f"{self.what}'s output on the probe's inputs")
                if self.e_all is None:  # all N errors at once: the same e whatever the chunks
                    gen = torch.Generator(device=y.device).manual_seed(self.e_seed)
                    self.e_all = torch.randn(
                        (self.N, *y.shape[1:]), generator=gen, device=y.device, dtype=y.dtype
                    )
                e = self.e_all[lo : lo + rows]
                if y.requires_grad:
                    torch.autograd.backward(y, grad_tensors=e)
        finally:
            for h in handles:
                h.remove()
        missing = [n for n in self.sites if n not in fwd]
        if missing:
            raise SigpropError(f"site {missing[0]!r} was not called by the model's forward", field="sites")
        # token ids have no scale: the forward ratios are then relative to the first site; several
        # inputs: their elements together
        if all(t.is_floating_point() for t in xc):
            ms_x = sum(self.per_sample_ms(t, "the input") * t[0].numel() for t in xc) / sum(
                t[0].numel() for t in xc
            )
        else:
            ms_x = fwd[self.sites[0]]
        ms_e = self.per_sample_ms(e)
        # a site the output's gradient never reaches (its hook never ran): -inf here, marked off the
        # path by the kind; one it reaches with dl/dh = 0 (a dead ReLU) reads ratio 0 too
        zero = torch.full((rows,), -math.inf, dtype=torch.float64, device=xc[0].device)
        self.reached |= set(bwd)
        for n in self.sites:
            self.parts_f[n].append(0.5 * (fwd[n] / ms_x).log())
            self.parts_b[n].append(0.5 * (bwd[n] / ms_e).log() if n in bwd else zero)
            self.parts_c[n].append(cos[n] if n in cos else torch.full_like(zero, math.nan))
            h = None if reader is None else reader.at(n)
            self.parts_h[n].append(torch.full_like(zero, math.nan) if h is None else h.to(zero.device))
