"""The ResNet kind (sigprop/kinds/resnet.py): its walks against the torch.autograd oracle
(../shared/STYLE.md habit 10) for every scheme, for D > 1 and K > 1, and the BN net of De & Smith
2020, appendix C; log space at 3000 blocks; its plan."""

import math

import numpy as np
import pytest
import torch
import walks
from oracle import oracle_bn, oracle_resnet

from sigprop import inits, kinds, specs, walker
from sigprop.kernels import sampling
from sigprop.kinds import resnet
from sigprop.kinds.resnet import ResNetSpec

KIND = kinds.KINDS["resnet"]
RESNET_INITS = inits.names(KIND.provides)
CPU = torch.device("cpu")


def _plan(dim, stages, blocks, depth, lo=3, hi=9, seed=0):
    spec = ResNetSpec(
        blocks=blocks,
        stages=stages,
        dim=dim,
        width=specs.WidthSpec(lo, hi),
        block_depth=depth,
        inits=("proposed",),
    )
    return KIND.plan(spec, seed)


@pytest.mark.parametrize("name", RESNET_INITS)
@pytest.mark.parametrize("shape", [(7, 1, 4, 1), (6, 3, 3, 2), (5, 2, 2, 3)])
def test_resnet_engine_matches_autograd(name, shape):
    dim, stages, blocks, depth = shape
    plan = _plan(dim, stages, blocks, depth)
    x, e = sampling.probe_inputs(4, 16, plan.dim, plan.entries[-1], CPU, torch.float64)
    r, params = walks.resnet_draw(inits.get(name), plan, x, e, seed=4, draw=0)
    fwd, bwd, branch, _ = oracle_resnet(params, x, e)
    np.testing.assert_allclose(torch.exp(r.ln_fwd).numpy(), fwd.numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_bwd).numpy(), bwd.numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_branch).numpy(), branch.numpy(), rtol=1e-10, atol=0)


def test_plan_shapes():
    plan = _plan(6, 3, 3, 2)
    assert plan.stage_dims == (6, 12, 24)
    assert plan.entries == [6] + [6] * 3 + [12] * 3 + [24] * 3
    assert plan.entry_stages() == [0] + [1] * 3 + [2] * 3 + [3] * 3
    assert [b.projection for b in plan.blocks] == [False] * 3 + [True, False, False] * 2
    assert [plan.stage_span(k) for k in (1, 2, 3)] == [(0, 3), (3, 6), (6, 9)]
    roles = plan.blocks[3].branch_roles()
    assert [r.kind for r in roles] == ["relu", "relu", "block_last"]
    assert roles[0].fan_in == 6 and roles[-1].fan_out == 12
    assert plan.blocks[3].projection_role().kind == "projection"
    units, _ = walker.compile_plan(plan.steps, inits.get("proposed"))
    ids = [i for u in units for i in u.layer_ids]
    assert len(ids) == len(set(ids))  # every layer has its own generator


def test_proposed_gains_and_alpha():
    role = inits.LayerRole(200, 500, "block_last", blocks_in_stage=40, block_index=3)
    p = sampling.sample(inits.get("proposed"), role, torch.Generator().manual_seed(0), CPU, torch.float64)
    assert torch.allclose(p.g, torch.full((500,), math.sqrt(200 / (40 * 500)), dtype=torch.float64))
    p = sampling.sample(inits.get("stage-hanin"), role, torch.Generator().manual_seed(0), CPU, torch.float64)
    assert torch.allclose(p.g, torch.full((500,), 0.9**4 * math.sqrt(200 / 500), dtype=torch.float64))
    proj = inits.LayerRole(500, 1000, "projection", 40, 0)
    p = sampling.sample(inits.get("proposed"), proj, torch.Generator().manual_seed(0), CPU, torch.float64)
    assert torch.allclose(p.g, torch.full((1000,), math.sqrt(0.5), dtype=torch.float64))
    assert inits.get("skipinit").alpha(40) == 0.0
    assert inits.get("skipinit-sqrt").alpha(40) == pytest.approx(1 / math.sqrt(40))
    assert inits.get("proposed").alpha(40) == 1.0


def test_datadep_standardises_every_resnet_layer():
    plan = _plan(8, 2, 2, 2, lo=10, hi=14)
    x, e = sampling.probe_inputs(0, 64, plan.dim, plan.entries[-1], CPU, torch.float64)
    _, params = walks.resnet_draw(inits.get("datadep"), plan, x, e, seed=0, draw=0)
    _, _, _, pre = oracle_resnet(params, x, e)
    assert len(pre) == 4 * 3 + 1  # 2 stages x 2 blocks x 3 branch layers, and one projection
    for a in pre:
        assert torch.allclose(a.mean(0), torch.zeros(a.shape[1], dtype=a.dtype), atol=1e-9)
        assert torch.allclose(a.std(0, unbiased=False), torch.ones(a.shape[1], dtype=a.dtype), atol=1e-9)


def test_skipinit_is_exactly_the_identity():
    plan = _plan(10, 1, 50, 1)
    x, e = sampling.probe_inputs(1, 32, 10, 10, CPU, torch.float64)
    r, _ = walks.resnet_draw(inits.get("skipinit"), plan, x, e, seed=1, draw=0)
    assert torch.all(r.ln_fwd.abs() < 1e-14) and torch.all(r.ln_bwd.abs() < 1e-14)
    assert torch.all(torch.isneginf(r.ln_branch))


@pytest.mark.parametrize("dim, blocks", [(6, 3), (12, 7)])
def test_bn_engine_matches_autograd(dim, blocks):
    plan = KIND.plan(ResNetSpec(blocks=blocks, dim=dim, norm="bn", inits=("he",)), 0)
    assert plan.entries == [dim] * (blocks + 2)
    x, e = sampling.probe_inputs(2, 20, dim, dim, CPU, torch.float64)
    r, params = walks.bn_draw(plan, x, e, seed=2, draw=0)
    fwd, bwd, hs = oracle_bn(params, x, e)
    np.testing.assert_allclose(torch.exp(r.ln_fwd).numpy(), fwd.numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_bwd).numpy(), bwd.numpy(), rtol=1e-9)
    for l, X in enumerate(hs):
        assert r.bn[l, 0].item() == pytest.approx(X.var(unbiased=False).item(), rel=1e-12)
        assert r.bn[l, 1].item() == pytest.approx(X.var(0, unbiased=False).mean().item(), rel=1e-12)
        assert r.bn[l, 2].item() == pytest.approx((X.mean(0) ** 2).mean().item(), rel=1e-12)


@pytest.mark.parametrize("name", ["he", "unnormalized-he", "proposed"])
def test_log_space_3000_blocks_stays_finite(name):
    spec = ResNetSpec(blocks=3000, dim=24, width=specs.WidthSpec(12, 12), inits=(name,))
    plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=16, device="cpu"))
    f, b = out[name]["fwd"], out[name]["bwd"]
    assert np.isfinite(f).all() and np.isfinite(b).all()
    scheme = inits.get(name)
    run = walks.assemble("resnet", scheme, plan, out[name], spec, specs.ProbeSpec(samples=16))
    last = run.layers[-1].forward
    assert math.isfinite(last.log10_mean) and last.agrees
    if name != "proposed":
        # he: (1 + 1/2)^{1500} ~ 10^264; unnormalized-he: 3^{1500} ~ 10^716: no float holds them
        assert last.log10_predicted > 250
    if name == "unnormalized-he":
        assert last.rms is None and last.log10_rms > 600  # reported from its log10
    # the typical ratio sits var below the rms (docs/theory.md §7): at width 24, 3000 blocks of
    # unnormalized-he drift by ~ -190 in ln, which the spread model predicts
    pred = resnet.prediction(scheme, plan)
    var_f, _ = resnet.variances(scheme.orthogonal, plan, pred.gains).variances
    assert abs(f[0, -1].mean() - (pred.ln_forward[-1] - var_f[-1])) < 4 * math.sqrt(var_f[-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", RESNET_INITS)
def test_cuda_resnet_matches_autograd(name):
    plan = _plan(6, 2, 3, 2)
    dev = torch.device("cuda")
    x, e = sampling.probe_inputs(4, 16, plan.dim, plan.entries[-1], dev, torch.float64)
    r, params = walks.resnet_draw(inits.get(name), plan, x, e, seed=4, draw=0)
    fwd, bwd, _, _ = oracle_resnet(params, x, e)
    np.testing.assert_allclose(torch.exp(r.ln_fwd).cpu().numpy(), fwd.cpu().numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_bwd).cpu().numpy(), bwd.cpu().numpy(), rtol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bn_matches_autograd():
    plan = KIND.plan(ResNetSpec(blocks=5, dim=8, norm="bn", inits=("he",)), 0)
    dev = torch.device("cuda")
    x, e = sampling.probe_inputs(2, 20, 8, 8, dev, torch.float64)
    r, params = walks.bn_draw(plan, x, e, seed=2, draw=0)
    fwd, bwd, _ = oracle_bn(params, x, e)
    np.testing.assert_allclose(torch.exp(r.ln_fwd).cpu().numpy(), fwd.cpu().numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_bwd).cpu().numpy(), bwd.cpu().numpy(), rtol=1e-9)


@pytest.mark.parametrize("name", ["proposed", "datadep", "pytorch", "skipinit-sqrt", "unnormalized-he"])
@pytest.mark.parametrize("stream", [False, True])
def test_resnet_batched_and_streamed_match_autograd_per_draw(name, stream):
    """Batched draws (stored or streamed, with projections and D = 2) equal the oracle per draw
    and the one-draw walk."""
    plan = _plan(6, 2, 3, 2)
    x, e = sampling.probe_inputs(4, 16, plan.dim, plan.entries[-1], CPU, torch.float64)
    with torch.no_grad():
        r, _ = walks.resnet(inits.get(name), plan, x, e, seed=4, draws=[2, 0], stream=stream)
    for s, draw in enumerate([2, 0]):
        r1, params = walks.resnet_draw(inits.get(name), plan, x, e, seed=4, draw=draw)
        fwd, bwd, branch, _ = oracle_resnet(params, x, e)
        for got, one, ref in (
            (r.ln_fwd, r1.ln_fwd, fwd),
            (r.ln_bwd, r1.ln_bwd, bwd),
            (r.ln_branch, r1.ln_branch, branch),
        ):
            np.testing.assert_allclose(got[s].numpy(), one.numpy(), rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(torch.exp(got[s]).numpy(), ref.numpy(), rtol=1e-10)


@pytest.mark.parametrize("stream", [False, True])
def test_bn_batched_and_streamed_match_autograd_per_draw(stream):
    plan = KIND.plan(ResNetSpec(blocks=4, dim=7, norm="bn", inits=("he",)), 0)
    x, e = sampling.probe_inputs(2, 20, 7, 7, CPU, torch.float64)
    with torch.no_grad():
        r, _ = walks.bn(plan, x, e, seed=2, draws=[1, 0, 2], stream=stream)
    for s, draw in enumerate([1, 0, 2]):
        r1, params = walks.bn_draw(plan, x, e, seed=2, draw=draw)
        fwd, bwd, _ = oracle_bn(params, x, e)
        np.testing.assert_allclose(torch.exp(r.ln_fwd[s]).numpy(), fwd.numpy(), rtol=1e-10)
        np.testing.assert_allclose(torch.exp(r.ln_bwd[s]).numpy(), bwd.numpy(), rtol=1e-9)
        np.testing.assert_allclose(r.bn[s].numpy(), r1.bn.numpy(), rtol=1e-12)


@pytest.mark.parametrize(
    "norm, names",
    [("wn", ("proposed", "datadep", "stage-hanin")), ("bn", ("he",)), ("none", ("he", "skipinit"))],
)
def test_resnet_streaming_equals_stored(norm, names):
    kw = {} if norm == "bn" else {"stages": 2, "block_depth": 2, "width": specs.WidthSpec(5, 9)}
    spec = ResNetSpec(blocks=3, dim=8, norm=norm, inits=names, **kw)
    runs = [
        walks.measure(spec, specs.ProbeSpec(samples=24, seed=3, seeds=2, device="cpu", stream=s))
        for s in (False, True)
    ]
    assert [r[2]["stream"] for r in runs] == [False, True]
    for name in spec.resolved_inits():
        for key, arr in runs[0][1][name].items():
            np.testing.assert_array_equal(arr, runs[1][1][name][key])
