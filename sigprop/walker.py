"""One walker over plans (torch): a plan's steps compiled into units, run forward and backward in
log space for S weight draws at once, with measurements as observers.

A plan (sigprop/plans.py: a flat sequence of steps) is compiled into *units*: the steps between
two ``Record``s.  Five unit kinds exist --

* ``DenseLayer``: a linear (WN or plain) layer and its ReLU (a layer of the MLP, Arpit et al.
  2019, eq. 1-5), recorded forward at its output h^l = ReLU(a^l) and backward at its
  pre-activation, delta^l = dl/da^l (eq. 4-5);
* ``ConvLayer``: a ``DenseLayer`` whose matmul is a k x k convolution (the plain CNN's layers,
  the WRN's conv1), recorded as the dense layer is;
* ``ResidualBlock``: Open, the branch's layers (dense or conv), Close (identity or projection
  skip, alpha), recorded at the block output h^b both ways (h^b and dl/dh^b; Arpit et al. 2019,
  eq. 6);
* ``BNLayer``: BatchNorm -> ReLU -> linear, as the stem (x^1 = W^0 BN(x^0)^+) or as a residual
  block (x^{l+1} = x^l + W^l BN(x^l)^+) of the BN ResNet of De & Smith 2020, appendix C,
  recorded at its output x^{l+1} both ways;
* ``BNConvUnit``: the batch-normalized WRN's conv1 and blocks (convs each followed by
  training-mode BN), recorded at their outputs both ways --

and ``walk`` runs any sequence of them: forward unit by unit, then backward from the top Record
to the first recorded one, each unit (each way) one step of a ``replay`` runner (eager, or a
CUDA graph), weights stored in an arena or redrawn from their generators (streamed), every
draw of a batch along a leading dim.  The walker measures nothing itself: it hands each
recorded state (and each unit's output) to its observers (sigprop/observers/), which own their
buffers.  Each unit is also a differentiable function of its parameters (``apply``, with
``parameters`` read from what the walk kept): the curvature (sigprop/hessian.py) builds its loss
from the units the probe walked.

The numbers are those of the three hand-written walkers this replaced (0.4.0's) bit for bit on
a CPU: the same kernels on the same data in the same order (``benchmarks/golden.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from sigprop import plans
from sigprop.inits import InitScheme, LayerRole
from sigprop.kernels import device, replay, sampling
from sigprop.kernels import logspace as ls
from sigprop.kernels.logspace import LayerParams
from sigprop.kernels.ops import ConvOp, DenseOp, channels_last

#: training-mode batch norm's eps (torch.nn.BatchNorm's default)
BN_EPS = 1e-5


# --------------------------------------------------------------------------------------------
# state spaces: how a unit's state is held and how its norm is read
# --------------------------------------------------------------------------------------------
class LogSpace:
    """Per-sample log space (the WN nets): a state is unit rows u and float64 ln-norms c,
    h = exp(c) u; a gradient is unit rows d and ln-norms acc.  Nothing under- or overflows at
    any depth (``kernels.ops.DenseOp.forward``)."""

    def start(self, x: torch.Tensor, S: int) -> tuple[dict, torch.Tensor]:
        u, c = ls.normalize(x.expand(S, *x.shape))
        return {"u": u, "c": c}, c.clone()

    def ln_forward(self, state: dict, ref: torch.Tensor, out: torch.Tensor) -> None:
        torch.sub(state["c"], ref, out=out)

    def rows(self, state: dict) -> torch.Tensor:
        """Rows proportional to the state's (unit rows; zero rows stay zero)."""
        return state["u"]

    def grad_start(self, e: torch.Tensor, S: int) -> tuple[dict, torch.Tensor | None]:
        d, _ = ls.normalize(e.expand(S, *e.shape))
        return {"d": d, "acc": torch.zeros(S, e.shape[0], dtype=torch.float64, device=e.device)}, None

    def ln_backward(self, grad: dict, ref, out: torch.Tensor) -> None:
        out.copy_(grad["acc"])


class PlainSpace:
    """Plain floats (the BN net: batch statistics couple the samples, so there is no
    per-sample renormalisation; the skip variance grows only linearly).  The gradient, linear in
    the whole error matrix, is renormalised by one scalar per draw (``acc`` [S, 1])."""

    def start(self, x: torch.Tensor, S: int) -> tuple[dict, torch.Tensor]:
        return {"X": x.expand(S, *x.shape)}, ls.ln_rows(x)

    def ln_forward(self, state: dict, ref: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(ls.ln_rows(state["X"]) - ref)

    def rows(self, state: dict) -> torch.Tensor:
        return state["X"]

    def grad_start(self, e: torch.Tensor, S: int) -> tuple[dict, torch.Tensor]:
        G, acc = ls.rescale(e.expand(S, *e.shape), None)
        return {"G": G, "acc": acc}, ls.ln_rows(e)

    def ln_backward(self, grad: dict, ref: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(grad["acc"] + ls.ln_rows(grad["G"]) - ref)


# --------------------------------------------------------------------------------------------
# the walk: one context, one skeleton
# --------------------------------------------------------------------------------------------
def _no_reseed() -> None:
    pass


class Walk:
    """What every unit of one walk shares: the init, the draws and their generators (one
    ``LayerGenerators`` per layer slot of the widest unit), the runner, where weights, masks and
    per-row parameters are kept, the space, and the forward reference ln-norms."""

    def __init__(
        self, units, scheme: InitScheme, space, x, seed: int, draws, stream: bool, runner, keep: bool
    ) -> None:
        self.units, self.scheme, self.space = units, scheme, space
        self.calibrate = sampling.calibration(scheme)  # a data-dependent scheme's, else None
        self.device, self.dtype = x.device, x.dtype
        self.seed, self.draws = seed, list(draws)
        self.S, self.n = len(self.draws), x.shape[0]
        self.stream, self.runner, self.keep = stream, runner, keep
        self.store = keep and not stream  # directions kept for the backward pass
        self.slots = [
            sampling.LayerGenerators(seed, self.draws, self.device)
            for _ in range(max(len(u.layer_ids) for u in units))
        ]
        self.chunks = HaarChunks.maybe(self)
        runner.bind(
            [g for s in self.slots for g in s.gens]
            + ([] if self.chunks is None else self.chunks.generators())
        )
        S, n = self.S, self.n
        self.weights = (
            ls.Arena(S * sum(u.weight_count for u in units), self.device, self.dtype) if self.store else None
        )
        self.masks = (
            ls.Arena(S * n * sum(u.mask_bytes for u in units), self.device, torch.uint8) if keep else None
        )
        self.rows = (
            ls.rows_arena(S, [w for u in units for w in u.row_widths], self.device, self.dtype)
            if keep
            else None
        )
        self.ref: torch.Tensor | None = None

    def sample(self, role: LayerRole, slot: int, v_out=None) -> LayerParams:
        """One layer's parameters for every draw from generator slot ``slot`` (reseeded by the step)."""
        return sampling.sample_layer(self.scheme, role, self.slots[slot].gens, self.device, self.dtype, v_out)

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
        rows arena (``kernels.logspace.keep``)."""
        if slot is not None and out[f"v{j}"].data_ptr() != slot.data_ptr():
            slot.copy_(out[f"v{j}"])
        return ls.keep(
            LayerParams(v=slot, g=out[f"g{j}"], bias=out[f"bias{j}"], scale=out[f"scale{j}"]),
            self.rows,
            self.stream,
        )


@dataclass
class Walked:
    """A walk's observations ({observer name: tensor}) and what each unit kept (for the oracle)."""

    observed: dict
    kept: list


def walk(
    units: Sequence,
    scheme: InitScheme,
    x: torch.Tensor,
    e: torch.Tensor | None,
    seed: int,
    draws,
    observers: Sequence,
    record_input: bool,
    space=None,
    progress: Callable[[], None] | None = None,
    stream: bool = False,
    runner: replay.Eager | None = None,
) -> Walked:
    """Run ``units`` on inputs x [N, n_0] for S = len(draws) draws at once: forward unit by unit,
    then (``e`` given: the error vectors at the top [N, n_top]) backward to the first recorded
    state.  Entries: the input when ``record_input``, then each unit's output.  Each observer
    sees every entry's state forward and gradient backward.  A data-dependent init runs eagerly
    (its calibration reads the batch on the host), as does a plan with a unit that is not
    ``replayable``."""
    space = space or LogSpace()
    if runner is None or scheme.standardizes or not all(u.replayable for u in units):
        runner = replay.Eager()
    w = Walk(units, scheme, space, x, seed, draws, stream, runner, keep=e is not None)
    # a conv state's rows are held channels last (kernels/ops.py ConvOp): the input and the error
    # vectors converted once; a norm or cosine of a row does not depend on its units' order
    x = channels_last(x, units[0].shape_in)
    e = None if e is None else channels_last(e, units[-1].shape_out)
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
# unit kinds
# --------------------------------------------------------------------------------------------
@dataclass
class BlockParams:
    """One residual block as run: branch layers, optional projection, alpha."""

    branch: list[LayerParams]
    projection: LayerParams | None
    alpha: float


def _dense_parameters(kp: LayerParams, normalized: bool, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """A layer's trainable parameters of draw 0: v, g (WN), b (zero when it has none)."""
    out = [(f"{prefix}v", kp.v[0].detach().clone())]
    if normalized and kp.g is not None:
        out.append((f"{prefix}g", kp.g[0].detach().clone()))
    out.append(
        (
            f"{prefix}b",
            (kp.bias[0] if kp.bias is not None else torch.zeros_like(kp.v[0, :, 0])).detach().clone(),
        )
    )
    return out


def _dense_count(role: LayerRole, normalized: bool) -> int:
    return role.fan_in * role.fan_out + role.fan_out * (1 + bool(normalized))  # v, b (and g)


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

    def __init__(self, step, layer: int, op: DenseOp | None = None) -> None:
        self.role, self.layer, self.relu = step.role, layer, step.relu
        self.op = op or DenseOp(step)
        self.layer_ids = [layer]
        self.weight_count = self.role.fan_out * self.role.fan_in
        self.mask_bytes = (self.op.units_out + 7) // 8 if self.relu else 0
        self.row_widths = [self.role.fan_out]

    def _forward(self, u, c, w: Walk, v_out=None):
        p = w.sample(self.role, 0, v_out)
        u, c, mask, p = self.op.forward(p, u, c, self.relu, w.calibrate)
        out = {"u": u, "c": c, "v": p.v, "g": p.g, "bias": p.bias, "scale": p.scale}
        if mask is not None:
            out["packed"] = ls.pack_mask(mask)
        return out

    def _forward_given(self, u, c, v, scale):
        """The layer with directions drawn by ``HaarChunks``."""
        u, c, mask, _ = self.op.forward(LayerParams(v=v, g=None, bias=None, scale=scale), u, c, relu=True)
        return {"u": u, "c": c, "packed": ls.pack_mask(mask)}

    def _backward(self, d, acc, scale, packed=None, w: Walk = None, v=None):
        if v is None:  # streaming: redraw (the generators were reseeded for this layer)
            v = w.sample(self.role, 0).v
        y = ls.masked(self.op.vjp(LayerParams(v=v, g=None, bias=None, scale=scale), d), packed)
        d, ln_norm = ls.normalize(y, inplace=True)
        return {"d": d, "acc": acc + ln_norm}

    def forward(self, w: Walk, index: int, state: dict):
        role, run = self.role, w.runner.run
        slot = w.slot(role)
        if w.chunks is not None and w.chunks.covers(
            self.layer
        ):  # drawn with its chunk (one batched Haar call)
            chunk, k = w.chunks.forward(w, self.layer)
            v = chunk["v"][k]
            if slot is not None:
                v = slot.copy_(v)
            out = run(
                ("fwd-given", role),
                self._forward_given,
                {"u": state["u"], "c": state["c"], "v": v, "scale": chunk["scale"][k]},
                _no_reseed,
            )
            out = {**out, "v": v, "g": chunk["g"][k], "bias": None, "scale": chunk["scale"][k]}
        else:
            out = run(
                ("fwd", self.op.key(True), self.relu),
                partial(self._forward, w=w),
                {"u": state["u"], "c": state["c"]},
                w.reseeder(self),
                {"v_out": slot},
            )
        kept = None
        if w.keep:
            kept = KeptLayer(
                w.kept_params(out, slot), w.masks.take(out["packed"]) if "packed" in out else None
            )
        return {"u": out["u"], "c": out["c"]}, out, kept

    def backward(self, w: Walk, index: int, grad: dict, kept: KeptLayer, below):
        p = kept.params
        inputs = {"d": grad["d"], "acc": grad["acc"], "scale": p.scale}
        if (
            getattr(below, "packed", None) is not None
        ):  # the ReLU of the layer below (none: a block or the input below)
            inputs["packed"] = below.packed
        reseed = w.reseeder(self) if w.stream else _no_reseed
        if not w.stream:
            inputs["v"] = p.v
        elif w.chunks is not None:  # streaming in chunks: redraw a chunk when the walk enters it from above
            inputs["v"], reseed = w.chunks.backward(w, self.layer), _no_reseed
        return w.runner.run(
            ("bwd", self.op.key(True), "packed" in inputs), partial(self._backward, w=w), inputs, reseed
        )

    # -- the unit as a differentiable function (the curvature, the oracle) -------------------
    @property
    def shape_in(self) -> tuple:
        return self.op.shape_in

    @property
    def shape_out(self) -> tuple:
        return self.op.shape_out

    def parameters(self, kept: KeptLayer, normalized: bool, device, dtype) -> list[tuple[str, torch.Tensor]]:
        return _dense_parameters(kept.params, normalized)

    def parameter_count(self, normalized: bool) -> int:
        return _dense_count(self.role, normalized)

    def apply(self, p: dict, h: torch.Tensor) -> torch.Tensor:
        h = self.op.apply(p["v"], p.get("g"), p["b"], h)
        return torch.relu(h) if self.relu else h


class HaarChunks:
    """Directions of K consecutive dense layers of one shape drawn in one batched Haar call
    (CUDA: ``kernels.sampling.haar_chunk`` says when, and how many), each chunk one step of the runner
    with its own generators (one ``LayerGenerators`` row per layer of a chunk).  Covers layers
    2..L (layer 1 reads the input width)."""

    def __init__(self, w: Walk, K: int) -> None:
        self.K, self.L = K, len(w.units)
        self.rows = [sampling.LayerGenerators(w.seed, w.draws, w.device) for _ in range(K)]
        self.current: dict = {}

    @classmethod
    def maybe(cls, w: Walk) -> "HaarChunks | None":
        if not all(type(u) is DenseLayer for u in w.units):
            return None
        widths = [w.units[0].role.fan_in] + [u.role.fan_out for u in w.units]
        K = sampling.haar_chunk(
            w.scheme, widths, w.S, w.device, torch.finfo(w.dtype).bits // 8, device.available_bytes(w.device)
        )
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
        g = torch.stack(
            [torch.stack([sampling.gaussian(role, gen, w.device, w.dtype) for gen in row]) for row in gens]
        )
        p = sampling.haar_params(w.scheme, role, g)
        return {"v": p.v, "g": p.g, "scale": p.scale}

    def _run(self, w: Walk, layer: int) -> None:
        first, count = self.span(layer)
        role = w.units[first - 1].role
        self.current = w.runner.run(
            ("chunk", role, count),
            partial(self._draw, w=w, role=role, count=count),
            {"anchor": w.ref},
            sampling.chunk_reseeder(self.rows, first, count),
        )

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
        super().__init__(step, layer, ConvOp(step))
        self.step = step


@dataclass
class KeptBlock:
    params: BlockParams
    masks: dict  # branch layer j -> its packed ReLU mask


class ResidualBlock:
    """h' = S h + alpha F(h) (Arpit et al. 2019, eq. 6): the branch's layers (``ops``: dense or
    conv, a ReLU after those flagged in ``relus``) and the skip (identity, or a projection layer)
    from the same (u, c), summed in log space with the larger exponent factored out
    (``kernels.logspace.combine_``).  Backward (Arpit et al. 2019, eq. 54-63): d = S^T d' + alpha J_F^T d',
    J_F^T the branch's layers transposed with their masks.  ``layer_ids``: the generator ids of
    the branch layers and (last) the projection, unique over the net and the same for every init."""

    branch = True
    replayable = True

    def __init__(
        self,
        ops: Sequence[DenseOp],
        relus: Sequence[bool],
        projection: DenseOp | None,
        alpha: float,
        layer_ids,
        by_block_index: bool,
    ) -> None:
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

    def _forward(self, u, c, w: Walk, v_outs=None):
        out, bu, bc, su, sc = {}, u, c, u, c
        for j, op in enumerate(self.ops):
            p = w.sample(op.role, self.slot_ids[j], None if v_outs is None else v_outs[j])
            if j < self.k:  # the branch unnormalised: its norm is read once, the sum normalised once
                bu, bc, mask, p = op.forward(p, bu, bc, self.relus[j], w.calibrate, normalized=False)
                if mask is not None:
                    out[f"packed{j}"] = ls.pack_mask(mask)
            else:
                su, sc, _, p = op.forward(p, u, c, False, w.calibrate)
            out.update({f"v{j}": p.v, f"g{j}": p.g, f"bias{j}": p.bias, f"scale{j}": p.scale})
        fc = bc + (math.log(self.alpha) if self.alpha > 0 else -math.inf)  # alpha F(h) = exp(fc) bu
        fb = fc + ls.ln_rows(bu)
        out["branch"] = fb - c
        out["u"], out["c"] = ls.combine_(sc, su, fc, bu, fb)
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
                p = layer(j)
                if j == k - 1:  # alpha folded into the top layer's per-row scale: no pass for it
                    p.scale = p.scale * self.alpha
                z = self.ops[j].vjp(p, z)
                if j > 0 and self.relus[j - 1]:
                    z = z.mul_(ls.mask_of(t[f"packed{j - 1}"], z.shape[-1], z.dtype))
            y = z.add_(y)  # z: the branch's own temporary
        d, ln_norm = ls.normalize(y, inplace=y is not d)
        return {"d": d, "acc": acc + ln_norm}

    def forward(self, w: Walk, index: int, state: dict):
        v_outs = [w.slot(r) for r in self.roles] if w.store else None
        out = w.runner.run(
            ("fwd", *self.key),
            partial(self._forward, w=w),
            {"u": state["u"], "c": state["c"]},
            w.reseeder(self),
            {"v_outs": v_outs},
        )
        kept = None
        if w.keep:
            params = [
                w.kept_params(out, None if v_outs is None else v_outs[j], str(j))
                for j in range(len(self.roles))
            ]
            kept = KeptBlock(
                BlockParams(params[: self.k], params[self.k] if self.has_projection else None, self.alpha),
                {j: w.masks.take(out[f"packed{j}"]) for j in range(self.k) if self.relus[j]},
            )
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
        return w.runner.run(
            ("bwd", *self.key),
            partial(self._backward, w=w),
            inputs,
            w.reseeder(self) if w.stream else _no_reseed,
        )

    @property
    def shape_in(self) -> tuple:
        return self.ops[0].shape_in

    @property
    def shape_out(self) -> tuple:
        return self.ops[self.k - 1].shape_out

    def parameters(self, kept: KeptBlock, normalized: bool, device, dtype) -> list[tuple[str, torch.Tensor]]:
        bp = kept.params
        layers = bp.branch + ([bp.projection] if bp.projection is not None else [])
        return [item for j, lp in enumerate(layers) for item in _dense_parameters(lp, normalized, f"{j}.")]

    def parameter_count(self, normalized: bool) -> int:
        return sum(_dense_count(r, normalized) for r in self.roles)

    def apply(self, p: dict, h: torch.Tensor) -> torch.Tensor:
        """h' = S h + alpha F(h) (Arpit et al. 2019, eq. 6)."""
        z = h
        for j in range(self.k):
            z = self.ops[j].apply(p[f"{j}.v"], p.get(f"{j}.g"), p[f"{j}.b"], z)
            z = torch.relu(z) if self.relus[j] else z
        k = self.k
        skip = (
            h if not self.has_projection else self.ops[k].apply(p[f"{k}.v"], p.get(f"{k}.g"), p[f"{k}.b"], h)
        )
        return skip + self.alpha * z


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
        Y, s, _, _ = ls.bn(X, self.eps)
        p = w.sample(self.role, 0, v_out)
        F = torch.relu(Y) @ ls.transpose(p.v)
        out = {
            "Y": Y,
            "s": s,
            "packed": ls.pack_mask(Y > 0),
            "v": p.v,
            "g": p.g,
            "bias": p.bias,
            "scale": p.scale,
        }
        if self.residual:
            out["branch"] = ls.ln_rows(F) - ls.ln_rows(X)
            out["X"] = X + F
        else:
            out["X"] = F
        return out

    def _backward(self, G, acc, Y, s, packed, w: Walk, v=None):
        if v is None:
            v = w.sample(self.role, 0).v
        dX = ls.bn_backward((G @ v).mul_(ls.mask_of(packed, self.role.fan_in, G.dtype)), Y, s)
        G, acc = ls.rescale(G + dX if self.residual else dX, acc)
        return {"G": G, "acc": acc}

    def forward(self, w: Walk, index: int, state: dict):
        slot = w.slot(self.role)
        out = w.runner.run(
            ("bn", self.role, self.residual),
            partial(self._forward, w=w),
            {"X": state["X"]},
            w.reseeder(self),
            {"v_out": slot},
        )
        kept = KeptBN(w.kept_params(out, slot), out["Y"], out["s"], out["packed"]) if w.keep else None
        return {"X": out["X"]}, out, kept

    def backward(self, w: Walk, index: int, grad: dict, kept: KeptBN, below):
        inputs = {"G": grad["G"], "acc": grad["acc"], "Y": kept.Y, "s": kept.s, "packed": kept.packed}
        if not w.stream:
            inputs["v"] = kept.params.v
        return w.runner.run(
            ("bn-bwd", self.role, self.residual),
            partial(self._backward, w=w),
            inputs,
            w.reseeder(self) if w.stream else _no_reseed,
        )

    @property
    def shape_in(self) -> tuple:
        return (self.role.fan_in,)

    @property
    def shape_out(self) -> tuple:
        return (self.role.fan_out,)

    def parameters(self, kept: KeptBN, normalized: bool, device, dtype) -> list[tuple[str, torch.Tensor]]:
        """The plain W and BN's affine gamma = 1, beta = 0 (over its input's units)."""
        return [
            ("v", kept.params.v[0].detach().clone()),
            ("gamma", torch.ones(self.role.fan_in, device=device, dtype=dtype)),
            ("beta", torch.zeros(self.role.fan_in, device=device, dtype=dtype)),
        ]

    def parameter_count(self, normalized: bool) -> int:
        return self.role.fan_in * self.role.fan_out + 2 * self.role.fan_in

    def apply(self, p: dict, h: torch.Tensor) -> torch.Tensor:
        """x' = [x +] W BN(x)^+ (De & Smith 2020, appendix C)."""
        z = (
            torch.relu(F.batch_norm(h, None, None, p["gamma"], p["beta"], training=True, eps=self.eps))
            @ p["v"].T
        )
        return h + z if self.residual else z


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

    def __init__(self, convs, projection, residual: bool, layer_ids, eps: float) -> None:
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
            Y, sd, _, _ = ls.bn(op.conv(p.v, X if j == len(self.convs) else Z), self.eps, dims=(1, 2))
            out.update(
                {
                    f"Y{j}": Y,
                    f"s{j}": sd,
                    f"v{j}": p.v,
                    f"g{j}": p.g,
                    f"bias{j}": p.bias,
                    f"scale{j}": p.scale,
                }
            )
            if j < len(self.convs):
                Z = (torch.relu(Y) if op.step.relu else Y).reshape(S, N, -1)
        if self.residual:
            skip = X if self.projection is None else out[f"Y{len(self.convs)}"].reshape(S, N, -1)
            out["branch"] = ls.ln_rows(Z) - ls.ln_rows(X)
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
            return op.conv_t(v, ls.bn_backward(dY, Y, t[f"s{j}"], dims=(1, 2)))

        z = G
        for j in range(len(self.convs) - 1, -1, -1):
            z = through(j, z)
        if self.residual:
            z = z + (G if self.projection is None else through(len(self.convs), G))
        G, acc = ls.rescale(z, acc)
        return {"G": G, "acc": acc}

    def forward(self, w: Walk, index: int, state: dict):
        v_outs = [w.slot(op.role) for op in self.ops] if w.store else None
        out = w.runner.run(
            ("bn-conv", tuple(op.key(True) for op in self.ops), self.residual),
            partial(self._forward, w=w),
            {"X": state["X"]},
            w.reseeder(self),
            {"v_outs": v_outs},
        )
        kept = None
        if w.keep:
            params = [
                w.kept_params(out, None if v_outs is None else v_outs[j], str(j))
                for j in range(len(self.ops))
            ]
            kept = KeptBNConv(params, {k: out[k] for j in range(len(self.ops)) for k in (f"Y{j}", f"s{j}")})
        return {"X": out["X"]}, out, kept

    def backward(self, w: Walk, index: int, grad: dict, kept: KeptBNConv, below):
        inputs = {"G": grad["G"], "acc": grad["acc"], **kept.saved}
        if not w.stream:
            inputs.update({f"v{j}": p.v for j, p in enumerate(kept.params)})
        return w.runner.run(
            ("bn-conv-bwd", tuple(op.key(True) for op in self.ops), self.residual),
            partial(self._backward, w=w),
            inputs,
            w.reseeder(self) if w.stream else _no_reseed,
        )

    @property
    def shape_in(self) -> tuple:
        return self.ops[0].shape_in

    @property
    def shape_out(self) -> tuple:
        return self.ops[len(self.convs) - 1].shape_out

    def parameters(self, kept: KeptBNConv, normalized: bool, device, dtype) -> list[tuple[str, torch.Tensor]]:
        """Per conv its plain kernel and BN's affine gamma = 1, beta = 0 (per output channel)."""
        out = []
        for j, op in enumerate(self.ops):
            out += [
                (f"{j}.v", kept.params[j].v[0].detach().clone()),
                (f"{j}.gamma", torch.ones(op.role.fan_out, device=device, dtype=dtype)),
                (f"{j}.beta", torch.zeros(op.role.fan_out, device=device, dtype=dtype)),
            ]
        return out

    def parameter_count(self, normalized: bool) -> int:
        return sum(op.role.fan_in * op.role.fan_out + 2 * op.role.fan_out for op in self.ops)

    def apply(self, p: dict, h: torch.Tensor) -> torch.Tensor:
        z = h
        for j, op in enumerate(self.ops[: len(self.convs)]):
            z = op.apply_bn(p[f"{j}.v"], p[f"{j}.gamma"], p[f"{j}.beta"], z, self.eps)
            z = torch.relu(z) if op.step.relu else z
        if not self.residual:
            return z
        j = len(self.convs)
        return (
            h
            if self.projection is None
            else self.ops[j].apply_bn(p[f"{j}.v"], p[f"{j}.gamma"], p[f"{j}.beta"], h, self.eps)
        ) + z


# --------------------------------------------------------------------------------------------
# plans -> units
# --------------------------------------------------------------------------------------------
def _op(step) -> DenseOp:
    return ConvOp(step) if isinstance(step, plans.Conv) else DenseOp(step)


def one_draw_at_a_time(steps: Sequence, device: torch.device) -> bool:
    """Whether a plan's draws walk one at a time by default: on a CPU when it has a conv, whose
    per-draw convs (``ConvOp``) would otherwise be stacked into one [S, ...] tensor, a copy of
    every activation and gradient each layer that a single draw's view avoids (a WRN, one
    thread: 1.2x the autograd floor batched against 0.95-1.03x one at a time,
    benchmarks/floor.py conv).  Dense layers keep their batched ``bmm`` (5-10% faster than one
    draw at a time at width 512)."""
    return device.type == "cpu" and any(isinstance(s, plans.Conv) for s in steps)


def compile_plan(steps: Sequence, scheme: InitScheme) -> tuple[list, bool]:
    """The units of a plan and whether its input is recorded (a leading ``Record``).

    [Linear, Record] -> ``DenseLayer``, [Conv, Record] -> ``ConvLayer`` (generator = its position,
    1-based); [Open, Linear|Conv ..., Close, Record] -> ``ResidualBlock`` (the b-th block's
    generator ids start at (units before the first block) + b (layers + 1), the same for every
    init); a conv with batch norm -> ``BNConvUnit`` (alone, or a block of them); [BatchNorm,
    Linear, Record] and [Open, BatchNorm, Linear, Close, Record] -> ``BNLayer`` (generator = its
    entry index)."""
    units: list = []
    record_input = bool(steps) and isinstance(steps[0], plans.Record)
    i = 1 if record_input else 0
    residual, before = 0, None
    while i < len(steps):
        s = steps[i]
        if isinstance(s, plans.Linear):
            units.append(DenseLayer(s, len(units) + 1))
            i += 2
        elif isinstance(s, plans.Conv) and s.bn:  # the BN WRN's conv1
            units.append(BNConvUnit([s], None, residual=False, layer_ids=[len(units) + 1], eps=BN_EPS))
            i += 2
        elif isinstance(s, plans.Conv):
            units.append(ConvLayer(s, len(units) + 1))
            i += 2
        elif isinstance(s, plans.BatchNorm):
            units.append(BNLayer(steps[i + 1].role, len(units), residual=False, eps=s.eps))
            i += 3
        elif isinstance(s, plans.Open):
            j = next(k for k in range(i, len(steps)) if isinstance(steps[k], plans.Close))
            close, inner = steps[j], steps[i + 1 : j]
            if isinstance(inner[0], plans.BatchNorm):
                units.append(BNLayer(inner[1].role, len(units), residual=True, eps=inner[0].eps))
            else:
                if before is None:
                    before = len(units)
                residual += 1
                base = before + residual * (len(inner) + 1)
                ids = range(base, base + len(inner) + 1)
                if inner[0].bn:
                    units.append(
                        BNConvUnit(inner, close.projection, residual=True, layer_ids=ids, eps=BN_EPS)
                    )
                else:
                    proj = None if close.projection is None else _op(close.projection)
                    units.append(
                        ResidualBlock(
                            [_op(st) for st in inner],
                            [st.relu for st in inner],
                            proj,
                            scheme.alpha(close.blocks_in_stage),
                            ids,
                            scheme.by_block_index,
                        )
                    )
            i = j + 2
        else:
            raise ValueError(f"cannot compile step {s!r} at position {i}")
    return units, record_input


SPACES = {"log": LogSpace, "plain": PlainSpace}


@dataclass
class Function:
    """A plan's net at init as an ordinary differentiable function: ``params`` (name -> leaf
    tensor, one draw; unit i's as ``i.name``) and ``forward(params, x, upto=None)`` -- each unit's
    ``apply`` over its parameters, composed (the last state, or the state after the first
    ``upto`` units)."""

    units: list
    params: dict
    forward: Callable
    shape_out: tuple


def as_function(
    steps, scheme: InitScheme, x: torch.Tensor, seed: int, draw: int, space: str = "log"
) -> Function:
    """The net of the plan ``steps`` under ``scheme``, draw ``draw``, as a function: the walker
    draws (and, for a data-dependent init, calibrates on x) the weights exactly as the probe
    does, and keeps them (used by the Hessian, sigprop/hessian.py, and the spectra,
    sigprop/spectra.py)."""
    units, record_input = compile_plan(steps, scheme)
    last = units[-1].shape_out
    with torch.no_grad():  # a walk with an error vector keeps its weights (its ratios are not observed)
        e = torch.ones(x.shape[0], math.prod(last), device=x.device, dtype=x.dtype)
        kept = walk(units, scheme, x, e, seed, [draw], [], record_input, space=SPACES[space]()).kept
    params: dict[str, torch.Tensor] = {}
    keys: list[list[tuple[str, str]]] = []
    for i, (u, k) in enumerate(zip(units, kept)):
        own = u.parameters(k, scheme.normalized, x.device, x.dtype)
        keys.append([(name, f"{i}.{name}") for name, _ in own])
        params.update({f"{i}.{name}": t for name, t in own})

    def forward(p: dict, xb: torch.Tensor, upto: int | None = None) -> torch.Tensor:
        """The state after the first ``upto`` units (all when None)."""
        h = xb
        for u, names in list(zip(units, keys))[:upto]:
            h = u.apply({name: p[full] for name, full in names}, h)
        return h

    return Function(units, params, forward, tuple(last))
