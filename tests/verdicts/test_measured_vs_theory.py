"""Measured against predicted, with the tolerances of sigprop/theory/tolerances.py
(../shared/STYLE.md habits 9, 11)."""

import math

import closed_forms
import numpy as np
import pytest
import walks

from sigprop import inits, kinds, plans, specs
from sigprop.kinds import mlp
from sigprop.kinds.mlp import MLPSpec

CLOSED_FORM = [
    s.name
    for s in inits.INITS.values()
    if s.moments is not None and s.defined_for(kinds.KINDS["mlp"].provides)
]


@pytest.fixture(scope="module")
def wide_run():
    spec = MLPSpec(
        depth=10,
        input_dim=1000,
        width=specs.WidthSpec(950, 1050),
        inits=tuple(inits.names(kinds.KINDS["mlp"].provides)),
    )
    plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=256, seed=1, device="cpu"))
    return plan.widths, out


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_every_closed_form_agrees_at_width_1000(wide_run, name):
    widths, out = wide_run
    run = walks.mlp_run(inits.get(name), widths, out[name]["fwd"], out[name]["bwd"])
    for r in run.layers:
        for direction, s in (("forward", r.forward), ("backward", r.backward)):
            assert s.agrees, (name, direction, r.index, s.log10_rms, s.log10_low, s.log10_high)
            # the band is the finite-width one: at width ~1000 and depth <= 10 it is within 40%
            assert s.log10_high - s.log10_predicted < math.log10(1.4)


def test_datadep_forward_approximation_at_width_1000(wide_run):
    widths, out = wide_run
    run = walks.mlp_run(inits.get("datadep"), widths, out["datadep"]["fwd"], out["datadep"]["bwd"])
    for r in run.layers:
        assert r.forward.agrees
        assert r.backward.predicted is None and r.backward.agrees is None


def test_figure1_top_proposed_preserves_he_vanishes():
    spec = MLPSpec(depth=20, inits=("proposed", "proposed-gaussian", "he"))
    plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=300, device="cpu"))
    widths = plan.widths
    runs = {n: walks.mlp_run(inits.get(n), widths, out[n]["fwd"], out[n]["bwd"]) for n in spec.inits}
    assert runs["proposed"].passed and runs["proposed-gaussian"].passed
    assert not runs["he"].passed
    # he: forward ~ sqrt(n_L / (n_0 2^20)) ~ 7e-4, backward at layer 1 ~ 2^{-9.5} ~ 1.4e-3
    assert runs["he"].layers[-1].forward.rms < 2e-3
    assert runs["he"].layers[0].backward.rms < 3e-3
    for r in runs["proposed"].layers:
        assert 0.5 < r.forward.mean < 2.0 and 0.5 < r.backward.mean < 2.0


@pytest.mark.parametrize("name", ["proposed", "proposed-gaussian"])
@pytest.mark.parametrize("width", [64, 256])
def test_finite_width_spread_model_across_seeds(name, width):
    """The spread model of closed_forms.log_ratio_variance against 30 independent draws."""
    draws = 30
    spec = MLPSpec(depth=20, input_dim=width, width=specs.WidthSpec(width, width), inits=(name,))
    plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=100, seeds=draws, seed=5, device="cpu"))
    widths = plan.widths
    f, b = out[name]["fwd"], out[name]["bwd"]
    var_f, var_b = closed_forms.log_ratio_variance(widths, inits.get(name).orthogonal)
    pred = plans.predict(mlp.steps(widths), inits.get(name))
    for arr, var, ln_pred in (
        (f[:, -1, :], var_f[-1], pred.ln_forward[-1]),
        (b[:, 0, :], var_b[0], pred.ln_backward[0]),
    ):
        sd = math.sqrt(var)
        assert np.std(arr) == pytest.approx(sd, rel=0.25)
        # the mean of ln ratio drifts by -var; its standard error over draws is < sd / sqrt(draws)
        assert abs(arr.mean() - (ln_pred - var)) < 3 * sd / math.sqrt(draws) + 0.02
