"""The curvature at init (issue 19, sigprop/hessian.py): Hessian-vector products against the dense
Hessian (torch.autograd.functional.hessian) on tiny nets for every init, power iteration and
Lanczos against numpy's eigvalsh, Hutchinson against the exact trace, the WRN's products against
autograd's hvp, the model against the probe's own weights, determinism per seed."""

import math

import numpy as np
import pytest
import torch

from sigprop import engine, hessian, inits, nets, plans, walker

CPU = torch.device("cpu")


def _dense(m, x, y):
    h = hessian.HVP(m, x, y)
    leaves = [t.detach() for t in h.leaves]
    blocks = torch.autograd.functional.hessian(lambda *ts: m.loss(dict(zip(h.names, ts)), x, y), tuple(leaves))
    offs = np.cumsum([0] + [t.numel() for t in leaves])
    full = np.zeros((h.size, h.size))
    for i in range(len(leaves)):
        for j in range(len(leaves)):
            full[offs[i]:offs[i + 1], offs[j]:offs[j + 1]] = blocks[i][j].reshape(leaves[i].numel(), leaves[j].numel()).numpy()
    return h, full


NETS = {
    "mlp": ([6, 5, 4], (6,)),
    "resnet": (nets.resnet_plan(4, 2, 1, 1, [3, 3]), (4,)),
    "cnn": (plans.cnn_steps((2, 5, 5), 3, 2), (2, 5, 5)),
    "bn-resnet": (nets.resnet_plan(4, 1, 2, 0, [], stem=True), (4,)),  # De & Smith's BN net: gamma, beta and W
}


@pytest.mark.parametrize("kind, name", [(k, n) for k in NETS if k != "bn-resnet" for n in inits.names(k)
                                        if inits.get(n).normalized or k != "cnn"] + [("bn-resnet", "he")])
def test_hvp_is_the_dense_hessian(kind, name):
    net, shape = NETS[kind]
    x, y = hessian.data(0, 8, shape, CPU, torch.float64)
    m = hessian.build(kind, net, walker.NET_KINDS[kind].scheme(name), x, 3, 1)
    h, full = _dense(m, x, y)
    np.testing.assert_allclose(h.dense().numpy(), full, rtol=1e-9, atol=1e-9)
    ev = np.linalg.eigvalsh((full + full.T) / 2)
    top = sorted(ev, key=abs, reverse=True)
    assert hessian.lanczos_top(h, 3) == pytest.approx(top[:3], rel=1e-6, abs=1e-9)
    # Hutchinson: unbiased, within 4 standard errors of the exact trace
    est, se = hessian.hutchinson_trace(h, 64, torch.Generator().manual_seed(2))
    assert abs(est - np.trace(full)) <= 4 * se + 1e-9


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_power_iteration_finds_the_largest_magnitude_eigenvalue(kind):
    net, shape = NETS[kind]
    x, y = hessian.data(1, 8, shape, CPU, torch.float64)
    for name in ("proposed", "pytorch"):
        m = hessian.build(kind, net, inits.get(name), x, 0, 0)
        h, full = _dense(m, x, y)
        ev = np.linalg.eigvalsh((full + full.T) / 2)
        lam = ev[np.argmax(abs(ev))]
        r = hessian.power_iteration(h, torch.Generator().manual_seed(0), iters=2000, tol=1e-12)
        assert r.status == "converged" and r.eigenvalue == pytest.approx(lam, rel=1e-6)


@pytest.mark.parametrize("bn", [False, True])
def test_wrn_hvp_equals_autograd(bn):
    """The WRN (conv1, projections, every init's weights) and the BN WRN (affine gamma, beta):
    too many parameters for a dense Hessian; its products against torch.autograd.functional.hvp."""
    steps = plans.wrn_steps((2, 4, 4), 1, bn=bn)
    kind = "wrn-bn" if bn else "wrn"
    x, y = hessian.data(0, 6, (2, 4, 4), CPU, torch.float64)
    for name in (["he"] if bn else ["proposed", "pytorch", "datadep", "stage-hanin"]):
        m = hessian.build(kind, steps, walker.NET_KINDS[kind].scheme(name), x, 0, 0)
        h = hessian.HVP(m, x, y)
        leaves = tuple(t.detach() for t in h.leaves)
        gen = torch.Generator().manual_seed(5)
        for _ in range(2):
            v = torch.randn(h.size, generator=gen, dtype=torch.float64)
            parts, k = [], 0
            for t in leaves:
                parts.append(v[k:k + t.numel()].reshape(t.shape))
                k += t.numel()
            _, ref = torch.autograd.functional.hvp(lambda *ts: m.loss(dict(zip(h.names, ts)), x, y), leaves, tuple(parts))
            np.testing.assert_allclose(h(v).numpy(), torch.cat([r.reshape(-1) for r in ref]).numpy(), rtol=1e-9, atol=1e-12)
        if bn:
            assert any(n.endswith("gamma") for n in h.names) and any(n.endswith("beta") for n in h.names)


@pytest.mark.parametrize("kind", ["mlp", "wrn"])
def test_the_model_is_the_probes_net(kind):
    """One source of truth: the model's hidden state at the head has the norm ratio the probe
    measures for the same seed and draw (same plan, same weights)."""
    net = [12, 9, 7] if kind == "mlp" else plans.wrn_steps((3, 6, 6), 1)
    shape = (12,) if kind == "mlp" else (3, 6, 6)
    x, y = hessian.data(4, 5, shape, CPU, torch.float64)
    scheme = inits.get("proposed")
    m = hessian.build(kind, net, scheme, x, 7, 2)
    probe = walker.NET_KINDS[kind].walk(net, scheme, x, torch.ones(5, math.prod(plans.convs(net)[-1].shape_out) if kind == "wrn" else 7,
                                                                   dtype=torch.float64), 7, [2]).observed["fwd"][0, -1]
    h = x
    p = m.params
    for i, u in enumerate(m.units):
        if isinstance(u, walker.ResidualBlock):
            z = h
            for j in range(u.k):
                z = hessian._apply(u.ops[j], p, f"{i}.{j}", z)
                z = torch.relu(z) if u.relus[j] else z
            h = (h if not u.has_projection else hessian._apply(u.ops[u.k], p, f"{i}.{u.k}", h)) + u.alpha * z
        else:
            h = hessian._apply(u.op, p, f"{i}", h)
            h = torch.relu(h) if u.relu else h
    np.testing.assert_allclose((h.norm(dim=1) / x.norm(dim=1)).numpy(), torch.exp(probe).numpy(), rtol=1e-10)


def test_power_iteration_is_deterministic_and_reports_divergence():
    x, y = hessian.data(0, 8, (6,), CPU, torch.float64)
    m = hessian.build("mlp", [6, 5, 4], inits.get("proposed"), x, 0, 0)
    runs = [hessian.power_iteration(hessian.HVP(m, x, y), torch.Generator().manual_seed(9), iters=30) for _ in range(2)]
    assert runs[0] == runs[1]
    m.params["0.v"] = m.params["0.v"] * math.inf  # a non-finite net: the power iteration says so
    assert hessian.power_iteration(hessian.HVP(m, x, y), torch.Generator().manual_seed(9)).status == "diverged"
