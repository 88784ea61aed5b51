"""Sampling the weights (sigprop/kernels/sampling.py): each init's distribution, common random
numbers across inits, Haar directions per layer or orthogonalized in batches (the CUDA path,
forced here on the CPU) to rounding and against the autograd oracle."""

import numpy as np
import pytest
import torch
import walks
from oracle import oracle_ratios

from sigprop import inits
from sigprop.kernels import replay, sampling

#: free bytes offered to ``haar_chunk`` (plenty: the chunk is then limited by CHUNK_MAX)
FREE = 2**34


def test_pytorch_matches_nn_linear_default_distribution():
    # nn.Linear's own reset_parameters draws from U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    lin = torch.nn.Linear(400, 300)
    bound = inits.pytorch_linear_bound(400)
    # float32 weights: a draw next to the bound may round one float32 ulp above it (a flake once
    # in a full run whose global generator state put one of the 120,000 draws there)
    assert lin.weight.abs().max().item() <= bound * (1 + 2**-23)
    assert lin.weight.var().item() == pytest.approx(bound**2 / 3, rel=0.05)
    role = inits.LayerRole(400, 300)
    p = sampling.sample(
        inits.get("pytorch"), role, torch.Generator().manual_seed(0), torch.device("cpu"), torch.float64
    )
    assert p.v.abs().max().item() <= bound
    assert p.v.var().item() == pytest.approx(bound**2 / 3, rel=0.05)
    assert torch.allclose(p.scale, torch.ones_like(p.scale))  # g = ||v||: w = v


@pytest.mark.parametrize("shape", [(30, 50), (50, 30), (40, 40)])
def test_orthogonal_directions(shape):
    role = inits.LayerRole(fan_in=shape[1], fan_out=shape[0])
    p = sampling.sample(
        inits.get("proposed"), role, torch.Generator().manual_seed(1), torch.device("cpu"), torch.float64
    )
    q = p.v
    gram = q @ q.T if shape[0] <= shape[1] else q.T @ q
    assert torch.allclose(gram, torch.eye(min(shape), dtype=torch.float64), atol=1e-12)
    assert torch.allclose(p.scale * torch.linalg.vector_norm(q, dim=1), p.g)


def test_common_random_numbers_across_inits():
    role = inits.LayerRole(20, 30)
    dev = torch.device("cpu")
    he = sampling.sample(inits.get("he"), role, sampling.layer_generator(0, 0, 1, dev), dev, torch.float64)
    pg = sampling.sample(
        inits.get("proposed-gaussian"), role, sampling.layer_generator(0, 0, 1, dev), dev, torch.float64
    )
    # same directions, different gains
    assert torch.allclose(he.v / he.v.norm(dim=1, keepdim=True), pg.v / pg.v.norm(dim=1, keepdim=True))


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

    widths = [12] + [16] * 11
    x, e = sampling.probe_inputs(5, 6, widths[0], widths[-1], torch.device("cpu"), torch.float64)
    scheme = inits.get(name)
    monkeypatch.setattr(sampling, "BATCHED_HAAR", "never")
    with torch.no_grad():
        want = walks.mlp(scheme, widths, x, e, 5, [0, 2], stream=stream)
    monkeypatch.setattr(sampling, "BATCHED_HAAR", "always")
    monkeypatch.setattr(sampling, "CHUNK_MAX", 4)
    assert sampling.haar_chunk(scheme, widths, 2, torch.device("cpu"), 8, FREE) == 4
    runner = replay.Emulated() if emulated else None
    monkeypatch.setattr(replay, "MIN_LATER", 0)  # chunks of 4, 4, 2: capture what recurs at all
    with torch.no_grad():
        got = walks.mlp(scheme, widths, x, e, 5, [0, 2], stream=stream, runner=runner)
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=0, atol=1e-13)
    np.testing.assert_allclose(got[1].numpy(), want[1].numpy(), rtol=0, atol=1e-13)
    if emulated:  # 10 layers in chunks of 4, 4, 2: the chunk step of 4 and the given-v step are replayed
        assert any(k[0] == "chunk" for k in runner.steps) and any(k[0] == "fwd-given" for k in runner.steps)
    if not stream:
        for pa, pb in zip(got[2], want[2]):
            assert (pa.v - pb.v).abs().max().item() < 1e-14
    _, _, p1 = walks.mlp_draw(scheme, widths, x, e, seed=5, draw=2)
    fwd, bwd, _ = oracle_ratios(p1, x, e)
    np.testing.assert_allclose(torch.exp(got[0][1]).numpy(), fwd.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(got[1][1]).numpy(), bwd.detach().numpy(), rtol=1e-10)


def test_chunking_is_off_where_it_does_not_apply(monkeypatch):
    monkeypatch.setattr(sampling, "BATCHED_HAAR", "always")
    cpu = torch.device("cpu")
    assert sampling.haar_chunk(inits.get("proposed"), [8, 16, 17, 16], 1, cpu, 4, FREE) == 0  # shapes differ
    assert sampling.haar_chunk(inits.get("he"), [8] + [16] * 5, 1, cpu, 4, FREE) == 0  # Gaussian directions
    assert sampling.haar_chunk(inits.get("datadep"), [8] + [16] * 5, 1, cpu, 4, FREE) == 0
    monkeypatch.setattr(sampling, "BATCHED_HAAR", "cuda")
    assert (
        sampling.haar_chunk(inits.get("proposed"), [8] + [16] * 5, 1, cpu, 4, FREE) == 0
    )  # CPU: LAPACK per layer


def test_batched_draws_use_one_haar_call_and_equal_per_draw(monkeypatch):
    """On CUDA the draws of a layer are orthogonalized together; forced here on the CPU: the
    same directions as drawing each alone, to rounding."""
    role = inits.LayerRole(12, 9)
    gens = lambda: [sampling.layer_generator(3, d, 1, torch.device("cpu")) for d in range(4)]
    want = sampling.sample_layer(inits.get("proposed"), role, gens(), "cpu", torch.float64)
    monkeypatch.setattr(sampling, "BATCHED_HAAR", "always")
    got = sampling.sample_layer(inits.get("proposed"), role, gens(), "cpu", torch.float64)
    assert (got.v - want.v).abs().max().item() < 1e-14 and (got.scale - want.scale).abs().max().item() < 1e-14
