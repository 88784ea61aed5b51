"""Plans as steps, theory by composition (sigprop/plans.py): composing the steps' moment maps
gives the per-architecture closed forms of theory.py, for every init with moments, to rounding
(float64 sums of logs in another order: 1e-12 relative, 1e-12 absolute near 0)."""

import math

import numpy as np
import pytest

from sigprop import inits, plans, specs, theory


def _close(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


MOMENT_INITS = [n for n in inits.names() if inits.get(n).moments is not None]


@pytest.mark.parametrize("name", [n for n in MOMENT_INITS if "mlp" in inits.get(n).applies_to])
@pytest.mark.parametrize("widths", [[20, 20, 20, 20], [500, 185, 207, 241, 178], [7, 30, 3, 12, 12, 40], [2, 5, 5]])
def test_mlp_composition_equals_the_closed_form(name, widths):
    scheme = inits.get(name)
    want = scheme.predict_mlp(widths)
    fwd, bwd = plans.predict(plans.mlp_steps(widths), scheme.moments, scheme.alpha, widths[0])
    _close(fwd, want.ln_forward)
    _close(bwd, want.ln_backward)


@pytest.mark.parametrize("name", [n for n in MOMENT_INITS if "resnet" in inits.get(n).applies_to])
@pytest.mark.parametrize("shape", [(1, 6, 1, "12"), (2, 3, 2, "6:14"), (3, 2, 1, "9"), (1, 40, 1, "150:250")])
def test_resnet_composition_equals_the_closed_form(name, shape):
    stages, blocks, depth, width = shape
    spec = specs.ResNetSpec(blocks=blocks, stages=stages, dim=16, width=specs.WidthSpec.parse(width), block_depth=depth,
                            inits=(name,))
    plan = spec.plan(4)
    scheme = inits.get(name)
    want = scheme.predict_resnet(plan)
    fwd, bwd = plans.predict(plans.resnet_steps(plan), scheme.moments, scheme.alpha, plan.dim)
    _close(fwd, want.ln_forward)
    _close(bwd, want.ln_backward)


def test_a_new_step_sequence_needs_no_new_theory():
    """A net no architecture function describes -- an MLP layer, then a residual block whose
    branch has two ReLU layers and a projection, then another MLP layer -- is predicted by the
    same composition; checked by hand against the affine recursion."""
    from sigprop.inits import LayerRole

    steps = (plans.Linear(LayerRole(10, 10), True), plans.Record(),
             plans.Open(), plans.Linear(LayerRole(10, 8, "relu", 1, 0), True), plans.Linear(LayerRole(8, 20, "block_last", 1, 0), False),
             plans.Close(1, LayerRole(10, 20, "projection", 1, 0)), plans.Record())
    moments = lambda role: theory.LayerMoments(row_sq={"relu": 2.0, "block_last": 1.0, "projection": 1.0}[role.kind])
    fwd, bwd = plans.predict(steps, moments, lambda b: 1.0, 10)
    # forward: layer 1 keeps E||h||^2 (r = 2, ReLU halves); the block: skip 20/10 * 1, branch 8/10*2/2 * 20/8*1 = 2
    assert fwd[0] == pytest.approx(0.0) and fwd[1] == pytest.approx(0.5 * math.log(2 + 2))
    # backward: through the block r_S + (1 * 2 / 2) = 2, at the top 0
    assert bwd[1] == 0.0 and bwd[0] == pytest.approx(0.5 * math.log(2.0))
