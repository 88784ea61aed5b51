"""Slopes of log-scale against log-width (numpy only): one least-squares slope per seed, their
mean and standard error over seeds (one seed: the regression's own standard error)."""

from __future__ import annotations

import math

import numpy as np


def slope(widths, values) -> tuple[float | None, float | None]:
    """The slope of log(values) on log(widths), ``values`` (seeds, widths), and its standard
    error: over seeds the spread of the per-seed slopes / sqrt(seeds); with one seed the
    regression's residual standard error (None with two widths).  (None, None) where a value is
    zero or not finite (an update at step 0, a zero readout)."""
    v = np.asarray(values, dtype=float)
    if v.ndim == 1:
        v = v[None]
    if not np.all(np.isfinite(v)) or np.any(v <= 0):
        return None, None
    x = np.log(np.asarray(widths, dtype=float))
    y = np.log(v)
    xc = x - x.mean()
    sxx = float(xc @ xc)
    per_seed = (y - y.mean(axis=1, keepdims=True)) @ xc / sxx
    s = float(per_seed.mean())
    if v.shape[0] > 1:
        return s, float(per_seed.std(ddof=1) / math.sqrt(v.shape[0]))
    if len(x) < 3:
        return s, None
    resid = y[0] - y[0].mean() - per_seed[0] * xc
    return s, float(math.sqrt(float(resid @ resid) / (len(x) - 2) / sxx))
