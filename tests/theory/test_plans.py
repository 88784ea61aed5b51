"""Plans as steps, theory by composition (sigprop/plans/): composing the steps' moment maps
gives the per-net closed forms (tests/closed_forms.py: Theorems 1-4 generalised, the data-dependent
init's approximation), for every init, to rounding (float64 sums of logs in another order: 1e-12
relative, 1e-12 absolute near 0)."""

import dataclasses
import math

import closed_forms
import numpy as np
import pytest

from sigprop import inits, kinds, plans, specs, theory
from sigprop.kinds import mlp, resnet
from sigprop.kinds.resnet import ResNetSpec


def _close(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


PREDICTED = [n for n in inits.names() if inits.get(n).moments is not None or inits.get(n).standardizes]


@pytest.mark.parametrize(
    "name", [n for n in PREDICTED if inits.get(n).defined_for(kinds.KINDS["mlp"].provides)]
)
@pytest.mark.parametrize(
    "widths", [[20, 20, 20, 20], [500, 185, 207, 241, 178], [7, 30, 3, 12, 12, 40], [2, 5, 5]]
)
def test_mlp_composition_equals_the_closed_form(name, widths):
    scheme = inits.get(name)
    got = plans.predict(mlp.steps(widths), scheme)
    want = closed_forms.mlp_prediction(scheme, widths)
    _close(got.ln_forward, want.ln_forward)
    _close(got.ln_backward, want.ln_backward)


@pytest.mark.parametrize(
    "name", [n for n in PREDICTED if inits.get(n).defined_for(kinds.KINDS["resnet"].provides)]
)
@pytest.mark.parametrize("shape", [(1, 6, 1, "12"), (2, 3, 2, "6:14"), (3, 2, 1, "9"), (1, 40, 1, "150:250")])
def test_resnet_composition_equals_the_closed_form(name, shape):
    """The kind's prediction (``kinds.resnet.prediction``: the composed map, the branch ratio and
    the branch-to-skip gains) against Theorems 3-4 generalised, block by block."""
    stages, blocks, depth, width = shape
    spec = ResNetSpec(
        blocks=blocks,
        stages=stages,
        dim=16,
        width=specs.WidthSpec.parse(width),
        block_depth=depth,
        inits=(name,),
    )
    plan = kinds.of(spec).plan(spec, 4)
    scheme = inits.get(name)
    got = resnet.prediction(scheme, plan)
    want = closed_forms.resnet_prediction(scheme, plan)
    _close(got.ln_forward, want.ln_forward)
    _close(got.ln_backward, want.ln_backward)
    if got.ln_branch is not None:
        # with biases in a branch its ratio depends on the state's norm: None there; alpha = 0
        # (SkipInit) gives ln 0 = -inf, which the closed form wrote as None
        kept = [i for i, v in enumerate(got.ln_branch) if v is not None and v > -math.inf]
        assert all(
            want.ln_branch[i] is None
            for i in range(len(got.ln_branch))
            if i not in kept and got.ln_branch[i] is not None
        )
        _close([got.ln_branch[i] for i in kept], [want.ln_branch[i] for i in kept])
    _close([g for g, _ in got.gains], want.gain_forward)
    if scheme.moments is not None:
        _close([g for _, g in got.gains], want.gain_backward)


def test_a_new_step_sequence_needs_no_new_theory():
    """A net no architecture function describes -- an MLP layer, then a residual block whose
    branch has two ReLU layers and a projection, then another MLP layer -- is predicted by the
    same composition; checked by hand against the affine recursion."""
    from sigprop.inits import LayerRole

    steps = (
        plans.Linear(LayerRole(10, 10), True),
        plans.Record(),
        plans.Open(1, 1),
        plans.Linear(LayerRole(10, 8, "relu", 1, 0), True),
        plans.Linear(LayerRole(8, 20, "block_last", 1, 0), False),
        plans.Close(1, plans.Linear(LayerRole(10, 20, "projection", 1, 0), relu=False)),
        plans.Record(),
    )
    row_sq = {"linear": 2.0, "relu": 2.0, "block_last": 1.0, "projection": 1.0}
    scheme = dataclasses.replace(
        inits.get("he"),
        name="test",
        moments=lambda role: theory.LayerMoments(row_sq=row_sq[role.kind]),
        alpha=lambda b: 1.0,
    )
    pred = plans.predict(steps, scheme)
    fwd, bwd = pred.ln_forward, pred.ln_backward
    # forward: layer 1 keeps E||h||^2 (r = 2, ReLU halves); the block: skip 20/10 * 1, branch 8/10*2/2 *
    # 20/8*1 = 2
    assert fwd[0] == pytest.approx(0.0) and fwd[1] == pytest.approx(0.5 * math.log(2 + 2))
    # backward: through the block r_S + (1 * 2 / 2) = 2, at the top 0
    assert bwd[1] == 0.0 and bwd[0] == pytest.approx(0.5 * math.log(2.0))


class _Foreign:
    """A step no fold has heard of (not a ``Linear``, not a ``Conv``): a dense layer written
    from outside, owning its maps (here a Linear's) and saying which visit it takes."""

    def __init__(self, layer: plans.Linear) -> None:
        self.layer, self.role, self.relu, self.bn = layer, layer.role, layer.relu, False

    visit = "layer"

    def __getattr__(self, name):  # energy, energy_back, pair_kernels, jacobian_moments, out_hw
        return getattr(self.layer, name)


@pytest.mark.parametrize("depth_of_block", [0, 2])
def test_every_fold_composes_a_step_it_has_never_heard_of(depth_of_block):
    """One walk (``plans.folds.fold``), and no fold dispatching on a step's type: a step class
    defined outside the package, taking the visit of a layer, goes through the energy forward
    and backward, the pair kernels and the Jacobian's moments exactly as the Linear it wraps
    (the same numbers to the bit), in an MLP and inside a ResNet's branch."""
    scheme = inits.get("proposed")
    if depth_of_block:
        spec = ResNetSpec(dim=24, blocks=3, block_depth=depth_of_block, width=specs.WidthSpec(24, 24))
        steps = kinds.get("resnet").plan(spec, 0).steps
    else:
        steps = mlp.steps([24, 30, 20, 16])
    i = [k for k, st in enumerate(steps) if isinstance(st, plans.Linear)][1]
    foreign = (*steps[:i], _Foreign(steps[i]), *steps[i + 1 :])
    for fn in (
        lambda s: plans.predict(s, scheme),
        lambda s: plans.predict_correlation(s, scheme, 0.5, 8),
        lambda s: plans.predict_jacobian(s, scheme),
    ):
        assert fn(foreign) == fn(steps)
