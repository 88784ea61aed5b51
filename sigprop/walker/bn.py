"""The batch-normalised units: BatchNorm -> ReLU -> linear of the BN ResNet (De & Smith 2020,
appendix C) and the batch-normalised WRN's conv units (each conv followed by training-mode BN)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from sigprop.inits import LayerRole
from sigprop.kernels import logspace as ls
from sigprop.kernels.logspace import LayerParams
from sigprop.kernels.ops import ConvOp
from sigprop.walker.state import Walk, _no_reseed

#: training-mode batch norm's eps (torch.nn.BatchNorm's default)
BN_EPS = 1e-5


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
