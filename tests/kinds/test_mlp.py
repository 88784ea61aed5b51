"""The MLP kind (sigprop/kinds/mlp.py): the walker against the torch.autograd oracle
(../shared/STYLE.md habit 10), log-space robustness at depth, determinism."""

import dataclasses
import math

import closed_forms
import numpy as np
import pytest
import torch
import walks
from oracle import oracle_ratios

from sigprop import inits, specs
from sigprop.errors import SigpropError
from sigprop.kernels import logspace as ls
from sigprop.kernels import sampling
from sigprop.kinds.mlp import MLPSpec
from sigprop.kinds.resnet import ResNetSpec

INIT_NAMES = inits.names("mlp")


@pytest.mark.parametrize("name", INIT_NAMES)
@pytest.mark.parametrize("widths", [[9, 7, 12, 5, 8, 11], [6, 6, 6], [12, 3, 20, 4]])
def test_engine_matches_autograd(name, widths):
    torch.manual_seed(0)
    x, e = sampling.probe_inputs(3, 16, widths[0], widths[-1], torch.device("cpu"), torch.float64)
    scheme = inits.get(name)
    ln_f, ln_b, params = walks.mlp_draw(scheme, widths, x, e, seed=3, draw=0)
    fwd, bwd, _ = oracle_ratios(params, x, e)
    np.testing.assert_allclose(torch.exp(ln_f).numpy(), fwd.detach().numpy(), rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(torch.exp(ln_b).numpy(), bwd.detach().numpy(), rtol=1e-10, atol=1e-300)


def test_datadep_standardises_preactivations():
    widths = [20, 30, 25, 40]
    x, e = sampling.probe_inputs(0, 64, 20, 40, torch.device("cpu"), torch.float64)
    _, _, params = walks.mlp_draw(inits.get("datadep"), widths, x, e, seed=0, draw=0)
    _, _, pre = oracle_ratios(params, x, e)
    for a in pre:
        a = a.detach()
        assert torch.allclose(a.mean(0), torch.zeros(a.shape[1], dtype=a.dtype), atol=1e-10)
        assert torch.allclose(a.std(0, unbiased=False), torch.ones(a.shape[1], dtype=a.dtype), atol=1e-10)


def test_log_space_depth_3000_stays_finite_and_near_theory():
    spec = MLPSpec(depth=3000, input_dim=64, width=specs.WidthSpec(64, 64), inits=("he", "proposed"))
    probe = specs.ProbeSpec(samples=32, device="cpu")
    plan, out, _ = walks.measure(spec, probe)
    widths = plan.widths
    for name, arr in out.items():
        f, b = arr["fwd"], arr["bwd"]
        assert np.isfinite(f).all() and np.isfinite(b).all()
        run = walks.mlp_run(inits.get(name), widths, f, b)
        for r in run.layers:
            for s in (r.forward, r.backward):
                assert s.log10_mean is not None and math.isfinite(s.log10_mean)
    he = walks.mlp_run(inits.get("he"), widths, out["he"]["fwd"], out["he"]["bwd"])
    last = he.layers[-1].forward
    # 2^{-1500}: about 10^{-451.5}; no float holds it, the log does
    assert last.log10_predicted == pytest.approx(-1500 * math.log10(2), rel=1e-12)
    assert last.mean is None or last.mean == 0.0 or last.mean < 1e-300
    assert last.agrees, (last.log10_rms, last.log10_low, last.log10_high)
    # the typical (geometric-mean) ratio sits var below the rms (docs/theory.md, finite-width spread)
    _, var_b = closed_forms.log_ratio_variance(widths, orthogonal=False)
    typical = (-2999 / 2 * math.log(2) - var_b[0]) / math.log(10)
    sd = math.sqrt(var_b[0]) / math.log(10)
    assert abs(he.layers[0].backward.log10_mean - typical) < 3 * sd
    prop = walks.mlp_run(inits.get("proposed"), widths, out["proposed"]["fwd"], out["proposed"]["bwd"])
    assert prop.layers[-1].forward.agrees


def test_same_seed_same_numbers():
    spec = MLPSpec(depth=5, input_dim=30, width=specs.WidthSpec(20, 40), inits=("proposed", "datadep"))
    probe = specs.ProbeSpec(samples=50, seed=7, seeds=2, device="cpu")
    w1, a, _ = walks.measure(spec, probe)
    w2, b, _ = walks.measure(spec, probe)
    assert w1 == w2
    for k in a:
        np.testing.assert_array_equal(a[k]["fwd"], b[k]["fwd"])
        np.testing.assert_array_equal(a[k]["bwd"], b[k]["bwd"])
    # another seed gives other widths and numbers
    w3, c, _ = walks.measure(spec, specs.ProbeSpec(samples=50, seed=8, seeds=2, device="cpu"))
    assert w3 != w1 or not np.array_equal(c["proposed"]["fwd"], a["proposed"]["fwd"])


@pytest.mark.parametrize("width", [1, 2, 3])
def test_dead_units_at_tiny_width_are_counted_not_nan(width):
    spec = MLPSpec(depth=12, input_dim=5, width=specs.WidthSpec(width, width), inits=("proposed", "pytorch"))
    plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=200, device="cpu"))
    widths = plan.widths
    for name, arr in out.items():
        f, b = arr["fwd"], arr["bwd"]
        assert not np.isnan(f).any() and not np.isnan(b).any()
        run = walks.mlp_run(inits.get(name), widths, f, b)
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
    x, e = sampling.probe_inputs(3, 16, widths[0], widths[-1], dev, torch.float64)
    ln_f, ln_b, params = walks.mlp_draw(inits.get(name), widths, x, e, seed=3, draw=0)
    fwd, bwd, _ = oracle_ratios(params, x, e)
    np.testing.assert_allclose(torch.exp(ln_f).cpu().numpy(), fwd.detach().cpu().numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(ln_b).cpu().numpy(), bwd.detach().cpu().numpy(), rtol=1e-10)


@pytest.mark.parametrize("name", ["proposed", "datadep", "pytorch"])
def test_streaming_equals_stored(name):
    spec = MLPSpec(depth=12, input_dim=30, width=specs.WidthSpec(20, 40), inits=(name,))
    _, stored, env = walks.measure(
        spec, specs.ProbeSpec(samples=40, seed=3, seeds=2, device="cpu", stream=False)
    )
    _, streamed, env_s = walks.measure(
        spec, specs.ProbeSpec(samples=40, seed=3, seeds=2, device="cpu", stream=True)
    )
    assert env["stream"] is False and env_s["stream"] is True
    np.testing.assert_array_equal(stored[name]["fwd"], streamed[name]["fwd"])
    np.testing.assert_array_equal(stored[name]["bwd"], streamed[name]["bwd"])


@pytest.mark.parametrize("name", INIT_NAMES)
@pytest.mark.parametrize("stream", [False, True])
def test_batched_draws_match_autograd_per_draw(name, stream):
    """S draws in one batched pass: each draw equals the oracle on that draw's parameters, and
    the batch equals running the draws one by one."""
    widths = [9, 7, 12, 5, 8]
    x, e = sampling.probe_inputs(5, 16, widths[0], widths[-1], torch.device("cpu"), torch.float64)
    scheme = inits.get(name)
    with torch.no_grad():
        f, b, params = walks.mlp(scheme, widths, x, e, seed=5, draws=[0, 3, 1], stream=stream)
    assert f.shape == (3, len(widths) - 1, 16)
    for s, draw in enumerate([0, 3, 1]):
        f1, b1, p1 = walks.mlp_draw(scheme, widths, x, e, seed=5, draw=draw)
        np.testing.assert_allclose(f[s].numpy(), f1.numpy(), rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(b[s].numpy(), b1.numpy(), rtol=1e-13, atol=1e-13)
        fwd, bwd, _ = oracle_ratios(p1, x, e)
        np.testing.assert_allclose(torch.exp(f[s]).numpy(), fwd.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(torch.exp(b[s]).numpy(), bwd.detach().numpy(), rtol=1e-10)
        if not stream:
            assert torch.equal(params[0].v[s], p1[0].v)


def test_draws_split_into_batches_give_the_same_numbers():
    """--seeds 5 run as one batch of 5 or as batches of 2, 2, 1 (as when memory is short, or as
    a rerun pins them); the correlation walks too."""
    spec = MLPSpec(depth=6, input_dim=20, width=specs.WidthSpec(10, 30), inits=("proposed", "datadep"))
    probe = specs.ProbeSpec(
        samples=24, seed=1, seeds=5, device="cpu", dtype="float64", correlations=(0.0, 0.7), pairs=9
    )
    _, whole, env = walks.measure(spec, probe)
    assert env["batch"] == 5
    _, split, env2 = walks.measure(spec, dataclasses.replace(probe, batch=2))
    assert env2["batch"] == 2
    for name in spec.inits:
        assert set(whole[name]) == set(split[name]) == {"fwd", "bwd", "correlation"}
        for key in whole[name]:
            a, b = whole[name][key], split[name][key]
            assert a.shape == ((5, 2, 6, 9) if key == "correlation" else (5, 6, 24))
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_tf32_is_refused_off_cuda():
    spec = MLPSpec(depth=2, input_dim=4, width=specs.WidthSpec(4, 4))
    with pytest.raises(SigpropError) as err:
        walks.measure(spec, specs.ProbeSpec(samples=4, device="cpu", precision="tf32"))
    assert err.value.field == "precision"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["proposed", "datadep"])
def test_cuda_batched_and_streamed_match_autograd(name):
    """On CUDA: batched draws, stored and streamed, equal each other and the oracle per draw.
    Not bit for bit there: on an H100 (2026-11-26) the streamed walk's regenerated Haar draws
    (proposed; datadep's Gaussian ones were equal) ended a few float64 ulps from the stored ones
    -- the regeneration's batched orthogonalisation is not the same kernel call on the same
    buffers -- so 1e-12 relative over these 4 layers (float64 rounding is 1e-16 a step)."""
    widths = [9, 7, 12, 5, 8]
    dev = torch.device("cuda")
    x, e = sampling.probe_inputs(5, 16, widths[0], widths[-1], dev, torch.float64)
    scheme = inits.get(name)
    with torch.no_grad():
        stored = walks.mlp(scheme, widths, x, e, seed=5, draws=[0, 1], stream=False)
        streamed = walks.mlp(scheme, widths, x, e, seed=5, draws=[0, 1], stream=True)
    for a, b in zip(stored[:2], streamed[:2]):
        print("stored - streamed, max |diff| of ln ratios:", float((a - b).abs().max()))
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for s in range(2):
        _, _, p1 = walks.mlp_draw(scheme, widths, x, e, seed=5, draw=s)
        fwd, bwd, _ = oracle_ratios(p1, x, e)
        np.testing.assert_allclose(
            torch.exp(stored[0][s]).cpu().numpy(), fwd.detach().cpu().numpy(), rtol=1e-10
        )
        np.testing.assert_allclose(
            torch.exp(stored[1][s]).cpu().numpy(), bwd.detach().cpu().numpy(), rtol=1e-10
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tf32_runs_and_stays_close_to_fp32():
    spec = MLPSpec(depth=50, input_dim=256, width=specs.WidthSpec(256, 256), inits=("proposed",))
    f32 = walks.measure(spec, specs.ProbeSpec(samples=256, device="cuda"))[1]["proposed"]["fwd"]
    t32 = walks.measure(spec, specs.ProbeSpec(samples=256, device="cuda", precision="tf32"))[1]["proposed"][
        "fwd"
    ]
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
    real = ls.Arena.__init__

    def tracking(self, numel, device, dtype):
        real(self, numel, device, dtype)
        if dtype.is_floating_point and numel > 2000:  # the weight arenas (rows arenas are small)
            live.append(weakref.ref(self.buf))  # views of it keep the buffer alive
            peak[0] = max(peak[0], sum(r() is not None for r in live))

    monkeypatch.setattr(ls.Arena, "__init__", tracking)
    gc.disable()  # refcounting alone must free them
    try:
        probe = specs.ProbeSpec(samples=8, seeds=2, device="cpu", stream=False, batch=1)
        if arch == "mlp":
            walks.measure(
                MLPSpec(
                    depth=6, input_dim=32, width=specs.WidthSpec(32, 32), inits=("proposed", "he", "pytorch")
                ),
                probe,
            )
        else:
            norm, names = ("bn", ("unnormalized-he",)) if arch == "bn" else ("wn", ("proposed", "he"))
            walks.measure(
                ResNetSpec(blocks=3, dim=32, width=specs.WidthSpec(32, 32), norm=norm, inits=names), probe
            )
    finally:
        gc.enable()
    assert len(live) >= 2 and peak[0] == 1
