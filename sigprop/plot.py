"""Figures (matplotlib, an optional extra: ``pip install 'sigprop[plot]'``).  Rendering only:
every number drawn is read from the result records (../shared/STYLE.md layers); nothing is measured here.

``probe_figure``: the paper's Figure 1 layout (Arpit et al. 2019, Figure 1) -- a forward and a
backward panel, one line and marker per init (the typical, geometric-mean ratio; +-1 sd of the
log ratio across samples shaded and, with several draws, across draws darker), the predicted
typical ratio dashed (docs/theory.md §4), the ResNet band [sqrt 2, sqrt e] as a bar where it applies
(at each stage's end: it bounds the stage's end-to-end ratio, not the states inside it), a
log axis when the values span more than a decade and then a linear zoom row for the inits that
stay near 1.
``sweep_figure``: end-to-end ratio against depth or width, one line per init, from a sweep's
JSON lines.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Sequence

import numpy as np

from sigprop import files, kinds
from sigprop.errors import SigpropError

FORMATS = ("png", "svg", "pdf")
#: values this far apart (max/min of the plotted means) switch the axis to log
LOG_SPAN_DECADES = 2.0
#: beyond 10^+-300 a float cannot be drawn: the axis shows log10 of the ratio instead
FLOAT_LOG10_LIMIT = 300.0
#: the axis labels of a residual net with several stages: each stage relative to its own ends
STAGED_LABELS = (
    r"$\|h^b\| \,/\, \|h^{\mathrm{stage\ start}}\|$",
    r"$\|\partial\ell/\partial h^b\| \,/\, \|\partial\ell/\partial h^{\mathrm{stage\ end}}\|$",
)


def check_target(path: Path, field: str = "plot") -> Path:
    """Fail before any work: matplotlib present, a known extension, an existing directory."""
    ext = path.suffix.lower().lstrip(".")
    if ext not in FORMATS:
        raise SigpropError(
            f"unknown figure format {path.suffix or '(none)'!r}; use .png, .svg or .pdf", field=field
        )
    target = path.resolve()
    if target.is_dir() or not target.parent.is_dir():
        raise SigpropError(
            f"cannot write {path}: {'is a directory' if target.is_dir() else 'no such directory'}",
            field=field,
        )
    try:
        import matplotlib  # noqa: F401  (the plot extra: is it installed?)
    except ImportError:
        raise SigpropError("plotting needs matplotlib: pip install 'sigprop[plot]'", field=field) from None
    return target


def _pyplot():
    import matplotlib  # the plot extra (optional): imported when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    return plt


def save(fig, path: Path) -> None:
    """Write the figure whole (temp file + rename), never half."""
    ext = path.suffix.lower().lstrip(".")
    try:
        files.atomic_write(
            path, lambda tmp: fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight"), suffix=f".{ext}"
        )
    finally:
        _pyplot().close(fig)


#: an init whose typical ratio stays within this many decades of 1 (per stage for a ResNet) is
#: also drawn in the linear zoom panel, where [sqrt 2, sqrt e] and small drifts are readable
ZOOM_DECADES = 0.5
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


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
    theory_labelled = False
    for run in runs:
        col, mk = colours[run.init]
        for j, seg in enumerate(_curve(run, direction, staged)):
            pts = [(x, m, sd, dsd) for x, m, sd, dsd, _ in seg if m is not None]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax.plot(
                xs,
                [conv(p[1]) for p in pts],
                color=col,
                lw=1.6,
                marker=mk,
                ms=4,
                markevery=max(1, len(xs) // 8),
                label=run.init if j == 0 else None,
            )
            if pts[0][2] is not None:
                ax.fill_between(
                    xs,
                    [conv(m - (sd or 0)) for _, m, sd, _ in pts],
                    [conv(m + (sd or 0)) for _, m, sd, _ in pts],
                    color=col,
                    alpha=0.15,
                    lw=0,
                )
                if seeds > 1:
                    ax.fill_between(
                        xs,
                        [conv(m - (d or 0)) for _, m, _, d in pts],
                        [conv(m + (d or 0)) for _, m, _, d in pts],
                        color=col,
                        alpha=0.3,
                        lw=0,
                    )
            th = [(x, p) for x, _, _, _, p in seg if p is not None]
            if th:
                ax.plot(
                    [t[0] for t in th],
                    [conv(t[1]) for t in th],
                    color=col,
                    ls="--",
                    lw=1.0,
                    label="theory (dashed): predicted typical ratio"
                    if first_panel and not theory_labelled
                    else None,
                )
                theory_labelled = True
    if kinds.get(
        result.command, field="result"
    ).hints.energy:  # no typical prediction for convs yet: the energy-map RMS, dotted
        labelled = False
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
                        [p[0] for p in pts],
                        [conv(p[1]) for p in pts],
                        color=colours[run.init][0],
                        ls=":",
                        lw=1.2,
                        label=f"theory (dotted): {kinds.get(result.command, field='result').hints.rms_label}"
                        if first_panel and not labelled
                        else None,
                    )
                    labelled = True
    if kinds.get(result.command, field="result").hints.residual:
        _draw_stage_bands(ax, result, direction, staged, yspace)
    if yspace == "log":
        ax.set_yscale("log")


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
    rows = (2 if zoom else 1) + cosines + bool(measured)
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
        _draw_cosines(axes[-1 - bool(measured)], result, colours, xlabel)
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


#: at most this many site names on an axis (every k-th beyond it)
MAX_NAME_TICKS = 24


def _name_ticks(ax, layers) -> None:
    """Row names (a model's module paths) as the x ticks, rotated; every k-th when there are many."""
    step = max(1, -(-len(layers) // MAX_NAME_TICKS))
    shown = layers[::step]
    ax.set_xticks([r.index for r in shown])
    ax.set_xticklabels([r.name or str(r.index) for r in shown], rotation=60, ha="right", fontsize=7)


#: one line style per input cosine c0 in the correlation row (never "--": that is the theory's)
COSINE_STYLES = ("-", ":", "-.", (0, (6, 2, 1, 2, 1, 2)))


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
    left.set_title("correlation: mean over input pairs (dashed: infinite-width theory)", fontsize=10)
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


def sweep_figure(rows: Sequence[dict], x: str, path: Path, direction: str = "forward") -> None:
    """Saved to ``path``: see :func:`build_sweep_figure`."""
    save(build_sweep_figure(rows, x, direction), path)


def _sweep_cosines(ax, groups, inits_seen, other_keys, colours, markers, varying, x) -> None:
    """Sweep rows with ``correlation``: the last state's mean cosine per init and input cosine
    (line style per c0), the prediction dashed in the same colour."""
    for (init, other), pts in sorted(
        groups.items(), key=lambda kv: (inits_seen.index(kv[0][0]), other_keys.index(kv[0][1]))
    ):
        pts = sorted(pts, key=lambda r: r["config"][x])
        c0s = [c["c0"] for c in pts[0].get("correlation", [])]
        for k, c0 in enumerate(c0s):
            xs = [p["config"][x] for p in pts]
            ys = [p["correlation"][k]["end_mean"] for p in pts]
            label = f"{init}, c0 = {c0:g}" + "".join(f", {kk} {v}" for kk, v in other if kk in varying)
            ax.plot(
                xs, ys, marker=markers[other], ms=4, color=colours[init], ls=COSINE_STYLES[k % 4], label=label
            )
            pred = [p["correlation"][k]["end_predicted"] for p in pts]
            if all(v is not None for v in pred):
                ax.plot(xs, pred, color=colours[init], ls="--", lw=0.8, alpha=0.7)
    ax.set_ylabel("mean cosine of the last states of input pairs")


def build_sweep_figure(rows: Sequence[dict], x: str, direction: str = "forward"):
    """End-to-end typical ratio (geometric mean over samples and draws) against ``x`` ("depth",
    "width", "blocks"): one colour per init, one marker per value of the other axes
    (width, samples, seeds: rows that differ in any of them are never merged into one line);
    a band of +-1 sd of log10 across samples and, with several draws, the across-draw sd;
    the predicted typical ratio (theory moved by the finite-width drift) dashed in the same
    colour; linear x axis, numeric legend order, legend outside the data."""
    plt = _pyplot()
    groups: dict[tuple, list[dict]] = {}
    others = [k for k in ("width", "depth", "blocks", "dim", "input_dim", "samples", "seeds") if k != x]
    for row in rows:
        other = tuple((k, row["config"].get(k)) for k in others if k in row["config"])
        groups.setdefault((row["init"], other), []).append(row)
    varying = [k for k in others if len({r["config"].get(k) for r in rows}) > 1]
    inits_seen = list(dict.fromkeys(r["init"] for r in rows))
    colours = {name: f"C{i % 10}" for i, name in enumerate(inits_seen)}
    other_keys = sorted(
        {g[1] for g in groups}, key=lambda t: [v if isinstance(v, (int, float)) else 0 for _, v in t]
    )
    markers = {o: ["o", "s", "^", "D", "v", "P"][i % 6] for i, o in enumerate(other_keys)}
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    if direction == "curvature":
        for (init, other), pts in sorted(
            groups.items(), key=lambda kv: (inits_seen.index(kv[0][0]), other_keys.index(kv[0][1]))
        ):
            pts = [
                p
                for p in sorted(pts, key=lambda r: r["config"][x])
                if p["curvature"]["log10_spectral_norm_mean"] is not None
            ]
            xs = [p["config"][x] for p in pts]
            ys = [p["curvature"]["log10_spectral_norm_mean"] for p in pts]
            err = [p["curvature"]["log10_spectral_norm_std"] or 0.0 for p in pts]
            label = init + "".join(f", {k} {v}" for k, v in other if k in varying)
            ax.errorbar(
                xs, ys, yerr=err, marker=markers[other], ms=4, color=colours[init], capsize=3, label=label
            )
        ax.set_xlabel(x)
        ax.set_ylabel("log10 spectral norm of the loss Hessian at init")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        ax.set_title(
            f"sigprop sweep --curvature: curvature at init vs {x} (bars: sd over draws; diverged points left "
            f"out)",
            fontsize=9,
        )
        fig.tight_layout()
        return fig
    if direction == "correlation":
        _sweep_cosines(ax, groups, inits_seen, other_keys, colours, markers, varying, x)
        ax.set_xlabel(x)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        ax.set_title(
            f"sigprop sweep: cosine of two inputs at the last state vs {x} (dashed: theory)", fontsize=10
        )
        fig.tight_layout()
        return fig
    theory_drawn = rms_drawn = False
    for (init, other), pts in sorted(
        groups.items(), key=lambda kv: (inits_seen.index(kv[0][0]), other_keys.index(kv[0][1]))
    ):
        pts = sorted(pts, key=lambda r: r["config"][x])
        xs = [p["config"][x] for p in pts]
        e2e = [p["end_to_end"][direction] for p in pts]
        ys = [e["log10_mean"] for e in e2e]
        sd = [e.get("log10_std") or 0.0 for e in e2e]
        dsd = [e.get("log10_draw_std") or 0.0 for e in e2e]
        label = init + "".join(f", {k} {v}" for k, v in other if k in varying)
        c = colours[init]
        ax.plot(xs, ys, marker=markers[other], ms=4, color=c, label=label)
        ax.fill_between(
            xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], color=c, alpha=0.12, lw=0
        )
        if any(dsd):
            ax.errorbar(xs, ys, yerr=dsd, fmt="none", ecolor=c, elinewidth=1.2, capsize=3)
        typ = [e.get("log10_predicted_typical") for e in e2e]
        rms = [e.get("log10_predicted") for e in e2e]
        if all(t is not None for t in typ):
            ax.plot(xs, typ, ls="--", lw=1, color=c)
            theory_drawn = True
        elif all(t is not None for t in rms):  # conv nets: the energy-map RMS (no typical prediction yet)
            ax.plot(xs, rms, ls=":", lw=1.2, color=c)
            rms_drawn = True
    ax.axhline(0.0, color="0.4", lw=0.8, ls=":")
    ax.set_xlabel(x)
    ax.set_ylabel(f"log10 typical end-to-end {direction} ratio")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if theory_drawn:
        from matplotlib.lines import Line2D  # the plot extra, loaded by _pyplot above

        handles.append(Line2D([], [], color="0.3", ls="--", lw=1))
        labels.append("theory (typical)")
    if rms_drawn:
        from matplotlib.lines import Line2D  # the plot extra, loaded by _pyplot above

        handles.append(Line2D([], [], color="0.3", ls=":", lw=1.2))
        labels.append("theory (energy-map RMS)")
    handles.append(plt.Rectangle((0, 0), 1, 1, color="0.5", alpha=0.2))
    labels.append("±1 sd across samples (bars: across draws)")
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(f"sigprop sweep: typical end-to-end {direction} ratio vs {x}", fontsize=10)
    fig.tight_layout()
    return fig


def hessian_figure(result, path: Path) -> None:
    """Saved to ``path``: see :func:`build_hessian_figure`."""
    save(build_hessian_figure(result), path)


def build_hessian_figure(result):
    """The curvature at init per init (Arpit et al. 2019, Table 2's quantity): a bar of the mean
    log10 spectral norm over the weight draws with its sd, each draw a point; an init whose every
    draw diverged is named on the axis with no bar."""
    plt = _pyplot()
    density = any(d.density for run in result.runs for d in run.draws)
    per_layer = any(d.blocks for run in result.runs for d in run.draws)
    panels = 1 + density + per_layer
    width = max(4.5, 1.3 * len(result.runs) + 2)
    fig, axes = plt.subplots(1, panels, figsize=(width + 6.5 * (panels - 1), 4.0), squeeze=False)
    ax = axes[0][0]
    for k, run in enumerate(result.runs):
        m, sd = run.summary()
        if m is not None:
            ax.bar(k, m, color=f"C{k % 10}", alpha=0.6, yerr=sd, capsize=4)
            pts = run.log10_norms
            ax.plot(
                [k + 0.12 * (j - (len(pts) - 1) / 2) / max(1, len(pts)) for j in range(len(pts))],
                pts,
                "o",
                color="0.15",
                ms=4,
            )
        else:
            ax.text(k, 0, "diverged", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(result.runs)), [r.init for r in result.runs])
    ax.axhline(0.0, color="0.4", lw=0.8)
    ax.set_ylabel("log10 spectral norm of the loss Hessian")
    cfg = result.config
    head = f", --head {cfg['head']}" if cfg.get("head") else ""
    ax.set_title(
        f"sigprop hessian {result.command}: curvature at init, {cfg.get('samples')} samples, "
        f"{cfg.get('seeds')} draw(s){head}\nbar: mean ± sd over draws; points: each draw",
        fontsize=9,
    )
    ax.grid(True, axis="y", alpha=0.3)
    if density:
        _draw_density(axes[0][1], result)
    if per_layer:
        _draw_per_layer(axes[0][panels - 1], result)
    fig.tight_layout()
    return fig


def _draw_per_layer(ax, result) -> None:
    """Per init the largest |eigenvalue| of each layer's diagonal block (mean over draws) against
    the layer's place in the net: where the curvature sits."""
    for k, run in enumerate(result.runs):
        per = [d.blocks for d in run.draws if d.blocks]
        if not per:
            continue
        names = [b["layer"] for b in per[0]]
        ys = []
        for j in range(len(names)):
            vals = [abs(b[j]["eigenvalue"]) for b in per if b[j]["eigenvalue"]]
            ys.append(statistics.fmean(vals) if vals else math.nan)
        ax.plot(range(len(names)), ys, "o-", color=f"C{k % 10}", ms=3, label=run.init)
        ticks = names
    step = max(1, len(ticks) // 12)
    ax.set_xticks(range(0, len(ticks), step), ticks[::step], rotation=45, fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("layer (parameter block)")
    ax.set_ylabel("largest |eigenvalue| of its diagonal block")
    ax.set_title("where the curvature sits (--per-layer)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)


#: the density's Gaussian smoothing, in the symmetric-log coordinate asinh(lambda/c), as a
#: fraction of the nodes' span there
DENSITY_SMOOTHING = 0.01


def density_curve(nodes, weights, c: float, points: int = 800):
    """The quadrature measure sum w_k delta(lambda - theta_k) (weights summing to 1 over all
    probes) smoothed by a Gaussian in u = asinh(lambda/c): (lambda grid, density per unit u)."""
    u_nodes = np.arcsinh(np.asarray(nodes) / c)
    lo, hi = float(u_nodes.min()), float(u_nodes.max())
    span = max(hi - lo, 1e-9)
    sigma = DENSITY_SMOOTHING * span
    u = np.linspace(lo - 4 * sigma, hi + 4 * sigma, points)
    w = np.asarray(weights)
    dens = (w[None, :] * np.exp(-0.5 * ((u[:, None] - u_nodes[None, :]) / sigma) ** 2)).sum(1)
    dens /= sigma * math.sqrt(2 * math.pi)
    return c * np.sinh(u), dens


def _draw_density(ax, result) -> None:
    """Per init the SLQ eigenvalue density (every probe of every draw pooled) on a symmetric
    log axis, its top eigenvalue (Lanczos) a solid tick and the trace/P (the mean eigenvalue)
    dashed."""
    all_nodes = [
        v for run in result.runs for d in run.draws if d.density for p in d.density["nodes"] for v in p
    ]
    scale = max(abs(v) for v in all_nodes) or 1.0
    c = 1e-3 * scale  # linear within a thousandth of the largest |eigenvalue|
    for k, run in enumerate(result.runs):
        dens = [d for d in run.draws if d.density]
        if not dens:
            continue
        nodes = [v for d in dens for p in d.density["nodes"] for v in p]
        total = sum(len(d.density["nodes"]) for d in dens)
        weights = [w / total for d in dens for p in d.density["weights"] for w in p]
        lam, y = density_curve(nodes, weights, c)
        ax.plot(lam, y, color=f"C{k % 10}", lw=1.4, label=run.init)
        top = [d.eigenvalue for d in dens if d.eigenvalue is not None]
        if top:
            ax.axvline(statistics.fmean(top), color=f"C{k % 10}", lw=1.0)
        mean = statistics.fmean(d.density["trace"] / d.parameters for d in dens)
        ax.axvline(mean, color=f"C{k % 10}", lw=1.0, ls="--")
    ax.set_xscale("symlog", linthresh=c)
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-4)
    ax.set_xlabel("eigenvalue of the loss Hessian (symmetric log axis)")
    ax.set_ylabel("density (per unit asinh(λ/c))")
    ax.set_title(
        "eigenvalue density by stochastic Lanczos quadrature\nsolid: top eigenvalue; dashed: trace / P",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)


def spectrum_figure(result, path: Path) -> None:
    """Saved to ``path``: see :func:`build_spectrum_figure`."""
    save(build_spectrum_figure(result), path)


def build_spectrum_figure(result):
    """The input-output Jacobian's spectrum (``sigprop spectrum``): left, the histogram of the
    eigenvalues sigma^2 of J J^T per init on a log axis (pooled over draws and samples; the zeros
    -- a ReLU's inactive units, and values below J's own precision -- which a log axis cannot
    show, counted in the legend), the predicted mean dashed, the free-probability density (dense
    chains) as a thin line in the histogram's units, and sigma^2 = 1 dotted; right, with
    ``--depths``, var/mean^2 against depth per init, measured (points) and predicted (dashed:
    the free-probability line L(mu2/mu1^2 - 1 - s1)) where derived."""
    plt = _pyplot()
    depths = any(run.depths for run in result.runs)
    fig, axes = plt.subplots(1, 2 if depths else 1, figsize=(11.5 if depths else 6.5, 4.2), squeeze=False)
    ax = axes[0][0]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    free = False
    for k, run in enumerate(result.runs):
        c = colours[k % len(colours)]
        h = run.histogram
        total = sum(h["counts"]) + h["zeros"]
        if h["counts"]:
            frac = [n / total for n in h["counts"]]
            zeros = f", {100 * h['zeros'] / total:.0f}% ≈ 0" if h["zeros"] else ""
            ax.stairs(frac, h["log10_edges"], color=c, lw=1.6, label=f"{run.init}{zeros}")
            pd = run.predicted_density
            if pd:  # the density per unit log10 sigma^2 times the bins' width: a fraction per bin
                edges = h["log10_edges"]
                width = edges[1] - edges[0]
                lo, hi = edges[0] - 2 * width, edges[-1] + 2 * width
                pts = [(x, y * width) for x, y in zip(pd["log10_lambda"], pd["per_log10"]) if lo <= x <= hi]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=c, lw=1, alpha=0.8)
                free = True
        if run.predicted_mean:
            ax.axvline(math.log10(run.predicted_mean), color=c, ls="--", lw=1)
    ax.axvline(0.0, color="0.4", ls=":", lw=1)
    ax.set_xlabel(r"$\log_{10} \sigma^2$ (eigenvalues of $J J^\top$)")
    ax.set_ylabel("fraction of eigenvalues per bin")
    ax.set_title(
        "spectrum of the input-output Jacobian (dashed: predicted mean"
        + ("; thin: free-probability density)" if free else ")"),
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    if depths:
        ax2 = axes[0][1]
        drawn = False
        for k, run in enumerate(result.runs):
            c = colours[k % len(colours)]
            ds = [d for d in run.depths if d["mean"]]
            xs = [d["depth"] for d in ds]
            # later inits drawn thinner: an init whose normalised spectrum equals another's (the
            # same directions, another gain: he and proposed-gaussian) stays visible beneath it
            lw, ms = max(3.0 - 0.8 * k, 1.0), max(6.0 - 1.5 * k, 2.5)
            ax2.plot(
                xs, [d["variance"] / d["mean"] ** 2 for d in ds], "o-", color=c, lw=lw, ms=ms, label=run.init
            )
            pred = [
                (d["depth"], d["predicted_variance"] / d["predicted_mean"] ** 2)
                for d in run.depths
                if d["predicted_variance"] is not None and d["predicted_mean"]
            ]
            if pred:
                ax2.plot([p[0] for p in pred], [p[1] for p in pred], "--", color=c, lw=1)
                drawn = True
        ax2.set_xlabel(f"depth ({kinds.get(result.command, field='result').hints.units})")
        ax2.set_ylabel(r"var $\sigma^2$ / mean$^2$")
        title = "spread against depth" + (
            " (dashed: free-probability theory)" if drawn else " (theory not derived)"
        )
        ax2.set_title(title, fontsize=10)
        ax2.legend(fontsize=8)
        ax2.grid(True, alpha=0.3)
    net = kinds.get(result.command, field="result").describe(result.config)
    fig.suptitle(
        f"sigprop spectrum {result.command}: {net}, "
        f"{result.environment['samples']} inputs x {result.config.get('seeds')} draw(s)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
