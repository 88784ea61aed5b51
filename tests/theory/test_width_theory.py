"""The width exponents (sigprop/theory/width.py) against what the papers state, and the
abc-symmetry it uses to write NTK in Table 3's form checked on trained nets (an NTK net with
its 1/sqrt(n) multipliers against sigprop's SP-init net with SGD learning rate 1/n)."""

from __future__ import annotations

import math
from fractions import Fraction as F

import pytest
import torch

from sigprop.theory import width as W

MLP = ["input", "hidden", "hidden", "output"]


def _updates(param, opt):
    return [(e.low, e.high) for e in W.chain_exponents(param, opt, MLP)]


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_mup_is_theta_one_everywhere(opt):
    """Yang et al. 2021, Definition 4.1 / Table 3: under μP every layer's features and the logits
    move Θ(1) at every step; the readout's output at init is n^-1/2 (variance 1/fan_in^2)."""
    es = W.chain_exponents("mup", opt, MLP)
    assert [(e.low, e.high) for e in es] == [(0, 0)] * 3 + [(F(-1, 2), 0)]  # the readout: see below
    assert [e.init for e in es] == [0, 0, 0, F(-1, 2)]
    for step in (1, 2, 5):
        assert W.site_exponents("mup", opt, MLP, step) == es


def test_ntk_features_freeze_and_its_logits_move():
    """Yang & Hu 2021, section 5 (the kernel regime): under NTK with SGD the features move
    n^-1/2, the logits Θ(1)."""
    assert _updates("ntk", "sgd") == [(F(-1, 2), F(-1, 2))] * 3 + [(F(-1, 2), 0)]


def test_sp_blows_up_along_the_chain():
    """Yang & Hu 2021, section 5's first step under SP: with SGD the first hidden layer's update
    grows n^1/2 and each later one compounds (asymptotes 1/2, 1, logits 2); with Adam (sign
    updates) one power of n per layer (1, 2, logits 3).  The low ends are the smallest terms:
    the first layer's change carried through the initial weights."""
    assert _updates("sp", "sgd") == [(F(-1, 2),) * 2, (F(-1, 2), F(1, 2)), (F(-1, 2), 1), (F(-1, 2), 2)]
    assert _updates("sp", "adam") == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert W.site_exponents("sp", "adam", MLP, 2) == [W.Exponents(F(0))] * 4  # not derived after step 1


def test_off_a_chain_only_what_does_not_depend_on_position():
    es = W.site_exponents("sp", "sgd", ["input", "hidden", "hidden", "output"], 1, chain=False)
    assert (es[0].low, es[0].high) == (F(-1, 2), F(-1, 2))
    assert all(e.low is None for e in es[1:])
    assert W.site_exponents("mup", "adam", ["hidden", "input", "output"], 1, chain=False)[0].low == 0
    assert all(e.init is None for e in W.site_exponents(W.AS_IS, "adam", MLP, 0))


def test_table3_scalings():
    """Yang et al. 2021, Table 3 relative to SP: μP's readout init n^-1/2 lower; its learning
    rates SGD (n, 1, 1/n) and Adam (1, 1/n, 1/n) for input, hidden, output; biases as inputs."""
    sgd = [W.scaling("mup", "sgd", r) for r in ("input", "hidden", "output", "vector")]
    adam = [W.scaling("mup", "adam", r) for r in ("input", "hidden", "output", "vector")]
    assert [s.lr for s in sgd] == [-1, 0, 1, -1] and [s.lr for s in adam] == [0, 1, 1, 0]
    assert [s.init for s in sgd] == [0, 0, F(1, 2), 0] == [s.init for s in adam]
    assert W.scaling("sp", "adam", "hidden") == W.Scaling(F(0), F(0))
    with pytest.raises(ValueError):
        W.scaling("ntk", "adam", "hidden")


def _mlp_forward(ws, x, mults):
    h = x
    for i, (w, m) in enumerate(zip(ws, mults)):
        h = m * (h @ w.T)
        if i < len(ws) - 1:
            h = torch.relu(h)
    return h


def test_ntk_in_table3_form_is_the_multiplier_form():
    """The abc-symmetry (Yang & Hu 2021, eq. 5) sigprop relies on: an NTK net (W = w/sqrt(fan_in),
    w ~ N(0, 1), SGD lr η on w) trains exactly as SP's draw W ~ N(0, 1/fan_in) with SGD lr η/fan_in
    on the hidden and output weights (η on the input layer, whose fan-in is fixed: its multiplier
    1/sqrt(d) a constant) -- checked over three steps on the same draws, float64."""
    torch.manual_seed(0)
    d, n, k = 8, 48, 3
    x = torch.randn(16, d, dtype=torch.float64)
    y = torch.randint(k, (16,))
    raw = [torch.randn(n, d, dtype=torch.float64), torch.randn(n, n, dtype=torch.float64),
           torch.randn(k, n, dtype=torch.float64)]  # fmt: skip
    fan = [d, n, n]
    eta = 0.7
    ntk = [w.clone().requires_grad_() for w in raw]
    sp = [(w / math.sqrt(f)).clone().requires_grad_() for w, f in zip(raw, fan)]
    lr_sp = [eta / d, eta / n, eta / n]  # the input layer: η/d is a constant in n, as its multiplier
    for _ in range(3):
        a = _mlp_forward(ntk, x, [1 / math.sqrt(f) for f in fan])
        b = _mlp_forward(sp, x, [1.0, 1.0, 1.0])
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
        for ws, out, lrs in ((ntk, a, [eta] * 3), (sp, b, lr_sp)):
            loss = torch.nn.functional.cross_entropy(out, y)
            gs = torch.autograd.grad(loss, ws)
            with torch.no_grad():
                for w, g, lr in zip(ws, gs, lrs):
                    w -= lr * g
    assert W.scaling("ntk", "sgd", "hidden").lr == 1 == W.scaling("ntk", "sgd", "output").lr
    assert W.scaling("ntk", "sgd", "input").lr == 0


def test_a_zero_readout():
    """Yang et al. 2021, Table 3's "or 0": the readout's output is exactly 0 at init; at step 1
    nothing below it moves (no gradient reaches it) and the readout moves by its own term, u + 1
    (μP: Θ(1); SP: n^1); from step 2 μP's exponents hold, SP's are not derived."""
    zero = W.site_exponents("mup", "adam", MLP, 0, zero_readout=True)
    assert zero[-1].init is None and zero[0].init == 0
    one = W.site_exponents("mup", "sgd", MLP, 1, zero_readout=True)
    assert [e.low for e in one] == [None, None, None, 0]
    assert W.site_exponents("sp", "adam", MLP, 1, zero_readout=True)[-1].low == 1
    assert W.site_exponents("mup", "adam", MLP, 2, zero_readout=True) == W.chain_exponents("mup", "adam", MLP)
    assert all(e.low is None for e in W.site_exponents("sp", "adam", MLP, 2, zero_readout=True))


def test_the_readouts_low_end_is_a_change_uncorrelated_with_it():
    """The readout's fixed fan-out sums n products of its weights (n^-ω) with the features'
    change: correlated with its rows (the backward's direction) they add up, n^(1-ω+e); with no
    correlation they add as noise, n^(1/2-ω+e) -- the low end of the interval (a decoder's
    readout under μP: docs/theory.md §17).  A hidden layer's fan-out grows with n, and both parts
    have its input's exponent."""
    mup = W.chain_exponents("mup", "adam", ["input", "hidden", "output"])
    assert (mup[-1].low, mup[-1].high) == (F(-1, 2), 0) and (mup[1].low, mup[1].high) == (0, 0)
    assert W.logits_exponents("mup", 1) == W.Exponents(F(-1, 2), F(-1, 2), F(0))
