"""The hand-written engine against the torch.autograd oracle (STYLE.md habit 10), log-space
robustness at depth, determinism."""

import math

import numpy as np
import pytest
import torch

from sigprop import engine, inits, specs, stats, theory
from sigprop.errors import SigpropError

INIT_NAMES = inits.names("mlp")


def oracle_ratios(params, x, e):
    """Plain autograd on the explicit WN formula w = g v / ||v||: forward ||h^l||/||x|| and
    backward ||dl/da^l||/||e|| with dl/da^L = e."""
    x = x.detach().clone().requires_grad_(True)
    h = x
    pre = []
    hs = []
    for p in params:
        v = p.v.detach().clone()
        if p.g is not None:
            w = p.g.detach().unsqueeze(1) * v / torch.linalg.vector_norm(v, dim=1, keepdim=True)
        else:
            w = v
        a = h @ w.T
        if p.bias is not None:
            a = a + p.bias.detach()
        a.retain_grad()
        pre.append(a)
        h = torch.relu(a)
        hs.append(h)
    pre[-1].backward(e)
    xn = torch.linalg.vector_norm(x, dim=1)
    en = torch.linalg.vector_norm(e, dim=1)
    fwd = torch.stack([torch.linalg.vector_norm(hh, dim=1) / xn for hh in hs])
    bwd = torch.stack([torch.linalg.vector_norm(a.grad, dim=1) / en for a in pre])
    return fwd, bwd, pre


@pytest.mark.parametrize("name", INIT_NAMES)
@pytest.mark.parametrize("widths", [[9, 7, 12, 5, 8, 11], [6, 6, 6], [12, 3, 20, 4]])
def test_engine_matches_autograd(name, widths):
    torch.manual_seed(0)
    x, e = engine.probe_inputs(3, 16, widths[0], widths[-1], torch.device("cpu"), torch.float64)
    scheme = inits.get(name)
    ln_f, ln_b, params = engine.mlp_forward_backward(scheme, widths, x, e, seed=3, draw=0)
    fwd, bwd, _ = oracle_ratios(params, x, e)
    np.testing.assert_allclose(torch.exp(ln_f).numpy(), fwd.detach().numpy(), rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(torch.exp(ln_b).numpy(), bwd.detach().numpy(), rtol=1e-10, atol=1e-300)


def test_datadep_standardises_preactivations():
    widths = [20, 30, 25, 40]
    x, e = engine.probe_inputs(0, 64, 20, 40, torch.device("cpu"), torch.float64)
    _, _, params = engine.mlp_forward_backward(inits.get("datadep"), widths, x, e, seed=0, draw=0)
    _, _, pre = oracle_ratios(params, x, e)
    for a in pre:
        a = a.detach()
        assert torch.allclose(a.mean(0), torch.zeros(a.shape[1], dtype=a.dtype), atol=1e-10)
        assert torch.allclose(a.std(0, unbiased=False), torch.ones(a.shape[1], dtype=a.dtype), atol=1e-10)


def test_pytorch_matches_nn_linear_default_distribution():
    # nn.Linear's own reset_parameters draws from U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    lin = torch.nn.Linear(400, 300)
    bound = inits.pytorch_linear_bound(400)
    assert lin.weight.abs().max().item() <= bound
    assert lin.weight.var().item() == pytest.approx(bound**2 / 3, rel=0.05)
    role = inits.LayerRole(400, 300)
    p = inits.get("pytorch").sample(role, torch.Generator().manual_seed(0), torch.device("cpu"), torch.float64)
    assert p.v.abs().max().item() <= bound
    assert p.v.var().item() == pytest.approx(bound**2 / 3, rel=0.05)
    assert torch.allclose(p.scale, torch.ones_like(p.scale))  # g = ||v||: w = v


@pytest.mark.parametrize("shape", [(30, 50), (50, 30), (40, 40)])
def test_orthogonal_directions(shape):
    role = inits.LayerRole(fan_in=shape[1], fan_out=shape[0])
    p = inits.get("proposed").sample(role, torch.Generator().manual_seed(1), torch.device("cpu"), torch.float64)
    q = p.v
    gram = q @ q.T if shape[0] <= shape[1] else q.T @ q
    assert torch.allclose(gram, torch.eye(min(shape), dtype=torch.float64), atol=1e-12)
    assert torch.allclose(p.scale * torch.linalg.vector_norm(q, dim=1), p.g)


def test_common_random_numbers_across_inits():
    role = inits.LayerRole(20, 30)
    dev = torch.device("cpu")
    he = inits.get("he").sample(role, engine.layer_generator(0, 0, 1, dev), dev, torch.float64)
    pg = inits.get("proposed-gaussian").sample(role, engine.layer_generator(0, 0, 1, dev), dev, torch.float64)
    # same directions, different gains
    assert torch.allclose(he.v / he.v.norm(dim=1, keepdim=True), pg.v / pg.v.norm(dim=1, keepdim=True))


def test_log_space_depth_3000_stays_finite_and_near_theory():
    spec = specs.MLPSpec(depth=3000, input_dim=64, width=specs.WidthSpec(64, 64), inits=("he", "proposed"))
    probe = specs.ProbeSpec(samples=32, device="cpu")
    widths, out, _ = engine.run_mlp(spec, probe)
    for name, arr in out.items():
        f, b = arr["fwd"], arr["bwd"]
        assert np.isfinite(f).all() and np.isfinite(b).all()
        run = stats.mlp_run(inits.get(name), widths, f, b)
        for r in run.layers:
            for s in (r.forward, r.backward):
                assert s.log10_mean is not None and math.isfinite(s.log10_mean)
    he = stats.mlp_run(inits.get("he"), widths, out["he"]["fwd"], out["he"]["bwd"])
    last = he.layers[-1].forward
    # 2^{-1500}: about 10^{-451.5}; no float holds it, the log does
    assert last.log10_predicted == pytest.approx(-1500 * math.log10(2), rel=1e-12)
    assert last.mean is None or last.mean == 0.0 or last.mean < 1e-300
    assert last.agrees, (last.log10_rms, last.log10_low, last.log10_high)
    # the typical (geometric-mean) ratio sits var below the rms (docs/theory.md, finite-width spread)
    _, var_b = theory.log_ratio_variance(widths, orthogonal=False)
    typical = (-2999 / 2 * math.log(2) - var_b[0]) / math.log(10)
    sd = math.sqrt(var_b[0]) / math.log(10)
    assert abs(he.layers[0].backward.log10_mean - typical) < 3 * sd
    prop = stats.mlp_run(inits.get("proposed"), widths, out["proposed"]["fwd"], out["proposed"]["bwd"])
    assert prop.layers[-1].forward.agrees


def test_same_seed_same_numbers():
    spec = specs.MLPSpec(depth=5, input_dim=30, width=specs.WidthSpec(20, 40), inits=("proposed", "datadep"))
    probe = specs.ProbeSpec(samples=50, seed=7, seeds=2, device="cpu")
    w1, a, _ = engine.run_mlp(spec, probe)
    w2, b, _ = engine.run_mlp(spec, probe)
    assert w1 == w2
    for k in a:
        np.testing.assert_array_equal(a[k]["fwd"], b[k]["fwd"])
        np.testing.assert_array_equal(a[k]["bwd"], b[k]["bwd"])
    # another seed gives other widths and numbers
    w3, c, _ = engine.run_mlp(spec, specs.ProbeSpec(samples=50, seed=8, seeds=2, device="cpu"))
    assert w3 != w1 or not np.array_equal(c["proposed"]["fwd"], a["proposed"]["fwd"])


@pytest.mark.parametrize("width", [1, 2, 3])
def test_dead_units_at_tiny_width_are_counted_not_nan(width):
    spec = specs.MLPSpec(depth=12, input_dim=5, width=specs.WidthSpec(width, width), inits=("proposed", "pytorch"))
    widths, out, _ = engine.run_mlp(spec, specs.ProbeSpec(samples=200, device="cpu"))
    for name, arr in out.items():
        f, b = arr["fwd"], arr["bwd"]
        assert not np.isnan(f).any() and not np.isnan(b).any()
        run = stats.mlp_run(inits.get(name), widths, f, b)
        for r in run.layers:
            for s in (r.forward, r.backward):
                assert 0.0 <= s.dead_fraction <= 1.0
                # log10_mean is over the non-zero ratios: finite unless every sample is dead
                if s.dead_fraction < 1.0:
                    assert math.isfinite(s.log10_mean)
                else:
                    assert s.log10_mean is None and s.mean == 0.0
        if any(c.log10_measured is None for c in run.checks):
            assert not run.passed  # a dead signal never passes --check


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", INIT_NAMES)
def test_cuda_engine_matches_autograd(name):
    widths = [9, 7, 12, 5, 8]
    dev = torch.device("cuda")
    x, e = engine.probe_inputs(3, 16, widths[0], widths[-1], dev, torch.float64)
    ln_f, ln_b, params = engine.mlp_forward_backward(inits.get(name), widths, x, e, seed=3, draw=0)
    fwd, bwd, _ = oracle_ratios(params, x, e)
    np.testing.assert_allclose(torch.exp(ln_f).cpu().numpy(), fwd.detach().cpu().numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(ln_b).cpu().numpy(), bwd.detach().cpu().numpy(), rtol=1e-10)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 250])
def test_mask_bit_packing_round_trip(n, monkeypatch):
    mask = torch.rand(3, 13, n, generator=torch.Generator().manual_seed(n)) > 0.5
    packed = engine.pack_mask(mask)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 13, (n + 7) // 8)
    assert torch.equal(engine.unpack_mask(packed, n), mask)
    # unit k of a group of 8 sits at bit k: the int64 gather equals the weighted-sum fallback
    assert int(engine.pack_mask(torch.tensor([[True] + [False] * 7]))[0, 0]) == 1
    assert int(engine.pack_mask(torch.tensor([[False] * 7 + [True]]))[0, 0]) == 128
    monkeypatch.setattr(engine.sys, "byteorder", "big")
    assert torch.equal(engine.pack_mask(mask), packed)


@pytest.mark.parametrize("name", ["proposed", "datadep", "pytorch"])
def test_streaming_equals_stored(name):
    spec = specs.MLPSpec(depth=12, input_dim=30, width=specs.WidthSpec(20, 40), inits=(name,))
    _, stored, env = engine.run_mlp(spec, specs.ProbeSpec(samples=40, seed=3, seeds=2, device="cpu", stream=False))
    _, streamed, env_s = engine.run_mlp(spec, specs.ProbeSpec(samples=40, seed=3, seeds=2, device="cpu", stream=True))
    assert env["stream"] is False and env_s["stream"] is True
    np.testing.assert_array_equal(stored[name]["fwd"], streamed[name]["fwd"])
    np.testing.assert_array_equal(stored[name]["bwd"], streamed[name]["bwd"])


@pytest.mark.parametrize("name", INIT_NAMES)
@pytest.mark.parametrize("stream", [False, True])
def test_batched_draws_match_autograd_per_draw(name, stream):
    """S draws in one batched pass: each draw equals the oracle on that draw's parameters, and
    the batch equals running the draws one by one."""
    widths = [9, 7, 12, 5, 8]
    x, e = engine.probe_inputs(5, 16, widths[0], widths[-1], torch.device("cpu"), torch.float64)
    scheme = inits.get(name)
    with torch.no_grad():
        f, b, params = engine.mlp_batch(scheme, widths, x, e, seed=5, draws=[0, 3, 1], stream=stream)
    assert f.shape == (3, len(widths) - 1, 16)
    for s, draw in enumerate([0, 3, 1]):
        f1, b1, p1 = engine.mlp_forward_backward(scheme, widths, x, e, seed=5, draw=draw)
        np.testing.assert_allclose(f[s].numpy(), f1.numpy(), rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(b[s].numpy(), b1.numpy(), rtol=1e-13, atol=1e-13)
        fwd, bwd, _ = oracle_ratios(p1, x, e)
        np.testing.assert_allclose(torch.exp(f[s]).numpy(), fwd.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(torch.exp(b[s]).numpy(), bwd.detach().numpy(), rtol=1e-10)
        if not stream:
            assert torch.equal(params[0].v[s], p1[0].v)


def test_draws_split_into_batches_give_the_same_numbers(monkeypatch):
    """--seeds 5 run as one batch of 5 or as batches of 2, 2, 1 (as when memory is short); the
    correlation walks too."""
    spec = specs.MLPSpec(depth=6, input_dim=20, width=specs.WidthSpec(10, 30), inits=("proposed", "datadep"))
    probe = specs.ProbeSpec(samples=24, seed=1, seeds=5, device="cpu", dtype="float64", correlations=(0.0, 0.7), pairs=9)
    _, whole, env = engine.run_mlp(spec, probe)
    assert env["batch"] == 5
    monkeypatch.setattr(engine, "plan_batches", lambda *a, **k: 2)
    _, split, env2 = engine.run_mlp(spec, probe)
    assert env2["batch"] == 2
    for name in spec.inits:
        assert set(whole[name]) == set(split[name]) == {"fwd", "bwd", "correlation"}
        for key in whole[name]:
            a, b = whole[name][key], split[name][key]
            assert a.shape == ((5, 2, 6, 9) if key == "correlation" else (5, 6, 24))
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_tf32_is_refused_off_cuda():
    spec = specs.MLPSpec(depth=2, input_dim=4, width=specs.WidthSpec(4, 4))
    with pytest.raises(SigpropError) as err:
        engine.run_mlp(spec, specs.ProbeSpec(samples=4, device="cpu", precision="tf32"))
    assert err.value.field == "precision"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["proposed", "datadep"])
def test_cuda_batched_and_streamed_match_autograd(name):
    """On CUDA: batched draws, stored and streamed, equal each other and the oracle per draw."""
    widths = [9, 7, 12, 5, 8]
    dev = torch.device("cuda")
    x, e = engine.probe_inputs(5, 16, widths[0], widths[-1], dev, torch.float64)
    scheme = inits.get(name)
    with torch.no_grad():
        stored = engine.mlp_batch(scheme, widths, x, e, seed=5, draws=[0, 1], stream=False)
        streamed = engine.mlp_batch(scheme, widths, x, e, seed=5, draws=[0, 1], stream=True)
    assert torch.equal(stored[0], streamed[0]) and torch.equal(stored[1], streamed[1])
    for s in range(2):
        _, _, p1 = engine.mlp_forward_backward(scheme, widths, x, e, seed=5, draw=s)
        fwd, bwd, _ = oracle_ratios(p1, x, e)
        np.testing.assert_allclose(torch.exp(stored[0][s]).cpu().numpy(), fwd.detach().cpu().numpy(), rtol=1e-10)
        np.testing.assert_allclose(torch.exp(stored[1][s]).cpu().numpy(), bwd.detach().cpu().numpy(), rtol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tf32_runs_and_stays_close_to_fp32():
    spec = specs.MLPSpec(depth=50, input_dim=256, width=specs.WidthSpec(256, 256), inits=("proposed",))
    f32 = engine.run_mlp(spec, specs.ProbeSpec(samples=256, device="cuda"))[1]["proposed"]["fwd"]
    t32 = engine.run_mlp(spec, specs.ProbeSpec(samples=256, device="cuda", precision="tf32"))[1]["proposed"]["fwd"]
    assert torch.backends.cuda.matmul.allow_tf32 is False  # restored after the run
    # TF32 keeps 10 mantissa bits: per-layer relative error ~ 2^-11; 50 layers stay well within 1%
    assert np.abs(t32 - f32).max() < 0.01


@pytest.mark.parametrize("arch", ["mlp", "resnet", "bn"])
def test_one_weight_arena_alive_at_a_time(monkeypatch, arch):
    """Each init (and batch of draws) frees its stored weights before the next allocates its
    own: the peak memory is one draw batch's, as the estimate assumes.  (Keeping the returned
    params alive across the loop once doubled the peak: 16 GiB for an 8 GiB ResNet.)"""
    import gc
    import weakref

    live, peak = [], [0]
    real = engine.Arena.__init__

    def tracking(self, numel, device, dtype):
        real(self, numel, device, dtype)
        if dtype.is_floating_point and numel > 2000:  # the weight arenas (rows arenas are small)
            live.append(weakref.ref(self.buf))  # views of it keep the buffer alive
            peak[0] = max(peak[0], sum(r() is not None for r in live))

    monkeypatch.setattr(engine.Arena, "__init__", tracking)
    gc.disable()  # refcounting alone must free them
    try:
        probe = specs.ProbeSpec(samples=8, seeds=2, device="cpu", stream=False, batch=1)
        if arch == "mlp":
            engine.run_mlp(specs.MLPSpec(depth=6, input_dim=32, width=specs.WidthSpec(32, 32), inits=("proposed", "he", "pytorch")), probe)
        else:
            norm, names = ("bn", ("unnormalized-he",)) if arch == "bn" else ("wn", ("proposed", "he"))
            engine.run_resnet(specs.ResNetSpec(blocks=3, dim=32, width=specs.WidthSpec(32, 32), norm=norm, inits=names), probe)
    finally:
        gc.enable()
    assert len(live) >= 2 and peak[0] == 1


# ------------------------------------------------------------------------------------------
# Haar directions orthogonalized in batches (the CUDA default), checked on the CPU
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["proposed"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("emulated", [False, True])
def test_chunked_haar_equals_per_layer_and_autograd(monkeypatch, name, stream, emulated):
    """Layers 2..L drawn CHUNK_MAX = 4 at a time and orthogonalized in one batched UT-transform
    call (stored, or redrawn chunk by chunk in the backward pass): the ratios of the per-layer
    LAPACK path to rounding (float64: 1e-13 in ln ratio over 2 x 11 steps), the same directions,
    and the autograd oracle per draw."""
    from sigprop import replay

    widths = [12] + [16] * 11
    x, e = engine.probe_inputs(5, 6, widths[0], widths[-1], torch.device("cpu"), torch.float64)
    scheme = inits.get(name)
    monkeypatch.setattr(engine, "BATCHED_HAAR", "never")
    with torch.no_grad():
        want = engine.mlp_batch(scheme, widths, x, e, 5, [0, 2], stream=stream)
    monkeypatch.setattr(engine, "BATCHED_HAAR", "always")
    monkeypatch.setattr(engine, "CHUNK_MAX", 4)
    assert engine.haar_chunk(scheme, widths, 2, torch.device("cpu"), 8) == 4
    runner = replay.Emulated() if emulated else None
    with torch.no_grad():
        got = engine.mlp_batch(scheme, widths, x, e, 5, [0, 2], stream=stream, runner=runner)
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=0, atol=1e-13)
    np.testing.assert_allclose(got[1].numpy(), want[1].numpy(), rtol=0, atol=1e-13)
    if emulated:  # 10 layers in chunks of 4, 4, 2: the chunk step of 4 and the given-v step are replayed
        assert any(k[0] == "chunk" for k in runner.steps) and any(k[0] == "fwd-given" for k in runner.steps)
    if not stream:
        for pa, pb in zip(got[2], want[2]):
            assert (pa.v - pb.v).abs().max().item() < 1e-14
    _, _, p1 = engine.mlp_forward_backward(scheme, widths, x, e, seed=5, draw=2)
    fwd, bwd, _ = oracle_ratios(p1, x, e)
    np.testing.assert_allclose(torch.exp(got[0][1]).numpy(), fwd.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(got[1][1]).numpy(), bwd.detach().numpy(), rtol=1e-10)


def test_chunking_is_off_where_it_does_not_apply(monkeypatch):
    monkeypatch.setattr(engine, "BATCHED_HAAR", "always")
    cpu = torch.device("cpu")
    assert engine.haar_chunk(inits.get("proposed"), [8, 16, 17, 16], 1, cpu, 4) == 0  # shapes differ
    assert engine.haar_chunk(inits.get("he"), [8] + [16] * 5, 1, cpu, 4) == 0  # Gaussian directions
    assert engine.haar_chunk(inits.get("datadep"), [8] + [16] * 5, 1, cpu, 4) == 0
    monkeypatch.setattr(engine, "BATCHED_HAAR", "cuda")
    assert engine.haar_chunk(inits.get("proposed"), [8] + [16] * 5, 1, cpu, 4) == 0  # CPU: LAPACK per layer


def test_batched_draws_use_one_haar_call_and_equal_per_draw(monkeypatch):
    """On CUDA the draws of a layer are orthogonalized together; forced here on the CPU: the
    same directions as drawing each alone, to rounding."""
    role = inits.LayerRole(12, 9)
    gens = lambda: [engine.layer_generator(3, d, 1, torch.device("cpu")) for d in range(4)]
    want = engine.sample_layer(inits.get("proposed"), role, gens(), "cpu", torch.float64)
    monkeypatch.setattr(engine, "BATCHED_HAAR", "always")
    got = engine.sample_layer(inits.get("proposed"), role, gens(), "cpu", torch.float64)
    assert (got.v - want.v).abs().max().item() < 1e-14 and (got.scale - want.scale).abs().max().item() < 1e-14
