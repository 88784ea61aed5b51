"""Layer steps captured once and replayed (sigprop/kernels/replay.py): the static-buffer plumbing is
checked on any device with ``replay.Emulated`` (the same code path as CUDA graphs but for the
capture itself), the fallbacks on a CPU, and the CUDA graphs themselves where CUDA is present."""

import dataclasses

import numpy as np
import pytest
import torch
import walks
from arith import assert_same_up_to_order
from oracle import oracle_ratios

from sigprop import inits, specs
from sigprop.engines import plan as plan_engine
from sigprop.inits import LayerRole
from sigprop.kernels import replay, sampling
from sigprop.kinds import resnet
from sigprop.kinds.cnn import CNNSpec
from sigprop.kinds.mlp import MLPSpec
from sigprop.kinds.resnet import ResNetSpec
from sigprop.kinds.wrn import WRNSpec

CPU = torch.device("cpu")
MLP_WIDTHS = [12, 9, 17, 17, 17, 17, 8, 11]  # (17, 17) repeats: one step each way is captured


@pytest.fixture(autouse=True)
def capture_at_the_second_run(monkeypatch):
    """These tests check the replay plumbing on small nets whose shapes recur only a few times:
    a step is captured at its second run whatever follows (``replay.MIN_LATER`` = 0).  The rule
    that skips steps too rare to pay for their capture is tested in test_capture_rule.py."""
    monkeypatch.setattr(replay, "MIN_LATER", 0)


def _same_mlp(got, want, widths=MLP_WIDTHS):
    """The ln ratios of two MLP runs, within the reduction-order bound (tests/arith.py): 2L steps
    of width at most max(widths)."""
    for a, b in zip(got[:2], want[:2]):
        assert_same_up_to_order(a, b, max(widths), 2 * len(widths))


def _mlp(name, runner, stream, device=CPU, widths=MLP_WIDTHS, dtype=torch.float64):
    x, e = sampling.probe_inputs(5, 6, widths[0], widths[-1], device, dtype)
    with torch.no_grad():
        return walks.mlp(inits.get(name), widths, x, e, 5, [0, 3, 4], stream=stream, runner=runner)


@pytest.mark.parametrize("name", inits.names("mlp"))
@pytest.mark.parametrize("stream", [False, True])
def test_replayed_steps_equal_eager_mlp(name, stream):
    """Static inputs copied in, generators reseeded, outputs copied out: the same bits as the
    eager walk, the same stored directions, and the oracle per draw."""
    eager = _mlp(name, None, stream)
    runner = replay.Emulated()
    replayed = _mlp(name, runner, stream)
    _same_mlp(replayed, eager)
    if not inits.get(name).standardizes:
        assert set(runner.steps) == {("fwd", LayerRole(17, 17), True), ("bwd", LayerRole(17, 17), True)}
        assert runner.status == "on"
    else:  # a data-dependent init synchronises with the host every layer: always eager
        assert not runner.steps
    if not stream:
        for pe, pr in zip(eager[2], replayed[2]):
            assert_same_up_to_order(pe.v, pr.v, max(MLP_WIDTHS), 1)
            assert_same_up_to_order(pe.scale, pr.scale, max(MLP_WIDTHS), 1)
    x, e = sampling.probe_inputs(5, 6, MLP_WIDTHS[0], MLP_WIDTHS[-1], CPU, torch.float64)
    _, _, p1 = walks.mlp_draw(inits.get(name), MLP_WIDTHS, x, e, seed=5, draw=3)
    fwd, bwd, _ = oracle_ratios(p1, x, e)
    np.testing.assert_allclose(torch.exp(replayed[0][1]).numpy(), fwd.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(replayed[1][1]).numpy(), bwd.detach().numpy(), rtol=1e-10)


@pytest.mark.parametrize("name", inits.names("resnet"))
@pytest.mark.parametrize("width", ["7", "6:14"])
@pytest.mark.parametrize("stream", [False, True])
def test_replayed_steps_equal_eager_resnet(name, width, stream):
    """Two stages (a projection block), two hidden layers per branch; fixed widths reuse the
    block steps, random widths exercise the cap."""
    spec = ResNetSpec(
        blocks=4, stages=2, dim=10, width=specs.WidthSpec.parse(width), block_depth=2, inits=(name,)
    )
    plan = resnet.ResNet().plan(spec, 3)
    dims = plan.entries
    x, e = sampling.probe_inputs(3, 5, dims[0], dims[-1], CPU, torch.float64)
    scheme = inits.get(name)
    with torch.no_grad():
        eager, pe = walks.resnet(scheme, plan, x, e, 3, [0, 2], stream=stream)
        runner = replay.Emulated()
        replayed, pr = walks.resnet(scheme, plan, x, e, 3, [0, 2], stream=stream, runner=runner)
    for k in ("ln_fwd", "ln_bwd", "ln_branch"):
        assert_same_up_to_order(getattr(eager, k), getattr(replayed, k), max(dims + [14]), 4 * len(dims))
    if not scheme.standardizes and not scheme.by_block_index and width == "7":
        # each way: the blocks of stage 1 and blocks 2-4 of stage 2 (its first has the
        # projection, seen once: eager)
        assert len(runner.steps) == 4
    if not stream:
        for be, br in zip(pe, pr):
            for a, b in zip(be.branch, br.branch):
                assert_same_up_to_order(a.v, b.v, 14, 1)


def test_at_most_max_graphs_steps_are_captured():
    """Ten layer shapes, each seen twice each way: the first eight repeated shapes are captured,
    the rest run eagerly, with the same numbers."""
    widths = list(range(4, 15)) * 2
    runner = replay.Emulated()
    got = _mlp("proposed", runner, False, widths=widths)
    want = _mlp("proposed", None, False, widths=widths)
    assert len(runner.steps) == replay.MAX_GRAPHS < 20
    _same_mlp(got, want, widths)


def test_a_replay_that_differs_from_eager_turns_graphs_off():
    """The first replay of every step shape is compared with the eager step: a replay that got
    anything else wrong (here: a perturbed output) is caught, and the run goes on eagerly with
    the eager numbers."""

    class Wrong(replay.Emulated):
        def _replay(self, step, body):
            super()._replay(step, body)
            step.outputs["c"].add_(1e-3)

    runner = Wrong()
    got = _mlp("proposed", runner, False)
    want = _mlp("proposed", None, False)
    assert runner.status.startswith("fell back to eager") and "'c'" in runner.status
    assert not runner.steps
    _same_mlp(got, want)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback where CUDA is absent")
def test_cuda_graphs_without_cuda_fall_back_to_eager():
    runner = replay.CudaGraphs()
    got = _mlp("proposed", runner, True)
    want = _mlp("proposed", None, True)
    assert runner.status.startswith("fell back to eager: ")
    _same_mlp(got, want)
    assert plan_engine.graphs_status([replay.Eager(), runner]) == runner.status


def test_a_runner_serves_one_call():
    runner = replay.Emulated()
    _mlp("he", runner, False)
    with pytest.raises(RuntimeError, match="one walk"):
        _mlp("he", runner, False)


def test_emulated_replay_overwrites_its_outputs():
    """As a CUDA graph does: an output kept past the next replay of its step changes."""
    runner = replay.Emulated()
    body = lambda a: {"b": a * 2}
    runner.run("k", body, {"a": torch.ones(3)}, lambda: None)  # first sight: eager
    kept = runner.run("k", body, {"a": torch.ones(3)}, lambda: None)["b"]  # captured
    assert torch.equal(kept, torch.full((3,), 2.0))
    runner.run("k", body, {"a": torch.full((3,), 5.0)}, lambda: None)
    assert torch.equal(kept, torch.full((3,), 10.0))


@pytest.mark.parametrize("name", inits.names({"blocks", "taps"}))  # as-is draws nothing: a model's own
def test_by_block_index_flag_matches_the_sampler(name):
    """Residual blocks share a captured step only when the scheme's draws do not depend on the
    block's index (InitScheme.by_block_index): checked against the sampler itself."""
    scheme = inits.get(name)
    differs = False
    for kind in ("relu", "block_last", "projection"):
        draws = []
        for index in (0, 3):
            gen = torch.Generator().manual_seed(1)
            p = sampling.sample(scheme, LayerRole(6, 5, kind, 4, index), gen, CPU, torch.float64)
            draws.append(p)
        a, b = (dataclasses.asdict(p) for p in draws)
        differs |= any(
            not (x is None and y is None) and (x is None or y is None or not torch.equal(x, y))
            for x, y in zip(a.values(), b.values())
        )
    assert differs == scheme.by_block_index


def test_graphs_are_refused_off_cuda_and_recorded_off():
    from sigprop.errors import SigpropError

    spec = MLPSpec(depth=2, input_dim=4, width=specs.WidthSpec(4, 4), inits=("proposed",))
    with pytest.raises(SigpropError) as err:
        walks.measure(spec, specs.ProbeSpec(samples=4, device="cpu", graphs=True))
    assert err.value.field == "graphs"
    assert walks.measure(spec, specs.ProbeSpec(samples=4, device="cpu"))[2]["graphs"] == "off"


# ------------------------------------------------------------------------------------------
# CUDA: the graphs themselves
# ------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
@pytest.mark.parametrize("name", ["proposed", "he", "pytorch"])
@pytest.mark.parametrize("stream", [False, True])
def test_cuda_graphs_equal_eager_mlp(name, stream):
    dev = torch.device("cuda")
    runner = replay.CudaGraphs()
    replayed = _mlp(name, runner, stream, dev)
    eager = _mlp(name, None, stream, dev)
    assert runner.status == "on" and len(runner.steps) == 2, runner.status
    np.testing.assert_allclose(replayed[0].cpu().numpy(), eager[0].cpu().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(replayed[1].cpu().numpy(), eager[1].cpu().numpy(), rtol=1e-12, atol=1e-12)
    x, e = sampling.probe_inputs(5, 6, MLP_WIDTHS[0], MLP_WIDTHS[-1], dev, torch.float64)
    _, _, p1 = walks.mlp_draw(inits.get(name), MLP_WIDTHS, x, e, seed=5, draw=0)
    fwd, bwd, _ = oracle_ratios(p1, x, e)
    np.testing.assert_allclose(
        torch.exp(replayed[0][0]).cpu().numpy(), fwd.detach().cpu().numpy(), rtol=1e-10
    )
    np.testing.assert_allclose(
        torch.exp(replayed[1][0]).cpu().numpy(), bwd.detach().cpu().numpy(), rtol=1e-10
    )


@needs_cuda
@pytest.mark.parametrize("stream", [False, True])
def test_cuda_graphs_run_mlp_and_resnet_float32(stream):
    """Through the driver (run.measure) at float32 (the default path on a GPU): graphs on, recorded,
    and the numbers of --no-graphs."""
    mlp = MLPSpec(depth=30, input_dim=64, width=specs.WidthSpec(64, 64), inits=("proposed", "he", "datadep"))
    res = ResNetSpec(
        blocks=6, stages=2, dim=32, width=specs.WidthSpec(32, 32), block_depth=1, inits=("proposed", "he")
    )
    for spec in (mlp, res):
        on = walks.measure(spec, specs.ProbeSpec(samples=64, seeds=2, device="cuda", stream=stream))
        off = walks.measure(
            spec, specs.ProbeSpec(samples=64, seeds=2, device="cuda", stream=stream, graphs=False)
        )
        assert on[2]["graphs"].startswith("on") and off[2]["graphs"] == "off", on[2]["graphs"]
        for name in on[1]:
            a, b = on[1][name], off[1][name]
            assert set(a) == set(b) and {"fwd", "bwd"} <= set(a)  # and "branch" for the ResNet
            for key in a:
                np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-5)


def test_a_replay_that_raises_later_falls_back_and_redoes_the_layer():
    """A replay that fails half-way (at the fifth replay, after overwriting its outputs -- which
    are the caller's inputs of this layer) is redone eagerly from the static inputs, and the run
    goes on eagerly: the eager numbers."""

    class Flaky(replay.Emulated):
        calls = 0

        def _replay(self, step, body):
            Flaky.calls += 1
            super()._replay(step, body)
            if Flaky.calls == 5:
                for t in step.outputs.values():
                    if t is not None and t.dtype.is_floating_point:
                        t.fill_(float("nan"))
                raise RuntimeError("replay failed")

    widths = [12] + [17] * 10
    runner = Flaky()
    got = _mlp("he", runner, True, widths=widths)
    want = _mlp("he", None, True, widths=widths)
    assert runner.status == "fell back to eager: RuntimeError: replay failed" and runner.off
    _same_mlp(got, want, widths)


def test_graphs_status_line():
    captured, idle = replay.Emulated(), replay.Emulated()
    _mlp("he", captured, False)
    assert plan_engine.graphs_status([captured, idle]) == "on (2 captured steps)"
    assert plan_engine.graphs_status([idle]) == "on (0 captured steps)"  # no shape repeated
    assert plan_engine.graphs_status([replay.Eager()]) == "off"


@pytest.mark.parametrize("stream", [False, True])
def test_a_plan_with_a_unit_that_cannot_be_replayed_runs_eagerly(stream):
    """The BN layer keeps its BN output by reference, which a replayed step's static buffers
    would overwrite: handed a replaying runner, the walk runs eagerly and gives the eager numbers."""
    plan = resnet.resnet_plan(8, 1, 4, 0, [], stem=True)
    x, e = sampling.probe_inputs(2, 6, 8, 8, CPU, torch.float64)
    scheme = inits.get("unnormalized-he")
    observe = ("fwd", "bwd", "branch", "bn")
    eager = walks.walk(plan.steps, scheme, x, e, 2, [0, 1], observe, space="plain", stream=stream).observed
    runner = replay.Emulated()
    replayed = walks.walk(
        plan.steps, scheme, x, e, 2, [0, 1], observe, space="plain", stream=stream, runner=runner
    ).observed
    assert runner.steps == {} and not runner.seen  # never used
    for key in eager:
        assert torch.equal(eager[key], replayed[key]), key


@needs_cuda
@pytest.mark.parametrize("stream", [False, True])
def test_cuda_graphs_run_cnn_and_wrn(stream):
    """Through the driver on CUDA (issue 18: written and CPU-tested, the graphs not yet run on a
    device): graphs on, recorded, and the numbers of --no-graphs, for the plain CNN (two strided
    convs of one role with different maps: distinct graph keys) and the WRN (projections)."""
    cnn = CNNSpec(depth=6, channels=16, image=(3, 16, 16), inits=("proposed", "pytorch"))
    wrn = WRNSpec(blocks=2, image=(3, 16, 16), inits=("proposed", "stage-hanin"))
    for spec in (cnn, wrn):
        on = walks.measure(spec, specs.ProbeSpec(samples=32, seeds=2, device="cuda", stream=stream))
        off = walks.measure(
            spec, specs.ProbeSpec(samples=32, seeds=2, device="cuda", stream=stream, graphs=False)
        )
        assert on[2]["graphs"].startswith("on") and off[2]["graphs"] == "off", on[2]["graphs"]
        for name in on[1]:
            for key in on[1][name]:
                np.testing.assert_allclose(on[1][name][key], off[1][name][key], rtol=1e-5, atol=1e-5)
