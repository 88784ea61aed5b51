"""CPU proxy for CUDA-graph safety: no step body may copy host data to the device or read device
data to the host.

Why this test exists: the walker's GPU paths were first run on an NVIDIA H100 80 GB (torch
2.11+cu130) after being written on CPUs only, and no CUDA graph ever captured.
``sigprop/haar.py`` (now sigprop/kernels/haar.py) assigned Python scalars into device tensors
(``tau[-1], beta[-1], denom[-1] = 0.0, alpha[-1], 1.0``); during capture that is a host-to-device
copy, and CUDA said "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the
CPU tensor is pinned". Every GPU run silently fell back to eager. On a CPU the same line runs fine,
so the test watches the ops instead: under a TorchDispatchMode every step body of every captured
init (MLP and ResNet, stored and streamed, batched draws) must dispatch none of

* ``aten::lift_fresh`` / ``lift_fresh_copy``: a tensor made from Python data (``torch.tensor``,
  ``t[i] = 0.0``) -- on CUDA a host-to-device copy;
* ``aten::_local_scalar_dense``: ``.item()``, ``float(t)``, ``bool(t)`` -- a device-to-host read
  and a synchronisation;
* ops whose output size depends on values (``nonzero``, ``masked_select``, ``unique``) -- a sync;
* a copy or conversion whose source and destination devices differ.
Python numbers passed as kernel arguments (``t * 2.0``, ``aten::scalar_tensor`` for ``where``)
are by-value launch parameters and are allowed.
"""

import math

import pytest
import torch
import walks
from torch.utils._python_dispatch import TorchDispatchMode

from sigprop import inits, kinds, plans, specs
from sigprop.kernels import replay, sampling
from sigprop.kinds import cnn, mlp, resnet, wrn
from sigprop.kinds.resnet import ResNetSpec

FORBIDDEN = {
    "aten::lift_fresh",
    "aten::lift_fresh_copy",
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::nonzero",
    "aten::masked_select",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
}
CPU = torch.device("cpu")


class HostTraffic(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in FORBIDDEN:
            self.found.append(name)
        if name in ("aten::copy_", "aten::_to_copy"):
            devs = {a.device for a in args if isinstance(a, torch.Tensor)}
            if "device" in kwargs and kwargs["device"] is not None:
                devs.add(torch.device(kwargs["device"]))
            if len(devs) > 1:
                self.found.append(f"{name} across {sorted(map(str, devs))}")
        return func(*args, **kwargs)


class Guarded(replay.Eager):
    """Runs every step body eagerly under ``HostTraffic``; counts the steps it watched."""

    def __init__(self) -> None:
        self.mode = HostTraffic()
        self.steps = 0

    def run(self, key, body, inputs, reseed, direct=None):
        reseed()  # the generators are reseeded on the host, outside the graph (replay.py)
        self.steps += 1
        with self.mode:
            return body(**inputs, **(direct or {}))


CAPTURED = [n for n in inits.names(kinds.KINDS["mlp"].provides) if not inits.get(n).standardizes]


@pytest.mark.parametrize("name", CAPTURED)
@pytest.mark.parametrize("stream", [False, True])
def test_mlp_steps_are_graph_safe(name, stream):
    widths = [12, 9, 16, 16, 16, 8]
    x, e = sampling.probe_inputs(1, 6, widths[0], widths[-1], CPU, torch.float32)
    runner = Guarded()
    with torch.no_grad():
        walks.mlp(inits.get(name), widths, x, e, 1, [0, 2], stream=stream, runner=runner)
    assert runner.steps == 2 * (len(widths) - 1) - 1
    assert not runner.mode.found, sorted(set(runner.mode.found))


RESNET_CAPTURED = [n for n in inits.names(kinds.KINDS["resnet"].provides) if not inits.get(n).standardizes]


@pytest.mark.parametrize("name", RESNET_CAPTURED)
@pytest.mark.parametrize("stream", [False, True])
def test_resnet_steps_are_graph_safe(name, stream):
    spec = ResNetSpec(blocks=4, stages=2, dim=10, width=specs.WidthSpec(8, 8), block_depth=2, inits=(name,))
    plan = kinds.of(spec).plan(spec, 3)
    dims = plan.entries
    x, e = sampling.probe_inputs(3, 5, dims[0], dims[-1], CPU, torch.float32)
    runner = Guarded()
    with torch.no_grad():
        walks.resnet(inits.get(name), plan, x, e, 3, [0, 2], stream=stream, runner=runner)
    assert runner.steps >= 2 * len(plan.blocks)
    assert not runner.mode.found, sorted(set(runner.mode.found))


def test_the_watch_catches_the_h100_bug():
    """The pattern that broke capture on the H100 is caught: a Python scalar written into a
    tensor, and a device value read on the host."""
    mode = HostTraffic()
    t = torch.zeros(4)
    with mode:
        t[-1] = 0.0
        _ = float(t.sum())
    assert "aten::lift_fresh" in mode.found and "aten::_local_scalar_dense" in mode.found


@pytest.mark.parametrize("stream", [False, True])
def test_chunked_haar_steps_are_graph_safe(monkeypatch, stream):
    """The CUDA default for Haar directions: chunks of layers drawn and orthogonalized in one
    batched call (haar.orthogonalize_batched), forced here on the CPU."""
    monkeypatch.setattr(sampling, "BATCHED_HAAR", "always")
    monkeypatch.setattr(sampling, "CHUNK_MAX", 3)
    widths = [12] + [16] * 8
    x, e = sampling.probe_inputs(1, 6, widths[0], widths[-1], CPU, torch.float32)
    runner = Guarded()
    with torch.no_grad():
        walks.mlp(inits.get("proposed"), widths, x, e, 1, [0, 2], stream=stream, runner=runner)
    assert not runner.mode.found, sorted(set(runner.mode.found))


@pytest.mark.parametrize("kind, name", [("mlp", "proposed"), ("resnet", "proposed"), ("bn-resnet", "he")])
def test_whole_walks_with_every_observer_move_nothing_between_host_and_device(kind, name):
    """Not only the captured steps: the walker's own loop and every observer (ratios, branch,
    BN statistics, the correlation cosines) run without a host read or a lifted scalar, so a
    GPU walk never synchronises between steps."""
    steps = {
        "mlp": mlp.steps([12, 9, 16, 8]),
        "resnet": resnet.resnet_plan(12, 2, 2, 1, [7, 8, 9, 6]).steps,
        "bn-resnet": resnet.resnet_plan(12, 1, 3, 0, [], stem=True).steps,
    }[kind]
    top = {"mlp": 8, "resnet": 24, "bn-resnet": 12}[kind]
    bn = kind == "bn-resnet"
    observe = (
        ("fwd", "bwd", "branch", "correlation") + (("bn",) if bn else ())
        if kind != "mlp"
        else ("fwd", "bwd", "correlation")
    )
    x = sampling.pair_inputs(1, 6, 12, 0.3, CPU, torch.float32)
    e = torch.randn(12, top, generator=torch.Generator().manual_seed(0))
    mode = HostTraffic()
    with torch.no_grad(), mode:
        r = walks.walk(
            steps,
            inits.get("unnormalized-he" if bn else name),
            x,
            e,
            1,
            [0, 2],
            observe,
            space="plain" if bn else "log",
        )
    assert set(r.observed) >= {"fwd", "bwd", "correlation"}
    assert not mode.found, sorted(set(mode.found))


@pytest.mark.parametrize("name", ["proposed", "he", "pytorch"])
@pytest.mark.parametrize("stream", [False, True])
def test_conv_steps_are_graph_safe(name, stream):
    """The conv unit (issue 18) runs on CUDA with graphs like the dense one."""
    steps = cnn.steps((3, 9, 9), 6, 4)
    x, e = sampling.probe_inputs(1, 5, 243, math.prod(steps[-2].shape_out), CPU, torch.float32)
    runner = Guarded()
    with torch.no_grad():
        walks.walk(steps, inits.get(name), x, e, 1, [0, 2], stream=stream, runner=runner)
    assert runner.steps == 2 * 4 - 1
    assert not runner.mode.found, sorted(set(runner.mode.found))


@pytest.mark.parametrize("name", ["proposed", "pytorch", "stage-hanin", "skipinit"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("bottleneck", [False, True])
def test_wrn_steps_are_graph_safe(name, stream, bottleneck):
    """The WRN's units (a ConvLayer stem without ReLU, residual blocks of ConvOps with the 1 x 1
    stride-2 projection, bottlenecks) and the walker loop with every observer: no host traffic."""
    steps = wrn.steps((3, 6, 6), 2, bottleneck=bottleneck)
    out = plans.layers(steps)[-1].shape_out
    x, e = sampling.probe_inputs(1, 4, 108, math.prod(out), CPU, torch.float32)
    runner = Guarded()
    mode = HostTraffic()
    with mode:
        walks.walk(
            steps,
            inits.get(name),
            x,
            e,
            1,
            [0, 2],
            ("fwd", "bwd", "branch", "correlation"),
            stream=stream,
            runner=runner,
        )
    assert runner.steps == 14  # 7 units forward, 7 backward (the stem's backward reaches the input)
    assert not runner.mode.found, sorted(set(runner.mode.found))
    assert not mode.found, sorted(set(mode.found))


@pytest.mark.parametrize("name", ["he", "proposed", "skipinit"])
@pytest.mark.parametrize("stream", [False, True])
def test_fused_steps_are_graph_safe(name, stream):
    """``--fuse`` (kernels/fused.py, issue 41): the compiled forward and backward tails of the
    dense layers and of the residual blocks (sum, normalisation, mask) inside captured steps.
    Under a dispatch mode the compiled functions dispatch their source's ops one by one (seen
    here: relu, the mask's shifts and pad, the norms), so the watch covers the arithmetic Inductor
    compiles; its generated kernels take the sizes as launch arguments, and the replay's
    comparison with the eager step checks the capture on a device (kernels/replay.py)."""
    scheme = inits.get(name)
    runs = []
    if scheme.defined_for(kinds.KINDS["mlp"].provides):
        widths = [12, 9, 16, 16, 16, 8]
        x, e = sampling.probe_inputs(1, 6, widths[0], widths[-1], CPU, torch.float32)
        runs.append((mlp.steps(widths), x, e))
    spec = ResNetSpec(blocks=3, stages=2, dim=10, width=specs.WidthSpec(8, 8), block_depth=2, inits=(name,))
    plan = kinds.of(spec).plan(spec, 3)
    x, e = sampling.probe_inputs(3, 5, plan.entries[0], plan.entries[-1], CPU, torch.float32)
    runs.append((plan.steps, x, e))
    for steps, x, e in runs:
        runner = Guarded()
        walks.walk(steps, scheme, x, e, 3, [0, 2], stream=stream, runner=runner, fuse=True)
        assert runner.steps > 0
        assert not runner.mode.found, sorted(set(runner.mode.found))
