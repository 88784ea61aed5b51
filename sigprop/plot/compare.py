"""A sweep's configurations side by side (``--arg norm_first=True,False --plot d.png`` writes
``d-all.png`` beside each configuration's own figure): per configuration and init the typical
forward and backward ratio at every site, the traced theory's RMS ratio dotted (the token cosine's
prediction dashed), and the token cosine where the
sites read one -- pre-LN against post-LN at a glance.  The x axis is the site's position among its
configuration's sites (their counts may differ: a depth sweep).  Rendering only."""

from __future__ import annotations

from pathlib import Path

from sigprop.plot.common import LOG_SPAN_DECADES, MARKERS, _pyplot, save


def _series(run, get):
    pts = [(r.index, get(r)) for r in run.layers]
    return [(i, v) for i, v in pts if v is not None]


def compare_figure(labels: list[str], results: list, path: Path) -> None:
    save(build_compare_figure(labels, results), path)


def build_compare_figure(labels: list[str], results: list):
    """The figure of :func:`compare_figure` (not saved; tests read its axes back)."""
    plt = _pyplot()
    tokens = any(r.tokens is not None for res in results for run in res.runs for r in run.layers)
    fig, axes = plt.subplots(1, 3 if tokens else 2, figsize=(15 if tokens else 11, 4.4), squeeze=False)
    axes = axes[0]
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    k = 0
    spans = {0: [], 1: []}
    for label, res in zip(labels, results):
        for run in res.runs:
            name = label if len(res.runs) == 1 else f"{label} {run.init}"
            colour, marker = cycle[k % len(cycle)], MARKERS[k % len(MARKERS)]
            k += 1
            for c, direction in enumerate(("forward", "backward")):
                typical = _series(
                    run,
                    lambda r: (
                        None
                        if getattr(r, direction).log10_mean is None or r.off_path and direction == "backward"
                        else 10 ** getattr(r, direction).log10_mean
                    ),
                )
                # the traced theory's RMS ratio (the table's theory column): a model's typical
                # prediction leans on a spread model that counts its layers as if in series
                theory = _series(
                    run,
                    lambda r: (
                        None
                        if getattr(r, direction).log10_predicted is None
                        else 10 ** getattr(r, direction).log10_predicted
                    ),
                )
                if typical:
                    axes[c].plot(*zip(*typical), color=colour, marker=marker, markersize=4, label=name)
                    spans[c] += [v for _, v in typical]
                if theory:
                    axes[c].plot(*zip(*theory), color=colour, linestyle=":", linewidth=1.2)
            if tokens:
                cos = _series(run, lambda r: None if r.tokens is None else r.tokens.mean)
                pred = _series(run, lambda r: None if r.tokens is None else r.tokens.predicted)
                if cos:
                    axes[2].plot(*zip(*cos), color=colour, marker=marker, markersize=4, label=name)
                if pred:
                    axes[2].plot(*zip(*pred), color=colour, linestyle="--", linewidth=1)
    titles = (
        "forward: typical ratio at each site",
        "backward: typical ratio at each site",
        "token cosine (1: collapsed)",
    )
    for c, ax in enumerate(axes):
        ax.set_title(titles[c], fontsize=10)
        ax.set_xlabel("site (its position in the configuration)")
        ax.grid(True, alpha=0.3)
        vals = [v for v in spans.get(c, []) if v > 0]
        if c < 2 and vals and max(vals) / min(vals) > 10 ** (LOG_SPAN_DECADES / 2):
            ax.set_yscale("log")
    if tokens:
        axes[2].set_ylim(-0.05, 1.05)
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle(
        f"sigprop {results[0].command}: {len(labels)} configurations side by side; solid: measured "
        "(typical); dotted: traced theory's RMS ratio; dashed: its token cosine",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
