"""Roles read off the shapes at two widths, the redraw, and the learning rates per role."""

from __future__ import annotations

import math

import pytest
import torch
from width_nets import TinyLM, mlp

from sigprop.errors import SigpropError
from sigprop.theory import width as W
from sigprop.width import params as P


def test_roles_of_an_mlp():
    roles = {r.name: (r.role, r.fan_in) for r in P.roles(mlp(32), mlp(64))}
    assert roles == {
        "0.weight": ("input", 8), "0.bias": ("vector", 1), "2.weight": ("hidden", 32),
        "2.bias": ("vector", 1), "4.weight": ("output", 32), "4.bias": ("fixed", 1),
    }  # fmt: skip


def test_roles_of_a_transformer():
    roles = {r.name: r.role for r in P.roles(TinyLM(32), TinyLM(64))}
    assert roles["emb.weight"] == "input"  # (vocab, width): its input is the vocabulary
    assert roles["attn.in_proj_weight"] == roles["attn.out_proj.weight"] == roles["up.weight"] == "hidden"
    assert roles["out.weight"] == "output" and roles["out.bias"] == "fixed"
    assert roles["norm1.weight"] == "vector"


def test_a_width_that_changes_nothing_is_refused():
    with pytest.raises(SigpropError, match="changes no layer"):
        P.roles(mlp(32), mlp(32))
    with pytest.raises(SigpropError, match="not in the model at every width"):
        P.roles(mlp(32), torch.nn.Sequential(torch.nn.Linear(8, 32)))


@pytest.mark.parametrize("param,opt", [("sp", "adam"), ("mup", "adam"), ("mup", "sgd"), ("ntk", "sgd")])
def test_redraw_scales_and_learning_rates(param, opt):
    """Each matrix redrawn N(0, (n/n0)^-2 init / fan_in), growing biases zero, the rest kept;
    each parameter's learning rate lr (n/n0)^-lr of its role (Yang et al. 2021, Table 3)."""
    torch.manual_seed(1)
    model, ratio = mlp(512), 8.0
    roles = P.roles(model, mlp(64))
    kept = model[4].bias.detach().clone()
    P.apply(model, roles, param, opt, ratio, torch.Generator().manual_seed(0))
    params = dict(model.named_parameters())
    for r in roles:
        p = params[r.name].detach()
        if r.role in ("input", "hidden", "output"):
            want = ratio ** -float(W.scaling(param, opt, r.role).init) / math.sqrt(r.fan_in)
            n = p.numel()
            assert abs(p.std().item() / want - 1) < 5 / math.sqrt(2 * n), r.name  # 5 s.e. of a sample sd
        elif r.bias and r.role == "vector":
            assert p.abs().max() == 0
    assert torch.equal(model[4].bias.detach(), kept)
    rates = {id(p): g["lr"] for g in P.groups(model, roles, param, opt, 0.1, ratio) for p in g["params"]}
    for r in roles:
        want = 0.1 * ratio ** -float(W.scaling(param, opt, r.role).lr)
        assert math.isclose(rates[id(params[r.name])], want, rel_tol=1e-12), r.name


def test_as_is_changes_nothing():
    model = mlp(64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    roles = P.roles(model, mlp(32))
    P.apply(model, roles, W.AS_IS, "adam", 2.0, torch.Generator())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [g["lr"] for g in P.groups(model, roles, W.AS_IS, "adam", 0.01, 2.0)] == [0.01]
