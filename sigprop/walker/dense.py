"""The dense and conv units: a (WN or plain) linear layer or k x k convolution and its ReLU
(Arpit et al. 2019, eq. 1-5), forward, backward and as a differentiable ``apply``; the Haar
draws of a wide layer in chunks (sigprop/walker/haar.py)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from sigprop.inits import LayerRole
from sigprop.kernels import fused
from sigprop.kernels import logspace as ls
from sigprop.kernels.logspace import LayerParams
from sigprop.kernels.ops import ConvOp, DenseOp
from sigprop.walker.state import Walk, _no_reseed


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

    #: a chain of dense layers of one shape may draw its directions in chunks (walker/haar.py)
    haar_chunks = True

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
        u, c, packed, p = self.op.forward(p, u, c, self.relu, w.calibrate, fused=w.fuse)
        out = {"u": u, "c": c, "v": p.v, "g": p.g, "bias": p.bias, "scale": p.scale}
        if packed is not None:
            out["packed"] = packed
        return out

    def _forward_given(self, u, c, v, scale, fused: bool = False):
        """The layer with directions drawn by ``HaarChunks``."""
        p = LayerParams(v=v, g=None, bias=None, scale=scale)
        u, c, packed, _ = self.op.forward(p, u, c, relu=True, fused=fused)
        return {"u": u, "c": c, "packed": packed}

    def _backward(self, d, acc, scale, packed=None, w: Walk = None, v=None):
        if v is None:  # streaming: redraw (the generators were reseeded for this layer)
            v = w.sample(self.role, 0).v
        y = self.op.vjp(LayerParams(v=v, g=None, bias=None, scale=scale), d)
        if w.fuse:
            d, ln_norm = fused.backward(y, packed)
        else:
            d, ln_norm = ls.normalize(ls.masked(y, packed), inplace=True)
        return {"d": d, "acc": acc + ln_norm}

    def step_keys(self, w: Walk, below) -> tuple:
        """The runner's keys of this layer's forward and backward steps (``below``: the unit
        under it, None for the first): the steps ``forward`` and ``backward`` run."""
        masked = below is not None and not below.branch and below.relu  # its kept mask is packed
        return self._fwd_key(w), self._bwd_key(masked)

    def _fwd_key(self, w: Walk) -> tuple:
        return ("fwd-given", self.role) if self._given(w) else ("fwd", self.op.key(True), self.relu)

    def _bwd_key(self, masked: bool) -> tuple:
        return ("bwd", self.op.key(True), masked)

    def _given(self, w: Walk) -> bool:
        """Drawn with its chunk (one batched Haar call, walker/haar.py)."""
        return w.chunks is not None and w.chunks.covers(self.layer)

    def forward(self, w: Walk, index: int, state: dict):
        role, run = self.role, w.runner.run
        slot = w.slot(role)
        if self._given(w):
            chunk, k = w.chunks.forward(w, self.layer)
            v = chunk["v"][k]
            if slot is not None:
                v = slot.copy_(v)
            out = run(
                self._fwd_key(w),
                partial(self._forward_given, fused=w.fuse),
                {"u": state["u"], "c": state["c"], "v": v, "scale": chunk["scale"][k]},
                _no_reseed,
            )
            out = {**out, "v": v, "g": chunk["g"][k], "bias": None, "scale": chunk["scale"][k]}
        else:
            out = run(
                self._fwd_key(w),
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
        key = self._bwd_key("packed" in inputs)
        return w.runner.run(key, partial(self._backward, w=w), inputs, reseed)

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


class ConvLayer(DenseLayer):
    """A k x k convolution (``plans.Conv``) and its ReLU (or none: ``Conv.relu``), recorded as
    the dense layer is (forward after the ReLU, backward at the pre-activation): the dense
    layer's walk with the matmul a ``ConvOp``."""

    haar_chunks = False

    def __init__(self, step, layer: int) -> None:
        super().__init__(step, layer, ConvOp(step))
        self.step = step
