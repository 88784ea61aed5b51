"""A layer's map in torch, three ways (sigprop/plans/ holds the steps as data; each weighted step
has an op here):

* ``directions(v, X)`` / ``transpose(v, G)``: the product with the directions v and its
  transpose, what the walker uses in log space (forward a = scale * directions + b, backward
  the transpose of scale * directions), for S draws at once;
* ``forward`` / ``vjp``: that layer in log space (kernels/logspace.py), with the ReLU mask and a
  data-dependent scheme's calibration;
* ``apply(params, h)``: the layer as an ordinary differentiable function of its parameters,
  a = (g v/||v||) h + b with the weight normalisation written out (Salimans & Kingma 2016,
  eq. 2; torch 2.13's fused ``torch._weight_norm`` has a wrong second derivative,
  tests/test_hessian.py), what the autograd oracle and the curvature differentiate.

Tests hold the walker's log-space layers equal to autograd through ``apply``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from sigprop.kernels import fused as fused_ops
from sigprop.kernels import logspace, sampling
from sigprop.kernels.logspace import LayerParams, col, normalize, transpose


def _activate(a: torch.Tensor, m: torch.Tensor, relu: bool, normalized: bool, fused: bool = False) -> tuple:
    """A layer's output from its pre-activations ``a`` (the layer's own temporary) at ln-scale
    ``m``: (rows, ln-scale, packed ReLU mask or None), the rows unit-normalised unless
    ``normalized`` is False (a residual branch's inner layers).  ``fused``: the same arithmetic
    compiled (kernels/fused.py, ``--fuse``)."""
    if fused:
        return fused_ops.activate(a, m, relu, normalized)
    a = torch.relu_(a) if relu else a
    # = (a > 0) before the ReLU; bool() of the output is 3x faster
    packed = logspace.pack_mask(a.bool()) if relu else None
    if not normalized:
        return a, m, packed
    u, ln_norm = normalize(a, inplace=True)
    return u, m + ln_norm, packed


def weight(v: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    """A layer's effective weight from its rows v [out, in]: g v/||v|| per row (WN) or v (plain)."""
    if g is None:
        return v
    return g.unsqueeze(1) * v / torch.linalg.vector_norm(v, dim=1, keepdim=True)


class DenseOp:
    """The affine map of a dense layer (``plans.Linear``)."""

    def __init__(self, step) -> None:
        self.step = step
        self.role = step.role
        self.units_in, self.units_out = self.role.fan_in, self.role.fan_out
        self.shape_in, self.shape_out = (self.units_in,), (self.units_out,)

    def key(self, by_block_index: bool):
        """What a replayed step's identity depends on (kernels/replay.py)."""
        return self.role if by_block_index else replace(self.role, block_index=0)

    def directions(self, v: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return logspace.mm(X, transpose(v))  # the module's seam: benchmarks/tf32_bias.py replaces it

    def forward(self, p: LayerParams, u, c, relu: bool, calibrate=None, normalized: bool = True, fused=False):
        """One layer for a batch of draws in log space: input h = exp(c) * u (unit rows u [S, N,
        in], ln-norms c [S, N] in float64), params stacked [S, ...]; output (u', c', packed ReLU
        mask or None, params -- calibrated for a data-dependent scheme); ``fused``: the ReLU and
        the normalisation compiled (kernels/fused.py).  ``normalized=False``: the rows
        as computed with their ln-scale, not divided by their norms (a residual branch's inner
        layers, whose block normalises its sum: two passes over the rows fewer); the next layer
        reads any rows h = exp(c) * u.

        t = u @ v^T (one batched matmul);  a = exp(c) * scale * t + b.  Splitting m = max(c, 0):
        a = exp(m) * (exp(c - m) * scale * t + exp(-m) * b), and ReLU is positively homogeneous,
        so the output is exp(m) * ReLU(a') with both exponents <= 0: nothing overflows, and a
        vanishing signal beside a bias correctly reads as a ~= b."""
        dtype = u.dtype
        t = self.directions(p.v, u)
        if calibrate is not None:
            vnorm = torch.linalg.vector_norm(p.v, dim=-1)
            p = sampling.calibrate_batch(calibrate, p, col(c, dtype) * t / vnorm.unsqueeze(-2))
        a = t.mul_(p.scale.unsqueeze(-2))  # t is this layer's own temporary: in place from here on
        if p.bias is not None:
            m = torch.clamp(c, min=0.0)
            a = a.mul_(col(c - m, dtype)).add_(col(-m, dtype) * p.bias.unsqueeze(-2))
        else:
            m = c
        return _activate(a, m, relu, normalized, fused) + (p,)

    def vjp(self, p: LayerParams, d: torch.Tensor) -> torch.Tensor:
        """d (scale * v): the layer's transpose applied to error rows d [S, N, out]."""
        return logspace.mm(d * p.scale.unsqueeze(-2), p.v)

    def apply(self, v, g, b, h: torch.Tensor) -> torch.Tensor:
        """Rows h [N, in] -> [N, out], differentiable in v, g, b."""
        return h @ weight(v, g).T + b


def channels_last(rows: torch.Tensor, shape: tuple) -> torch.Tensor:
    """Rows [N, C H W] of images (C, H, W) in PyTorch's order as the walker holds a conv's
    state: [N, H W C], channels last (``ConvOp``); rows of any other shape as they are."""
    if len(shape) != 3:
        return rows
    C, H, W = shape
    return rows.reshape(rows.shape[0], C, H, W).permute(0, 2, 3, 1).reshape(rows.shape[0], -1)


class ConvOp(DenseOp):
    """A k x k convolution (``plans.Conv``: zero padding, stride) in the same log space.  The
    state rows are an image's C x H x W units flattened channels last (H W C: the walk converts
    its input and error vectors, ``channels_last``), so that a row block [N, H W C] is, without a
    copy, the channels-last tensor [N, C, H, W] that oneDNN's convolutions run fastest on (2-3x
    at 16 channels, 20% at 64: docs/benchmarks.md); the output comes back channels last as well.
    On a CPU the S draws run one at a time (``_per_draw``); on a GPU as S groups of one grouped
    conv (input [N, S C, H, W], weights [S c_out, C, k, k]), so one kernel serves every draw.
    WN is the per-row scale (a row: one output channel's c_in k^2 kernel entries, the order of
    ``shape_in``); a data-dependent init standardises each channel over the batch and the
    positions.  The transpose is the conv's input gradient (``conv_transpose2d`` on a CPU,
    ``torch.nn.grad.conv2d_input`` on a GPU).  ``apply`` -- the unit as a function, for the
    oracle and the curvature -- keeps PyTorch's order (C H W)."""

    def __init__(self, step) -> None:
        super().__init__(step)
        self.units_in, self.units_out = math.prod(step.shape_in), math.prod(step.shape_out)
        self.shape_in, self.shape_out = step.shape_in, step.shape_out

    def key(self, by_block_index: bool):
        return replace(self.step, role=super().key(by_block_index))

    def _per_draw(self, x: torch.Tensor, v: torch.Tensor, transposed: bool) -> torch.Tensor:
        """One conv (or its transpose) per draw (CPU), rows [S, N, units] channels last in and
        out.  One draw's output is a view of its conv's (no copy); several are stacked, a copy of
        all of them (oneDNN has no strided ``out=``: the out variant computes into a buffer and
        copies too), which is why a CPU walk runs its draws one at a time (``run``).  The
        transposed conv took half the time of ``conv2d_input``'s backward kernel in oneDNN
        (benchmarks/floor.py conv)."""
        st, (S, N) = self.step, x.shape[:2]
        (C, H, W), (Ho, Wo) = st.shape_in, st.out_hw()
        co = self.role.fan_out
        image = lambda r, c, h, w: r.reshape(N, h, w, c).permute(0, 3, 1, 2)  # channels-last view
        if transposed:  # output_padding: the input size that the strided conv maps onto Ho x Wo
            pad = (
                H - ((Ho - 1) * st.stride - 2 * st.padding + st.kernel),
                W - ((Wo - 1) * st.stride - 2 * st.padding + st.kernel),
            )
            outs = [
                F.conv_transpose2d(
                    image(x[s], co, Ho, Wo),
                    self.kernel(v[s]),
                    stride=st.stride,
                    padding=st.padding,
                    output_padding=pad,
                )
                for s in range(S)
            ]
        else:
            outs = [
                F.conv2d(image(x[s], C, H, W), self.kernel(v[s]), stride=st.stride, padding=st.padding)
                for s in range(S)
            ]
        # channels last back to rows: a view of a channels-last output (a copy of any other)
        outs = [o.permute(0, 2, 3, 1).reshape(N, -1) for o in outs]
        return outs[0].unsqueeze(0) if S == 1 else torch.stack(outs)

    def _grouped(self, x: torch.Tensor, v: torch.Tensor, transposed: bool) -> torch.Tensor:
        """The S draws as S groups of one grouped conv (or its input gradient) in PyTorch's order
        (GPU: channels last is not measured there), rows [S, N, units] channels last in and out:
        one transposing copy each way."""
        st, (S, N) = self.step, x.shape[:2]
        (C, H, W), (Ho, Wo) = st.shape_in, st.out_hw()
        co = self.role.fan_out
        kernels = v.reshape(S * co, C, st.kernel, st.kernel)
        if transposed:
            g = x.reshape(S, N, Ho, Wo, co).permute(1, 0, 4, 2, 3).reshape(N, S * co, Ho, Wo)
            y = torch.nn.grad.conv2d_input(
                (N, S * C, H, W), kernels, g, stride=st.stride, padding=st.padding, groups=S
            )
        else:
            xs = x.reshape(S, N, H, W, C).permute(1, 0, 4, 2, 3).reshape(N, S * C, H, W)
            y = F.conv2d(xs, kernels, stride=st.stride, padding=st.padding, groups=S)
        return y.reshape(N, S, y.shape[1] // S, -1).permute(1, 0, 3, 2).reshape(S, N, -1)

    def conv(self, v: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """The conv of rows X [S, N, units_in] with the directions v [S, c_out, c_in k^2] as
        kernels: [S, N, H' W', c_out].  On a GPU one grouped conv serves the S draws; on a CPU one
        conv per draw (oneDNN's grouped conv was 15% slower than the S convs, and its layout cost
        a transposing copy each way)."""
        S, N = X.shape[:2]
        rows = self._grouped(X, v, False) if X.is_cuda else self._per_draw(X, v, transposed=False)
        return rows.reshape(S, N, -1, self.role.fan_out)

    directions = conv

    def conv_t(self, v: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        """The transpose of ``conv`` (its input gradient) applied to G [S, N, H' W', c_out]: [S, N,
        units_in], channels last."""
        S, N = G.shape[:2]
        rows = self._grouped(G, v, True) if G.is_cuda else self._per_draw(G, v, transposed=True)
        return rows.reshape(S, N, self.units_in)

    def forward(self, p: LayerParams, u, c, relu: bool, calibrate=None, normalized: bool = True, fused=False):
        """As the dense layer's (``normalized``, ``fused`` too), the rows' units positions x channels."""
        S, N = u.shape[:2]
        if calibrate is not None:  # per channel over the batch and the positions: [S, N H' W', c_out]
            t = self.conv(p.v, u)
            vnorm = torch.linalg.vector_norm(p.v, dim=-1)
            t_true = (col(c, t.dtype)[..., None] * t / vnorm[:, None, None, :]).reshape(
                S, -1, self.role.fan_out
            )
            p = sampling.calibrate_batch(calibrate, p, t_true)
            a = t * p.scale[:, None, None, :]
        else:  # WN's per-row scale folded into the kernels: no pass over the activations for it
            a = self.conv(self.scaled(p), u)
        if p.bias is not None:  # as the dense layer: exp(m) (exp(c - m) scale t + exp(-m) b), m = max(c, 0)
            m = torch.clamp(c, min=0.0)
            a = (
                a * torch.exp(c - m).to(a.dtype)[..., None, None]
                + torch.exp(-m).to(a.dtype)[..., None, None] * p.bias[:, None, None, :]
            )
        else:
            m = c
        return _activate(a.reshape(S, N, self.units_out), m, relu, normalized, fused) + (p,)

    def scaled(self, p: LayerParams) -> torch.Tensor:
        """The rows scale * v [S, c_out, c_in k^2]: the effective kernels (WN's g v/||v||)."""
        return p.v * p.scale.unsqueeze(-1)

    def vjp(self, p: LayerParams, d: torch.Tensor) -> torch.Tensor:
        S, N = d.shape[:2]
        return self.conv_t(self.scaled(p), d.reshape(S, N, -1, self.role.fan_out))

    def kernel(self, w: torch.Tensor) -> torch.Tensor:
        """Rows [c_out, c_in k^2] as conv2d's kernel [c_out, c_in, k, k]."""
        st = self.step
        return w.reshape(st.role.fan_out, st.shape_in[0], st.kernel, st.kernel)

    def apply(self, v, g, b, h: torch.Tensor) -> torch.Tensor:
        """Rows h [N, C H W] -> [N, c_out H' W'], differentiable in v, g, b."""
        st = self.step
        return F.conv2d(
            h.reshape(h.shape[0], *st.shape_in),
            self.kernel(weight(v, g)),
            b,
            stride=st.stride,
            padding=st.padding,
        ).flatten(1)

    def apply_bn(self, v, gamma, beta, h: torch.Tensor, eps: float) -> torch.Tensor:
        """The plain conv followed by training-mode batch norm with affine gamma, beta (the BN
        WRN's convs), differentiable in v, gamma, beta."""
        st = self.step
        a = F.conv2d(
            h.reshape(h.shape[0], *st.shape_in), self.kernel(v), stride=st.stride, padding=st.padding
        )
        return F.batch_norm(a, None, None, gamma, beta, training=True, eps=eps).flatten(1)
