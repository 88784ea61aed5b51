"""One walker over plans, with measurements as observers (issue 17).

A plan (``sigprop.plans``: a flat sequence of steps) is compiled into *units*: the steps between
two ``Record``s.  Five unit kinds exist today --

* ``DenseLayer``: a linear (WN or plain) layer and its ReLU (a layer of the MLP, Arpit et al.
  2019, eq. 1-5), recorded forward at its output h^l = ReLU(a^l) and backward at its
  pre-activation, delta^l = dl/da^l (eq. 4-5);
* ``ResidualBlock``: Open, the branch's layers, Close (identity or projection skip, alpha),
  recorded at the block output h^b both ways (h^b and dl/dh^b; Arpit et al. 2019, eq. 6);
* ``ConvLayer``: a ``DenseLayer`` whose matmul is a k x k convolution (the plain CNN's layers,
  the WRN's conv1), recorded as the dense layer is; a ``ResidualBlock`` of conv ops is the WRN's
  block;
* ``BNLayer``: BatchNorm -> ReLU -> linear, as the stem (x^1 = W^0 BN(x^0)^+) or as a residual
  block (x^{l+1} = x^l + W^l BN(x^l)^+) of the BN ResNet of De & Smith 2020, appendix C,
  recorded at its output x^{l+1} both ways;
* ``BNConvUnit``: the batch-normalized WRN's conv1 and blocks (convs each followed by
  training-mode BN), recorded at their outputs both ways --

and ``walk`` runs any sequence of them: forward unit by unit, then backward from the top Record
to the first recorded one, each unit (each way) one step of a ``replay`` runner (eager, or a
CUDA graph), weights stored in an arena or redrawn from their generators (streamed), every
draw of a batch along a leading dim.  The walker measures nothing itself: it hands each
recorded state (and each unit's output) to its **observers** -- ``ForwardRatio``,
``BackwardRatio``, ``BranchRatio``, ``BNStatistics``, ``Correlation`` -- which own their
buffers.  Adding a unit kind is one class with ``forward``/``backward`` (and its sizes); adding a
measurement is one observer class.

The numbers are those of the three hand-written walkers this replaced (0.4.0's ``mlp_batch``,
``resnet_batch``, ``bn_batch``) bit for bit on a CPU: the same kernels on the same data in the
same order (``benchmarks/golden.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Sequence

import torch

from sigprop import engine as E
from sigprop import inits as inits_mod
from sigprop import plans, replay, theory
from sigprop.inits import InitScheme, LayerParams, LayerRole


# --------------------------------------------------------------------------------------------
# state spaces: how a unit's state is held and how its norm is read
# --------------------------------------------------------------------------------------------
class LogSpace:
    """Per-sample log space (the WN nets): a state is unit rows u and float64 ln-norms c,
    h = exp(c) u; a gradient is unit rows d and ln-norms acc.  Nothing under- or overflows at
    any depth (``engine._linear``)."""

    def start(self, x: torch.Tensor, S: int) -> tuple[dict, torch.Tensor]:
        u, c = E._normalize(x.expand(S, *x.shape))
        return {"u": u, "c": c}, c.clone()

    def ln_forward(self, state: dict, ref: torch.Tensor, out: torch.Tensor) -> None:
        torch.sub(state["c"], ref, out=out)

    def rows(self, state: dict) -> torch.Tensor:
        """Rows proportional to the state's (unit rows; zero rows stay zero)."""
        return state["u"]

    def grad_start(self, e: torch.Tensor, S: int) -> tuple[dict, torch.Tensor | None]:
        d, _ = E._normalize(e.expand(S, *e.shape))
        return {"d": d, "acc": torch.zeros(S, e.shape[0], dtype=torch.float64, device=e.device)}, None

    def ln_backward(self, grad: dict, ref, out: torch.Tensor) -> None:
        out.copy_(grad["acc"])


class PlainSpace:
    """Plain floats (the BN net: batch statistics couple the samples, so there is no
    per-sample renormalisation; the skip variance grows only linearly).  The gradient, linear in
    the whole error matrix, is renormalised by one scalar per draw (``acc`` [S, 1])."""

    def start(self, x: torch.Tensor, S: int) -> tuple[dict, torch.Tensor]:
        return {"X": x.expand(S, *x.shape)}, E._ln_rows(x)

    def ln_forward(self, state: dict, ref: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(E._ln_rows(state["X"]) - ref)

    def rows(self, state: dict) -> torch.Tensor:
        return state["X"]

    def grad_start(self, e: torch.Tensor, S: int) -> tuple[dict, torch.Tensor]:
        G, acc = _rescale(e.expand(S, *e.shape), None)
        return {"G": G, "acc": acc}, E._ln_rows(e)

    def ln_backward(self, grad: dict, ref: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(grad["acc"] + E._ln_rows(grad["G"]) - ref)


def _rescale(G: torch.Tensor, acc: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """G divided by its RMS row norm per draw, the log of that scale accumulated in ``acc``."""
    S, n = G.shape[0], G.shape[-2]
    scale = torch.linalg.vector_norm(G, dim=(-2, -1), keepdim=True) / math.sqrt(n)
    ln = torch.log(scale.to(torch.float64)).reshape(S, 1)
    return G / scale, ln if acc is None else acc + ln


# --------------------------------------------------------------------------------------------
# the walk: one context, one skeleton
# --------------------------------------------------------------------------------------------
def _no_reseed() -> None:
    pass


class Walk:
    """What every unit of one walk shares: the init, the draws and their generators (one
    ``LayerGenerators`` per layer slot of the widest unit), the runner, where weights, masks and
    per-row parameters are kept, the space, and the forward reference ln-norms."""

    def __init__(self, units, scheme: InitScheme, space, x, seed: int, draws, stream: bool, runner, keep: bool) -> None:
        self.units, self.scheme, self.space = units, scheme, space
        self.device, self.dtype = x.device, x.dtype
        self.seed, self.draws = seed, list(draws)
        self.S, self.n = len(self.draws), x.shape[0]
        self.stream, self.runner, self.keep = stream, runner, keep
        self.store = keep and not stream  # directions kept for the backward pass
        self.slots = [E.LayerGenerators(seed, self.draws, self.device) for _ in range(max(len(u.layer_ids) for u in units))]
        self.chunks = HaarChunks.maybe(self)
        runner.bind([g for s in self.slots for g in s.gens] + ([] if self.chunks is None else self.chunks.generators()))
        S, n = self.S, self.n
        self.weights = E.Arena(S * sum(u.weight_count for u in units), self.device, self.dtype) if self.store else None
        self.masks = E.Arena(S * n * sum(u.mask_bytes for u in units), self.device, torch.uint8) if keep else None
        self.rows = E._rows_arena(S, [w for u in units for w in u.row_widths], self.device, self.dtype) if keep else None
        self.ref: torch.Tensor | None = None

    def sample(self, role: LayerRole, slot: int, v_out=None) -> LayerParams:
        """One layer's parameters for every draw from generator slot ``slot`` (reseeded by the step)."""
        return E.sample_layer(self.scheme, role, self.slots[slot].gens, self.device, self.dtype, v_out)

    def reseeder(self, unit) -> Callable[[], None]:
        fns = [self.slots[j].reseeder(lid) for j, lid in enumerate(unit.layer_ids)]
        return fns[0] if len(fns) == 1 else (lambda: [f() for f in fns])

    def slot(self, role: LayerRole) -> torch.Tensor | None:
        """Where a layer's stored directions go (None when they are not stored)."""
        return self.weights.alloc(self.S, role.fan_out, role.fan_in) if self.store else None

    def kept_params(self, out: dict, slot: torch.Tensor | None, j: str = "") -> LayerParams:
        """What a layer keeps for the backward pass, from its step's outputs (keys v, g, bias,
        scale, each suffixed by ``j``): its directions in ``slot`` (None when streaming; copied
        there when a replayed step drew into its own buffer) and its per-row parameters in the
        rows arena (``engine._keep``)."""
        if slot is not None and out[f"v{j}"].data_ptr() != slot.data_ptr():
            slot.copy_(out[f"v{j}"])
        return E._keep(LayerParams(v=slot, g=out[f"g{j}"], bias=out[f"bias{j}"], scale=out[f"scale{j}"]), self.rows, self.stream)


@dataclass
class Walked:
    """A walk's observations ({observer name: tensor}) and what each unit kept (for the oracle)."""

    observed: dict
    kept: list


def walk(units: Sequence, scheme: InitScheme, x: torch.Tensor, e: torch.Tensor | None, seed: int, draws,
         observers: Sequence, record_input: bool, space=None, progress: Callable[[], None] | None = None,
         stream: bool = False, runner: replay.Eager | None = None) -> Walked:
    """Run ``units`` on inputs x [N, n_0] for S = len(draws) draws at once: forward unit by unit,
    then (``e`` given: the error vectors at the top [N, n_top]) backward to the first recorded
    state.  Entries: the input when ``record_input``, then each unit's output.  Each observer
    sees every entry's state forward and gradient backward.  A data-dependent init runs eagerly
    (its calibration reads the batch on the host), as does a plan with a unit that is not
    ``replayable``."""
    space = space or LogSpace()
    if runner is None or scheme.calibrate is not None or not all(u.replayable for u in units):
        runner = replay.Eager()
    w = Walk(units, scheme, space, x, seed, draws, stream, runner, keep=e is not None)
    first = 0 if record_input else 1
    entries = len(units) + int(record_input)
    for obs in observers:
        obs.start(w, entries)
    state, w.ref = space.start(x, w.S)
    if record_input:
        for obs in observers:
            obs.forward(w, 0, state, None)
    kept = []
    for i, unit in enumerate(units):
        state, out, k = unit.forward(w, i, state)
        kept.append(k)
        for obs in observers:
            obs.forward(w, i + int(record_input), state, out)
        if progress is not None:
            progress()
    if e is not None:
        grad, ref = space.grad_start(e, w.S)
        for obs in observers:
            obs.top(w, entries - 1)
        for i in range(len(units) - 1, first - 1, -1):
            grad = units[i].backward(w, i, grad, kept[i], kept[i - 1] if i > 0 else None)
            for obs in observers:
                obs.backward(w, i - 1 + int(record_input), grad, ref)
            if progress is not None:
                progress()
    return Walked({obs.name: obs.result() for obs in observers}, kept)


# --------------------------------------------------------------------------------------------
# observers
# --------------------------------------------------------------------------------------------
class Observer:
    """A measurement: ``start`` allocates, ``forward``/``backward`` see each entry, ``result`` is
    its tensor.  The base class ignores everything (override what you measure)."""

    name = ""

    def start(self, w: Walk, entries: int) -> None:
        pass

    def forward(self, w: Walk, entry: int, state: dict, out: dict | None) -> None:
        pass

    def top(self, w: Walk, entry: int) -> None:
        pass

    def backward(self, w: Walk, entry: int, grad: dict, ref) -> None:
        pass

    def result(self):
        return None


class ForwardRatio(Observer):
    """ln ||h|| / ||x|| per draw, entry and sample [S, E, N] (float64)."""

    name = "fwd"

    def start(self, w, entries):
        self.buf = torch.empty(w.S, entries, w.n, dtype=torch.float64, device=w.device)

    def forward(self, w, entry, state, out):
        w.space.ln_forward(state, w.ref, self.buf[:, entry])

    def result(self):
        return self.buf


class BackwardRatio(ForwardRatio):
    """ln ||dl/d(entry)|| / ||e|| [S, E, N]: the top entry is the reference (0)."""

    name = "bwd"

    def forward(self, w, entry, state, out):
        pass

    def top(self, w, entry):
        self.buf[:, entry].zero_()  # a fill kernel: no Python scalar lifted onto the device

    def backward(self, w, entry, grad, ref):
        w.space.ln_backward(grad, ref, self.buf[:, entry])


class BranchRatio(Observer):
    """ln ||alpha F(h)|| / ||h|| of every residual unit [S, B, N] (units that report ``branch``)."""

    name = "branch"

    def start(self, w, entries):
        count = sum(1 for u in w.units if u.branch)
        self.buf = torch.empty(w.S, count, w.n, dtype=torch.float64, device=w.device)
        self.k = 0

    def forward(self, w, entry, state, out):
        if out is not None and "branch" in out:
            self.buf[:, self.k].copy_(out["branch"])
            self.k += 1

    def result(self):
        return self.buf


class BNStatistics(Observer):
    """Per draw and entry: the variance of x over channels and examples, the mean per-channel
    batch variance and the mean squared per-channel batch mean [S, E, 3] (De & Smith 2020,
    appendix B: the statistics a BN layer at x would record)."""

    name = "bn"

    def start(self, w, entries):
        self.buf = torch.empty(w.S, entries, 3, dtype=torch.float64, device=w.device)

    def forward(self, w, entry, state, out):
        X = state["X"]
        mu = X.mean(dim=-2, keepdim=True)
        var = X.var(dim=-2, unbiased=False, keepdim=True)
        self.buf[:, entry] = E._bn_record(X, mu, var)

    def result(self):
        return self.buf


class Correlation(Observer):
    """The cosine of the two forward states of each input pair [S, E, P], computed in float64
    (so it stays in [-1, 1] to rounding whatever the compute dtype; nan where a state is zero,
    e.g. an all-dead ReLU layer): the walk's samples are P pairs, rows i and P + i
    (``engine.pair_inputs``)."""

    name = "correlation"

    def start(self, w, entries):
        self.pairs = w.n // 2
        self.buf = torch.empty(w.S, entries, self.pairs, dtype=torch.float64, device=w.device)

    def forward(self, w, entry, state, out):
        r = w.space.rows(state).to(torch.float64)
        a, b = r[:, :self.pairs], r[:, self.pairs:]
        norms = torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1)
        dot = (a * b).sum(dim=-1)
        torch.where(norms > 0, dot / torch.where(norms > 0, norms, torch.ones_like(norms)), torch.full_like(dot, math.nan),
                    out=self.buf[:, entry])

    def result(self):
        return self.buf


# --------------------------------------------------------------------------------------------
# unit kinds
# --------------------------------------------------------------------------------------------
class DenseOp:
    """The affine map of a dense layer in log space (``engine._linear``) and its transpose
    (``engine._vjp``): what a unit applies to a state's rows."""

    def __init__(self, role: LayerRole) -> None:
        self.role = role
        self.units_in, self.units_out = role.fan_in, role.fan_out

    def key(self, by_block_index: bool):
        """What a replayed step's identity depends on (sigprop/replay.py)."""
        return self.role if by_block_index else replace(self.role, block_index=0)

    def forward(self, p: LayerParams, u, c, relu: bool, calibrate=None):
        return E._linear(p, u, c, relu=relu, calibrate=calibrate)

    def vjp(self, p: LayerParams, d: torch.Tensor) -> torch.Tensor:
        return E._vjp(p, d)


class ConvOp(DenseOp):
    """A k x k convolution (``plans.Conv``: zero padding, stride) in the same log space: the
    state rows are the C x H x W units flattened; the S draws run as S groups of one grouped conv
    (input [N, S C, H, W], weights [S c_out, C, k, k]), so one kernel serves every draw.  WN is
    the per-row scale of ``engine._linear`` (a row: one output channel's c_in k^2 kernel
    entries); a data-dependent init standardises each channel over the batch and the positions.
    The transpose is the conv's input gradient (``torch.nn.grad.conv2d_input``)."""

    def __init__(self, step: "plans.Conv") -> None:
        super().__init__(step.role)
        self.step = step
        self.units_in, self.units_out = math.prod(step.shape_in), math.prod(step.shape_out)

    def key(self, by_block_index: bool):
        return replace(self.step, role=super().key(by_block_index))

    def conv(self, v: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """The conv of rows X [S, N, units_in] with the directions v [S, c_out, c_in k^2] as
        kernels, one grouped conv for the S draws: [S, N, c_out, H' W']."""
        st, (S, N) = self.step, X.shape[:2]
        C, H, W = st.shape_in
        co = self.role.fan_out
        x = X.reshape(S, N, C, H, W).transpose(0, 1).reshape(N, S * C, H, W)
        t = torch.nn.functional.conv2d(x, v.reshape(S * co, C, st.kernel, st.kernel), stride=st.stride, padding=st.padding, groups=S)
        return t.reshape(N, S, co, -1).transpose(0, 1)

    def conv_t(self, v: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        """The transpose of ``conv`` (its input gradient) applied to G [S, N, c_out, H' W']: [S, N, units_in]."""
        st, (S, N) = self.step, G.shape[:2]
        C, H, W = st.shape_in
        co = self.role.fan_out
        g = G.transpose(0, 1).reshape(N, S * co, *st.out_hw())
        y = torch.nn.grad.conv2d_input((N, S * C, H, W), v.reshape(S * co, C, st.kernel, st.kernel), g, stride=st.stride,
                                       padding=st.padding, groups=S)
        return y.reshape(N, S, self.units_in).transpose(0, 1)

    def forward(self, p: LayerParams, u, c, relu: bool, calibrate=None):
        S, N = u.shape[:2]
        t = self.conv(p.v, u)
        if calibrate is not None:  # per channel over the batch and the positions: [S, N H' W', c_out]
            vnorm = torch.linalg.vector_norm(p.v, dim=-1)
            t_true = (E._col(c, t.dtype)[..., None] * t / vnorm[:, None, :, None]).transpose(-1, -2).reshape(S, -1, self.role.fan_out)
            p = E._calibrate_batch(calibrate, p, t_true)
        a = t * p.scale[:, None, :, None]
        if p.bias is not None:  # as engine._linear: exp(m) (exp(c - m) scale t + exp(-m) b), m = max(c, 0)
            m = torch.clamp(c, min=0.0)
            a = a * torch.exp(c - m).to(a.dtype)[..., None, None] + torch.exp(-m).to(a.dtype)[..., None, None] * p.bias[:, None, :, None]
        else:
            m = c
        a = a.reshape(S, N, self.units_out)
        mask = a > 0 if relu else None
        u, ln_norm = E._normalize(torch.relu_(a) if relu else a, inplace=True)
        return u, m + ln_norm, mask, p

    def vjp(self, p: LayerParams, d: torch.Tensor) -> torch.Tensor:
        S, N = d.shape[:2]
        return self.conv_t(p.v, d.reshape(S, N, self.role.fan_out, -1) * p.scale[:, None, :, None])


def _masked(y: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """y times the unpacked ReLU mask (none: no ReLU there, or the net's input)."""
    return y if packed is None else y.mul_(E.unpack_mask(packed, y.shape[-1]))


@dataclass
class KeptLayer:
    """What a dense layer keeps for the backward pass: its parameters (directions unless
    streaming) and its bit-packed ReLU mask."""

    params: LayerParams
    packed: torch.Tensor | None


class DenseLayer:
    """Linear(role) -> ReLU: one MLP layer, generator ``layer``; recorded forward at its output
    h = ReLU(a), backward at its pre-activation (dl/da).
    Backward (Arpit et al. 2019, eq. 5): delta^{l-1} = 1(a^{l-1} > 0) * (v^T (scale * delta^l)),
    the mask being the layer below's (none below the first layer).  ``op``: the layer's map
    (``DenseOp``; ``ConvLayer`` a ``ConvOp``); ``relu`` False: no ReLU (a conv net's stem)."""

    branch = False
    #: its step outputs may live in a replayed step's static buffers: what it keeps is copied out
    replayable = True

    def __init__(self, role: LayerRole, layer: int, op: DenseOp | None = None, relu: bool = True) -> None:
        self.role, self.layer, self.relu = role, layer, relu
        self.op = op or DenseOp(role)
        self.layer_ids = [layer]
        self.weight_count = role.fan_out * role.fan_in
        self.mask_bytes = (self.op.units_out + 7) // 8 if relu else 0
        self.row_widths = [role.fan_out]

    def _forward(self, u, c, w: Walk, v_out=None):
        p = w.sample(self.role, 0, v_out)
        u, c, mask, p = self.op.forward(p, u, c, self.relu, w.scheme.calibrate)
        out = {"u": u, "c": c, "v": p.v, "g": p.g, "bias": p.bias, "scale": p.scale}
        if mask is not None:
            out["packed"] = E.pack_mask(mask)
        return out

    def _forward_given(self, u, c, v, scale):
        """The layer with directions drawn by ``HaarChunks``."""
        u, c, mask, _ = E._linear(LayerParams(v=v, g=None, bias=None, scale=scale), u, c, relu=True)
        return {"u": u, "c": c, "packed": E.pack_mask(mask)}

    def _backward(self, d, acc, scale, packed=None, w: Walk = None, v=None):
        if v is None:  # streaming: redraw (the generators were reseeded for this layer)
            v = w.sample(self.role, 0).v
        y = _masked(self.op.vjp(LayerParams(v=v, g=None, bias=None, scale=scale), d), packed)
        d, ln_norm = E._normalize(y, inplace=True)
        return {"d": d, "acc": acc + ln_norm}

    def forward(self, w: Walk, index: int, state: dict):
        role, run = self.role, w.runner.run
        slot = w.slot(role)
        if w.chunks is not None and w.chunks.covers(self.layer):  # drawn with its chunk (one batched Haar call)
            chunk, k = w.chunks.forward(w, self.layer)
            v = chunk["v"][k]
            if slot is not None:
                v = slot.copy_(v)
            out = run(("fwd-given", role), self._forward_given, {"u": state["u"], "c": state["c"], "v": v, "scale": chunk["scale"][k]},
                      _no_reseed)
            out = {**out, "v": v, "g": chunk["g"][k], "bias": None, "scale": chunk["scale"][k]}
        else:
            out = run(("fwd", self.op.key(True), self.relu), partial(self._forward, w=w), {"u": state["u"], "c": state["c"]},
                      w.reseeder(self), {"v_out": slot})
        kept = None
        if w.keep:
            kept = KeptLayer(w.kept_params(out, slot), w.masks.take(out["packed"]) if "packed" in out else None)
        return {"u": out["u"], "c": out["c"]}, out, kept

    def backward(self, w: Walk, index: int, grad: dict, kept: KeptLayer, below):
        p = kept.params
        inputs = {"d": grad["d"], "acc": grad["acc"], "scale": p.scale}
        if getattr(below, "packed", None) is not None:  # the ReLU of the layer below (none: a block or the input below)
            inputs["packed"] = below.packed
        reseed = w.reseeder(self) if w.stream else _no_reseed
        if not w.stream:
            inputs["v"] = p.v
        elif w.chunks is not None:  # streaming in chunks: redraw a chunk when the walk enters it from above
            inputs["v"], reseed = w.chunks.backward(w, self.layer), _no_reseed
        return w.runner.run(("bwd", self.op.key(True), "packed" in inputs), partial(self._backward, w=w), inputs, reseed)


class HaarChunks:
    """Directions of K consecutive dense layers of one shape drawn in one batched Haar call
    (CUDA: ``engine.haar_chunk`` says when, and how many), each chunk one step of the runner
    with its own generators (one ``LayerGenerators`` row per layer of a chunk).  Covers layers
    2..L (layer 1 reads the input width)."""

    def __init__(self, w: Walk, K: int) -> None:
        self.K, self.L = K, len(w.units)
        self.rows = [E.LayerGenerators(w.seed, w.draws, w.device) for _ in range(K)]
        self.current: dict = {}

    @classmethod
    def maybe(cls, w: Walk) -> "HaarChunks | None":
        if not all(type(u) is DenseLayer for u in w.units):
            return None
        widths = [w.units[0].role.fan_in] + [u.role.fan_out for u in w.units]
        K = E.haar_chunk(w.scheme, widths, w.S, w.device, torch.finfo(w.dtype).bits // 8)
        return cls(w, K) if K else None

    def generators(self) -> list:
        return [g for row in self.rows for g in row.gens]

    def covers(self, layer: int) -> bool:
        return layer >= 2

    def span(self, layer: int) -> tuple[int, int]:
        """(first layer, layer count) of the chunk holding ``layer``."""
        first = 2 + ((layer - 2) // self.K) * self.K
        return first, min(self.K, self.L - first + 1)

    def _draw(self, anchor, w: Walk, role: LayerRole, count: int):
        gens = [row.gens for row in self.rows[:count]]
        g = torch.stack([torch.stack([inits_mod.gaussian(role, gen, w.device, w.dtype) for gen in row]) for row in gens])
        p = E.haar_params(w.scheme, role, g)
        return {"v": p.v, "g": p.g, "scale": p.scale}

    def _run(self, w: Walk, layer: int) -> None:
        first, count = self.span(layer)
        role = w.units[first - 1].role
        self.current = w.runner.run(("chunk", role, count), partial(self._draw, w=w, role=role, count=count), {"anchor": w.ref},
                                    E.chunk_reseeder(self.rows, first, count))

    def forward(self, w: Walk, layer: int) -> tuple[dict, int]:
        """The chunk holding ``layer`` (drawn when the walk enters it) and the layer's index in it."""
        first, _ = self.span(layer)
        if layer == first:
            self._run(w, layer)
        return self.current, layer - first

    def backward(self, w: Walk, layer: int) -> torch.Tensor:
        """Streaming: the layer's directions, the chunk redrawn when the walk enters it from above."""
        first, count = self.span(layer)
        if layer == first + count - 1:
            self._run(w, layer)
        return self.current["v"][layer - first]


class ConvLayer(DenseLayer):
    """A k x k convolution (``plans.Conv``) and its ReLU (or none: ``Conv.relu``), recorded as
    the dense layer is (forward after the ReLU, backward at the pre-activation): the dense
    layer's walk with the matmul a ``ConvOp``."""

    def __init__(self, step, layer: int) -> None:
        super().__init__(step.role, layer, ConvOp(step), relu=step.relu)
        self.step = step


@dataclass
class KeptBlock:
    params: "E.BlockParams"
    masks: dict  # branch layer j -> its packed ReLU mask


class ResidualBlock:
    """h' = S h + alpha F(h) (Arpit et al. 2019, eq. 6): the branch's layers (``ops``: dense or
    conv, a ReLU after those flagged in ``relus``) and the skip (identity, or a projection layer)
    from the same (u, c), summed in log space with the larger exponent factored out
    (``engine._combine``).  Backward (Arpit et al. 2019, eq. 54-63): d = S^T d' + alpha J_F^T d',
    J_F^T the branch's layers transposed with their masks.  ``layer_ids``: the generator ids of
    the branch layers and (last) the projection, unique over the net and the same for every init."""

    branch = True
    replayable = True

    def __init__(self, ops: Sequence[DenseOp], relus: Sequence[bool], projection: DenseOp | None, alpha: float, layer_ids,
                 by_block_index: bool) -> None:
        self.alpha = float(alpha)
        self.k = len(ops)
        self.ops = list(ops) + ([projection] if projection is not None else [])
        self.relus = list(relus)
        self.has_projection = projection is not None
        self.roles = [op.role for op in self.ops]
        self.layer_ids = list(layer_ids)
        # layer j draws from slot j; the projection from the block's last generator id
        self.slot_ids = [j if j < self.k else len(self.layer_ids) - 1 for j in range(len(self.roles))]
        self.weight_count = sum(r.fan_in * r.fan_out for r in self.roles)
        self.mask_bytes = sum((op.units_out + 7) // 8 for op, relu in zip(self.ops, self.relus) if relu)
        self.row_widths = [r.fan_out for r in self.roles]
        self.key = (tuple(op.key(by_block_index) for op in self.ops), tuple(self.relus), self.alpha)

    @classmethod
    def of_block(cls, block, alpha: float, by_block_index: bool) -> "ResidualBlock":
        """A block of the fully connected ResNet (``nets.Block``): a ReLU after all but the last layer."""
        roles = block.branch_roles()
        proj = block.projection_role()
        return cls([DenseOp(r) for r in roles], [j < len(roles) - 1 for j in range(len(roles))],
                   None if proj is None else DenseOp(proj), alpha, block.layer_ids(), by_block_index)

    def _forward(self, u, c, w: Walk, v_outs=None):
        out, bu, bc, su, sc = {}, u, c, u, c
        for j, op in enumerate(self.ops):
            p = w.sample(op.role, self.slot_ids[j], None if v_outs is None else v_outs[j])
            if j < self.k:
                bu, bc, mask, p = op.forward(p, bu, bc, self.relus[j], w.scheme.calibrate)
                if mask is not None:
                    out[f"packed{j}"] = E.pack_mask(mask)
            else:
                su, sc, _, p = op.forward(p, u, c, False, w.scheme.calibrate)
            out.update({f"v{j}": p.v, f"g{j}": p.g, f"bias{j}": p.bias, f"scale{j}": p.scale})
        fb = bc + (math.log(self.alpha) if self.alpha > 0 else -math.inf)
        out["branch"] = fb - c
        out["u"], out["c"] = E._combine(sc, su, fb, bu)
        return out

    def _backward(self, d, acc, w: Walk, **t):
        def layer(j: int) -> LayerParams:
            v = t.get(f"v{j}")
            if v is None:  # streaming: redraw (the block's generators were reseeded)
                v = w.sample(self.roles[j], self.slot_ids[j]).v
            return LayerParams(v=v, g=None, bias=None, scale=t[f"scale{j}"])

        k = self.k
        y = d if not self.has_projection else self.ops[k].vjp(layer(k), d)
        if self.alpha != 0.0:
            z = d
            for j in range(k - 1, -1, -1):
                z = self.ops[j].vjp(layer(j), z)
                if j > 0 and self.relus[j - 1]:
                    z = z * E.unpack_mask(t[f"packed{j - 1}"], z.shape[-1])
            y = y + self.alpha * z
        d, ln_norm = E._normalize(y)
        return {"d": d, "acc": acc + ln_norm}

    def forward(self, w: Walk, index: int, state: dict):
        v_outs = [w.slot(r) for r in self.roles] if w.store else None
        out = w.runner.run(("fwd", *self.key), partial(self._forward, w=w), {"u": state["u"], "c": state["c"]}, w.reseeder(self),
                           {"v_outs": v_outs})
        kept = None
        if w.keep:
            params = [w.kept_params(out, None if v_outs is None else v_outs[j], str(j)) for j in range(len(self.roles))]
            kept = KeptBlock(E.BlockParams(params[:self.k], params[self.k] if self.has_projection else None, self.alpha),
                             {j: w.masks.take(out[f"packed{j}"]) for j in range(self.k) if self.relus[j]})
        return {"u": out["u"], "c": out["c"]}, out, kept

    def backward(self, w: Walk, index: int, grad: dict, kept: KeptBlock, below):
        bp = kept.params
        layers = bp.branch + ([bp.projection] if bp.projection is not None else [])
        inputs = {"d": grad["d"], "acc": grad["acc"]}
        for j, p in enumerate(layers):
            if self.alpha != 0.0 or j == self.k:  # a zero branch is never read
                inputs[f"scale{j}"] = p.scale
                if not w.stream:
                    inputs[f"v{j}"] = p.v
        if self.alpha != 0.0:
            inputs.update({f"packed{j}": m for j, m in kept.masks.items()})
        return w.runner.run(("bwd", *self.key), partial(self._backward, w=w), inputs, w.reseeder(self) if w.stream else _no_reseed)


@dataclass
class KeptBN:
    params: LayerParams
    Y: torch.Tensor
    s: torch.Tensor
    packed: torch.Tensor


class BNLayer:
    """BatchNorm (training mode, gamma = 1, beta = 0) -> ReLU -> linear W, as the stem
    (``residual=False``: x' = W BN(x)^+) or a residual block (x' = x + W BN(x)^+) of the BN
    ResNet (De & Smith 2020, appendix C); generator ``layer``.  Runs in ``PlainSpace``.  Not
    ``replayable``: it keeps its BN output Y and scale s by reference, which a replayed step
    (whose outputs are static buffers, overwritten by the next block) would not preserve."""

    replayable = False

    def __init__(self, role: LayerRole, layer: int, residual: bool, eps: float) -> None:
        self.role, self.layer, self.residual, self.eps = role, layer, residual, eps
        self.branch = residual
        self.layer_ids = [layer]
        self.weight_count = role.fan_in * role.fan_out
        self.mask_bytes = 0  # the mask is kept with the unit's saved BN output
        self.row_widths = [role.fan_out]

    def _forward(self, X, w: Walk, v_out=None):
        Y, s, _, _ = E._bn(X, self.eps)
        p = w.sample(self.role, 0, v_out)
        F = torch.relu(Y) @ E._t(p.v)
        out = {"Y": Y, "s": s, "packed": E.pack_mask(Y > 0), "v": p.v, "g": p.g, "bias": p.bias, "scale": p.scale}
        if self.residual:
            out["branch"] = E._ln_rows(F) - E._ln_rows(X)
            out["X"] = X + F
        else:
            out["X"] = F
        return out

    def _backward(self, G, acc, Y, s, packed, w: Walk, v=None):
        if v is None:
            v = w.sample(self.role, 0).v
        dX = E._bn_backward((G @ v) * E.unpack_mask(packed, self.role.fan_in), Y, s)
        G, acc = _rescale(G + dX if self.residual else dX, acc)
        return {"G": G, "acc": acc}

    def forward(self, w: Walk, index: int, state: dict):
        slot = w.slot(self.role)
        out = w.runner.run(("bn", self.role, self.residual), partial(self._forward, w=w), {"X": state["X"]}, w.reseeder(self),
                           {"v_out": slot})
        kept = KeptBN(w.kept_params(out, slot), out["Y"], out["s"], out["packed"]) if w.keep else None
        return {"X": out["X"]}, out, kept

    def backward(self, w: Walk, index: int, grad: dict, kept: KeptBN, below):
        inputs = {"G": grad["G"], "acc": grad["acc"], "Y": kept.Y, "s": kept.s, "packed": kept.packed}
        if not w.stream:
            inputs["v"] = kept.params.v
        return w.runner.run(("bn-bwd", self.role, self.residual), partial(self._backward, w=w), inputs,
                            w.reseeder(self) if w.stream else _no_reseed)


@dataclass
class KeptBNConv:
    params: list
    saved: dict  # Y{j}, s{j} of every conv (the projection's last): the BN outputs and scales


class BNConvUnit:
    """The batch-normalized WRN's units, in plain floats (``PlainSpace``, as the BN ResNet of De
    & Smith 2020: batch statistics couple the samples): convs each followed by training-mode BN
    per channel over the batch and the positions (``Conv.bn``) and their ReLUs -- conv1 (the
    stem, ``residual`` False: X' = BN(conv X)) or a block X' = S X + F(X), S the identity or
    BN(1 x 1 strided conv X).  Backward: BN's vector-Jacobian product (the batch mean and the
    normalised direction projected out, over (N, P)), the conv input gradients, the masks; the
    gradient renormalised per draw (``_rescale``).  Not ``replayable``: it keeps its BN outputs
    by reference."""

    replayable = False

    def __init__(self, convs, projection, residual: bool, layer_ids, eps: float = theory.BN_EPS) -> None:
        self.convs, self.projection, self.residual, self.eps = list(convs), projection, residual, eps
        self.branch = residual
        self.ops = [ConvOp(c) for c in self.convs] + ([ConvOp(projection)] if projection is not None else [])
        self.layer_ids = list(layer_ids)
        self.slot_ids = [j if j < len(self.convs) else len(self.layer_ids) - 1 for j in range(len(self.ops))]
        self.weight_count = sum(op.role.fan_in * op.role.fan_out for op in self.ops)
        self.mask_bytes = 0  # the masks are read from the kept BN outputs
        self.row_widths = [op.role.fan_out for op in self.ops]

    def _forward(self, X, w: Walk, v_outs=None):
        out, Z, (S, N) = {}, X, X.shape[:2]
        for j, op in enumerate(self.ops):
            p = w.sample(op.role, self.slot_ids[j], None if v_outs is None else v_outs[j])
            Y, sd, _, _ = E._bn(op.conv(p.v, X if j == len(self.convs) else Z), self.eps, dims=(1, 3))
            out.update({f"Y{j}": Y, f"s{j}": sd, f"v{j}": p.v, f"g{j}": p.g, f"bias{j}": p.bias, f"scale{j}": p.scale})
            if j < len(self.convs):
                Z = (torch.relu(Y) if op.step.relu else Y).reshape(S, N, -1)
        if self.residual:
            skip = X if self.projection is None else out[f"Y{len(self.convs)}"].reshape(S, N, -1)
            out["branch"] = E._ln_rows(Z) - E._ln_rows(X)
            out["X"] = skip + Z
        else:
            out["X"] = Z
        return out

    def _backward(self, G, acc, w: Walk, **t):
        def through(j: int, D: torch.Tensor) -> torch.Tensor:
            """D at op j's output (after its ReLU) back to its input."""
            op, Y = self.ops[j], t[f"Y{j}"]
            v = t.get(f"v{j}")
            if v is None:  # streaming: redraw (the unit's generators were reseeded)
                v = w.sample(op.role, self.slot_ids[j]).v
            dY = D.reshape(Y.shape)
            if j < len(self.convs) and op.step.relu:
                dY = dY * (Y > 0)
            return op.conv_t(v, E._bn_backward(dY, Y, t[f"s{j}"], dims=(1, 3)))

        z = G
        for j in range(len(self.convs) - 1, -1, -1):
            z = through(j, z)
        if self.residual:
            z = z + (G if self.projection is None else through(len(self.convs), G))
        G, acc = _rescale(z, acc)
        return {"G": G, "acc": acc}

    def forward(self, w: Walk, index: int, state: dict):
        v_outs = [w.slot(op.role) for op in self.ops] if w.store else None
        out = w.runner.run(("bn-conv", tuple(op.key(True) for op in self.ops), self.residual), partial(self._forward, w=w),
                           {"X": state["X"]}, w.reseeder(self), {"v_outs": v_outs})
        kept = None
        if w.keep:
            params = [w.kept_params(out, None if v_outs is None else v_outs[j], str(j)) for j in range(len(self.ops))]
            kept = KeptBNConv(params, {k: out[k] for j in range(len(self.ops)) for k in (f"Y{j}", f"s{j}")})
        return {"X": out["X"]}, out, kept

    def backward(self, w: Walk, index: int, grad: dict, kept: KeptBNConv, below):
        inputs = {"G": grad["G"], "acc": grad["acc"], **kept.saved}
        if not w.stream:
            inputs.update({f"v{j}": p.v for j, p in enumerate(kept.params)})
        return w.runner.run(("bn-conv-bwd", tuple(op.key(True) for op in self.ops), self.residual), partial(self._backward, w=w),
                            inputs, w.reseeder(self) if w.stream else _no_reseed)


# --------------------------------------------------------------------------------------------
# plans -> units
# --------------------------------------------------------------------------------------------
def compile_plan(steps: Sequence, scheme: InitScheme, blocks=None) -> tuple[list, bool]:
    """The units of a plan and whether its input is recorded (a leading ``Record``).

    [Linear(relu), Record(pre_activation)] -> ``DenseLayer`` (generator = its position, 1-based);
    [Open, Linear..., Close, Record] -> ``ResidualBlock`` (``blocks``: the ``nets.Block`` of each,
    for its generator ids and roles); [Conv, Record] -> ``ConvLayer``; [Open, Conv..., Close,
    Record] -> a ``ResidualBlock`` of ``ConvOp``s (generator ids from its place among the blocks); [BatchNorm, Linear, Record] and [Open, BatchNorm, Linear,
    Close, Record] -> ``BNLayer`` (stem and blocks, generator = entry index)."""
    units: list = []
    record_input = bool(steps) and isinstance(steps[0], plans.Record)
    i = 1 if record_input else 0
    block_iter = iter(blocks or ())
    residual = 0
    while i < len(steps):
        s = steps[i]
        if isinstance(s, plans.Linear):
            units.append(DenseLayer(s.role, len(units) + 1))
            i += 2
        elif isinstance(s, plans.Conv) and s.bn:  # the BN WRN's conv1
            units.append(BNConvUnit([s], None, residual=False, layer_ids=[len(units) + 1]))
            i += 2
        elif isinstance(s, plans.Conv):
            units.append(ConvLayer(s, len(units) + 1))
            i += 2
        elif isinstance(s, plans.BatchNorm):
            units.append(BNLayer(steps[i + 1].role, len(units), residual=False, eps=s.eps))
            i += 3
        elif isinstance(s, plans.Open):
            j = next(k for k in range(i, len(steps)) if isinstance(steps[k], plans.Close))
            if isinstance(steps[i + 1], plans.BatchNorm):
                units.append(BNLayer(steps[i + 2].role, len(units), residual=True, eps=steps[i + 1].eps))
            elif isinstance(steps[i + 1], plans.Conv):  # a conv block: its ops from the steps
                close, inner = steps[j], steps[i + 1:j]
                residual += 1
                base = 1 + residual * (len(inner) + 1)  # unit 0 (the stem) is generator 1
                if inner[0].bn:
                    units.append(BNConvUnit(inner, close.projection, residual=True, layer_ids=range(base, base + len(inner) + 1)))
                else:
                    proj = None if close.projection is None else ConvOp(close.projection)
                    units.append(ResidualBlock([ConvOp(c) for c in inner], [c.relu for c in inner], proj,
                                               scheme.alpha(close.blocks_in_stage), range(base, base + len(inner) + 1),
                                               scheme.by_block_index))
            else:
                close = steps[j]
                units.append(ResidualBlock.of_block(next(block_iter), scheme.alpha(close.blocks_in_stage), scheme.by_block_index))
            i = j + 2
        else:
            raise ValueError(f"cannot compile step {s!r} at position {i}")
    return units, record_input


# --------------------------------------------------------------------------------------------
# net kinds: how a network is walked
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NetKind:
    """A registered network: its plan (``steps`` of its widths or ``nets.ResNetPlan``), the
    observers of a probe, its memory estimate, the space it runs in and the init scheme an init
    name means for it (the BN net is unnormalized He whatever the name).  Adding a net kind is a
    ``steps`` function (with any new unit kind it needs), an estimate and one ``register`` call;
    its theory is ``plans.predict`` over the same steps (or, for batch-coupled steps, its own
    recursion in ``theory``)."""

    name: str
    steps: Callable
    observers: Callable[[], list]
    #: (net, samples, itemsize) -> peak bytes of one draw, weights stored (engine's estimates)
    estimate: Callable[..., int]
    space: type = LogSpace
    scheme: Callable[[str], InitScheme] = inits_mod.get

    def units(self, net, scheme: InitScheme) -> tuple[list, bool]:
        return compile_plan(self.steps(net), scheme, getattr(net, "blocks", None))

    def walk(self, net, scheme: InitScheme, x, e, seed: int, draws, observers=None, **kw) -> Walked:
        units, record_input = self.units(net, scheme)
        obs = self.observers() if observers is None else observers
        return walk(units, scheme, x, e, seed, draws, obs, record_input, space=self.space(), **kw)


NET_KINDS: dict[str, NetKind] = {}


def register(kind: NetKind) -> NetKind:
    NET_KINDS[kind.name] = kind
    return kind


register(NetKind("mlp", plans.mlp_steps, lambda: [ForwardRatio(), BackwardRatio()], E.estimate_mlp_bytes))
register(NetKind("resnet", plans.resnet_steps, lambda: [ForwardRatio(), BackwardRatio(), BranchRatio()],
                 lambda plan, samples, itemsize: E.estimate_resnet_bytes(plan, samples, itemsize, bn=False)))
register(NetKind("cnn", lambda steps: steps, lambda: [ForwardRatio(), BackwardRatio()], E.estimate_cnn_bytes))
register(NetKind("wrn", lambda steps: steps, lambda: [ForwardRatio(), BackwardRatio(), BranchRatio()], E.estimate_cnn_bytes))
register(NetKind("wrn-bn", lambda steps: steps, lambda: [ForwardRatio(), BackwardRatio(), BranchRatio()], E.estimate_bn_conv_bytes,
                 PlainSpace, lambda name: inits_mod.get("unnormalized-he")))
register(NetKind("bn-resnet", lambda plan: plans.bn_resnet_steps(plan, theory.BN_EPS),
                 lambda: [ForwardRatio(), BackwardRatio(), BranchRatio(), BNStatistics()],
                 lambda plan, samples, itemsize: E.estimate_resnet_bytes(plan, samples, itemsize, bn=True), PlainSpace,
                 lambda name: inits_mod.get("unnormalized-he")))
