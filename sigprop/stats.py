"""From the engine's ln-ratio arrays to result records: statistics, predictions, checks.

numpy/scipy only (no torch): the engine hands over float64 arrays of ln(ratio) with shape
[draws, layers, samples]; every statistic is computed in log space so nothing under- or
overflows before the final conversion (which yields None where a float64 cannot hold it).
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np

from sigprop import inits, plans, theory
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
    std = 0.0 if within_var == 0 else _exp_or_none(ln_std)
    if samples < 2:  # one sample has no spread across samples: unknown, not 0
        std = None
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
        log10_std = float(math.sqrt(np.mean(within))) if samples > 1 else None
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


def rounding_ln(dtype: str, steps: int) -> float:
    """Worst-case floating-point error of an ln ratio accumulated over ``steps`` renormalised
    steps: 4 ulp of the probe dtype per step (the margin that lets an exact prediction, such as
    SkipInit's ratio 1 or the backward ratio 1 at the last layer, be met by a float measurement)."""
    eps = {"float32": 2.0**-23, "float64": 2.0**-52}[dtype]
    return 4.0 * eps * (steps + 1)


def attach_prediction(
    stats: RatioStats, ln_pred: float | None, ln_var: float, z: float = theory.Z_AGREEMENT, rounding: float = 1e-9 * LN10,
    drift: float | None = None,
) -> None:
    """Pair a measurement with its prediction.

    The prediction is the true RMS, E[ratio^2]^{1/2}.  Across samples and draws ln(ratio) is
    close to normal with variance var = theory.log_ratio_variance (docs/theory.md), so the
    typical ratio sits exp(-var) below the RMS, and an RMS measured on one draw (whose samples
    share the weights) lies between the two.  The band is that hull widened by z sd:
        [ln_pred - var - z sd, ln_pred + z sd].
    ``drift``: the exact E[ln ratio] - ln RMS where known (MLP: theory.log_ratio_cumulants),
    replacing the lognormal -var.
    """
    if ln_pred is None or not math.isfinite(ln_pred):
        return
    var = max(ln_var, 0.0)
    sd = math.sqrt(var)
    stats.log10_predicted = ln_pred / LN10
    stats.predicted = _exp_or_none(ln_pred)
    stats.log10_predicted_typical = (ln_pred + (-var if drift is None else drift)) / LN10
    stats.log10_std_predicted = sd / LN10
    stats.log10_low = (ln_pred + (-var if drift is None else min(drift, 0.0)) - z * sd) / LN10
    stats.log10_high = (ln_pred + z * sd) / LN10
    if stats.log10_rms is not None:
        # exact equality (e.g. the backward ratio at layer L, sd = 0) needs a rounding margin
        eps = rounding / LN10
        stats.agrees = bool(stats.log10_low - eps <= stats.log10_rms <= stats.log10_high + eps)
    else:
        stats.agrees = False


def _fmt(log10: float | None) -> str:
    """A ratio from its log10, for notes: 0.0123 or 10^-23.3."""
    if log10 is None:
        return "n/a"
    return f"{10.0 ** log10:.3g}" if -4 <= log10 <= 4 else f"10^{log10:.1f}"


def _gate(name: str, verdict: str, st: RatioStats, low_ln: float, high_ln: float) -> Check:
    """measured = the geometric-mean ratio (over samples and draws) inside [low, high] (ln);
    a dead sample (ratio 0) fails."""
    low, high = low_ln / LN10, high_ln / LN10
    m = st.log10_mean
    passed = m is not None and st.dead_fraction == 0.0 and low <= m <= high
    return Check(name=name, passed=passed, log10_measured=m, log10_low=low, log10_high=high, verdict=verdict)


def _explain_preserved(c: Check, st: RatioStats, ln_rms: float | None, ln_typical: float | None, depth: int, width: str) -> str:
    """Why the signal was not preserved, from the init's own theory (docs/theory.md §4)."""
    if c.passed:
        return ""
    if st.dead_fraction > 0:
        return f"{st.dead_fraction:.1%} of the samples died (ratio 0)"
    if ln_rms is None:
        return "no closed-form prediction for this init"
    lo, hi = c.log10_low, c.log10_high
    r, t = ln_rms / LN10, (ln_typical if ln_typical is not None else ln_rms) / LN10
    if not lo <= r <= hi:
        return f"the theory predicts an RMS ratio of {_fmt(r)} (typical {_fmt(t)}): this init does not keep the norm"
    if not lo <= t <= hi:
        return (f"finite-width drift: the mean square is preserved (RMS {_fmt(r)}) but the theory predicts a typical "
                f"ratio of {_fmt(t)} at width {width} over {depth} layers (E ln ratio falls by about c/(4 n) per layer); "
                f"widen the layers or shorten the net")
    return f"the theory predicts a typical ratio of {_fmt(t)} (RMS {_fmt(r)}), inside the band: the measurement disagrees"


def mlp_checks(widths: Sequence[int], fwd: RatioStats, bwd: RatioStats, cum_f, cum_b, pred_f: float | None,
               pred_b: float | None, band: tuple[float, float] | None = None, z: float = theory.Z_CHECK) -> list[Check]:
    """The two verdicts on the forward ratio at layer L and the backward ratio at layer 1, each
    judged on the typical (geometric-mean) ratio over samples and draws:

    * ``preserved``: inside the norm-preserving reference hull (theory.check_reference_ln)
      widened by the factors ``band`` (default specs.MLP_BAND) -- an absolute band that always
      contains 1, whatever the depth or width;
    * ``theory``: inside the band of this init's own prediction (``pred_*``, ln RMS) moved by
      the exact finite-width drift and widened by z sd with the Cornish-Fisher skew correction
      (theory.cornish_fisher_band; ``cum_*`` = (drift, variance, third cumulant)).
    """
    from sigprop.specs import MLP_BAND, MLP_BAND_LIMITS

    default = band is None
    band = band or MLP_BAND
    refs = theory.check_reference_ln(widths)
    limits = (math.log(MLP_BAND_LIMITS[0]), math.log(MLP_BAND_LIMITS[1])) if default else (-math.inf, math.inf)
    L = len(widths) - 1
    width = str(widths[1]) if len(set(widths[1:])) == 1 else f"{min(widths[1:])}..{max(widths[1:])}"
    preserved, agrees = [], []
    named = ((f"forward ratio at layer {L}", fwd, refs[0], cum_f, pred_f), ("backward ratio at layer 1", bwd, refs[1], cum_b, pred_b))
    for name, st, (lo, hi), cum, pred in named:
        c = _gate(name, "preserved", st, max(lo + math.log(band[0]), limits[0]), min(hi + math.log(band[1]), limits[1]))
        typical = None if pred is None else pred + float(cum[0])
        c.note = _explain_preserved(c, st, pred, typical, L, width)
        preserved.append(c)
        if pred is None:
            agrees.append(Check(name, False, st.log10_mean, math.nan, math.nan, "theory", "no closed-form prediction for this init"))
            continue
        c = _gate(name, "theory", st, *theory.cornish_fisher_band(pred, pred, cum, z))
        if not c.passed:
            c.note = f"the theory predicts a typical ratio of {_fmt(typical / LN10)}"
        agrees.append(c)
    return preserved + agrees


def mlp_run(scheme: InitScheme, widths: list[int], ln_fwd: np.ndarray, ln_bwd: np.ndarray,
            band: tuple[float, float] | None = None, gate: str = "preserved") -> RunResult:
    """Assemble one init's run: per-layer stats beside predictions, and both verdicts."""
    L = len(widths) - 1
    pred = scheme.predict_mlp(widths)
    cum_f, cum_b = theory.log_ratio_cumulants(widths, scheme.orthogonal)
    layers = []
    for l in range(1, L + 1):
        f = ratio_stats(ln_fwd[:, l - 1, :])
        b = ratio_stats(ln_bwd[:, l - 1, :])
        attach_prediction(f, pred.ln_forward[l - 1] if pred.ln_forward else None, float(cum_f[l - 1, 1]), drift=float(cum_f[l - 1, 0]))
        attach_prediction(b, pred.ln_backward[l - 1] if pred.ln_backward else None, float(cum_b[l - 1, 1]), drift=float(cum_b[l - 1, 0]))
        layers.append(LayerRecord(index=l, width=widths[l], forward=f, backward=b))
    checks = mlp_checks(widths, layers[-1].forward, layers[0].backward, cum_f[-1], cum_b[0],
                        pred.ln_forward[-1] if pred.ln_forward else None, pred.ln_backward[0] if pred.ln_backward else None, band)
    return RunResult(init=scheme.name, widths=list(widths), layers=layers, checks=checks, description=scheme.description, gate=gate)


# --------------------------------------------------------------------------------------------
# conv nets (docs/theory.md §11)
# --------------------------------------------------------------------------------------------


def conv_moment(scheme: InitScheme | None, st) -> theory.ConvMoments:
    """The theory's view of one conv step (``plans.Conv``) under ``scheme``; ``scheme`` None: the
    lossless reference -- centre-tap rows with the proposed gain, which keep every position's
    energy."""
    m = inits.get("proposed").moments(st.role) if scheme is None else scheme.moments(st.role)
    taps = "centre" if scheme is None else scheme.taps
    return theory.ConvMoments(st.shape_in[0], st.role.fan_out, st.kernel, st.stride, st.padding, m.row_sq, m.bias_var, taps)


def conv_moments(scheme: InitScheme | None, steps) -> list[theory.ConvMoments]:
    """``conv_moment`` of every conv step of a plan."""
    return [conv_moment(scheme, st) for st in plans.convs(steps)]


def cnn_run(scheme: InitScheme, steps, ln_fwd: np.ndarray, ln_bwd: np.ndarray, band: tuple[float, float] | None = None,
            gate: str = "preserved", z: float = theory.Z_CHECK) -> RunResult:
    """One init's conv-net run.  Per layer the measured ratios beside the energy-map prediction
    (``theory.cnn_rms_prediction``) with its finite-width band (``theory.conv_log_ratio_variance``:
    the RMS prediction, the typical ratio var below it, +- z sd).  Verdicts:

    * ``preserved``: the typical forward ratio at layer L and backward ratio at layer 1 inside
      ``band`` (default specs.MLP_BAND) times the lossless reference --
      the prediction of centre-tap rows with the proposed gain, which keep every position's
      energy: a stride-2 layer then halves the norm over all units (a quarter of the positions),
      so the reference is 1/2 per strided layer forward and 1 backward;
    * ``theory``: the same typical ratios inside the init's own band, [pred - var - z sd,
      pred - var + z sd] (``theory.log_band``); not testable for an init without a prediction."""
    from sigprop.specs import MLP_BAND

    convs = plans.convs(steps)
    image = convs[0].shape_in
    pred = theory.cnn_rms_prediction(image, conv_moments(scheme, steps)) if scheme.moments is not None else None
    ref = theory.cnn_rms_prediction(image, conv_moments(None, steps))
    widths = [math.prod(image)] + [math.prod(st.shape_out) for st in convs]
    var_f, var_b = theory.conv_log_ratio_variance([image[0]] + [st.role.fan_out for st in convs])
    pf = None if pred is None or pred.ln_forward is None else pred.ln_forward
    pb = None if pred is None else pred.ln_backward
    L = len(convs)
    rounding = rounding_ln("float32", L)  # the backward ratio at layer L is exactly 1: a float meets it to rounding
    layers = []
    for l, st in enumerate(convs, 1):
        f, b = ratio_stats(ln_fwd[:, l - 1, :]), ratio_stats(ln_bwd[:, l - 1, :])
        attach_prediction(f, None if pf is None else pf[l - 1], float(var_f[l - 1]), rounding=rounding)
        attach_prediction(b, None if pb is None else pb[l - 1], float(var_b[l - 1]), rounding=rounding)
        layers.append(LayerRecord(index=l, width=widths[l], forward=f, backward=b))
    band = band or MLP_BAND
    checks, own = [], []
    named = ((f"forward ratio at layer {L}", layers[-1].forward, ref.ln_forward[-1], None if pf is None else pf[-1], float(var_f[-1])),
             ("backward ratio at layer 1", layers[0].backward, ref.ln_backward[0], None if pb is None else pb[0], float(var_b[0])))
    for name, st, r, p, var in named:
        c = _gate(name, "preserved", st, r + math.log(band[0]), r + math.log(band[1]))
        if not c.passed:
            if st.dead_fraction > 0:
                c.note = f"{st.dead_fraction:.1%} of the samples died (ratio 0)"
            elif p is None:
                c.note = f"outside the band around the lossless reference {_fmt(r / LN10)}; no prediction for this init"
            elif not c.log10_low <= p / LN10 <= c.log10_high:
                c.note = (f"the theory predicts an RMS ratio of {_fmt(p / LN10)} against the lossless {_fmt(r / LN10)}: "
                          f"zero padding loses energy at the borders every layer (docs/theory.md §11)")
            else:
                c.note = (f"the theory's RMS ratio {_fmt(p / LN10)} is inside the band but its typical ratio, "
                          f"{_fmt((p - var) / LN10)}, is not: finite-width drift ({convs[0].role.fan_out} channels over {L} layers); "
                          f"more channels or fewer layers move it")
        checks.append(c)
        if p is None:
            own.append(Check(name, False, st.log10_mean, math.nan, math.nan, "theory", "no closed-form prediction for this init"))
            continue
        t = _gate(name, "theory", st, *theory.log_band(p, var, z))
        if not t.passed:
            t.note = f"the theory predicts a typical ratio of {_fmt((p - var) / LN10)}"
        own.append(t)
    return RunResult(init=scheme.name, widths=widths, layers=layers, checks=checks + own, description=scheme.description, gate=gate)


def wrn_stage_bands(steps, blocks: int) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """The ``preserved`` band of each group (ln, forward and backward): Theorem 3's [sqrt 2,
    sqrt e] (Arpit et al. 2019) times the group's unavoidable transition -- what the lossless
    reference (centre-tap rows, proposed gains: ``conv_moment(None, .)``, which keep every
    position's energy) loses to the stride-2 downsampling, its stage ratio divided by its
    branches' (1 + 1/B)^{B/2} (docs/theory.md §11, "Residual conv nets")."""
    _, widths, E = wrn_entries(steps)
    ref_f, ref_b, _ = plans.predict_conv(plans.with_bn(steps, False), lambda st: conv_moment(None, st), lambda B: 1.0)
    branch = 0.5 * blocks * math.log1p(1.0 / blocks)
    lo, hi = math.log(theory.RESNET_LOWER), math.log(theory.RESNET_UPPER)
    out = []
    for g in range((E - 2) // blocks):
        first, last = 1 + g * blocks, 1 + (g + 1) * blocks
        tf = ref_f[last] - ref_f[first] - branch
        tb = ref_b[first] - ref_b[last] - branch
        out.append(((lo + tf, hi + tf), (lo + tb, hi + tb)))
    return out


def wrn_stage_variances(steps, blocks: int) -> list[tuple[float, float]]:
    """The finite-width allowance of each group's stage ratio (variance of its ln, forward and
    backward): the fully connected ResNet's per-block law (``theory.resnet_step_variance``,
    docs/theory.md §7) for the band's own reference net -- the proposed gains with i.i.d. rows,
    branch-to-skip power 1/B -- with a conv's channels as the width of its power fluctuations
    (its weights are shared by every position) and the units (channels x positions) as the
    dimension of the skip-branch cross term.  Measured (docs/theory.md §11), it overstates the
    across-draw spread of the proposed WRN by 1.5-3x forward and more backward: the band errs wide."""
    per_group: list[list[float]] = []
    for item in plans._blocks(steps):
        if not isinstance(item, tuple):
            continue
        inner, close = item
        if not per_group or len(per_group[-1]) == 2 * blocks:
            per_group.append([])
        chans = [inner[0].shape_in[0]] + [c.role.fan_out for c in inner]
        v_s = 2.0 / chans[-1] if close.projection is not None else 0.0
        g = 1.0 / blocks
        per_group[-1] += [theory.resnet_step_variance(g, theory.branch_variance(chans, False), v_s, math.prod(inner[-1].shape_out)),
                          theory.resnet_step_variance(g, theory.branch_variance(chans[::-1], False), v_s, math.prod(inner[0].shape_in))]
    return [(sum(v[0::2]), sum(v[1::2])) for v in per_group]


def wrn_variances(steps, gains: Sequence[tuple[float, float]] | None) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Per-sample variance of ln(ratio) at every recorded state of a WRN plan, forward (from the
    input) and backward (from the top), and the branch ratio's per block: conv1 adds the conv
    law's step (``theory.conv_log_ratio_variance``: c = 5 over its channels), each block the
    ResNet's (``theory.resnet_step_variance``, docs/theory.md §7) with its channels as the width
    of the branch's power fluctuation and its units as the dimension of the skip-branch cross
    term, at the init's own branch-to-skip power ratios ``gains`` [(forward, backward)] per block
    (None: forward and backward 1/B_k, the proposed init's).  The same upper envelope of the
    measured spread as the CNN's (benchmarks/conv_spread.py; docs/theory.md §11)."""
    stem = plans.convs(steps)[0]
    v_stem = theory.SPREAD_C_GAUSSIAN / (4.0 * stem.role.fan_out)
    f_steps, b_steps, branch = [v_stem], [v_stem], []
    items = [it for it in plans._blocks(steps) if isinstance(it, tuple)]
    for k, (inner, close) in enumerate(items):
        chans = [inner[0].shape_in[0]] + [c.role.fan_out for c in inner]
        v_s = 2.0 / chans[-1] if close.projection is not None else 0.0
        g_f, g_b = (1.0 / close.blocks_in_stage,) * 2 if gains is None else gains[k]
        v_f = theory.branch_variance(chans, False)
        f_steps.append(theory.resnet_step_variance(g_f, v_f, v_s, math.prod(inner[-1].shape_out)))
        b_steps.append(theory.resnet_step_variance(g_b, theory.branch_variance(chans[::-1], False), v_s, math.prod(inner[0].shape_in)))
        branch.append(v_f / 4.0)
    var_f = np.concatenate([[0.0], np.cumsum(f_steps)])
    var_b = np.concatenate([np.cumsum(np.array(b_steps)[::-1])[::-1], [0.0]])
    return var_f, var_b, branch


def wrn_entries(steps) -> tuple[list, list[int], int]:
    """The recorded states of a WRN plan (the input, conv1's output, every block's output):
    their shapes, units and count."""
    shapes = [plans.convs(steps)[0].shape_in]
    for item in plans._blocks(steps):
        if isinstance(item, plans.Conv):
            shapes.append(item.shape_out)
        elif isinstance(item, tuple):
            inner, _ = item
            shapes.append(inner[-1].shape_out)
    return shapes, [math.prod(sh) for sh in shapes], len(shapes)


def wrn_run(scheme: InitScheme, steps, blocks: int, arrays: dict[str, np.ndarray], band: tuple[float, float] | None = None,
            gate: str = "preserved", z: float = theory.Z_CHECK, init: str | None = None) -> RunResult:
    """One init's WRN run: per state (input, conv1, each block) the measured ratios and per
    block the branch ratio, beside the energy-map prediction (``plans.predict_conv``) with its
    finite-width band (``wrn_variances``); per group (stage) the ``preserved`` check -- the
    typical stage ratio, forward and backward, in ``wrn_stage_bands`` widened by ``band`` and by
    z sd of ``wrn_stage_variances`` -- and the ``theory`` check: the same typical stage ratio
    within z sd of the init's own prediction (its typical value, var below the RMS)."""
    from sigprop.results import StageInfo

    shapes, widths, E = wrn_entries(steps)
    pf = pb = pbr = None
    gains: list | None = None
    bn = any(st.bn for st in plans.convs(steps))
    description = scheme.description
    if bn:
        description = "He convs each followed by training-mode batch norm (gamma = 1, beta = 0), ReLU after BN, no ReLU after the sum"
    if scheme.moments is not None and not bn:
        gains = []
        pf, pb, pbr = plans.predict_conv(steps, lambda st: conv_moment(scheme, st), scheme.alpha, gains=gains)
    elif scheme.calibrate is not None or bn:  # standardised convs: forward only, approximate (docs/theory.md §7, §11)
        closes = [s for s in steps if isinstance(s, plans.Close)]
        fwd, g = theory.datadep_resnet_ln_forward(widths[0], widths[2:], [c.projection is not None for c in closes], start=widths[1])
        pf = None if fwd is None else [0.0] + fwd
        gains = [(v, v) for v in g]
    var_f, var_b, var_br = wrn_variances(steps, gains)
    rounding = rounding_ln("float32", E)
    ln_f, ln_b, ln_br = arrays["fwd"], arrays["bwd"], arrays["branch"]
    layers = []
    for i in range(E):
        f, b = ratio_stats(ln_f[:, i, :]), ratio_stats(ln_b[:, i, :])
        attach_prediction(f, None if pf is None else pf[i], float(var_f[i]), rounding=rounding)
        attach_prediction(b, None if pb is None else pb[i], float(var_b[i]), rounding=rounding)
        br = None
        if i >= 2:
            br = ratio_stats(ln_br[:, i - 2, :])
            attach_prediction(br, None if pbr is None else pbr[i - 2], var_br[i - 2], rounding=rounding)
        stage = 0 if i < 2 else 1 + (i - 2) // blocks
        layers.append(LayerRecord(index=i, width=widths[i], forward=f, backward=b, stage=stage, branch=br, resnet=True))
    widen = (0.0, 0.0) if band is None else (math.log(band[0]), math.log(band[1]))
    infos, checks, untested = [], [], []
    variances = wrn_stage_variances(steps, blocks)
    for k, (fb, bb) in enumerate(wrn_stage_bands(steps, blocks), 1):
        first, last = 1 + (k - 1) * blocks, 1 + k * blocks
        sf = None if pf is None else _exp_or_none(pf[last] - pf[first])
        sb = None if pb is None else _exp_or_none(pb[first] - pb[last])
        infos.append(StageInfo(k, first, last, widths[first], widths[last], blocks, (math.exp(fb[0]), math.exp(fb[1])),
                               (math.exp(bb[0]), math.exp(bb[1])), sf, sb))
        names = (f"stage {k} forward ||h^{last}||/||h^{first}||", f"stage {k} backward ||dl/dh^{first}||/||dl/dh^{last}||")
        measured = (ln_f[:, last, :] - ln_f[:, first, :], ln_b[:, first, :] - ln_b[:, last, :])
        own = ((pf, var_f, last, first), (pb, var_b, first, last))
        for name, ln, bnd, pred, var, (lnp, v, a, e) in zip(names, measured, (fb, bb), (sf, sb), variances[k - 1], own):
            c = _stage_check(name, ln, (bnd[0] + widen[0], bnd[1] + widen[1]), var, z)
            if not c.passed:
                c.note = "outside Theorem 3's band [sqrt 2, sqrt e] times the stride-2 transition, with its finite-width allowance"
                if pred is not None:
                    c.note += f"; the theory predicts an RMS stage ratio of {_fmt(math.log10(pred)) if pred > 0 else '0'} for this init"
            checks.append(c)
            if lnp is None:
                untested.append(Check(name, False, c.log10_measured, math.nan, math.nan, "theory", "no closed-form prediction for this init"))
                continue
            centre, own_var = lnp[a] - lnp[e], abs(float(v[a] - v[e]))
            t = _stage_check(name, ln, (centre, centre), own_var, z, verdict="theory")
            if not t.passed:
                t.note = f"the theory predicts an RMS stage ratio of {_fmt(centre / LN10)}"
            untested.append(t)
    return RunResult(init=init or scheme.name, widths=widths, layers=layers, checks=checks + untested, description=description,
                     stages=infos, gate=gate)


# --------------------------------------------------------------------------------------------
# ResNets
# --------------------------------------------------------------------------------------------
def resnet_variances(scheme: InitScheme | None, plan, pred: theory.ResNetPrediction) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample variance of ln(ratio) at every entry (forward, backward), and per block (forward
    steps, backward steps), from theory.resnet_step_variance (docs/theory.md §7).
    ``scheme`` None: the BN net (its stem adds one MLP layer's worth, (5 + 2)/(4 d))."""
    orth = scheme is not None and scheme.orthogonal
    f_steps, b_steps = [], []
    for i, blk in enumerate(plan.blocks):
        v_f = theory.branch_variance(blk.widths, orth)
        v_b = theory.branch_variance(blk.widths[::-1], orth)
        v_s = 2.0 / blk.d_out if blk.projection else 0.0
        f_steps.append(theory.resnet_step_variance(pred.gain_forward[i], v_f, v_s, blk.d_out))
        b_steps.append(theory.resnet_step_variance(pred.gain_backward[i], v_b, v_s, blk.d_in))
    if plan.stem:
        stem = (theory.SPREAD_C_GAUSSIAN + 2.0) / (4.0 * plan.dim)
        f_steps.insert(0, stem)
        b_steps.insert(0, stem)
    f_steps_a, b_steps_a = np.array(f_steps), np.array(b_steps)
    var_f = np.concatenate([[0.0], np.cumsum(f_steps_a)])
    var_b = np.concatenate([np.cumsum(b_steps_a[::-1])[::-1], [0.0]])
    return var_f, var_b, f_steps_a, b_steps_a


def _stage_check(name: str, ln: np.ndarray, band: tuple[float, float], var: float, z: float, verdict: str = "preserved") -> Check:
    """The stage ratio's typical value (mean ln over samples and draws) inside ``band`` (ln)
    widened as a lognormal of variance ``var``: typical sits var below the RMS, +- z sd."""
    low = theory.log_band(band[0], var, z)[0] / LN10
    high = theory.log_band(band[1], var, z)[1] / LN10
    finite = np.isfinite(ln).all()
    m = float(ln.mean() / LN10) if finite else None
    passed = m is not None and low <= m <= high
    return Check(name=name, passed=passed, log10_measured=m, log10_low=low, log10_high=high, verdict=verdict)


def _bn_record(arr: np.ndarray, l: int, batch: int):
    from sigprop.results import BNStats

    pred = theory.bn_statistics_prediction(l, batch)
    mean = arr[:, l, :].mean(axis=0)
    std = arr[:, l, :].std(axis=0, ddof=1) if arr.shape[0] > 1 else [None] * 3
    return BNStats(
        float(mean[0]), float(mean[1]), float(mean[2]), *pred,
        *(None if v is None else float(v) for v in std),
    )


def resnet_run(
    scheme: InitScheme, plan, arrays: dict[str, np.ndarray], samples: int, dtype: str = "float32", z: float = theory.Z_CHECK,
    band: tuple[float, float] | None = None, gate: str = "preserved",
) -> RunResult:
    """Assemble one init's ResNet run: per-entry stats beside predictions, stages, checks."""
    from sigprop.results import StageInfo

    bn = "bn" in arrays
    if bn:
        pred = theory.bn_resnet_prediction(plan.dim, len(plan.blocks))
        description = "batch-normalized ReLU ResNet x + W BN(x)^+, He W, stem W^0 BN(x^0)^+ (De & Smith 2020, appendix C)"
        var_f, var_b, f_steps, b_steps = resnet_variances(None, plan, pred)
    else:
        pred = scheme.predict_resnet(plan)
        description = scheme.description
        var_f, var_b, f_steps, b_steps = resnet_variances(scheme, plan, pred)
    ln_f, ln_b, ln_br = arrays["fwd"], arrays["bwd"], arrays["branch"]
    dims, stages = plan.entry_dims(), plan.entry_stages()
    first_block_entry = 2 if plan.stem else 1
    layers = []
    for i in range(len(dims)):
        f = ratio_stats(ln_f[:, i, :])
        b = ratio_stats(ln_b[:, i, :])
        steps = len(dims)
        attach_prediction(f, pred.ln_forward[i] if pred.ln_forward else None, float(var_f[i]), rounding=rounding_ln(dtype, steps))
        attach_prediction(b, pred.ln_backward[i] if pred.ln_backward else None, float(var_b[i]), rounding=rounding_ln(dtype, steps))
        br = None
        k = i - first_block_entry  # block index producing entry i
        if k >= 0:
            br = ratio_stats(ln_br[:, k, :])
            blk = plan.blocks[k]
            ln_pred = pred.ln_branch[k] if pred.ln_branch else None
            v = theory.branch_variance(blk.widths, scheme is not None and scheme.orthogonal) / 4.0 if not bn else 7.0 / (4 * plan.dim)
            attach_prediction(br, ln_pred, v, rounding=rounding_ln(dtype, steps))
        rec = LayerRecord(index=i, width=dims[i], forward=f, backward=b, stage=stages[i], branch=br, resnet=True)
        if bn:
            rec.bn = _bn_record(arrays["bn"], i, samples)
        layers.append(rec)
    # The --check tolerance is the spread of a net that sits in the band: the proposed gains
    # (branch-to-skip power 1/B_k) with i.i.d. rows, on this plan -- not the init's own spread,
    # which for an exploding init is so wide that it would drag the band far from [sqrt 2, sqrt e].
    ref = inits.get("proposed-gaussian")
    ref_f, ref_b, _, _ = resnet_variances(ref, plan, ref.predict_resnet(plan))
    widen = (0.0, 0.0) if band is None else (math.log(band[0]), math.log(band[1]))
    infos, checks, theory_checks = [], [], []
    for k in range(1, plan.stages + 1):
        first, last = plan.stage_span(k)
        fb, bb = theory.stage_band_ln(dims[first], dims[last])
        vf = float(ref_f[last] - ref_f[first])
        vb = float(ref_b[first] - ref_b[last])
        pf = pb = None
        if pred.ln_forward:
            pf = _exp_or_none(pred.ln_forward[last] - pred.ln_forward[first])
        if pred.ln_backward:
            pb = _exp_or_none(pred.ln_backward[first] - pred.ln_backward[last])
        blocks_k = sum(1 for blk in plan.blocks if blk.stage == k)
        infos.append(StageInfo(k, first, last, dims[first], dims[last], blocks_k,
                               (math.exp(fb[0]), math.exp(fb[1])), (math.exp(bb[0]), math.exp(bb[1])), pf, pb))
        fb = (fb[0] + widen[0], fb[1] + widen[1])
        bb = (bb[0] + widen[0], bb[1] + widen[1])
        names = (f"stage {k} forward ||h^{last}||/||h^{first}||", f"stage {k} backward ||dl/dh^{first}||/||dl/dh^{last}||")
        measured = (ln_f[:, last, :] - ln_f[:, first, :], ln_b[:, first, :] - ln_b[:, last, :])
        # theory: the init's own predicted stage ratio (ln RMS) with the init's own spread
        own = ((pred.ln_forward, var_f, last, first), (pred.ln_backward, var_b, first, last))
        for name, ln, b, v, (lnp, var, a, e) in zip(names, measured, (fb, bb), (vf, vb), own):
            c = _stage_check(name, ln, b, v, z)
            if not c.passed:
                c.note = "outside Theorem 3's band [sqrt 2, sqrt e] with its finite-width allowance"
            checks.append(c)
            if not lnp:
                theory_checks.append(Check(name, False, None, math.nan, math.nan, "theory", "no closed-form prediction for this init"))
                continue
            centre, own_var = lnp[a] - lnp[e], abs(float(var[a] - var[e]))
            if not c.passed:
                c.note += f"; the theory predicts a typical stage ratio of {_fmt((centre - own_var) / LN10)} for this init"
            t = _stage_check(name, ln, (centre, centre), own_var, z, verdict="theory")
            if not t.passed:
                t.note = f"the theory predicts an RMS stage ratio of {_fmt(centre / LN10)}"
            theory_checks.append(t)
    return RunResult(init=scheme.name, widths=list(dims), layers=layers, checks=checks + theory_checks, description=description,
                     stages=infos, gate=gate)


# --------------------------------------------------------------------------------------------
# correlation propagation (docs/theory.md §10)
# --------------------------------------------------------------------------------------------
#: why an init or net has no correlation prediction
NO_CORRELATION_MAP = "no second-moment map for this init"


def _conv_plan(net) -> bool:
    return isinstance(net, tuple) and bool(net) and isinstance(net[0], (plans.Conv, plans.Record))


def correlation_prediction(scheme: InitScheme | None, net, c0: float, batch: int) -> tuple[list[float] | None, str]:
    """The infinite-width cosine at every entry (an MLP's widths: layers 1..L; a ResNet plan:
    h^0..h^B; ``scheme`` None: the BN net, x^0..x^{B+1}; a conv net's plan steps: its Records)
    for inputs of cosine c0, and the reason when there is none.  Batch-coupled layers (BN, the
    data-dependent init) use the batch of 2P pair inputs (``batch``)."""
    if scheme is None:
        return theory.bn_resnet_correlation(c0, len(net.blocks), batch), ""
    if _conv_plan(net):  # a conv net's steps: the per-position kernel map (docs/theory.md §11)
        if any(st.bn for st in plans.convs(net)):
            return None, "no correlation map for batch-normalized conv nets"
        if scheme.moments is None:
            return None, NO_CORRELATION_MAP
        return plans.predict_conv_correlation(net, lambda st: conv_moment(scheme, st), scheme.alpha, c0), ""
    if isinstance(net, (list, tuple)):
        if scheme.calibrate is not None:
            return theory.datadep_mlp_correlation(c0, len(net) - 1, batch), ""
        if scheme.moments is None:
            return None, NO_CORRELATION_MAP
        layers = []
        for i in range(1, len(net)):
            m = scheme.moments(inits.LayerRole(net[i - 1], net[i]))
            layers.append(theory.LinearMoments(net[i - 1], net[i], m.row_sq, m.bias_var))
        return theory.mlp_correlation(c0, layers), ""
    if scheme.calibrate is not None:
        blocks = [(len(b.branch_roles()), b.projection, scheme.alpha(b.blocks_in_stage) ** 2) for b in net.blocks]
        return theory.datadep_resnet_correlation(c0, blocks, batch), ""
    if scheme.moments is None:
        return None, NO_CORRELATION_MAP
    return [c0] + theory.resnet_correlation(c0, [scheme.block_moments(b) for b in net.blocks]), ""


def cosine_agrees(mean: float, sd: float, predicted: float | None, collapse_sd: float, slack: float = 0.0,
                  z: float = theory.Z_AGREEMENT) -> bool | None:
    """The correlation agreement rule (``attach_correlations``): within z sd (+ rounding) of the
    prediction, or 1 - mean within a factor exp(z collapse_sd) of 1 - predicted; None without a
    prediction or a measurement."""
    if predicted is None or not (math.isfinite(predicted) and math.isfinite(mean)):
        return None
    if abs(mean - predicted) <= z * sd + slack:
        return True
    return bool(mean < 1.0 and predicted < 1.0 and abs(math.log((1.0 - mean) / (1.0 - predicted))) <= z * collapse_sd)


def attach_correlations(run: RunResult, scheme: InitScheme | None, net, arr: np.ndarray | None, c0s, pairs: int,
                        max_correlation: float | None, dtype: str = "float32", z: float = theory.Z_AGREEMENT) -> None:
    """Per layer and input cosine the measured mean and sd of the pairs' cosines (``arr`` [S, C,
    E, P]: over pairs and draws) beside the prediction, a summary per cosine, and the
    ``--max-correlation`` check (the last state's mean for c0 = 0).

    Agreement (docs/theory.md §10, "Finite-width band"): the mean lies within z sd of the
    prediction (sd: one pair's spread; plus the rounding of the compute dtype -- a cosine of rows
    perturbed by a relative d moves by at most 2d, ``rounding_ln`` over the entries -- so that an
    exact c = 1 can be met in float32), or 1 - mean lies within a factor exp(z s) of 1 - predicted,
    s the fitted across-draw sd of ln(1 - c) (``theory.correlation_collapse_sd``): near collapse
    the pairs agree with each other far better than one draw agrees with the infinite width."""
    from sigprop.results import CorrelationStats, CorrelationSummary, CosineCheck

    if arr is None:
        return
    slack = 2.0 * rounding_ln(dtype, arr.shape[2])
    conv = _conv_plan(net)  # no finite-width band for conv nets: the prediction is shown, not tested
    collapse = theory.correlation_collapse_sd([r.width for r in run.layers])
    for k, c0 in enumerate(c0s):
        a = arr[:, k]
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an entry where every pair is dead: nan (JSON null)
            mean, sd = np.nanmean(a, axis=(0, 2)), np.nanstd(a, axis=(0, 2))
        pred, reason = correlation_prediction(scheme, net, c0, 2 * pairs)
        for i, rec in enumerate(run.layers):
            p = None if pred is None else pred[i]
            agrees = None if conv else cosine_agrees(float(mean[i]), float(sd[i]), p, collapse[i], slack, z)
            rec.correlation.append(CorrelationStats(c0, float(mean[i]), float(sd[i]), p, agrees))
        # a ResNet's (and the WRN's) entry 0 is the input itself
        first = 1 if hasattr(net, "blocks") or (conv and isinstance(net[0], plans.Record)) else 0
        run.correlations.append(CorrelationSummary(
            c0, float(mean[-1]), None if pred is None else pred[-1],
            theory.correlation_depth_scale(c0, [float(v) for v in mean[first:]]),
            None if pred is None else theory.correlation_depth_scale(c0, pred[first:]), reason))
        if max_correlation is not None and c0 == 0.0:
            passed = bool(math.isfinite(mean[-1]) and mean[-1] <= max_correlation)
            note = "" if passed else "deep ReLU nets map inputs towards one direction (docs/theory.md §10)"
            run.checks.append(CosineCheck("end-to-end mean cosine of input pairs with cosine 0", passed, float(mean[-1]),
                                          max_correlation, note=note))
