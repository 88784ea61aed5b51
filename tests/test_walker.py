"""The walker over plans (sigprop/walker/): units compiled from plans, observers, the
correlation observer against a direct float64 computation, pair inputs."""

import numpy as np
import pytest
import torch

from sigprop import inits, plans, walker
from sigprop.kernels import logspace as ls
from sigprop.kernels import sampling
from sigprop.kinds import mlp, resnet
from sigprop.observers.correlation import Correlation


def test_pair_inputs_have_the_cosine_and_equal_norms():
    for c0 in (-1.0, -0.3, 0.0, 0.7, 1.0):
        x = sampling.pair_inputs(4, 50, 12, c0, "cpu", torch.float64)
        a, b = x[:50], x[50:]
        na, nb = torch.linalg.vector_norm(a, dim=1), torch.linalg.vector_norm(b, dim=1)
        torch.testing.assert_close(na, nb, rtol=1e-12, atol=0)
        torch.testing.assert_close(
            (a * b).sum(1) / (na * nb), torch.full((50,), c0, dtype=torch.float64), rtol=0, atol=1e-12
        )
    # the same a, b for every c0 (common random numbers)
    assert torch.equal(
        sampling.pair_inputs(4, 5, 12, 0.1, "cpu", torch.float64)[:5],
        sampling.pair_inputs(4, 5, 12, 0.9, "cpu", torch.float64)[:5],
    )


def _direct_mlp_cosines(params, x, P):
    """Forward by hand in float64 with the walk's own parameters: cosine of rows i, P + i."""
    h, out = x, []
    for p in params:
        a = p.scale * (h @ p.v.T) + (0 if p.bias is None else p.bias)
        h = torch.relu(a)
        n = torch.linalg.vector_norm(h[:P], dim=1) * torch.linalg.vector_norm(h[P:], dim=1)
        out.append((h[:P] * h[P:]).sum(1) / n)
    return torch.stack(out)


@pytest.mark.parametrize("name", ["proposed", "he", "pytorch"])
def test_correlation_observer_equals_a_direct_forward(name):
    widths, P = [10, 14, 9, 12, 11], 6
    x = sampling.pair_inputs(2, P, widths[0], 0.3, "cpu", torch.float64)
    e = torch.zeros(2 * P, widths[-1], dtype=torch.float64)
    scheme = inits.get(name)
    units, rec = walker.compile_plan(mlp.steps(widths), scheme)
    r = walker.walk(units, scheme, x, e, 3, [0], [Correlation()], rec)
    want = _direct_mlp_cosines([ls.unstack(k.params, 0) for k in r.kept], x, P)
    np.testing.assert_allclose(r.observed["correlation"][0].numpy(), want.numpy(), rtol=0, atol=1e-12)


def test_correlation_walk_draws_the_probe_weights():
    """The forward-only correlation walk uses the same weights as the probe (common random
    numbers): its first-layer cosines equal those of a stored walk's parameters."""
    widths = [8, 10, 10]
    x = sampling.pair_inputs(1, 4, 8, 0.0, "cpu", torch.float64)
    scheme = inits.get("proposed")
    units, rec = walker.compile_plan(mlp.steps(widths), scheme)
    only = walker.walk(units, scheme, x, None, 5, [0, 1], [Correlation()], rec).observed["correlation"]
    e = torch.zeros(8, 10, dtype=torch.float64)
    both = walker.walk(units, scheme, x, e, 5, [0, 1], [Correlation()], rec).observed["correlation"]
    assert torch.equal(only, both)


def test_plans_compile_to_units():
    plan = resnet.resnet_plan(8, 2, 2, 2, [5, 6, 7, 8, 9, 10, 11, 12])
    units, rec = walker.compile_plan(plan.steps, inits.get("proposed"))
    assert rec and [type(u) for u in units] == [walker.ResidualBlock] * 4
    assert [u.has_projection for u in units] == [False, False, True, False]
    units, rec = walker.compile_plan(mlp.steps([4, 5, 6]), inits.get("he"))
    assert not rec and [u.layer for u in units] == [1, 2]
    bn = resnet.resnet_plan(6, 1, 3, 0, [], stem=True)
    units, rec = walker.compile_plan(bn.steps, inits.get("unnormalized-he"))
    assert (
        rec
        and [u.residual for u in units] == [False, True, True, True]
        and [u.layer for u in units] == [0, 1, 2, 3]
    )
    with pytest.raises(ValueError, match="BatchNorm"):
        plans.predict(bn.steps, inits.get("unnormalized-he"))


def test_a_step_the_compiler_does_not_know_is_refused():
    with pytest.raises(ValueError, match="cannot compile step"):
        walker.compile_plan((plans.Record(), plans.Close(1), plans.Record()), inits.get("he"))


def test_the_docstrings_say_what_is_recorded_where():
    """Issue 27, item 10: the forward ratio is read after a layer's ReLU (h = ReLU(a), Arpit et al.
    2019, eq. 1-3) and the backward one at its pre-activation (dl/da, eq. 4-5) -- what the
    autograd oracle of tests/kinds/test_mlp.py checks -- and the docstrings say so (0.7.0's
    said "recorded at its pre-activation")."""
    for doc in (walker.__doc__, walker.DenseLayer.__doc__, walker.ConvLayer.__doc__):
        flat = " ".join(doc.split())
        assert "recorded at its pre-activation" not in flat and "recorded at the pre-activation" not in flat
    assert "forward at its output h = ReLU(a), backward at its pre-activation" in " ".join(
        walker.DenseLayer.__doc__.split()
    )
