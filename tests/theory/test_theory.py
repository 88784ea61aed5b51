"""Theory two ways (../shared/STYLE.md habit 9): golden values and independent cross-checks."""

import math
import subprocess
import sys

import closed_forms
import numpy as np
import pytest

from sigprop import inits, plans, theory
from sigprop.errors import SigpropError
from sigprop.kinds import mlp

SMALL_N = [2, 3, 4, 5, 6, 7, 10, 11, 50, 101, 500]
LARGE_N = [10**3, 10**4, 10**5, 10**6, 10**7]


@pytest.mark.parametrize("n", SMALL_N + LARGE_N)
def test_kn_closed_form_is_one_and_matches_quadrature(n):
    closed = theory.kn_closed_form(n)
    quad = theory.kn_quadrature(n)
    assert closed == pytest.approx(1.0, abs=1e-12)
    assert quad == pytest.approx(closed, abs=1e-10)


@pytest.mark.parametrize("n", SMALL_N)
def test_kn_log_gamma_matches_literal_products(n):
    # the products of 001 eq. 25/28 multiplied out one factor at a time
    assert theory.kn_closed_form(n) == pytest.approx(theory.kn_product_literal(n), rel=1e-12)


@pytest.mark.parametrize("n", SMALL_N + LARGE_N)
def test_main_text_reading_also_one(n):
    assert theory.kn_main_text_reading(n) == pytest.approx(1.0, abs=1e-12)


def test_mixed_reading_golden_values():
    # Gamma(n/2)^2 / (Gamma((n-1)/2) Gamma((n+1)/2)): 2/pi at n = 2, pi/4 at n = 3
    assert theory.kn_mixed_reading(2) == pytest.approx(2 / math.pi, rel=1e-14)
    assert theory.kn_mixed_reading(3) == pytest.approx(math.pi / 4, rel=1e-14)
    assert theory.kn_mixed_reading(10**6) == pytest.approx(1 - 1 / (2 * 10**6), rel=1e-9)


def test_kn_rejects_bad_n():
    with pytest.raises(SigpropError):
        theory.kn_closed_form(1)


def test_resnet_ratio_band_and_golden():
    assert theory.resnet_ratio(1) == pytest.approx(math.sqrt(2))
    assert theory.resnet_ratio(40) == pytest.approx((1 + 1 / 40) ** 20, rel=1e-14)
    for b in [1, 2, 3, 10, 40, 1000, 10**6]:
        assert theory.in_resnet_band(theory.resnet_ratio(b))
    assert not theory.in_resnet_band(1.4) and not theory.in_resnet_band(1.65)


def test_he_prediction_closed_form():
    widths = [500, 180, 220, 200, 240]
    pred = plans.predict(mlp.steps(widths), inits.get("he"))
    for l in range(1, 5):
        assert math.exp(pred.ln_forward[l - 1]) == pytest.approx(
            math.sqrt(widths[l] / (500 * 2**l)), rel=1e-12
        )
        assert math.exp(pred.ln_backward[l - 1]) == pytest.approx(2 ** (-(4 - l) / 2), rel=1e-12)


def test_proposed_prediction_closed_form():
    widths = [500, 180, 220, 200, 240]
    pred = plans.predict(mlp.steps(widths), inits.get("proposed"))
    assert [math.exp(v) for v in pred.ln_forward] == pytest.approx([1.0] * 4, rel=1e-12)
    assert [math.exp(v) for v in pred.ln_backward] == pytest.approx(
        [math.sqrt(n / 240) for n in widths[1:]], rel=1e-12
    )


def test_prediction_representable_at_depth_3000():
    widths = [64] * 3001
    pred = plans.predict(mlp.steps(widths), inits.get("he"))
    assert pred.ln_forward[-1] == pytest.approx(-1500 * math.log(2))
    pt = plans.predict(mlp.steps(widths), inits.get("pytorch"))
    assert all(math.isfinite(v) for v in pt.ln_forward + pt.ln_backward)


def test_every_init_has_prediction_or_declares_none():
    widths = [100, 80, 120, 90]
    for scheme in (s for s in inits.INITS.values() if inits.MODEL not in s.needs):  # as-is: a model's
        pred = plans.predict(mlp.steps(widths), scheme)
        if scheme.moments is not None:
            assert pred.ln_forward is not None and pred.ln_backward is not None
        else:
            assert scheme.name == "datadep" and pred.ln_backward is None


def test_spread_model_shape():
    widths = [100, 100, 100, 100]
    vf, vb = closed_forms.log_ratio_variance(widths, orthogonal=False)
    assert list(vf) == pytest.approx([5 / 400, 10 / 400, 15 / 400])
    assert list(vb) == pytest.approx([10 / 400, 5 / 400, 0.0])
    vf_o, _ = closed_forms.log_ratio_variance(widths, orthogonal=True)
    assert list(vf_o) == pytest.approx([3 / 400, 6 / 400, 9 / 400])


def test_theory_does_not_import_torch():
    code = (
        "import sigprop.theory, sigprop.inits, sigprop.specs, sigprop.stats, sys; print('torch' in "
        "sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "n, m, orthogonal", [(16, 16, True), (12, 40, True), (40, 12, True), (16, 16, False), (64, 64, True)]
)
def test_exact_layer_cumulants_against_monte_carlo(n, m, orthogonal):
    """relu_layer_log_cumulants against 400k simulated layers: orthogonal rows see a uniform
    direction on the sphere of R^max(n, m) (its first n coordinates when n < m); Gaussian rows
    with a large fan-in a N(0, I_n) pre-activation."""
    rng = np.random.default_rng(n * 1000 + m)
    draws = 400_000
    if orthogonal:
        g = rng.standard_normal((draws, max(n, m)))
        a = (g / np.linalg.norm(g, axis=1, keepdims=True))[:, :n]
    else:
        a = rng.standard_normal((draws, n))
    f = (np.maximum(a, 0.0) ** 2).sum(axis=1)
    f = f[f > 0]  # K = 0 is left out by the model (and counted as dead by the walker)
    x = 0.5 * (np.log(f) - np.log(f.mean()))
    drift, var, k3 = theory.relu_layer_log_cumulants(n, m, orthogonal)
    se = math.sqrt(var / x.size)
    assert abs(x.mean() - drift) < 5 * se + 1e-4
    assert x.var() == pytest.approx(var, rel=0.02)
    assert ((x - x.mean()) ** 3).mean() == pytest.approx(k3, rel=0.1, abs=1e-4)


def test_exact_cumulants_approach_the_leading_order_model():
    """4 n Var -> 3 (orthogonal, square) and 5 (Gaussian) as n grows; at n = 64 the exact
    orthogonal variance is 9% above the leading order (why proposed at width 64, depth 200
    alarmed on 1% of seeds with the leading-order band: docs/reliability.md)."""
    for n, tol in ((4096, 0.01), (1024, 0.02)):
        assert 4 * n * theory.relu_layer_log_cumulants(n, n, True)[1] == pytest.approx(3.0, rel=tol)
        assert 4 * n * theory.relu_layer_log_cumulants(n, n, False)[1] == pytest.approx(5.0, rel=tol)
    assert 4 * 64 * theory.relu_layer_log_cumulants(64, 64, True)[1] == pytest.approx(3.28, abs=0.01)
    f, b = closed_forms.log_ratio_cumulants([64] * 201, True)
    assert f[-1, 1] == pytest.approx(200 * theory.relu_layer_log_cumulants(64, 64, True)[1])
    assert b[-1].tolist() == [0.0, 0.0, 0.0] and b[0, 1] == pytest.approx(
        199 * theory.relu_layer_log_cumulants(64, 64, True)[1]
    )
    lo, hi = theory.cornish_fisher_band(0.0, 0.0, f[-1], 3.0)
    assert hi - f[-1, 0] < f[-1, 0] - lo  # left skew widens the lower side


@pytest.mark.parametrize("m", [0, 1, 2, 3])
def test_numpy_polygamma_against_scipy(m):
    """theory.polygamma (recurrence + asymptotic series, no scipy at run time) equals
    scipy.special.polygamma at the integer and half-integer arguments the cumulants use, and
    elsewhere, from 0.5 to 5e6."""
    from scipy.special import polygamma as sp_polygamma

    x = np.concatenate(
        [np.arange(1, 400) / 2.0, [0.01, 0.3, 1.7, 11.99, 12.0, 12.01, 77.3, 1e3 + 0.5, 4e4, 5e6]]
    )
    got, ref = theory.polygamma(m, x), sp_polygamma(m, x)
    assert np.max(np.abs(got - ref) / np.abs(ref)) < 1e-13


def test_numpy_log_gamma_and_binomial_against_scipy():
    from scipy.special import gammaln
    from scipy.stats import binom

    x = np.concatenate([np.arange(1, 400) / 2.0, [0.01, 0.3, 1.7, 11.99, 12.0, 77.3, 4e4, 5e6, 1e9]])
    assert np.max(np.abs(theory.log_gamma(x) - gammaln(x)) / np.maximum(np.abs(gammaln(x)), 1.0)) < 2e-14
    for n in (1, 2, 7, 64, 1000, 20000):
        k = np.arange(1, n + 1)
        ref = binom.logpmf(k, n, 0.5)
        # ln n! - ln k! - ln (n-k)! cancels terms of size ln n! (and log_gamma's recurrence sums
        # terms up to ln 11! below x = 12): a few ulps of the larger is the floor
        assert np.max(np.abs(theory._log_binomial_half(n) - ref)) < 8 * np.finfo(float).eps * max(
            gammaln(n + 1.0), gammaln(12.0)
        )
