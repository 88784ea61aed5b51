"""``sigprop sweep``'s figure: the end-to-end ratios (or cosines, or curvature) against the swept
parameter, one curve per init and other parameters.  Rendering only."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from sigprop.plot.common import COSINE_STYLES, _pyplot, save


def sweep_figure(
    rows: Sequence[dict], x: str, path: Path, direction: str = "forward", others: Sequence[str] = ()
) -> None:
    """Saved to ``path``: see :func:`build_sweep_figure`."""
    save(build_sweep_figure(rows, x, direction, others), path)


def _sweep_cosines(ax, ordered, colours, markers, varying, x) -> None:
    """Sweep rows with ``correlation``: the last state's mean cosine per init and input cosine
    (line style per c0), the prediction dashed in the same colour."""
    for (init, other), pts in ordered:
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


def _sweep_curvature(ax, ordered, colours, markers, varying, x) -> None:
    """Sweep rows with ``curvature``: the log10 spectral norm per init, bars of its sd over draws,
    diverged points left out."""
    for (init, other), pts in ordered:
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
    ax.set_ylabel("log10 spectral norm of the loss Hessian at init")


def _sweep_ratios(ax, ordered, colours, markers, varying, x, direction) -> tuple[bool, bool]:
    """Sweep rows with ``end_to_end``: the typical ratio per init and the other axes, +-1 sd
    across samples shaded, across draws as bars, the typical prediction dashed (or, for a conv
    net, the energy-map RMS dotted).  Returns whether either prediction was drawn."""
    theory_drawn = rms_drawn = False
    for (init, other), pts in ordered:
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
    return theory_drawn, rms_drawn


def build_sweep_figure(rows: Sequence[dict], x: str, direction: str = "forward", others: Sequence[str] = ()):
    """End-to-end typical ratio (geometric mean over samples and draws) against ``x`` ("depth",
    "width", "blocks"): one colour per init, one marker per value of the other axes
    (width, samples, seeds: rows that differ in any of them are never merged into one line);
    a band of +-1 sd of log10 across samples and, with several draws, the across-draw sd;
    the predicted typical ratio (theory moved by the finite-width drift) dashed in the same
    colour; linear x axis, numeric legend order, legend outside the data.  ``others``: more axes
    that keep lines apart (a model's --arg names, ``sweeps.plot_rows``; and its input shape)."""
    plt = _pyplot()
    groups: dict[tuple, list[dict]] = {}
    axes = ("width", "depth", "blocks", "dim", "input_dim", "samples", "seeds", *others, "input_shape")
    others = [k for k in dict.fromkeys(axes) if k != x]
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
    ordered = sorted(groups.items(), key=lambda kv: (inits_seen.index(kv[0][0]), other_keys.index(kv[0][1])))
    titles = {
        "curvature": (
            _sweep_curvature,
            f"sigprop sweep --curvature: curvature at init vs {x} (bars: sd over draws; diverged points left "
            "out)",
            9,
        ),
        "correlation": (
            _sweep_cosines,
            f"sigprop sweep: cosine of two inputs at the last state vs {x} (dashed: theory)",
            10,
        ),
    }
    if direction in titles:
        draw, title, size = titles[direction]
        draw(ax, ordered, colours, markers, varying, x)
        ax.set_xlabel(x)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        ax.set_title(title, fontsize=size)
        fig.tight_layout()
        return fig
    theory_drawn, rms_drawn = _sweep_ratios(ax, ordered, colours, markers, varying, x, direction)
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
