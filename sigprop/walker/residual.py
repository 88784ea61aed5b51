"""The residual block unit: Open, the branch's layers (dense or conv), Close (identity or
projection skip, alpha), recorded at the block output both ways (Arpit et al. 2019, eq. 6)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Sequence

import torch

from sigprop.kernels import fused
from sigprop.kernels import logspace as ls
from sigprop.kernels.logspace import LayerParams
from sigprop.kernels.ops import DenseOp
from sigprop.walker.dense import BlockParams, _dense_count, _dense_parameters
from sigprop.walker.state import Walk, _no_reseed


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
                bu, bc, packed, p = op.forward(
                    p, bu, bc, self.relus[j], w.calibrate, normalized=False, fused=w.fuse
                )
                if packed is not None:
                    out[f"packed{j}"] = packed
            else:
                su, sc, _, p = op.forward(p, u, c, False, w.calibrate, fused=w.fuse)
            out.update({f"v{j}": p.v, f"g{j}": p.g, f"bias{j}": p.bias, f"scale{j}": p.scale})
        fc = bc + (math.log(self.alpha) if self.alpha > 0 else -math.inf)  # alpha F(h) = exp(fc) bu
        if w.fuse:
            out["u"], out["c"], fb = fused.combine(sc, su, fc, bu)
        else:
            fb = fc + ls.ln_rows(bu)
            out["u"], out["c"] = ls.combine_(sc, su, fc, bu, fb)
        out["branch"] = fb - c
        return out

    def _backward(self, d, acc, w: Walk, **t):
        def layer(j: int) -> LayerParams:
            v = t.get(f"v{j}")
            if v is None:  # streaming: redraw (the block's generators were reseeded)
                v = w.sample(self.roles[j], self.slot_ids[j]).v
            return LayerParams(v=v, g=None, bias=None, scale=t[f"scale{j}"])

        k = self.k
        y = d if not self.has_projection else self.ops[k].vjp(layer(k), d)
        z = None
        if self.alpha != 0.0:
            z = d
            for j in range(k - 1, -1, -1):
                p = layer(j)
                if j == k - 1:  # alpha folded into the top layer's per-row scale: no pass for it
                    p.scale = p.scale * self.alpha
                z = self.ops[j].vjp(p, z)
                if j > 0 and self.relus[j - 1]:
                    z = z.mul_(ls.mask_of(t[f"packed{j - 1}"], z.shape[-1], z.dtype))
        if w.fuse:
            d, ln_norm = fused.backward(y, None) if z is None else fused.sum_normalize(z, y)
        else:
            y = y if z is None else z.add_(y)  # z: the branch's own temporary
            d, ln_norm = ls.normalize(y, inplace=y is not d)
        return {"d": d, "acc": acc + ln_norm}

    def step_keys(self, w: Walk, below) -> tuple:
        """The runner's keys of this block's forward and backward steps."""
        return ("fwd", *self.key), ("bwd", *self.key)

    def forward(self, w: Walk, index: int, state: dict):
        v_outs = [w.slot(r) for r in self.roles] if w.store else None
        out = w.runner.run(
            self.step_keys(w, None)[0],
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
            self.step_keys(w, None)[1],
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
