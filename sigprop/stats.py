"""From the engine's ln-ratio arrays to result records: statistics, predictions, checks.

numpy/scipy only (no torch): the engine hands over float64 arrays of ln(ratio) with shape
[draws, layers, samples]; every statistic is computed in log space so nothing under- or
overflows before the final conversion (which yields None where a float64 cannot hold it).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from sigprop import theory
from sigprop.inits import InitScheme
from sigprop.results import Check, LayerRecord, RatioStats, RunResult

LN10 = math.log(10.0)
_MAX_LN = math.log(np.finfo(np.float64).max)


def _exp_or_none(x: float) -> float | None:
    if x == -math.inf:
        return 0.0
    if not math.isfinite(x) or x > _MAX_LN:
        return None
    return math.exp(x)


def _lse(a: np.ndarray, axis=None) -> np.ndarray:
    from scipy.special import logsumexp

    return logsumexp(a, axis=axis)


def ratio_stats(ln: np.ndarray) -> RatioStats:
    """Statistics of one layer's ratios from ln-ratios of shape [draws, samples]."""
    ln = np.asarray(ln, dtype=np.float64)
    draws, samples = ln.shape
    finite = np.isfinite(ln)
    dead = 1.0 - finite.mean()
    count = ln.size
    ln_mean = float(_lse(ln) - math.log(count))
    ln_rms = 0.5 * float(_lse(2.0 * ln) - math.log(count))
    # scale by the largest value so exp() cannot overflow; the std is then rescaled in log space
    k = float(ln[finite].max()) if finite.any() else 0.0
    scaled = np.exp(ln - k)  # in [0, 1]
    per_draw_mean = scaled.mean(axis=1)
    within_var = float((scaled.var(axis=1)).mean())
    ln_std = 0.5 * math.log(within_var) + k if within_var > 0 else -math.inf
    std = 0.0 if within_var == 0 else _exp_or_none(ln_std)
    if draws > 1:
        dv = float(per_draw_mean.var(ddof=1))
        draw_std = 0.0 if dv == 0 else _exp_or_none(0.5 * math.log(dv) + k)
    else:
        draw_std = None
    log10_mean = log10_std = log10_draw_std = None
    if finite.any():
        vals = ln[finite] / LN10
        log10_mean = float(vals.mean())
        per_draw = [ln[d][finite[d]] / LN10 for d in range(draws)]
        within = [np.var(p) for p in per_draw if p.size]
        log10_std = float(math.sqrt(np.mean(within)))
        if draws > 1:
            means = [p.mean() for p in per_draw if p.size]
            log10_draw_std = float(np.std(means, ddof=1)) if len(means) > 1 else None
    return RatioStats(
        mean=_exp_or_none(ln_mean),
        std=std,
        rms=_exp_or_none(ln_rms),
        log10_mean=log10_mean,
        log10_std=log10_std,
        log10_rms=ln_rms / LN10 if math.isfinite(ln_rms) else None,
        draw_std=draw_std,
        log10_draw_std=log10_draw_std,
        dead_fraction=float(dead),
    )


def attach_prediction(stats: RatioStats, ln_pred: float | None, ln_var: float, z: float = theory.Z_AGREEMENT) -> None:
    """Pair a measurement with its prediction.

    The prediction is the true RMS, E[ratio^2]^{1/2}.  Across samples and draws ln(ratio) is
    close to normal with variance var = theory.log_ratio_variance (docs/theory.md), so the
    typical ratio sits exp(-var) below the RMS, and an RMS measured on one draw (whose samples
    share the weights) lies between the two.  The band is that hull widened by z sd:
        [ln_pred - var - z sd, ln_pred + z sd].
    """
    if ln_pred is None or not math.isfinite(ln_pred):
        return
    var = max(ln_var, 0.0)
    sd = math.sqrt(var)
    stats.log10_predicted = ln_pred / LN10
    stats.predicted = _exp_or_none(ln_pred)
    stats.log10_low = (ln_pred - var - z * sd) / LN10
    stats.log10_high = (ln_pred + z * sd) / LN10
    if stats.log10_rms is not None:
        # exact equality (e.g. the backward ratio at layer L, sd = 0) needs a rounding margin
        eps = 1e-9
        stats.agrees = bool(stats.log10_low - eps <= stats.log10_rms <= stats.log10_high + eps)
    else:
        stats.agrees = False


def mlp_checks(widths: Sequence[int], fwd: RatioStats, bwd: RatioStats, var_f: float, var_b: float, z: float = theory.Z_CHECK) -> list[Check]:
    """``--check``: the typical (geometric-mean) forward ratio at layer L and backward ratio at
    layer 1 must lie in the norm-preserving band (theory.check_reference_ln) widened by the
    finite-width tolerance (theory.log_band)."""
    (f_lo, f_hi), (b_lo, b_hi) = theory.check_reference_ln(widths)
    out = []
    L = len(widths) - 1
    for name, st, (lo, hi), var in (
        (f"forward ratio at layer {L}", fwd, (f_lo, f_hi), var_f),
        ("backward ratio at layer 1", bwd, (b_lo, b_hi), var_b),
    ):
        low = theory.log_band(lo, var, z)[0] / LN10
        high = theory.log_band(hi, var, z)[1] / LN10
        m = st.log10_mean
        passed = m is not None and st.dead_fraction == 0.0 and low <= m <= high
        out.append(Check(name=name, passed=passed, log10_measured=m, log10_low=low, log10_high=high))
    return out


def mlp_run(scheme: InitScheme, widths: list[int], ln_fwd: np.ndarray, ln_bwd: np.ndarray) -> RunResult:
    """Assemble one init's run: per-layer stats beside predictions, and the checks."""
    L = len(widths) - 1
    pred = scheme.predict_mlp(widths)
    var_f, var_b = theory.log_ratio_variance(widths, scheme.orthogonal)
    layers = []
    for l in range(1, L + 1):
        f = ratio_stats(ln_fwd[:, l - 1, :])
        b = ratio_stats(ln_bwd[:, l - 1, :])
        attach_prediction(f, pred.ln_forward[l - 1] if pred.ln_forward else None, float(var_f[l - 1]))
        attach_prediction(b, pred.ln_backward[l - 1] if pred.ln_backward else None, float(var_b[l - 1]))
        layers.append(LayerRecord(index=l, width=widths[l], forward=f, backward=b))
    checks = mlp_checks(widths, layers[-1].forward, layers[0].backward, float(var_f[-1]), float(var_b[0]))
    return RunResult(init=scheme.name, widths=list(widths), layers=layers, checks=checks, description=scheme.description)
