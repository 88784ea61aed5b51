"""A probe's figure: per init the forward and backward ratios against depth with their theory and
bands, a zoomed row where some inits stay near 1, the cosines and the plug-in measurements.
Rendering only."""

from __future__ import annotations

import math
from pathlib import Path

from sigprop import kinds
from sigprop.plot.common import (
    COSINE_STYLES,
    FLOAT_LOG10_LIMIT,
    LOG_SPAN_DECADES,
    MARKERS,
    STAGED_LABELS,
    ZOOM_DECADES,
    _name_ticks,
    _pyplot,
    save,
)
from sigprop.plot.tokens import draw_tokens, has_tokens


def _curve(run, direction: str, staged: bool):
    """Per state: (x, log10 typical, log10 sd across samples or None, log10 sd across draws or
    None, log10 predicted typical or None), split into segments (one per stage when ``staged``:
    each stage's ratios relative to its own first state (forward) or last state (backward), the
    differences of the recorded log10 means -- the geometric mean of a ratio of ratios)."""
    layers = run.layers
    spans = [(st.first, st.last) for st in run.stages] if staged else [(0, len(layers) - 1)]
    segs = []
    for first, last in spans:
        ref = first if direction == "forward" else last
        s0 = getattr(layers[ref], direction)
        m0 = s0.log10_mean if staged else 0.0
        p0 = s0.log10_predicted_typical if staged else 0.0
        seg = []
        for i in range(first, last + 1):
            st = getattr(layers[i], direction)
            m = None if st.log10_mean is None or m0 is None else st.log10_mean - m0
            p = None if st.log10_predicted_typical is None or p0 is None else st.log10_predicted_typical - p0
            seg.append(
                (
                    layers[i].index,
                    m,
                    None if staged else st.log10_std,
                    None if staged else st.log10_draw_std,
                    p,
                )
            )
        segs.append(seg)
    return segs


def _extreme(result, staged: bool) -> float:
    vals = [
        abs(m)
        for run in result.runs
        for d in ("forward", "backward")
        for seg in _curve(run, d, staged)
        for _, m, _, _, _ in seg
        if m is not None
    ]
    return max(vals, default=0.0)


def _near(run, staged: bool) -> bool:
    vals = [
        abs(m)
        for d in ("forward", "backward")
        for seg in _curve(run, d, staged)
        for _, m, _, _, _ in seg
        if m is not None
    ]
    return bool(vals) and max(vals) <= ZOOM_DECADES


def _draw(
    ax, result, runs, direction: str, staged: bool, yspace: str, seeds: int, colours: dict, first_panel: bool
) -> None:
    """One panel: the typical ratio of each init (solid, its own marker), +-1 sd across samples
    shaded (and across draws, darker), the predicted typical ratio dashed in the same colour.
    ``yspace``: "log" (ratio on a log axis), "log10" (the exponent, for ratios beyond a float),
    "linear" (the ratio on a linear axis)."""
    conv = (lambda v: v) if yspace == "log10" else (lambda v: 10.0**v)
    hints = kinds.get(result.command, field="result").hints
    # a kind whose theory is drawn as its RMS prediction (dotted, as its table's theory column)
    # draws no typical one: a model's typical prediction leans on a spread model that counts its
    # weight layers as if in series (DenseNet121's logits: 10x below the measured; docs/theory.md §13)
    typical = not hints.energy
    drawn = False
    for run in runs:
        for j, seg in enumerate(_curve(run, direction, staged)):
            drawn |= _draw_segment(
                ax, seg, run.init if j == 0 else None, colours[run.init], seeds, conv, typical
            )
    # the theory's legend entries in a neutral colour: each init's theory is drawn in its own
    if first_panel and drawn:
        ax.plot(
            [],
            [],
            color="0.3",
            ls="--",
            lw=1.0,
            label="theory (dashed, each init's colour): predicted typical ratio",
        )
    if hints.energy:
        if _draw_energy(ax, runs, direction, staged, colours, conv) and first_panel:
            ax.plot(
                [],
                [],
                color="0.3",
                ls=":",
                lw=1.2,
                label=f"theory (dotted, each init's colour): {hints.rms_label}",
            )
    if hints.residual:
        _draw_stage_bands(ax, result, direction, staged, yspace)
    if yspace == "log":
        ax.set_yscale("log")


def _draw_segment(ax, seg, label, colour, seeds: int, conv, typical: bool = True) -> bool:
    """One curve segment of an init: its typical ratio, the spreads shaded, its predicted typical
    ratio dashed (``typical``); whether a prediction was drawn."""
    col, mk = colour
    pts = [(x, m, sd, dsd) for x, m, sd, dsd, _ in seg if m is not None]
    if pts:
        xs = [p[0] for p in pts]
        ax.plot(
            xs,
            [conv(p[1]) for p in pts],
            color=col,
            lw=1.6,
            marker=mk,
            ms=4,
            markevery=max(1, len(xs) // 8),
            label=label,
        )
        if pts[0][2] is not None:
            spreads = [(2, 0.15)] + ([(3, 0.3)] if seeds > 1 else [])  # across samples; across draws, darker
            for k, alpha in spreads:
                lo = [conv(p[1] - (p[k] or 0)) for p in pts]
                hi = [conv(p[1] + (p[k] or 0)) for p in pts]
                ax.fill_between(xs, lo, hi, color=col, alpha=alpha, lw=0)
    th = [(x, p) for x, _, _, _, p in seg if p is not None]
    if not pts or not th or not typical:
        return False
    ax.plot([t[0] for t in th], [conv(t[1]) for t in th], color=col, ls="--", lw=1.0)
    return True


def _draw_energy(ax, runs, direction: str, staged: bool, colours: dict, conv) -> bool:
    """The energy map's RMS prediction of each init, dotted, relative to each stage's start (or
    end, backward) when staged; whether one was drawn."""
    drawn = False
    for run in runs:
        spans = [(st.first, st.last) for st in run.stages] if staged else [(0, len(run.layers) - 1)]
        for first, last in spans:
            p0 = (
                getattr(run.layers[first if direction == "forward" else last], direction).log10_predicted
                if staged
                else 0.0
            )
            pts = [(r.index, getattr(r, direction).log10_predicted) for r in run.layers[first : last + 1]]
            pts = [(x, v - p0) for x, v in pts if v is not None and p0 is not None]
            if pts:
                ax.plot(
                    [p[0] for p in pts], [conv(p[1]) for p in pts], color=colours[run.init][0], ls=":", lw=1.2
                )
                drawn = True
    return drawn


def _draw_stage_bands(ax, result, direction: str, staged: bool, yspace: str) -> None:
    """Theorem 3's band [sqrt 2, sqrt e] (Arpit et al. 2019; per stage, with its projection's hull)
    bounds a stage's end-to-end ratio only -- ||h^last||/||h^first|| forward,
    ||dl/dh^first||/||dl/dh^last|| backward -- not the states inside it (the proposed init's
    ratio after b of B blocks is (1 + 1/B)^{b/2}, below sqrt 2 until the stage ends: the dashed
    theory curves).  So it is drawn where it applies: a bar at the stage's last state (forward)
    or first state (backward), where the curve -- relative to the stage's other end (one stage:
    h^0 or h^B; several: each stage from its own first or last state) -- reads that ratio."""
    stages = result.runs[0].stages or []
    for k, st in enumerate(stages):
        lo, hi = st.forward_band if direction == "forward" else st.backward_band
        if yspace == "log10":
            lo, hi = math.log10(lo), math.log10(hi)
        x = st.last if direction == "forward" else st.first
        label = "[√2, √e]: band of a stage's end-to-end ratio (at its end)" if k == 0 else None
        ax.plot([x, x], [lo, hi], color="0.3", lw=5, alpha=0.35, solid_capstyle="butt", label=label)
        ax.plot([x, x], [lo, lo], color="0.3", ls="none", marker="_", ms=14, mew=1.4)
        ax.plot([x, x], [hi, hi], color="0.3", ls="none", marker="_", ms=14, mew=1.4)
    if staged:
        for st in stages[1:]:
            ax.axvline(st.first, color="0.55", lw=0.9, ls="-.")


def probe_figure(result, path: Path) -> None:
    """Figure 1 style: forward and backward panels for every init of one probe, saved to ``path``."""
    save(build_probe_figure(result), path)


def build_probe_figure(result):
    """The matplotlib figure of :func:`probe_figure` (not saved; tests read its axes back).

    Top row: every init, on a log axis when the typical ratios span more than two decades.
    When some inits stay within ZOOM_DECADES of 1 and others do not, a second row shows only
    those on a linear axis (the paper's [sqrt 2, sqrt e] is a few pixels high on a 4-decade
    axis).  What is drawn is the typical (geometric-mean) ratio beside the predicted typical
    ratio (the RMS prediction moved by the finite-width drift), so a drift never reads as a
    disagreement.  Multi-stage ResNets: each stage's ratios relative to its own first (forward)
    or last (backward) state, so that the per-stage band applies where it is drawn; stage
    boundaries dash-dotted."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator  # the plot extra, loaded by _pyplot above

    kind = kinds.get(result.command, field="result")
    hints = kind.hints
    resnet = hints.residual
    staged = resnet and len(result.runs[0].stages or []) > 1
    extreme = _extreme(result, staged)
    top = "log10" if extreme > FLOAT_LOG10_LIMIT else ("log" if extreme > LOG_SPAN_DECADES / 2 else "linear")
    near = [run for run in result.runs if _near(run, staged)]
    zoom = top != "linear" and bool(near) and len(near) < len(result.runs)
    seeds = int(result.config.get("seeds", 1))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = {
        run.init: (cycle[k % len(cycle)], MARKERS[k % len(MARKERS)]) for k, run in enumerate(result.runs)
    }
    cosines = any(run.correlations for run in result.runs)
    measured = [m.name for m in result.runs[0].measurements][:2]  # plug-in measurements: one panel each
    tokens = has_tokens(result)
    rows = (2 if zoom else 1) + cosines + tokens + bool(measured)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 4.2 * rows), squeeze=False)
    panels = [(axes[0], result.runs, top)] + ([(axes[1], near, "linear")] if zoom else [])
    cfg = result.config
    xlabel, ylab, shape = hints.x, (hints.forward, hints.backward), kind.describe(cfg)
    if staged:  # each stage's ratios relative to its own first (forward) or last (backward) state
        ylab = STAGED_LABELS
    for r, (row, runs, yspace) in enumerate(panels):
        for c, (ax, direction, title, yl) in enumerate(
            zip(row, ("forward", "backward"), ("forward: activations", "backward: gradients"), ylab)
        ):
            _draw(ax, result, runs, direction, staged, yspace, seeds, colours, first_panel=(c == 1))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(("log$_{10}$ " + yl) if yspace == "log10" else yl)
            ax.set_title(title if r == 0 else f"{title.split(':')[0]}, zoom (linear axis)", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if hints.names:  # rows with names (a model's sites): the names on the axis, thinned
                _name_ticks(ax, result.runs[0].layers)
        row[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if cosines:
        _draw_cosines(axes[-1 - tokens - bool(measured)], result, colours, xlabel)
    if tokens:
        draw_tokens(axes[-1 - bool(measured)], result, colours, xlabel)
    if measured:
        _draw_measurements(axes[-1], result, measured, colours, xlabel)
    spread = "shaded: ± 1 sd of the log ratio across samples" + (
        f", darker: across {seeds} draws" if seeds > 1 else " (one draw: the across-draw spread is not shown)"
    )
    if staged:
        spread = "each stage relative to its own first (forward) or last (backward) state; spread not shown"
    fig.suptitle(
        f"sigprop {result.command}: {shape}, N = {cfg.get('samples')} samples\nsolid: typical "
        f"(geometric-mean) "
        f"ratio; {spread}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def _draw_cosines(row, result, colours: dict, xlabel: str) -> None:
    """The correlation row: left the mean cosine of the pairs' forward states (+-1 sd across
    pairs and draws shaded), right 1 - cosine on a log axis (how fast inputs collapse onto one
    direction); per init its colour, per input cosine c0 its marker; the infinite-width
    prediction as a thin black-edged line in the same colour."""
    left, right = row
    c0s = [c.c0 for c in result.runs[0].correlations]
    for run in result.runs:
        col, mk = colours[run.init]  # the init's colour and marker, as in the rows above
        for k, c0 in enumerate(c0s):
            recs = [(r.index, r.correlation[k]) for r in run.layers if len(r.correlation) > k]
            xs = [i for i, c in recs if c.mean == c.mean]
            ms = [c.mean for _, c in recs if c.mean == c.mean]
            sd = [c.std for _, c in recs if c.mean == c.mean]
            ls = COSINE_STYLES[k % len(COSINE_STYLES)]
            label = f"{run.init}, c0 = {c0:g}"
            left.plot(
                xs, ms, color=col, marker=mk, ms=4, markevery=max(1, len(xs) // 8), lw=1.4, ls=ls, label=label
            )
            left.fill_between(
                xs,
                [m - s for m, s in zip(ms, sd)],
                [m + s for m, s in zip(ms, sd)],
                color=col,
                alpha=0.12,
                lw=0,
            )
            one = [(x, 1.0 - m) for x, m in zip(xs, ms) if 1.0 - m > 0]
            right.plot(
                [p[0] for p in one],
                [p[1] for p in one],
                color=col,
                marker=mk,
                ms=4,
                markevery=max(1, len(one) // 8),
                lw=1.4,
                ls=ls,
                label=label,
            )
            th = [(i, c.predicted) for i, c in recs if c.predicted is not None]
            if th:  # theory: thin, dashed, unmarked (as in the rows above)
                left.plot([t[0] for t in th], [t[1] for t in th], color=col, ls="--", lw=0.9)
                th1 = [(x, 1.0 - p) for x, p in th if 1.0 - p > 0]
                right.plot([t[0] for t in th1], [t[1] for t in th1], color=col, ls="--", lw=0.9)
    left.set_ylabel("cosine of the two forward states")
    left.set_title("correlation: mean over input pairs\n(dashed: infinite-width theory)", fontsize=10)
    right.set_ylabel("1 − cosine")
    right.set_yscale("log")
    right.set_title("correlation: distance from collapse (log axis)", fontsize=10)
    for ax in row:
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _draw_measurements(row, result, names: list[str], colours: dict, xlabel: str) -> None:
    """The plug-in measurements' row (sigprop/observers/): per measurement a panel of its first
    column against the row index, one line per init (a log axis when the observer asks)."""
    for ax, name in zip(row, names):
        m = None
        for run in result.runs:
            m = next(x for x in run.measurements if x.name == name)
            pts = [(r.index, v[0]) for r, v in zip(run.layers, m.rows) if v and v[0] is not None]
            col, mk = colours[run.init]
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                color=col,
                marker=mk,
                ms=4,
                markevery=max(1, len(pts) // 8),
                lw=1.4,
                label=run.init,
            )
        if m.log:
            ax.set_yscale("log")
        ax.set_title(f"{m.title} ({m.name}, plug-in)", fontsize=10)
        ax.set_ylabel(m.columns[0])
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in row[len(names) :]:
        ax.set_visible(False)
