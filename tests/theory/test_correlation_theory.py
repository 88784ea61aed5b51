"""Correlation propagation at infinite width (docs/theory.md §10): the composed kernel map
(plans.predict_correlation) against Monte Carlo at width 1000 on weight-normalized nets built in
numpy, and against the per-net recursions written out (tests/closed_forms.py) for every net and
init the product predicts (the measurement in the probe is the correlation observer's)."""

import math

import closed_forms
import numpy as np
import pytest

from sigprop import inits, plans, theory
from sigprop.inits import LayerRole
from sigprop.kernels import sampling
from sigprop.kinds import mlp, resnet


def test_relu_cosine_map_fixed_points_and_known_values():
    f = theory.relu_cosine_map
    assert (
        f(1.0) == pytest.approx(1.0)
        and f(-1.0) == pytest.approx(0.0)
        and f(0.0) == pytest.approx(1 / math.pi)
    )
    for c in np.linspace(-0.99, 0.99, 23):
        assert f(c) > c  # every pair moves towards cosine 1


def test_relu_cosine_map_against_sampling():
    """E[ReLU(u)ReLU(v)] / E[ReLU(u)^2] for correlation rho: 400k samples, se ~ 0.003."""
    rng = np.random.default_rng(0)
    for rho in (-0.8, 0.0, 0.5, 0.9):
        u = rng.standard_normal(400_000)
        v = rho * u + math.sqrt(1 - rho * rho) * rng.standard_normal(400_000)
        ru, rv = np.maximum(u, 0), np.maximum(v, 0)
        assert (ru * rv).mean() / (ru * ru).mean() == pytest.approx(theory.relu_cosine_map(rho), abs=0.01)


def _layer(rng, n_in, n_out, name, role=None):
    """One WN layer of an init, as the walker draws it (directions, gains, biases)."""
    import torch

    gen = torch.Generator().manual_seed(int(rng.integers(1 << 31)))
    p = sampling.sample(inits.get(name), role or LayerRole(n_in, n_out), gen, "cpu", torch.float64)
    w = (p.v * p.scale.unsqueeze(1)).numpy()
    b = None if p.bias is None else p.bias.numpy()
    return w, b


def _pair(rng, n, c0):
    x = rng.standard_normal(n)
    y = rng.standard_normal(n)
    y -= x * (x @ y) / (x @ x)
    y *= np.linalg.norm(x) / np.linalg.norm(y)
    return x, c0 * x + math.sqrt(1 - c0 * c0) * y


def _cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", ["proposed", "he", "pytorch"])
def test_mlp_cosine_against_width_1000(name):
    """Width 1000, depth 20, c0 = 0, 8 input pairs: the measured cosine at layers 1, 5, 20 within
    0.03 of the infinite-width map (finite-width corrections are O(1/sqrt n) ~ 0.03 per pair;
    averaged over pairs and checked at three layers).  pytorch has biases: its own map."""
    rng = np.random.default_rng(1)
    n, depth = 1000, 20
    # the theory's inputs: per-unit second moment 1 (x ~ N(0, I))
    want = plans.predict_correlation(mlp.steps([n] * (depth + 1)), inits.get(name), 0.0, 512)
    layers = [_layer(rng, n, n, name) for _ in range(depth)]
    got = np.zeros(depth)
    for _ in range(8):
        a, b = _pair(rng, n, 0.0)
        for l, (w, bias) in enumerate(layers):
            a, b = w @ a, w @ b
            if bias is not None:
                a, b = a + bias, b + bias
            a, b = np.maximum(a, 0), np.maximum(b, 0)
            got[l] += _cos(a, b) / 8
    for l in (0, 4, 19):
        assert got[l] == pytest.approx(want[l], abs=0.03), (l, got[l], want[l])


def test_resnet_cosine_against_width_1000():
    """The proposed WN ResNet, one stage of 40 blocks (block depth 1, d = hidden = 1000), c0 = 0:
    h' = h + W2 ReLU(W1 h) with the branch-to-skip power 1/B."""
    rng = np.random.default_rng(2)
    n, B = 1000, 40
    r1, r2 = LayerRole(n, n, "relu", B, 0), LayerRole(n, n, "block_last", B, 0)
    want = plans.predict_correlation(
        resnet.resnet_plan(n, 1, B, 1, [n] * B).steps, inits.get("proposed"), 0.0, 512
    )[1:]
    weights = [(_layer(rng, n, n, "proposed", r1)[0], _layer(rng, n, n, "proposed", r2)[0]) for _ in range(B)]
    got = np.zeros(B)
    for _ in range(8):
        a, b = _pair(rng, n, 0.0)
        for k, (w1, w2) in enumerate(weights):
            a = a + w2 @ np.maximum(w1 @ a, 0)
            b = b + w2 @ np.maximum(w1 @ b, 0)
            got[k] += _cos(a, b) / 8
    for k in (0, 9, 39):
        assert got[k] == pytest.approx(want[k], abs=0.03), (k, got[k], want[k])
    # the closed form with identity skips and zero biases: c' = (c + beta f(c)) / (1 + beta), beta = 1/B
    c = 0.0
    for _ in range(B):
        c = (c + theory.relu_cosine_map(c) / B) / (1 + 1 / B)
    assert want[-1] == pytest.approx(c, rel=1e-12)


def test_depth_scale():
    assert theory.correlation_depth_scale(0.0, [theory.relu_cosine_map(0.0)]) is None  # 1 - 1/pi = 0.68 > 1/e
    cos = closed_forms.mlp_correlation(0.0, [closed_forms.LinearMoments(10, 10, 2.0)] * 50)
    k = theory.correlation_depth_scale(0.0, cos)
    assert k is not None and 1 - cos[k - 1] <= 1 / math.e and (k == 1 or 1 - cos[k - 2] > 1 / math.e)
    assert theory.correlation_depth_scale(1.0, cos) is None


@pytest.mark.parametrize(
    "name", ["proposed", "he", "pytorch", "datadep", "proposed-gaussian", "unnormalized-he"]
)
@pytest.mark.parametrize("c0", [0.0, 0.5, -0.4])
def test_the_composed_kernel_map_equals_the_mlp_recursion(name, c0):
    """plans.predict_correlation on an MLP's steps against Theorem-1-style kernel recursion (or,
    for the data-dependent init, the standardized-layer triple map), to rounding."""
    widths, batch = [30, 20, 40, 25, 25], 64
    scheme = inits.get(name)
    got = plans.predict_correlation(mlp.steps(widths), scheme, c0, batch)
    if scheme.standardizes:
        want = closed_forms.datadep_mlp_correlation(c0, len(widths) - 1, batch)
    else:
        roles = [LayerRole(widths[i - 1], widths[i]) for i in range(1, len(widths))]
        want = closed_forms.mlp_correlation(
            c0,
            [
                closed_forms.LinearMoments(
                    r.fan_in, r.fan_out, scheme.moments(r).row_sq, scheme.moments(r).bias_var
                )
                for r in roles
            ],
        )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["proposed", "he", "pytorch", "datadep", "skipinit-sqrt", "stage-hanin"])
@pytest.mark.parametrize("stages, depth", [(1, 1), (2, 2)])
def test_the_composed_kernel_map_equals_the_resnet_recursion(name, stages, depth):
    """The same for residual plans (projections, D > 1), and the BN ResNet's (De & Smith 2020,
    appendix C) against its batch-coupled recursion."""
    plan = resnet.resnet_plan(12, stages, 3, depth, [9] * (stages * 3 * depth))
    scheme, batch = inits.get(name), 48
    got = plans.predict_correlation(plan.steps, scheme, 0.3, batch)
    if scheme.standardizes:
        blocks = [
            (len(b.widths) - 1, b.projection, scheme.alpha(b.blocks_in_stage) ** 2) for b in plan.blocks
        ]
        want = closed_forms.datadep_resnet_correlation(0.3, blocks, batch)
    else:
        want = [0.3] + closed_forms.resnet_correlation(
            0.3, [closed_forms.block_moments(scheme, b) for b in plan.blocks]
        )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    bn = resnet.resnet_plan(12, 1, 4, 0, [], stem=True)
    np.testing.assert_allclose(
        plans.predict_correlation(bn.steps, inits.get("unnormalized-he"), 0.3, batch),
        closed_forms.bn_resnet_correlation(0.3, 4, batch),
        rtol=1e-12,
        atol=1e-12,
    )
