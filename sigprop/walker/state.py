"""What every unit of one walk reads: how a unit's state is held (``LogSpace``: unit rows and
float64 ln-norms; or ``PlainSpace``) and the walk's shared context (``Walk``: the init, the draws
and their generators, the runner, where weights, masks and per-row parameters are kept).  Below
the units (sigprop/walker/dense.py, residual.py, bn.py) and the observers, which read it, and
below ``walk`` (walk.py), which drives them: a unit reaching for its draws does not call back
into the walk."""

from __future__ import annotations

from typing import Callable

import torch

from sigprop.inits import InitScheme, LayerRole
from sigprop.kernels import logspace as ls
from sigprop.kernels import sampling
from sigprop.kernels.logspace import LayerParams
from sigprop.walker.haar import HaarChunks


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


def _no_reseed() -> None:
    pass


class Walk:
    """What every unit of one walk shares: the init, the draws and their generators (one
    ``LayerGenerators`` per layer slot of the widest unit), the runner, where weights, masks and
    per-row parameters are kept, the space, and the forward reference ln-norms."""

    def __init__(
        self,
        units,
        scheme: InitScheme,
        space,
        x,
        seed: int,
        draws,
        stream: bool,
        runner,
        keep: bool,
        fuse: bool = False,
    ) -> None:
        self.units, self.scheme, self.space = units, scheme, space
        self.calibrate = sampling.calibration(scheme)  # a data-dependent scheme's, else None
        self.device, self.dtype = x.device, x.dtype
        self.seed, self.draws = seed, list(draws)
        self.S, self.n = len(self.draws), x.shape[0]
        self.stream, self.runner, self.keep = stream, runner, keep
        #: a dense or conv layer's bookkeeping compiled (kernels/fused.py, ``--fuse``)
        self.fuse = fuse
        self.store = keep and not stream  # directions kept for the backward pass
        self.slots = [
            sampling.LayerGenerators(seed, self.draws, self.device)
            for _ in range(max(len(u.layer_ids) for u in units))
        ]
        # the batched Haar chunks: a CUDA path (``sampling.batched_haar``), asked only there
        self.chunks = HaarChunks.maybe(self) if sampling.batched_haar(scheme, self.device) else None
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


SPACES = {"log": LogSpace, "plain": PlainSpace}
