"""The ResNet engines against the torch.autograd oracle (STYLE.md habit 10), for every scheme,
for D > 1 and K > 1, and the BN net of 004 appendix C; log space at 3000 blocks."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sigprop import engine, inits, nets, specs, theory

RESNET_INITS = inits.names("resnet")
CPU = torch.device("cpu")


def _weight(p):
    v = p.v.detach().clone()
    if p.g is None:
        return v
    return p.g.detach().unsqueeze(1) * v / torch.linalg.vector_norm(v, dim=1, keepdim=True)


def _apply(p, h):
    a = h @ _weight(p).T
    return a if p.bias is None else a + p.bias.detach()


def oracle_resnet(params, x, e):
    """Plain autograd on the explicit formula h^b = S h^{b-1} + alpha F(h^{b-1}), w = g v/||v||:
    forward ||h^b||/||x||, backward ||dl/dh^b||/||e|| with l = sum_i <e_i, h^E_i>, branch ratios,
    and every pre-activation (to check the data-dependent calibration)."""
    h = x.detach().clone().requires_grad_(True)
    hs, branch, pre = [h], [], []
    for bp in params:
        z = hs[-1]
        for j, p in enumerate(bp.branch):
            z = _apply(p, z)
            pre.append(z)
            if j < len(bp.branch) - 1:
                z = torch.relu(z)
        s = hs[-1] if bp.projection is None else _apply(bp.projection, hs[-1])
        if bp.projection is not None:
            pre.append(s)
        branch.append(torch.linalg.vector_norm(bp.alpha * z, dim=1) / torch.linalg.vector_norm(hs[-1], dim=1))
        h = s + bp.alpha * z
        h.retain_grad()
        hs.append(h)
    for t in hs:
        t.retain_grad()
    (hs[-1] * e).sum().backward()
    xn = torch.linalg.vector_norm(x, dim=1)
    en = torch.linalg.vector_norm(e, dim=1)
    fwd = torch.stack([torch.linalg.vector_norm(t, dim=1) / xn for t in hs])
    bwd = torch.stack([torch.linalg.vector_norm(t.grad, dim=1) / en for t in hs])
    return fwd.detach(), bwd.detach(), torch.stack(branch).detach(), [p.detach() for p in pre]


def _plan(dim, stages, blocks, depth, lo=3, hi=9, seed=0):
    spec = specs.ResNetSpec(blocks=blocks, stages=stages, dim=dim, width=specs.WidthSpec(lo, hi), block_depth=depth, inits=("proposed",))
    return spec.plan(seed)


@pytest.mark.parametrize("name", RESNET_INITS)
@pytest.mark.parametrize("shape", [(7, 1, 4, 1), (6, 3, 3, 2), (5, 2, 2, 3)])
def test_resnet_engine_matches_autograd(name, shape):
    dim, stages, blocks, depth = shape
    plan = _plan(dim, stages, blocks, depth)
    x, e = engine.probe_inputs(4, 16, plan.dim, plan.entry_dims()[-1], CPU, torch.float64)
    r, params = engine.resnet_forward_backward(inits.get(name), plan, x, e, seed=4, draw=0)
    fwd, bwd, branch, _ = oracle_resnet(params, x, e)
    np.testing.assert_allclose(torch.exp(r.ln_fwd).numpy(), fwd.numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_bwd).numpy(), bwd.numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_branch).numpy(), branch.numpy(), rtol=1e-10, atol=0)


def test_plan_shapes():
    plan = _plan(6, 3, 3, 2)
    assert plan.stage_dims == (6, 12, 24)
    assert plan.entry_dims() == [6] + [6] * 3 + [12] * 3 + [24] * 3
    assert plan.entry_stages() == [0] + [1] * 3 + [2] * 3 + [3] * 3
    assert [b.projection for b in plan.blocks] == [False] * 3 + [True, False, False] * 2
    assert [plan.stage_span(k) for k in (1, 2, 3)] == [(0, 3), (3, 6), (6, 9)]
    roles = plan.blocks[3].branch_roles()
    assert [r.kind for r in roles] == ["relu", "relu", "block_last"]
    assert roles[0].fan_in == 6 and roles[-1].fan_out == 12
    assert plan.blocks[3].projection_role().kind == "projection"
    ids = [i for b in plan.blocks for i in b.layer_ids()]
    assert len(ids) == len(set(ids))  # every layer has its own generator


def test_proposed_gains_and_alpha():
    role = inits.LayerRole(200, 500, "block_last", blocks_in_stage=40, block_index=3)
    p = inits.get("proposed").sample(role, torch.Generator().manual_seed(0), CPU, torch.float64)
    assert torch.allclose(p.g, torch.full((500,), math.sqrt(200 / (40 * 500)), dtype=torch.float64))
    p = inits.get("stage-hanin").sample(role, torch.Generator().manual_seed(0), CPU, torch.float64)
    assert torch.allclose(p.g, torch.full((500,), 0.9**4 * math.sqrt(200 / 500), dtype=torch.float64))
    proj = inits.LayerRole(500, 1000, "projection", 40, 0)
    p = inits.get("proposed").sample(proj, torch.Generator().manual_seed(0), CPU, torch.float64)
    assert torch.allclose(p.g, torch.full((1000,), math.sqrt(0.5), dtype=torch.float64))
    assert inits.get("skipinit").alpha(40) == 0.0
    assert inits.get("skipinit-sqrt").alpha(40) == pytest.approx(1 / math.sqrt(40))
    assert inits.get("proposed").alpha(40) == 1.0


def test_datadep_standardises_every_resnet_layer():
    plan = _plan(8, 2, 2, 2, lo=10, hi=14)
    x, e = engine.probe_inputs(0, 64, plan.dim, plan.entry_dims()[-1], CPU, torch.float64)
    _, params = engine.resnet_forward_backward(inits.get("datadep"), plan, x, e, seed=0, draw=0)
    _, _, _, pre = oracle_resnet(params, x, e)
    assert len(pre) == 4 * 3 + 1  # 2 stages x 2 blocks x 3 branch layers, and one projection
    for a in pre:
        assert torch.allclose(a.mean(0), torch.zeros(a.shape[1], dtype=a.dtype), atol=1e-9)
        assert torch.allclose(a.std(0, unbiased=False), torch.ones(a.shape[1], dtype=a.dtype), atol=1e-9)


def test_skipinit_is_exactly_the_identity():
    plan = _plan(10, 1, 50, 1)
    x, e = engine.probe_inputs(1, 32, 10, 10, CPU, torch.float64)
    r, _ = engine.resnet_forward_backward(inits.get("skipinit"), plan, x, e, seed=1, draw=0)
    assert torch.all(r.ln_fwd.abs() < 1e-14) and torch.all(r.ln_bwd.abs() < 1e-14)
    assert torch.all(torch.isneginf(r.ln_branch))


def oracle_bn(params, x, e, eps=theory.BN_EPS):
    h = x.detach().clone().requires_grad_(True)
    hs = [h]
    for l, p in enumerate(params):
        y = F.batch_norm(hs[-1], None, None, training=True, eps=eps)
        z = torch.relu(y) @ p.v.detach().T
        h = z if l == 0 else hs[-1] + z
        h.retain_grad()
        hs.append(h)
    (hs[-1] * e).sum().backward()
    xn = torch.linalg.vector_norm(x, dim=1)
    en = torch.linalg.vector_norm(e, dim=1)
    fwd = torch.stack([torch.linalg.vector_norm(t, dim=1) / xn for t in hs])
    bwd = torch.stack([torch.linalg.vector_norm(t.grad, dim=1) / en for t in hs])
    return fwd.detach(), bwd.detach(), [t.detach() for t in hs]


@pytest.mark.parametrize("dim, blocks", [(6, 3), (12, 7)])
def test_bn_engine_matches_autograd(dim, blocks):
    plan = specs.ResNetSpec(blocks=blocks, dim=dim, norm="bn", inits=("he",)).plan(0)
    assert plan.entry_dims() == [dim] * (blocks + 2)
    x, e = engine.probe_inputs(2, 20, dim, dim, CPU, torch.float64)
    r, params = engine.bn_forward_backward(plan, x, e, seed=2, draw=0)
    fwd, bwd, hs = oracle_bn(params, x, e)
    np.testing.assert_allclose(torch.exp(r.ln_fwd).numpy(), fwd.numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_bwd).numpy(), bwd.numpy(), rtol=1e-9)
    for l, X in enumerate(hs):
        assert r.bn[l, 0].item() == pytest.approx(X.var(unbiased=False).item(), rel=1e-12)
        assert r.bn[l, 1].item() == pytest.approx(X.var(0, unbiased=False).mean().item(), rel=1e-12)
        assert r.bn[l, 2].item() == pytest.approx((X.mean(0) ** 2).mean().item(), rel=1e-12)


@pytest.mark.parametrize("name", ["he", "unnormalized-he", "proposed"])
def test_log_space_3000_blocks_stays_finite(name):
    from sigprop import stats

    spec = specs.ResNetSpec(blocks=3000, dim=24, width=specs.WidthSpec(12, 12), inits=(name,))
    plan, out, _ = engine.run_resnet(spec, specs.ProbeSpec(samples=16, device="cpu"))
    f, b = out[name]["fwd"], out[name]["bwd"]
    assert np.isfinite(f).all() and np.isfinite(b).all()
    scheme = inits.get(name)
    run = stats.resnet_run(scheme, plan, out[name], 16)
    last = run.layers[-1].forward
    assert math.isfinite(last.log10_mean) and last.agrees
    if name != "proposed":
        # he: (1 + 1/2)^{1500} ~ 10^264; unnormalized-he: 3^{1500} ~ 10^716: no float holds them
        assert last.log10_predicted > 250
    if name == "unnormalized-he":
        assert last.rms is None and last.log10_rms > 600  # reported from its log10
    # the typical ratio sits var below the rms (docs/theory.md §7): at width 24, 3000 blocks of
    # unnormalized-he drift by ~ -190 in ln, which the spread model predicts
    pred = scheme.predict_resnet(plan)
    var_f, _, _, _ = stats.resnet_variances(scheme, plan, pred)
    assert abs(f[0, -1].mean() - (pred.ln_forward[-1] - var_f[-1])) < 4 * math.sqrt(var_f[-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", RESNET_INITS)
def test_cuda_resnet_matches_autograd(name):
    plan = _plan(6, 2, 3, 2)
    dev = torch.device("cuda")
    x, e = engine.probe_inputs(4, 16, plan.dim, plan.entry_dims()[-1], dev, torch.float64)
    r, params = engine.resnet_forward_backward(inits.get(name), plan, x, e, seed=4, draw=0)
    fwd, bwd, _, _ = oracle_resnet(params, x, e)
    np.testing.assert_allclose(torch.exp(r.ln_fwd).cpu().numpy(), fwd.cpu().numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_bwd).cpu().numpy(), bwd.cpu().numpy(), rtol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bn_matches_autograd():
    plan = specs.ResNetSpec(blocks=5, dim=8, norm="bn", inits=("he",)).plan(0)
    dev = torch.device("cuda")
    x, e = engine.probe_inputs(2, 20, 8, 8, dev, torch.float64)
    r, params = engine.bn_forward_backward(plan, x, e, seed=2, draw=0)
    fwd, bwd, _ = oracle_bn(params, x, e)
    np.testing.assert_allclose(torch.exp(r.ln_fwd).cpu().numpy(), fwd.cpu().numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.ln_bwd).cpu().numpy(), bwd.cpu().numpy(), rtol=1e-9)


@pytest.mark.parametrize("name", ["proposed", "datadep", "pytorch", "skipinit-sqrt", "unnormalized-he"])
@pytest.mark.parametrize("stream", [False, True])
def test_resnet_batched_and_streamed_match_autograd_per_draw(name, stream):
    """Batched draws (stored or streamed, with projections and D = 2) equal the oracle per draw
    and the one-draw engine."""
    plan = _plan(6, 2, 3, 2)
    x, e = engine.probe_inputs(4, 16, plan.dim, plan.entry_dims()[-1], CPU, torch.float64)
    with torch.no_grad():
        r, _ = engine.resnet_batch(inits.get(name), plan, x, e, seed=4, draws=[2, 0], stream=stream)
    for s, draw in enumerate([2, 0]):
        r1, params = engine.resnet_forward_backward(inits.get(name), plan, x, e, seed=4, draw=draw)
        fwd, bwd, branch, _ = oracle_resnet(params, x, e)
        for got, one, ref in ((r.ln_fwd, r1.ln_fwd, fwd), (r.ln_bwd, r1.ln_bwd, bwd), (r.ln_branch, r1.ln_branch, branch)):
            np.testing.assert_allclose(got[s].numpy(), one.numpy(), rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(torch.exp(got[s]).numpy(), ref.numpy(), rtol=1e-10)


@pytest.mark.parametrize("stream", [False, True])
def test_bn_batched_and_streamed_match_autograd_per_draw(stream):
    plan = specs.ResNetSpec(blocks=4, dim=7, norm="bn", inits=("he",)).plan(0)
    x, e = engine.probe_inputs(2, 20, 7, 7, CPU, torch.float64)
    with torch.no_grad():
        r, _ = engine.bn_batch(plan, x, e, seed=2, draws=[1, 0, 2], stream=stream)
    for s, draw in enumerate([1, 0, 2]):
        r1, params = engine.bn_forward_backward(plan, x, e, seed=2, draw=draw)
        fwd, bwd, _ = oracle_bn(params, x, e)
        np.testing.assert_allclose(torch.exp(r.ln_fwd[s]).numpy(), fwd.numpy(), rtol=1e-10)
        np.testing.assert_allclose(torch.exp(r.ln_bwd[s]).numpy(), bwd.numpy(), rtol=1e-9)
        np.testing.assert_allclose(r.bn[s].numpy(), r1.bn.numpy(), rtol=1e-12)


@pytest.mark.parametrize("norm, names", [("wn", ("proposed", "datadep", "stage-hanin")), ("bn", ("he",)), ("none", ("he", "skipinit"))])
def test_resnet_streaming_equals_stored(norm, names):
    kw = {} if norm == "bn" else {"stages": 2, "block_depth": 2, "width": specs.WidthSpec(5, 9)}
    spec = specs.ResNetSpec(blocks=3, dim=8, norm=norm, inits=names, **kw)
    runs = [engine.run_resnet(spec, specs.ProbeSpec(samples=24, seed=3, seeds=2, device="cpu", stream=s)) for s in (False, True)]
    assert [r[2]["stream"] for r in runs] == [False, True]
    for name in spec.resolved_inits():
        for key, arr in runs[0][1][name].items():
            np.testing.assert_array_equal(arr, runs[1][1][name][key])
