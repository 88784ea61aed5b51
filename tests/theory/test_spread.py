"""One spread (``plans.spread``): the finite-width spread of every net kind composed from its
steps' own laws over the one walk of the folds equals what each kind computed itself until 0.17
(tests/closed_forms.py keeps those recursions as the oracle): the MLP's exact cumulants, the
CNN's conv law, the ResNet's and the WRN's block laws, at the init's own gains and at the
reference's, for orthogonal and i.i.d. rows."""

import closed_forms
import numpy as np
import pytest

from sigprop import kinds, plans, specs
from sigprop.kinds import cnn, mlp, resnet, wrn
from sigprop.kinds.resnet import ResNetSpec


@pytest.mark.parametrize("orthogonal", [False, True])
@pytest.mark.parametrize(
    "widths", [[20, 20, 20, 20], [500, 185, 207, 241, 178], [7, 30, 3, 12, 12, 40], [2, 5]]
)
def test_the_mlp_spread_is_its_exact_cumulants(widths, orthogonal):
    s = plans.spread(mlp.steps(widths), orthogonal)
    fwd, bwd = closed_forms.log_ratio_cumulants(widths, orthogonal)
    assert np.array_equal(s.forward, fwd) and np.array_equal(s.backward, bwd)


@pytest.mark.parametrize("depth, strided", [(1, 0), (5, 2), (12, 1)])
def test_the_cnn_spread_is_the_conv_law(depth, strided):
    steps = cnn.steps((3, 16, 16), 8, depth, strided)
    s = plans.spread(steps, orthogonal=True)  # a conv's law is the i.i.d. rows' whatever the init
    fwd, bwd = closed_forms.conv_log_ratio_variance([3] + [8] * depth)
    assert np.array_equal(s.forward[:, 1], fwd) and np.array_equal(s.backward[:, 1], bwd)
    assert not s.forward[:, [0, 2]].any() and not s.backward[:, [0, 2]].any()


@pytest.mark.parametrize(
    "spec",
    [
        ResNetSpec(dim=30, blocks=4, block_depth=1, width=specs.WidthSpec(20, 40)),
        ResNetSpec(dim=16, blocks=3, stages=3, block_depth=2, width=specs.WidthSpec(10, 50)),
        ResNetSpec(dim=24, blocks=5, norm="bn", inits=("he",)),
    ],
    ids=["one-stage", "projections", "bn"],
)
@pytest.mark.parametrize("name", ["proposed", "proposed-gaussian", "stage-hanin", "skipinit"])
def test_the_resnet_spread_is_its_block_law(spec, name):
    kind = kinds.get("resnet")
    plan = kind.plan(spec, 3)
    scheme = kind.scheme(spec, name)
    orth = spec.norm != "bn" and scheme.orthogonal
    gains = resnet.prediction(scheme, plan).gains
    reference = [(1.0 / b.blocks_in_stage,) * 2 for b in plan.blocks]
    for o, g in ((orth, gains), (False, reference)):
        s = plans.spread(plan.steps, o, g)
        var_f, var_b, f_steps, b_steps = closed_forms.resnet_log_ratio_variance(o, plan, g)
        if plan.stem:  # its stem is a batch norm's law plus a linear layer's: 3/(4d) + 2/(4d), not 5/(4d)
            np.testing.assert_allclose(s.forward[:, 1], var_f, rtol=4e-16, atol=0)
            np.testing.assert_allclose(s.backward[:, 1], var_b, rtol=4e-16, atol=0)
            f_steps, b_steps = f_steps[1:], b_steps[1:]
        else:
            assert np.array_equal(s.forward[:, 1], var_f) and np.array_equal(s.backward[:, 1], var_b)
        assert s.block_forward == f_steps and s.block_backward == b_steps


@pytest.mark.parametrize("bottleneck, bn", [(False, False), (True, False), (False, True)])
def test_the_wrn_spread_is_its_conv_and_block_laws(bottleneck, bn):
    steps = wrn.steps((3, 16, 16), 2, 2, bottleneck, bn=bn)
    gains = [(0.3 + 0.1 * k, 0.5 - 0.05 * k) for k in range(len(plans.nest(steps)))]
    for g in (None, gains):
        s = plans.spread(steps, orthogonal=True, gains=g)
        var_f, var_b, branch = closed_forms.wrn_log_ratio_variance(steps, g)
        assert np.array_equal(s.forward[:, 1], var_f) and np.array_equal(s.backward[:, 1], var_b)
        assert s.branch == branch
