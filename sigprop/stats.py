"""From the walker's ln-ratio arrays to result records: statistics, predictions beside them,
gates.  The pieces every net kind's verdict rules use (sigprop/kinds/ assemble them); no kind is
named here.

numpy only (no torch): the walker hands over float64 arrays of ln(ratio) with shape
[draws, layers, samples]; every statistic is computed in log space so nothing under- or
overflows before the final conversion (which yields None where a float64 cannot hold it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sigprop import theory
from sigprop.results import Check, CosineCheck, RatioStats, TokenStats, separates

LN10 = math.log(10.0)
_MAX_LN = math.log(np.finfo(np.float64).max)


def exp_or_none(x: float) -> float | None:
    if x == -math.inf:
        return 0.0
    if not math.isfinite(x) or x > _MAX_LN:
        return None
    return math.exp(x)


def _lse(a: np.ndarray) -> float:
    """ln sum exp(a) over all elements, the largest term factored out (-inf when all are -inf).
    Plain numpy: scipy.special.logsumexp's array-API dispatch cost ~0.3 ms a call, which at
    2000 layers x 4 calls was a sixth of a probe's time."""
    m = float(np.max(a))
    if not math.isfinite(m):
        return m
    return m + math.log(float(np.sum(np.exp(a - m))))


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
    std = 0.0 if within_var == 0 else exp_or_none(ln_std)
    if samples < 2:  # one sample has no spread across samples: unknown, not 0
        std = None
    if draws > 1:
        dv = float(per_draw_mean.var(ddof=1))
        draw_std = 0.0 if dv == 0 else exp_or_none(0.5 * math.log(dv) + k)
    else:
        draw_std = None
    log10_mean = log10_std = log10_draw_std = None
    if finite.any():
        vals = ln[finite] / LN10
        log10_mean = float(vals.mean())
        per_draw = [ln[d][finite[d]] / LN10 for d in range(draws)]
        within = [np.var(p) for p in per_draw if p.size]
        log10_std = float(math.sqrt(np.mean(within))) if samples > 1 else None
        if draws > 1:
            means = [p.mean() for p in per_draw if p.size]
            log10_draw_std = float(np.std(means, ddof=1)) if len(means) > 1 else None
    return RatioStats(
        mean=exp_or_none(ln_mean),
        std=std,
        rms=exp_or_none(ln_rms),
        log10_mean=log10_mean,
        log10_std=log10_std,
        log10_rms=ln_rms / LN10 if math.isfinite(ln_rms) else None,
        draw_std=draw_std,
        log10_draw_std=log10_draw_std,
        dead_fraction=float(dead),
    )


def run_standard_error(per_sample_var: float, samples: int, draws: int) -> float:
    """The standard error of a value averaged over ``samples`` samples of each of ``draws`` weight
    draws, from one sample's variance (within a draw): each draw's mean moves by var/S over its
    samples and by ``theory.DRAW_SHARE`` x var across draws (docs/theory.md §15)."""
    return math.sqrt(max(per_sample_var, 0.0) * (1.0 / samples + theory.DRAW_SHARE) / draws)


def rms_sample_variance(ln: np.ndarray) -> float:
    """One sample's share of the variance of a run's ln RMS ratio, from the ln ratios [draws,
    samples]: the delta method on the mean of r^2, Var[r^2] / (4 E[r^2]^2), pooled over the
    draws (0 with one sample: unknown, read as none)."""
    ln = np.asarray(ln, dtype=np.float64)
    if ln.shape[1] < 2 or not np.isfinite(ln).any():
        return 0.0
    k = float(ln[np.isfinite(ln)].max())
    r2 = np.exp(2.0 * (ln - k))  # in [0, 1]: no overflow
    m = r2.mean(axis=1)
    ok = m > 0
    if not ok.any():
        return 0.0
    return float(np.mean(r2[ok].var(axis=1, ddof=1) / (4.0 * m[ok] ** 2)))


def attach_traced(
    st: RatioStats,
    ln: np.ndarray,
    ln_pred: float | None,
    accuracy: float,
    rounding: float,
    z: float = theory.Z_CHECK,
    pred_draws: np.ndarray | None = None,
) -> None:
    """Pair a traced model's measured RMS ratio with its prediction (ln of the RMS over draws of
    each draw's composed maps): the band ln_pred +- (z se + ``accuracy``), se the run's standard
    error of its ln RMS (``run_standard_error`` of ``rms_sample_variance``) and ``accuracy`` the
    maps' stated accuracy in that direction (``theory.MAP_ACCURACY_*``); agrees when the
    measured RMS is inside (docs/theory.md §15: the prediction follows each draw's weights, so
    the question is whether the model behaves as the maps predict, not this init against
    another -- every such band is a test).  From ``theory.EMPIRICAL_DRAWS`` draws (``pred_draws``:
    each draw's own prediction, ln) the statistical part is the wider of that and the miss's own
    spread across the draws (``_between_draws``).  ``log10_std_predicted``: how far one draw's
    measured value moves across draws (the run's standard error times sqrt(draws))."""
    if ln_pred is None or not math.isfinite(ln_pred):
        return
    draws, samples = np.asarray(ln).shape
    se, k = run_standard_error(rms_sample_variance(ln), samples, draws), z
    spread = _between_draws(ln, pred_draws, z)
    if spread is not None and spread[0] * spread[1] > z * se:
        se, k = spread
    half = k * se + accuracy
    _set_band(st, ln_pred, ln_pred, se * math.sqrt(draws), ln_pred - half, ln_pred + half, rounding)
    st.log10_power, st.draws_for_power = band_power(se, draws, accuracy, k)


def _between_draws(ln: np.ndarray, pred_draws, z: float) -> tuple[float, float] | None:
    """(the standard error of the mean miss over the draws, Student's t quantile at z's two-sided
    level for draws - 1 degrees of freedom): the miss per draw is its measured ln RMS less its own
    prediction; None below ``theory.EMPIRICAL_DRAWS`` draws or without every draw's prediction."""
    ln = np.asarray(ln, dtype=np.float64)
    draws = ln.shape[0]
    if pred_draws is None or draws < theory.EMPIRICAL_DRAWS:
        return None
    pred = np.asarray(pred_draws, dtype=np.float64)
    if pred.shape != (draws,) or not np.all(np.isfinite(pred)) or not np.all(np.isfinite(ln)):
        return None
    from scipy.special import ndtr, stdtrit  # scipy's import is slow: only for many-draw runs

    k = float(ln.max())
    miss = 0.5 * np.log(np.exp(2.0 * (ln - k)).mean(axis=1)) + k - pred
    return float(miss.std(ddof=1) / math.sqrt(draws)), float(stdtrit(draws - 1, ndtr(z)))


def band_power(se: float, draws: int, accuracy: float, z: float) -> tuple[float, int | None]:
    """A traced band's power (docs/theory.md §15): a systematic miss d (ln) moves the measured
    value to N(ln_pred + d, se^2), outside the band ln_pred +- (z se + accuracy) in
    ``POWER_LEVEL`` of runs once |d| >= z se + accuracy + z_0.9 se -- that smallest d, log10 --
    and the draws at which it is ``POWER_TARGET`` (se falls as 1/sqrt(draws) at fixed samples;
    this run's draws when it already is; None where no draws would: accuracy >= target)."""
    power = (z + theory.Z_POWER) * se + accuracy
    room = theory.POWER_TARGET - accuracy
    if power <= theory.POWER_TARGET:
        need: int | None = draws
    elif room <= 0:
        need = None
    else:
        need = math.ceil(draws * ((z + theory.Z_POWER) * se / room) ** 2)
    return power / LN10, need


def token_stats(
    cos: np.ndarray,
    entropy: np.ndarray | None = None,
    predicted: np.ndarray | None = None,
    z: float = theory.Z_CHECK,
    predicted_entropy: np.ndarray | None = None,
) -> TokenStats | None:
    """The token cosine at one site from its per-sample values [draws, samples] (None where the
    site's output is no token sequence: nan): mean and sd over all samples (sd within draws,
    pooled), and the sd of the per-draw means across draws; beside it the attention entropy's
    mean and sd over the samples where it was read (``entropy`` finite); and the prediction, the
    mean over draws of each draw's traced token cosine (``predicted`` [draws], nan: no map),
    which agrees when |mean - predicted| <= z se + ``theory.MAP_ACCURACY_COSINE``, se the run's
    standard error of its mean (``run_standard_error``; ``tolerance`` holds that half-width:
    docs/theory.md §15); the entropy's prediction the mean over draws of ``predicted_entropy``
    (the traced attention's, nan: none)."""
    cos = np.asarray(cos, dtype=np.float64)
    if not np.isfinite(cos).all():
        return None
    draws, samples = cos.shape
    std = float(math.sqrt(cos.var(axis=1).mean())) if samples > 1 else float("nan")
    draw_std = float(cos.mean(axis=1).std(ddof=1)) if draws > 1 else None
    out = TokenStats(float(cos.mean()), std, draw_std)
    pred = None if predicted is None else np.asarray(predicted, dtype=np.float64)
    if pred is not None and np.isfinite(pred).all():
        out.predicted = float(pred.mean())
        var = std * std if std == std else 0.0
        out.tolerance = z * run_standard_error(var, samples, draws) + theory.MAP_ACCURACY_COSINE
        out.agrees = bool(abs(out.mean - out.predicted) <= out.tolerance)
    h = None if entropy is None else np.asarray(entropy, dtype=np.float64)
    if h is not None and np.isfinite(h).all():
        out.entropy = float(h.mean())
        out.entropy_std = float(math.sqrt(h.var(axis=1).mean())) if samples > 1 else None
        ph = None if predicted_entropy is None else np.asarray(predicted_entropy, dtype=np.float64)
        if ph is not None and np.isfinite(ph).all():
            out.entropy_predicted = float(ph.mean())
    return out


def token_cosine_check(site: str, st: TokenStats | None, high: float) -> CosineCheck:
    """``--max-token-cosine X`` at a site: its mean token cosine at most X (verdict "tokens");
    a site with no token sequence fails, said why."""
    name = f"mean cosine between the tokens of one sample at site {site}"
    if st is None:
        c = CosineCheck(name, False, float("nan"), high, verdict="tokens")
        c.note = f"site {site}'s output is no sequence of tokens [T, d]: name a site that is with --sites"
        return c
    return CosineCheck(name, bool(st.mean <= high), st.mean, high, verdict="tokens")


def no_ratio() -> RatioStats:
    """The statistics of a ratio that was not measured (a site off the output's path has no
    backward ratio): every value None."""
    return RatioStats(None, None, None, None, None, None, None, None, 0.0)


def rounding_ln(dtype: str, steps: int) -> float:
    """Worst-case floating-point error of an ln ratio accumulated over ``steps`` renormalised
    steps: 4 ulp of the probe dtype per step (the margin that lets an exact prediction, such as
    SkipInit's ratio 1 or the backward ratio 1 at the last layer, be met by a float measurement)."""
    eps = {"float32": 2.0**-23, "float64": 2.0**-52}[dtype]
    return 4.0 * eps * (steps + 1)


def attach_prediction(
    stats: RatioStats,
    ln_pred: float | None,
    ln_var: float,
    z: float = theory.Z_AGREEMENT,
    rounding: float = 1e-9 * LN10,
    drift: float | None = None,
    separation: tuple[float, float] | None = None,
) -> None:
    """Pair a measurement with its prediction.

    The prediction is the true RMS, E[ratio^2]^{1/2}.  Across samples and draws ln(ratio) is
    close to normal with variance var (the kind's finite-width spread, docs/theory.md §4), so the
    typical ratio sits exp(-var) below the RMS, and an RMS measured on one draw (whose samples
    share the weights) lies between the two.  The band is that hull widened by z sd:
        [ln_pred - var - z sd, ln_pred + z sd].
    ``drift``: the exact E[ln ratio] - ln RMS where known (the MLP: ``plans.spread``'s cumulants),
    replacing the lognormal -var.  ``separation``: (down, up), the ln shifts of the prediction
    with every weight layer's variance halved and doubled, which decide whether the band is a
    test (``RatioStats.informative``).
    """
    if ln_pred is None or not math.isfinite(ln_pred):
        return
    var = max(ln_var, 0.0)
    sd = math.sqrt(var)
    typical = ln_pred + (-var if drift is None else drift)
    low = ln_pred + (-var if drift is None else min(drift, 0.0)) - z * sd
    _set_band(stats, ln_pred, typical, sd, low, ln_pred + z * sd, rounding)
    if separation is not None:
        stats.log10_separation = (separation[0] / LN10, separation[1] / LN10)


def _set_band(
    st: RatioStats, ln_pred: float, ln_typical: float, sd: float, low: float, high: float, rounding: float
) -> None:
    """A prediction and its band on a ratio's record (all ln), and whether the measured RMS is
    inside -- with a rounding margin: an exact equality (the backward ratio at the last layer,
    sd = 0) must be met by a float measurement."""
    st.log10_predicted = ln_pred / LN10
    st.predicted = exp_or_none(ln_pred)
    st.log10_predicted_typical = ln_typical / LN10
    st.log10_std_predicted = sd / LN10
    st.log10_low, st.log10_high = low / LN10, high / LN10
    eps = rounding / LN10
    st.agrees = st.log10_rms is not None and bool(st.log10_low - eps <= st.log10_rms <= st.log10_high + eps)


def fmt(log10: float | None) -> str:
    """A ratio from its log10, for notes: 0.0123 or 10^-23.3."""
    if log10 is None:
        return "n/a"
    return f"{10.0**log10:.3g}" if -4 <= log10 <= 4 else f"10^{log10:.1f}"


def untestable(name: str, log10_measured: float | None, why: str | None = None) -> Check:
    """The ``theory`` verdict of a ratio with no prediction: not passed, no band, and why
    (default ``NO_CLOSED_FORM``)."""
    return Check(name, False, log10_measured, math.nan, math.nan, "theory", why or NO_CLOSED_FORM)


def theory_gate(
    name: str, st: RatioStats, low_ln: float, high_ln: float, typical_ln: float, separation=None
) -> Check:
    """The ``theory`` verdict on one ratio: the typical ratio inside [low, high] (ln) -- or not
    testable (``not_a_test``) when that band is wider than the step to the predicted typical ratio of the same
    net with every weight layer's variance halved or doubled (``separation``: the ln shifts
    (down, up); None: not known, the band is taken as a test)."""
    blind = not_a_test(name, st.log10_mean, low_ln, high_ln, typical_ln, separation)
    return blind or gate(name, "theory", st, low_ln, high_ln)


def not_a_test(
    name: str, log10_measured, low_ln: float, high_ln: float, typical_ln: float, separation
) -> Check | None:
    """The untestable ``theory`` check of a band that cannot tell this init from one off by a
    factor of two per layer -- it is wider than the shift of the predicted typical ratio
    (``typical_ln``) with every weight layer's variance halved or doubled (``separation``, ln
    shifts), so that a net of either alternative could read inside it -- with the reason; None
    where the band is a test (docs/theory.md §4, "Which bands are a test")."""
    if separation is None or separates(low_ln, high_ln, separation):
        return None
    down, up = separation
    why = (
        f"not a test: the band [{fmt(low_ln / LN10)}, {fmt(high_ln / LN10)}] is wider than the step to the "
        f"prediction with every weight layer's variance halved ({fmt((typical_ln + down) / LN10)}) or "
        f"doubled ({fmt((typical_ln + up) / LN10)})"
    )
    if max(abs(up), abs(down)) < 1e-9:
        why += ": the ratio does not depend on the weights' scale (normalised)"
    return untestable(name, log10_measured, why)


def unread(name: str, verdict: str, why: str) -> Check:
    """A verdict's check with nothing to read (no measured ratio, no band): not passed, and why."""
    return Check(name, False, None, math.nan, math.nan, verdict, why)


def gate(name: str, verdict: str, st: RatioStats, low_ln: float, high_ln: float) -> Check:
    """measured = the geometric-mean ratio (over samples and draws) inside [low, high] (ln);
    a dead sample (ratio 0) fails."""
    low, high = low_ln / LN10, high_ln / LN10
    m = st.log10_mean
    passed = m is not None and st.dead_fraction == 0.0 and low <= m <= high
    return Check(name=name, passed=passed, log10_measured=m, log10_low=low, log10_high=high, verdict=verdict)


@dataclass(frozen=True)
class EndRatio:
    """One end-to-end ratio a net's verdicts read (the forward ratio at the last layer, the
    backward at the first): its check's name, its statistics, the ``preserved`` reference (ln
    low, high: the band is this reference widened by ``--band``), the init's prediction (ln RMS;
    None: none) with the ln ratio's cumulants about it (drift below ln RMS, variance, third: an
    exact spread's, or a log-normal's (-var, var, 0)) and the band's separation (``theory_gate``)."""

    name: str
    stats: RatioStats
    reference: tuple[float, float]
    pred: float | None
    cumulants: tuple[float, float, float]
    separation: tuple[float, float] | None = None

    @property
    def typical(self) -> float | None:
        """The predicted typical ratio (ln): the prediction moved by the drift; None: none."""
        return None if self.pred is None else self.pred + float(self.cumulants[0])


def end_to_end(
    ends: Sequence[EndRatio],
    band: tuple[float, float],
    limits: tuple[float, float] = (-math.inf, math.inf),
    z: float = theory.Z_CHECK,
) -> list[Check]:
    """The verdict rule of a net judged end to end (the MLP's, the CNN's; a residual net is
    judged stage by stage, kinds.base.stage): per end its ``preserved`` check -- the typical ratio
    inside the reference widened by the factors ``band`` and clipped to ``limits`` (ln; its note,
    why a failed one failed, is the kind's to write: the first ``len(ends)`` checks returned) --
    then its ``theory`` check, the typical ratio inside the prediction's band
    (``theory.cornish_fisher_band``: z sd about the typical ratio, pred + drift, skew-corrected;
    not a test where ``separation`` says so; untestable without a prediction)."""
    preserved, agrees = [], []
    for e in ends:
        lo, hi = e.reference
        c = gate(
            e.name,
            "preserved",
            e.stats,
            max(lo + math.log(band[0]), limits[0]),
            min(hi + math.log(band[1]), limits[1]),
        )
        preserved.append(c)
        if e.pred is None:
            agrees.append(untestable(e.name, e.stats.log10_mean))
            continue
        low, high = theory.cornish_fisher_band(e.pred, e.pred, e.cumulants, z)
        t = theory_gate(e.name, e.stats, low, high, e.typical, e.separation)
        if not t.passed and t.has_band:
            t.note = f"the theory predicts a typical ratio of {fmt(e.typical / LN10)}"
        agrees.append(t)
    return preserved + agrees


def explain_preserved(
    c: Check, st: RatioStats, ln_rms: float | None, ln_typical: float | None, depth: int, width: str
) -> str:
    """Why the signal was not preserved, from the init's own theory (docs/theory.md §4)."""
    if c.passed:
        return ""
    if st.dead_fraction > 0:
        return f"{st.dead_fraction:.1%} of the samples died (ratio 0)"
    lo, hi = c.log10_low, c.log10_high
    if ln_rms is None:  # what the measurement says, since no theory says why
        m, way = c.log10_measured, "backward" if "backward" in c.name else "forward"
        if m is None:
            return NO_CLOSED_FORM
        off = (
            f"{fmt(m - hi)}x above the band's top: the signal grows"
            if m > hi
            else (f"{fmt(lo - m)}x below the band's bottom: the signal shrinks")
        )
        return f"{off} {way} through the net (this init has no closed-form prediction to say why)"
    r, t = ln_rms / LN10, (ln_typical if ln_typical is not None else ln_rms) / LN10
    if not lo <= r <= hi:
        return (
            f"the theory predicts an RMS ratio of {fmt(r)} (typical {fmt(t)}): this init does not keep "
            "the norm"
        )
    if not lo <= t <= hi:
        return (
            f"finite-width drift: the mean square is preserved (RMS {fmt(r)}) but the theory predicts a "
            f"typical "
            f"ratio of {fmt(t)} at width {width} over {depth} layers (E ln ratio falls by about c/(4 n) per "
            f"layer); "
            f"widen the layers or shorten the net"
        )
    return (
        f"the theory predicts a typical ratio of {fmt(t)} (RMS {fmt(r)}), inside the band: the "
        "measurement disagrees"
    )


# --------------------------------------------------------------------------------------------
# correlation propagation (docs/theory.md §10)
# --------------------------------------------------------------------------------------------
def stage_check(
    name: str,
    ln: np.ndarray,
    band: tuple[float, float],
    var: float,
    z: float,
    verdict: str = "preserved",
    separation: tuple[float, float] | None = None,
) -> Check:
    """A stage ratio's typical value (mean ln over samples and draws) inside ``band`` (ln)
    widened as a lognormal of variance ``var``: typical sits var below the RMS, +- z sd.  A
    ``theory`` check of a prediction (band[0] = band[1]) with its ``separation`` is not a test
    where the band holds the alternatives too (``not_a_test``)."""
    low = theory.log_band(band[0], var, z)[0] / LN10
    high = theory.log_band(band[1], var, z)[1] / LN10
    finite = np.isfinite(ln).all()
    m = float(ln.mean() / LN10) if finite else None
    blind = not_a_test(name, m, low * LN10, high * LN10, band[0] - var, separation)
    if blind is not None:
        return blind
    passed = m is not None and low <= m <= high
    return Check(name=name, passed=passed, log10_measured=m, log10_low=low, log10_high=high, verdict=verdict)


#: why an init or net has no correlation prediction
NO_CORRELATION_MAP = "no second-moment map for this init"
#: why a quantity has no prediction
NO_CLOSED_FORM = "no closed-form prediction for this init"


def cosine_agrees(
    mean: float,
    sd: float,
    predicted: float | None,
    collapse_sd: float,
    slack: float = 0.0,
    z: float = theory.Z_AGREEMENT,
) -> bool | None:
    """The correlation agreement rule (``attach_correlations``): within z sd (+ rounding) of the
    prediction, or 1 - mean within a factor exp(z collapse_sd) of 1 - predicted; None without a
    prediction or a measurement."""
    if predicted is None or not (math.isfinite(predicted) and math.isfinite(mean)):
        return None
    if abs(mean - predicted) <= z * sd + slack:
        return True
    return bool(
        mean < 1.0 and predicted < 1.0 and abs(math.log((1.0 - mean) / (1.0 - predicted))) <= z * collapse_sd
    )
