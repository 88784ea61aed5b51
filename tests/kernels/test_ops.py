"""kernels/ops.py: the conv's rows are channels last, its transpose is its adjoint, and the GPU's
grouped conv (run here on the CPU) equals the CPU's conv per draw."""

import pytest
import torch

from sigprop.inits import LayerRole
from sigprop.kernels import ops
from sigprop.plans import Conv

#: a 3 x 3 conv, a strided one, a strided 1 x 1 projection, and a stem of 3 channels
STEPS = [
    Conv(LayerRole(4 * 9, 5, "relu", taps=9), (4, 6, 6), 3, 1, 1),
    Conv(LayerRole(4 * 9, 6, "relu", taps=9), (4, 7, 7), 3, 2, 1),
    Conv(LayerRole(4, 6, "projection", taps=1), (4, 6, 6), 1, 2, 0, relu=False),
    Conv(LayerRole(3 * 9, 4, "linear", taps=9), (3, 5, 5), 3, 1, 1, relu=False),
]
S, N = 3, 4


def _draw(step, gen):
    v = torch.randn(S, step.role.fan_out, step.role.fan_in, generator=gen, dtype=torch.float64)
    x = torch.randn(S, N, ops.ConvOp(step).units_in, generator=gen, dtype=torch.float64)
    g = torch.randn(S, N, ops.ConvOp(step).units_out, generator=gen, dtype=torch.float64)
    return v, x, g


@pytest.mark.parametrize("step", STEPS, ids=["3x3", "3x3-stride2", "1x1-stride2", "stem"])
def test_conv_rows_are_channels_last(step):
    """The walker's conv of channels-last rows is PyTorch's conv of the image, channels last."""
    op, gen = ops.ConvOp(step), torch.Generator().manual_seed(1)
    v, _, _ = _draw(step, gen)
    h = torch.randn(N, op.units_in, generator=gen, dtype=torch.float64)  # PyTorch's order, C H W
    rows = op.conv(v[:1], ops.channels_last(h, step.shape_in)[None]).reshape(N, -1)
    want = ops.channels_last(op.apply(v[0], None, None, h), step.shape_out)
    torch.testing.assert_close(rows, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("step", STEPS, ids=["3x3", "3x3-stride2", "1x1-stride2", "stem"])
def test_conv_t_is_the_adjoint(step):
    """<conv(x), g> = <x, conv_t(g)> for every draw (float64: to rounding of sums of ~100 terms)."""
    op = ops.ConvOp(step)
    v, x, g = _draw(step, torch.Generator().manual_seed(2))
    lhs = (op.conv(v, x).reshape(S, -1) * g.reshape(S, -1)).sum(-1)
    rhs = (x.reshape(S, -1) * op.conv_t(v, g.reshape(S, N, -1, step.role.fan_out)).reshape(S, -1)).sum(-1)
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("step", STEPS, ids=["3x3", "3x3-stride2", "1x1-stride2", "stem"])
def test_grouped_conv_equals_per_draw(step):
    """The GPU's path (the S draws as groups of one conv, in PyTorch's order) gives the CPU's
    rows: both ways, every draw."""
    op = ops.ConvOp(step)
    v, x, g = _draw(step, torch.Generator().manual_seed(3))
    for inp, transposed in ((x, False), (g, True)):
        torch.testing.assert_close(
            op._grouped(inp, v, transposed), op._per_draw(inp, v, transposed), rtol=1e-12, atol=1e-12
        )


def test_channels_last_leaves_other_rows():
    x = torch.arange(24.0).reshape(2, 12)
    assert ops.channels_last(x, (12,)) is x
    assert ops.channels_last(x, (3, 2, 2))[0].tolist() == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
