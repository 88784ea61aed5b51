"""The CNN kind (sigprop/kinds/cnn.py): the walker's conv unit against the torch.autograd
oracle, batched draws and streaming, and the probe's measured RMS ratios against the composed
energy-map theory (docs/theory.md §11)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import walks

from sigprop import inits, plans
from sigprop.kernels import logspace as ls
from sigprop.kernels import sampling
from sigprop.kinds import cnn

CONV_INITS = ["proposed", "proposed-gaussian", "he", "pytorch"]


def _walk(name, steps, x, e, draws, stream=False):
    return walks.walk(steps, inits.get(name), x, e, 3, draws, stream=stream)


def oracle(params, steps, x, e):
    """Explicit WN convs w = g v/||v|| (or v), autograd: forward ||h^l||/||x||, backward
    ||dl/da^l||/||e|| with dl/da^L = e."""
    x = x.detach().clone().requires_grad_(True)
    N = x.shape[0]
    h, pre = x.reshape(N, *steps[0].shape_in), []
    for p, st in zip(params, plans.layers(steps)):
        v = p.v.detach()
        wmat = (
            p.g.detach().unsqueeze(1) * v / torch.linalg.vector_norm(v, dim=1, keepdim=True)
            if p.g is not None
            else v
        )
        wk = wmat.reshape(st.role.fan_out, st.shape_in[0], st.kernel, st.kernel)
        a = F.conv2d(h, wk, None if p.bias is None else p.bias.detach(), stride=st.stride, padding=st.padding)
        a.retain_grad()
        pre.append(a)
        h = torch.relu(a)
    pre[-1].backward(e.reshape(pre[-1].shape))
    xn, en = x.flatten(1).norm(dim=1), e.norm(dim=1)
    fwd = torch.stack([torch.relu(a).flatten(1).norm(dim=1) / xn for a in pre])
    bwd = torch.stack([a.grad.flatten(1).norm(dim=1) / en for a in pre])
    return fwd.detach(), bwd.detach()


@pytest.mark.parametrize("name", CONV_INITS)
@pytest.mark.parametrize("image, channels, depth", [((3, 9, 9), 5, 4), ((2, 8, 6), 7, 3)])
def test_conv_walk_matches_autograd(name, image, channels, depth):
    steps = cnn.steps(image, channels, depth)
    out = steps[-2].shape_out
    x, e = sampling.probe_inputs(2, 6, math.prod(image), math.prod(out), torch.device("cpu"), torch.float64)
    r = _walk(name, steps, x, e, [0])
    fwd, bwd = oracle([ls.unstack(k.params, 0) for k in r.kept], steps, x, e)
    np.testing.assert_allclose(torch.exp(r.observed["fwd"][0]).numpy(), fwd.numpy(), rtol=1e-10)
    np.testing.assert_allclose(torch.exp(r.observed["bwd"][0]).numpy(), bwd.numpy(), rtol=1e-10)


@pytest.mark.parametrize("stream", [False, True])
def test_conv_draws_batched_and_streamed_equal_one_by_one(stream):
    steps = cnn.steps((3, 10, 10), 6, 5)
    x, e = sampling.probe_inputs(
        1, 5, 300, math.prod(steps[-2].shape_out), torch.device("cpu"), torch.float64
    )
    batched = _walk("proposed", steps, x, e, [2, 0, 1], stream=stream).observed
    for s, draw in enumerate([2, 0, 1]):
        one = _walk("proposed", steps, x, e, [draw]).observed
        for key in ("fwd", "bwd"):
            np.testing.assert_allclose(batched[key][s].numpy(), one[key][0].numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", CONV_INITS)
def test_conv_probe_follows_the_energy_map(name):
    """The probe's mean squared ratios over 24 draws against the energy map with the scheme's own
    moments (the registry's conv gain: fan = c k^2 on both sides), within 4 standard errors
    across draws at every layer, both ways.  The probe shares its inputs and errors across draws
    (common random numbers), so the prediction is the one conditional on them (the composed
    energy map ``plans.predict`` given each input's and error's energy map, then averaged): with the
    unconditional
    one the first layer misses by 4 se -- the border map weighs the given inputs' positions."""
    steps = cnn.steps((3, 16, 16), 48, 8)
    x, e = sampling.probe_inputs(
        4, 32, 768, math.prod(steps[-2].shape_out), torch.device("cpu"), torch.float64
    )
    r = _walk(name, steps, x, e, list(range(24))).observed
    scheme = inits.get(name)
    xe = x.reshape(32, 3, 16, 16).pow(2).sum(1).numpy()
    ee = e.reshape(32, *steps[-2].shape_out).pow(2).sum(1).numpy()
    preds = [plans.predict(steps, scheme, xe[i], ee[i]) for i in range(32)]
    for key, attr in (("fwd", "ln_forward"), ("bwd", "ln_backward")):
        per_draw = torch.exp(2 * r[key]).mean(dim=2).numpy()  # [S, L]
        m, se = per_draw.mean(0), per_draw.std(0, ddof=1) / math.sqrt(per_draw.shape[0])
        want = np.mean([np.exp(2 * np.array(getattr(p, attr))) for p in preds], axis=0)
        assert np.all(np.abs(m - want) <= 4 * se + 1e-12 * want), (name, key, m / want, se / want)


def test_the_conv_gain_counts_taps_on_both_sides():
    """Arpit et al. 2019, footnote 3: n = k^2 c on both sides, so g^2 = 2 c_in / c_out -- an
    interior position keeps its energy; the MLP's gains are unchanged (taps = 1)."""
    role = cnn.steps((16, 8, 8), 32, 1, strided=0)[0].role
    assert inits.proposed_gain_sq(role) == pytest.approx(2 * 16 / 32)
    assert inits.proposed_gain_sq(inits.LayerRole(16, 32)) == pytest.approx(1.0)
