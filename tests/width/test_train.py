"""One point of the check against an independent one written here: the same draw trained by
hand (explicit SGD and Adam updates per parameter, no torch.optim), its sites read by calling
the layers one by one (no hooks)."""

from __future__ import annotations

import math

import pytest
import torch
from width_nets import mlp

from sigprop.theory import width as W
from sigprop.width import params as P
from sigprop.width import train as T


def _by_hand(model, roles, param, opt, lr, ratio, steps, x, y):
    """Sites (the three Linear outputs) per step, trained by explicit updates."""
    params = dict(model.named_parameters())
    rate = {r.name: lr * ratio ** -float(W.scaling(param, opt, r.role).lr) for r in roles}
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    out = []
    for t in range(steps + 1):
        h1 = model[0](x)
        h2 = model[2](torch.relu(h1))
        h3 = model[4](torch.relu(h2))
        out.append([h.detach() for h in (h1, h2, h3)])
        if t == steps:
            break
        loss = torch.nn.functional.cross_entropy(h3, y)
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for (k, p), g in zip(params.items(), grads):
                if opt == "sgd":
                    p -= rate[k] * g
                else:  # Adam (Kingma & Ba 2015, Algorithm 1), torch's defaults
                    m[k] = 0.9 * m[k] + 0.1 * g
                    v[k] = 0.999 * v[k] + 0.001 * g * g
                    mh, vh = m[k] / (1 - 0.9 ** (t + 1)), v[k] / (1 - 0.999 ** (t + 1))
                    p -= rate[k] * mh / (vh.sqrt() + 1e-8)
    return out


@pytest.mark.parametrize("param,opt", [("sp", "adam"), ("mup", "adam"), ("mup", "sgd"), ("ntk", "sgd")])
def test_point_equals_training_by_hand(param, opt):
    torch.manual_seed(3)
    model = mlp(96).double()
    roles = P.roles(model, mlp(48))
    x = torch.randn(20, 8, dtype=torch.float64)
    y = torch.randint(5, (20,))
    twin = mlp(96).double()
    twin.load_state_dict(model.state_dict())
    point = T.run_point(
        model, roles, param=param, optimizer=opt, lr=0.05, ratio=2.0, steps=3, x=x,
        target_of=lambda out: y, loss="xent", gen=torch.Generator().manual_seed(5), width=96, seed=0,
    )  # fmt: skip
    P.apply(twin, roles, param, opt, 2.0, torch.Generator().manual_seed(5))
    hand = _by_hand(twin, roles, param, opt, 0.05, 2.0, 3, x, y)
    assert [s.name for s in point.sites] == ["0", "2", "4"]
    for t in range(4):
        for i in range(3):
            h, h0 = hand[t][i], hand[0][i]
            # float64 throughout; torch.optim's Adam and the hand's order a few operations
            # differently (rounding 1e-16 each, grown by three steps' updates): 1e-9 relative
            assert math.isclose(point.stats["l1"][i][t], h.abs().mean().item(), rel_tol=1e-9)
            assert math.isclose(point.stats["rms"][i][t], h.pow(2).mean().sqrt().item(), rel_tol=1e-9)
            d = (h - h0).pow(2).mean().sqrt().item()
            assert math.isclose(point.stats["delta"][i][t], d, rel_tol=1e-7, abs_tol=1e-14)


def test_dropout_is_off_and_divergence_is_named():
    """The forward runs without its dropout (a coordinate check measures the parametrization,
    not a mask), and a loss that is not finite is one line naming --lr."""
    from width_nets import TinyLM

    from sigprop.errors import SigpropError

    torch.manual_seed(0)
    model = TinyLM(32)
    roles = P.roles(model, TinyLM(16))
    x = torch.randint(11, (4, 6))
    kw = dict(param="sp", optimizer="sgd", ratio=1.0, steps=1, x=x, loss="xent", width=32, seed=0)
    a = T.run_point(model, roles, lr=0.0 + 1e-30, target_of=lambda y: torch.zeros(4, 6, dtype=torch.long),
                    gen=torch.Generator().manual_seed(1), **kw)  # fmt: skip
    b = T.run_point(model, roles, lr=1e-30, target_of=lambda y: torch.zeros(4, 6, dtype=torch.long),
                    gen=torch.Generator().manual_seed(1), **kw)  # fmt: skip
    assert a.stats == b.stats  # the same draw twice: no random mask in between
    with pytest.raises(SigpropError, match="diverged") as e:
        T.run_point(mlp(32), P.roles(mlp(32), mlp(16)), param="sp", optimizer="sgd", lr=1e30, ratio=1.0,
                    steps=3, x=torch.randn(8, 8), target_of=lambda y: torch.zeros(8, dtype=torch.long),
                    loss="xent", gen=torch.Generator(), width=32, seed=0)  # fmt: skip
    assert e.value.field == "lr"
