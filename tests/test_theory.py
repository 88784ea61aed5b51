"""Theory two ways (STYLE.md habit 9): golden values and independent cross-checks."""

import math
import subprocess
import sys

import pytest

from sigprop import inits, theory
from sigprop.errors import SigpropError

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
    pred = inits.get("he").predict_mlp(widths)
    for l in range(1, 5):
        assert math.exp(pred.ln_forward[l - 1]) == pytest.approx(math.sqrt(widths[l] / (500 * 2**l)), rel=1e-12)
        assert math.exp(pred.ln_backward[l - 1]) == pytest.approx(2 ** (-(4 - l) / 2), rel=1e-12)


def test_proposed_prediction_closed_form():
    widths = [500, 180, 220, 200, 240]
    pred = inits.get("proposed").predict_mlp(widths)
    assert [math.exp(v) for v in pred.ln_forward] == pytest.approx([1.0] * 4, rel=1e-12)
    assert [math.exp(v) for v in pred.ln_backward] == pytest.approx([math.sqrt(n / 240) for n in widths[1:]], rel=1e-12)


def test_prediction_representable_at_depth_3000():
    widths = [64] * 3001
    pred = inits.get("he").predict_mlp(widths)
    assert pred.ln_forward[-1] == pytest.approx(-1500 * math.log(2))
    pt = inits.get("pytorch").predict_mlp(widths)
    assert all(math.isfinite(v) for v in pt.ln_forward + pt.ln_backward)


def test_every_init_has_prediction_or_declares_none():
    widths = [100, 80, 120, 90]
    for scheme in inits.INITS.values():
        pred = scheme.predict_mlp(widths)
        if scheme.moments is not None:
            assert pred.ln_forward is not None and pred.ln_backward is not None
        else:
            assert scheme.name == "datadep" and pred.ln_backward is None


def test_spread_model_shape():
    widths = [100, 100, 100, 100]
    vf, vb = theory.log_ratio_variance(widths, orthogonal=False)
    assert list(vf) == pytest.approx([5 / 400, 10 / 400, 15 / 400])
    assert list(vb) == pytest.approx([10 / 400, 5 / 400, 0.0])
    vf_o, _ = theory.log_ratio_variance(widths, orthogonal=True)
    assert list(vf_o) == pytest.approx([3 / 400, 6 / 400, 9 / 400])


def test_theory_does_not_import_torch():
    code = "import sigprop.theory, sigprop.inits, sigprop.specs, sigprop.stats, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
