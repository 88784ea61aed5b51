"""ResNet theory: the kind's composed predictions against golden closed forms (Theorems 3-4),
and measured against predicted with the tolerances of sigprop/theory/tolerances.py
(../shared/STYLE.md habits 9, 11)."""

import math

import numpy as np
import pytest
import torch
import walks

from sigprop import inits, kinds, specs, theory
from sigprop.kinds import resnet
from sigprop.kinds.resnet import ResNetSpec

CPU = specs.ProbeSpec(samples=200, device="cpu")


KIND = kinds.KINDS["resnet"]


def _plan(**kw):
    return KIND.plan(ResNetSpec(**{"inits": ("proposed",), **kw}), 0)


def _run(spec, name, plan, arrays, samples):
    """The run the kind assembles from the arrays, as the driver does."""
    return walks.assemble(
        "resnet", KIND.scheme(spec, name), plan, arrays, spec, specs.ProbeSpec(samples=samples)
    )


# ----------------------------------------------------------------------------------------------
# golden closed forms
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("blocks", [1, 2, 40, 400])
def test_proposed_prediction_is_theorem_3_and_4(blocks):
    plan = _plan(blocks=blocks)
    pred = resnet.prediction(inits.get("proposed"), plan)
    for b in range(blocks + 1):
        assert pred.ln_forward[b] == pytest.approx(0.5 * b * math.log1p(1 / blocks), abs=1e-12)
        assert pred.ln_backward[b] == pytest.approx(0.5 * (blocks - b) * math.log1p(1 / blocks), abs=1e-12)
    assert math.exp(pred.ln_forward[-1]) == pytest.approx(theory.resnet_ratio(blocks), rel=1e-12)
    assert theory.in_resnet_band(math.exp(pred.ln_forward[-1]))
    assert all(v == pytest.approx(-0.5 * math.log(blocks)) for v in pred.ln_branch)


@pytest.mark.parametrize("depth, base", [(1, 1.5), (2, 1.25), (3, 1.125)])
def test_he_prediction_is_one_plus_two_to_minus_d(depth, base):
    plan = _plan(blocks=30, block_depth=depth, width=specs.WidthSpec(50, 300))
    pred = resnet.prediction(inits.get("he"), plan)
    for b in range(31):
        assert pred.ln_forward[b] == pytest.approx(0.5 * b * math.log(base), abs=1e-12)
        assert pred.ln_backward[b] == pytest.approx(0.5 * (30 - b) * math.log(base), abs=1e-12)


def test_other_closed_forms():
    plan = _plan(blocks=40)
    sk = resnet.prediction(inits.get("skipinit-sqrt"), plan)
    assert sk.ln_forward[-1] == pytest.approx(
        20 * math.log1p(2 / 40), abs=1e-12
    )  # He branch: E||F||^2 = 2||h||^2
    un = resnet.prediction(inits.get("unnormalized-he"), plan)
    assert un.ln_forward[-1] == pytest.approx(20 * math.log(3.0), abs=1e-12)  # exponential, not linear
    z = resnet.prediction(inits.get("skipinit"), plan)
    assert z.ln_forward[-1] == 0.0 and z.ln_backward[0] == 0.0
    sh = resnet.prediction(inits.get("stage-hanin"), plan)
    assert sh.ln_forward[-1] == pytest.approx(0.5 * sum(math.log1p(0.81**b) for b in range(1, 41)), abs=1e-12)
    assert sh.ln_backward[0] == pytest.approx(sh.ln_forward[-1], abs=1e-12)


def test_multi_stage_proposed_and_projection_band():
    plan = _plan(blocks=10, stages=3, dim=100)
    pred = resnet.prediction(inits.get("proposed"), plan)
    r = 0.5 * 10 * math.log1p(1 / 10)
    assert pred.ln_forward[-1] == pytest.approx(3 * r, abs=1e-12)  # projections preserve the norm
    assert pred.ln_backward[0] == pytest.approx(
        3 * r - 2 * 0.5 * math.log(2), abs=1e-12
    )  # P^T halves ||d||^2
    (f_lo, f_hi), (b_lo, b_hi) = theory.stage_band_ln(100, 200)
    assert (f_lo, b_hi) == (math.log(theory.RESNET_LOWER), math.log(theory.RESNET_UPPER))
    # hull: forward up to sqrt(e) sqrt(2), backward down to sqrt(2)/sqrt(2) = 1
    assert f_hi == pytest.approx(0.5 + 0.5 * math.log(2)) and b_lo == pytest.approx(0.0, abs=1e-15)
    assert f_lo <= r <= f_hi and b_lo <= r - 0.5 * math.log(2) <= b_hi


def test_bn_predictions():
    assert theory.bn_statistics_prediction(0, 1000) == pytest.approx((1.0, 0.999, 0.001))
    sv, mv, ms = theory.bn_statistics_prediction(30, 10**9)
    assert (sv, mv, ms) == pytest.approx((30, 30 * (1 - 1 / math.pi), 30 / math.pi), rel=1e-8)
    p = theory.bn_resnet_prediction(500, 60)
    assert len(p.ln_forward) == 62 and p.ln_forward[1] == 0.0
    assert p.ln_backward[0] == p.ln_backward[1] and p.ln_backward[-1] == 0.0


# ----------------------------------------------------------------------------------------------
# measured against predicted
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("blocks", [40, 400])
def test_proposed_inside_the_band(blocks):
    spec = ResNetSpec(blocks=blocks, inits=("proposed", "proposed-gaussian"))
    plan, out, _ = walks.measure(spec, CPU)
    for name in spec.inits:
        run = _run(spec, name, plan, out[name], CPU.samples)
        assert run.passed, [(c.name, c.log10_measured, c.log10_low, c.log10_high) for c in run.checks]
        for c in run.verdict_checks(
            "preserved"
        ):  # the measured geometric mean itself, not only the widened band
            assert theory.RESNET_LOWER * 0.9 < 10**c.log10_measured < theory.RESNET_UPPER * 1.05
        ag = run.agreement()
        assert ag["forward"]["layers_agreeing"] == ag["forward"]["layers_compared"] == blocks + 1
        assert ag["backward"]["layers_agreeing"] == blocks + 1


def test_he_matches_three_halves():
    spec = ResNetSpec(blocks=40, inits=("he",))
    plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=200, seeds=3, device="cpu"))
    run = _run(spec, "he", plan, out["he"], 200)
    for r in run.layers:
        assert r.forward.predicted == pytest.approx(1.5 ** (r.index / 2), rel=1e-12)
        assert r.forward.agrees and r.backward.agrees
    assert not run.passed  # (3/2)^20 ~ 3325 is far outside the band
    assert 1e3 < run.layers[-1].forward.rms < 1e4


def test_bn_statistics_within_20_percent_at_width_1000():
    spec = ResNetSpec(blocks=20, dim=1000, norm="bn", inits=("he",))
    plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=1000, device="cpu"))
    run = _run(spec, "he", plan, out["he"], 1000)
    for r in run.layers[1:]:
        l = r.index
        assert r.bn.skip_variance == pytest.approx(l, rel=0.2)
        assert r.bn.moving_variance == pytest.approx(l * (1 - 1 / math.pi), rel=0.2)
        assert r.bn.moving_squared_mean == pytest.approx(l / math.pi, rel=0.2)
        assert r.forward.agrees and r.backward.agrees


def test_skipinit_ratio_is_exactly_one_and_fails_the_band():
    spec = ResNetSpec(blocks=40, dim=500, width=specs.WidthSpec(200, 200), inits=("skipinit",))
    plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=50, device="cpu"))
    run = _run(spec, "skipinit", plan, out["skipinit"], 50)
    for r in run.layers:
        assert abs(r.forward.rms - 1.0) < 1e-5 and abs(r.backward.rms - 1.0) < 1e-5
        assert r.forward.agrees and r.backward.agrees
    # the identity sits below sqrt 2: the band is Theorem 3's, by design.  (At width 500 the
    # widened band starts at ~1.23; at width ~64 the finite-width tolerance reaches below 1.)
    assert not run.passed


def test_multi_stage_proposed_passes_and_he_fails():
    spec = ResNetSpec(
        blocks=15, stages=3, dim=128, width=specs.WidthSpec(64, 96), block_depth=2, inits=("proposed", "he")
    )
    plan, out, _ = walks.measure(spec, CPU)
    prop = _run(spec, "proposed", plan, out["proposed"], CPU.samples)
    assert len(prop.verdict_checks("preserved")) == 6 and prop.passed, [
        (c.name, c.log10_measured, c.log10_low, c.log10_high) for c in prop.checks
    ]
    # every stage check with a band passes; at widths 64-96 and 15 blocks a stage's band is wider
    # than the step to every layer's variance halved or doubled there: not a test (issue 37, item 3)
    theory_checks = prop.verdict_checks("theory")
    assert all(c.passed for c in theory_checks if c.has_band), [
        (c.name, c.log10_measured, c.log10_low, c.log10_high) for c in theory_checks
    ]
    assert all("not a test" in c.note for c in theory_checks if not c.has_band)
    assert all(r.forward.agrees and r.backward.agrees for r in prop.layers)
    he = _run(spec, "he", plan, out["he"], CPU.samples)
    assert all(r.forward.agrees and r.backward.agrees for r in he.layers)


@pytest.mark.parametrize("name", ["proposed", "he", "skipinit-sqrt", "pytorch"])
def test_resnet_spread_model_across_seeds(name):
    """theory.resnet_step_variance against 30 independent draws (docs/theory.md §7)."""
    draws = 30
    spec = ResNetSpec(blocks=20, dim=128, width=specs.WidthSpec(64, 64), inits=(name,))
    plan, out, _ = walks.measure(spec, specs.ProbeSpec(samples=100, seeds=draws, seed=5, device="cpu"))
    scheme = inits.get(name)
    pred = resnet.prediction(scheme, plan)
    var_f, var_b = resnet.variances(scheme.orthogonal, plan, pred.gains).variances
    for arr, var, ln_pred in (
        (out[name]["fwd"][:, -1, :], var_f[-1], pred.ln_forward[-1]),
        (out[name]["bwd"][:, 0, :], var_b[0], pred.ln_backward[0]),
    ):
        sd = math.sqrt(var)
        assert np.std(arr) == pytest.approx(sd, rel=0.25)
        assert abs(arr.mean() - (ln_pred - var)) < 3 * sd / math.sqrt(draws) + 0.02


def test_datadep_forward_approximation():
    spec = ResNetSpec(blocks=20, stages=2, dim=200, width=specs.WidthSpec(100, 150), inits=("datadep",))
    plan, out, _ = walks.measure(spec, CPU)
    run = _run(spec, "datadep", plan, out["datadep"], CPU.samples)
    assert all(r.forward.agrees for r in run.layers)
    assert all(r.backward.predicted is None for r in run.layers)


@pytest.mark.parametrize("b", [1, 5])
def test_one_bn_block_follows_the_step_law_with_its_relus_share(b):
    """One block h' = h + W BN(h)^+ of the BN ResNet (De & Smith 2020, appendix C; He's W, h of
    power b d, so g = 1/b), by Monte Carlo over 64 draws of 128 samples at d = 128: the
    variance of ln(||h'||/||h||) is the step law's (``theory.resnet_step_variance``) with the
    branch's power varying by 2/d (W) + 3/d (the ReLU's share of BN(h)'s power: a half-Gaussian's
    fourth moment; docs/theory.md §7).  The variance of 8192 correlated samples (per draw) is
    measured to about 2.5%; 8% asserted.  0.16's 2/d law reads 33% below at b = 1, a ReLU
    layer's 5/d (7/d in all) 22% above."""
    gen = torch.Generator().manual_seed(b)
    d, n, draws = 128, 128, 64
    vals = []
    for _ in range(draws):
        h = torch.randn(n, d, generator=gen, dtype=torch.float64) * math.sqrt(b)
        z = (h - h.mean(0)) / h.std(0, unbiased=False)
        w = torch.randn(d, d, generator=gen, dtype=torch.float64) * math.sqrt(2.0 / d)
        out = h + z.clamp(min=0) @ w.T
        vals.append(0.5 * torch.log(out.pow(2).sum(1) / h.pow(2).sum(1)))
    measured = float(torch.cat(vals).var())
    law = theory.resnet_step_variance(1.0 / b, 5.0 / d, 0.0, d)
    assert measured == pytest.approx(law, rel=0.08)


def test_the_bn_resnets_stem_follows_its_relus_share():
    """The BN ResNet's stem x^1 = W^0 BN(x^0)^+ for x^0 ~ N(0, I) (De & Smith 2020, appendix C),
    by Monte Carlo over 64 draws of 128 fresh inputs at d = 128: ln(||x^1||/||x^0||) varies by
    (3 + 2)/(4d) (the ReLU's share and W's; docs/theory.md §7), which ``plans.spread`` gives
    the stem's entry; these draws read 5% above (over 100 draws of another generator: 2% at
    d = 128, 7% at 64, 0.5% at 256 -- the next order in 1/d), 8% asserted.  0.16's (5 + 2)/(4d)
    reads 25% below these draws.  (A probe shares its inputs across
    draws: its estimate of this variance moves by about 10% from seed to seed at 128 samples.)"""
    d, n, draws = 128, 128, 64
    spec = ResNetSpec(dim=d, blocks=2, norm="bn", inits=("he",))
    plan = kinds.get("resnet").plan(spec, 0)
    var_f, _ = resnet.variances(False, plan, [(0.5, 0.5)] * 2).variances
    gen = torch.Generator().manual_seed(7)
    vals = []
    for _ in range(draws):
        x = torch.randn(n, d, generator=gen, dtype=torch.float64)
        z = (x - x.mean(0)) / x.std(0, unbiased=False)
        w = torch.randn(d, d, generator=gen, dtype=torch.float64) * math.sqrt(2.0 / d)
        vals.append(0.5 * torch.log((z.clamp(min=0) @ w.T).pow(2).sum(1) / x.pow(2).sum(1)))
    assert var_f[1] == pytest.approx(5.0 / (4 * d))
    assert float(torch.cat(vals).var()) == pytest.approx(var_f[1], rel=0.08)
