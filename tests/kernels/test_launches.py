"""CPU proxy for the GPU's launch count (issue 41): the kernels one dense layer's step dispatches,
forward and backward, counted under a TorchDispatchMode, with a bound.

On a GPU a short or narrow probe is bound by the host issuing kernels, not by the GPU running
them (docs/benchmarks.md, "Launch overhead"), so every kernel a layer's bookkeeping adds is time.
The dispatcher sees the same ops on a CPU: views, allocations and Python scalars passed as
launch parameters are not kernels and are not counted.  Counts measured on sigprop 0.14.0
(issue 41): one draw of He directions, stored weights: forward 17 (6 draw the layer, 1 matmul,
10 scale, ReLU, normalise in log space and pack the mask), backward 11 (the scaled transpose
product, the mask, the normalisation).  0.13.0: 18 and 12 (the normalisation's safe divisor
took two kernels).  0.12.0: 23 and 13 (a stack per draw of g and the scale,
a copy of the directions, the mask packed in three kernels, a ``ones_like`` in the
normalisation).  S draws share every kernel but their generators' draws: the backward costs the
same at any S and the forward two kernels more per draw (16 draws: 47 kernels, 0.12.0 113).
"""

import collections

import pytest
import torch
import walks
from torch.utils._python_dispatch import TorchDispatchMode

from sigprop import inits
from sigprop.kernels import replay, sampling
from sigprop.kinds import resnet

#: dispatched ops that launch no kernel: views, allocations, Python scalars
NOT_KERNELS = {
    "view",
    "_unsafe_view",
    "reshape",
    "_reshape_alias",
    "unsqueeze",
    "squeeze",
    "expand",
    "slice",
    "select",
    "permute",
    "transpose",
    "t",
    "alias",
    "detach",
    "as_strided",
    "split",
    "unbind",
    "empty",
    "scalar_tensor",
    "lift_fresh",
}
CPU = torch.device("cpu")


class Kernels(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NOT_KERNELS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


class Counted(replay.Eager):
    """Runs every step eagerly and counts each one's kernels, by the step's kind (fwd, bwd)."""

    def __init__(self) -> None:
        self.steps: dict[str, list[collections.Counter]] = collections.defaultdict(list)

    def run(self, key, body, inputs, reseed, direct=None):
        reseed()
        with Kernels() as k:
            out = body(**inputs, **(direct or {}))
        self.steps[key[0]].append(k.ops)
        return out


def layer_kernels(name: str, draws: int, stream: bool = False) -> tuple[int, int]:
    """The kernels of a middle layer's forward and backward step of a 6-layer MLP of width 64."""
    widths = [64] * 7
    x, e = sampling.probe_inputs(1, 32, 64, 64, CPU, torch.float32)
    runner = Counted()
    with torch.no_grad():
        walks.mlp(inits.get(name), widths, x, e, 1, list(range(draws)), stream=stream, runner=runner)
    fwd, bwd = runner.steps["fwd"], runner.steps["bwd"]
    return sum(fwd[3].values()), sum(bwd[2].values())


def block_kernels(name: str, stream: bool = False) -> tuple[int, int]:
    """The kernels of a middle residual block's forward and backward step (4 blocks, dim 64,
    one hidden ReLU layer of width 48 per branch: the default ResNet's shape, smaller)."""
    plan = resnet.resnet_plan(64, 1, 4, 1, [48] * 4)
    x, e = sampling.probe_inputs(1, 32, 64, 64, CPU, torch.float32)
    runner = Counted()
    with torch.no_grad():
        walks.resnet(inits.get(name), plan, x, e, 1, [0], stream=stream, runner=runner)
    fwd, bwd = runner.steps["fwd"], runner.steps["bwd"]
    return sum(fwd[2].values()), sum(bwd[1].values())


def test_a_residual_blocks_kernels_are_bounded():
    """He, stored: forward 41 (two layers of 17 but the branch's one normalisation, the
    branch's ln-norm, and the log-space sum with the larger ln-norm factored out), backward 15.
    0.13.0: 47 and 16 (the factor's finiteness test took six kernels, ``nan_to_num`` one; the
    normalisation's safe divisor two, ``clamp_min`` one)."""
    fwd, bwd = block_kernels("he")
    assert fwd <= 41 and bwd <= 15, (fwd, bwd)


@pytest.mark.parametrize("name", ["he", "proposed-gaussian"])
def test_a_dense_layers_kernels_are_bounded(name):
    fwd, bwd = layer_kernels(name, 1)
    assert fwd <= 17 and bwd <= 11, (fwd, bwd)


@pytest.mark.parametrize("name", ["he", "proposed-gaussian", "pytorch-he"])
def test_draws_share_every_kernel_but_their_own_random_numbers(name):
    """16 draws: the backward launches what one draw's does (one batched product, one
    normalisation), the forward two kernels more per draw (each generator's randn)."""
    fwd1, bwd1 = layer_kernels(name, 1)
    fwd16, bwd16 = layer_kernels(name, 16)
    assert bwd16 == bwd1
    assert fwd16 <= fwd1 + 2 * 15, (fwd1, fwd16)


def test_streamed_backward_redraws_with_the_forwards_sampling():
    """Streaming redraws the directions in the backward step: its count is the stored backward's
    plus the draw's, never more."""
    fwd, bwd = layer_kernels("he", 1, stream=True)
    _, stored = layer_kernels("he", 1)
    assert bwd <= stored + 6, (bwd, stored)


def test_the_count_sees_a_kernel_added():
    """The count can fail: one more elementwise op in the step is one more kernel."""
    with Kernels() as k:
        t = torch.ones(4, 4)
        t.add_(1).view(16).mul_(2)
    assert sum(k.ops.values()) == 3  # ones (fill), add_, mul_; the view is not a kernel


@pytest.mark.parametrize("name", sorted(sampling.GAUSSIAN_SCHEMES))
@pytest.mark.parametrize("into", [False, True])
def test_batched_gaussian_draws_equal_each_draw_alone(name, into):
    """``sample_layer`` of a Gaussian scheme draws all S at once (one randn per generator into
    its slot, every other kernel once); the numbers are those of drawing each alone, bit for
    bit: the same randn, the same scale, the same reduction along each row."""
    role = inits.LayerRole(fan_in=48, fan_out=40)
    scheme = inits.get(name)
    gens = sampling.LayerGenerators(3, [0, 1, 2], CPU)
    gens.reseeder(1)()
    slot = torch.empty(3, 40, 48) if into else None
    batched = sampling.sample_layer(scheme, role, gens.gens, CPU, torch.float32, slot)
    gens.reseeder(1)()
    alone = [sampling.sample(scheme, role, gen, CPU, torch.float32) for gen in gens.gens]
    for field in ("v", "g", "bias", "scale"):
        want = [getattr(p, field) for p in alone]
        got = getattr(batched, field)
        if want[0] is None:
            assert got is None
            continue
        assert torch.equal(got, torch.stack(want)), field
    if into:
        assert batched.v.data_ptr() == slot.data_ptr()


def test_a_haar_draws_kernels_are_bounded():
    """One square Haar draw (kernels/haar.py): the batched UT transform (what CUDA runs, per layer
    or per chunk of layers) <= 43 kernels, the LAPACK path <= 25 (0.13.0: 48 and 27: the fills
    of ``zeros_like``/``ones_like`` where a Python scalar does, and ``-(v @ w) + eye`` as one
    subtraction; the same bits, tests/kernels/test_haar.py)."""
    from sigprop.kernels import haar

    g = torch.randn(3, 16, 16)
    with Kernels() as batched:
        haar.orthogonalize_batched(g)
    with Kernels() as lapack:
        haar.orthogonalize(g[0])
    assert sum(batched.ops.values()) <= 43 and sum(lapack.ops.values()) <= 25, (batched.ops, lapack.ops)
