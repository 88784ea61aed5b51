"""The slope fit against numpy's own least squares, exact on power laws."""

from __future__ import annotations

import math

import numpy as np

from sigprop.width import fit


def test_power_laws_give_their_exponent_exactly():
    w = [64, 128, 256, 512]
    s, se = fit.slope(w, [[3.0 * x**0.5 for x in w], [0.2 * x**0.5 for x in w]])
    assert math.isclose(s, 0.5, abs_tol=1e-12) and se < 1e-12


def test_against_polyfit_and_the_spread_over_seeds():
    rng = np.random.default_rng(0)
    w = np.array([64, 128, 256, 512, 1024])
    v = np.exp(rng.normal(size=(4, 5))) * w**1.3
    s, se = fit.slope(w, v)
    per = [np.polyfit(np.log(w), np.log(row), 1)[0] for row in v]
    assert math.isclose(s, np.mean(per), rel_tol=1e-12)
    assert math.isclose(se, np.std(per, ddof=1) / 2, rel_tol=1e-12)
    s1, se1 = fit.slope(w, v[:1])  # one seed: the regression's standard error
    import scipy.stats

    r = scipy.stats.linregress(np.log(w), np.log(v[0]))
    assert math.isclose(s1, r.slope, rel_tol=1e-12) and math.isclose(se1, r.stderr, rel_tol=1e-10)


def test_nothing_to_fit():
    assert fit.slope([1, 2, 3], [[0.0, 1.0, 2.0]]) == (None, None)
    assert fit.slope([1, 2], [[1.0, 2.0]])[1] is None
