"""sigprop/stats.py, the statistics every kind reads, against independent plain-numpy computations of
what its docstrings promise: the typical (geometric-mean) ratio, the RMS, the spread within and
across draws, dead samples, the band of a prediction, and which bands are a test."""

import math

import numpy as np
import pytest

from sigprop import stats


def test_ratio_stats_are_the_moments_of_the_ratios():
    rng = np.random.default_rng(0)
    ln = rng.normal(-0.3, 0.2, size=(3, 50))  # 3 draws x 50 samples of ln ratios
    r = np.exp(ln)
    st = stats.ratio_stats(ln)
    assert st.mean == pytest.approx(r.mean(), rel=1e-12)
    assert st.rms == pytest.approx(math.sqrt((r**2).mean()), rel=1e-12)
    assert st.std == pytest.approx(math.sqrt(r.var(axis=1).mean()), rel=1e-12)  # within draws
    assert st.draw_std == pytest.approx(r.mean(axis=1).std(ddof=1), rel=1e-12)  # across draws
    assert st.log10_mean == pytest.approx(np.log10(r).mean(), rel=1e-12)
    assert st.log10_std == pytest.approx(math.sqrt(np.log10(r).var(axis=1).mean()), rel=1e-12)
    assert st.dead_fraction == 0.0


def test_ratios_far_beyond_a_float_stay_finite_in_log10():
    ln = np.full((1, 4), 2000.0)  # ratio e^2000: no float64 holds it
    st = stats.ratio_stats(ln)
    assert st.mean is None and st.log10_mean == pytest.approx(2000.0 / math.log(10.0))


def test_a_dead_sample_is_counted_and_fails_the_gate():
    ln = np.array([[0.0, -np.inf, 0.1, 0.2]])
    st = stats.ratio_stats(ln)
    assert st.dead_fraction == pytest.approx(0.25)
    assert st.log10_mean == pytest.approx(np.mean([0.0, 0.1, 0.2]) / math.log(10.0))
    assert not stats.gate("x", "preserved", st, -1.0, 1.0).passed
    assert stats.gate("x", "preserved", stats.ratio_stats(ln[:, [0, 2, 3]]), -1.0, 1.0).passed


def test_one_sample_has_no_spread_across_samples():
    st = stats.ratio_stats(np.array([[0.1], [0.3]]))
    assert st.std is None and st.log10_std is None and st.draw_std is not None


def test_the_band_of_a_prediction_is_the_lognormal_hull_widened_by_z_sd():
    st = stats.ratio_stats(np.full((1, 8), math.log(0.9)))
    ln_pred, var, z = math.log(1.0), 0.01, 3.0
    stats.attach_prediction(st, ln_pred, var, z=z)
    assert st.log10_low == pytest.approx((ln_pred - var - z * 0.1) / math.log(10.0))
    assert st.log10_high == pytest.approx((ln_pred + z * 0.1) / math.log(10.0))
    assert st.agrees  # 0.9 lies in [e^-0.31, e^0.3]
    far = stats.ratio_stats(np.full((1, 8), math.log(0.5)))
    stats.attach_prediction(far, ln_pred, var, z=z)
    assert far.agrees is False


def test_a_band_wider_than_the_factor_two_alternatives_is_not_a_test():
    """docs/theory.md §4: the verdict needs a band narrower than the shift of the prediction with
    every weight layer's variance halved or doubled."""
    st = stats.ratio_stats(np.full((1, 8), 0.0))
    narrow = stats.theory_gate("x", st, -0.1, 0.1, 0.0, separation=(-0.35, 0.35))
    assert narrow.passed and narrow.has_band
    wide = stats.theory_gate("x", st, -0.5, 0.5, 0.0, separation=(-0.35, 0.35))
    assert not wide.passed and not wide.has_band and wide.note.startswith("not a test")
    assert stats.theory_gate("x", st, -0.5, 0.5, 0.0, separation=None).passed  # unknown: a test


def test_rounding_margin_counts_ulps_per_step():
    assert stats.rounding_ln("float32", 9) == pytest.approx(4 * 2.0**-23 * 10)
    assert stats.rounding_ln("float64", 0) == pytest.approx(4 * 2.0**-52)
