"""``sigprop width``'s figure: the coordinate check as users know it from ``mup`` (Yang et al.
2021, Figure 5), with the theory beside it.  Rendering only."""

from __future__ import annotations

import math
import os
from pathlib import Path

from sigprop.plot.common import _pyplot, save

#: a panel spans at least this factor on its log axis: a flat line reads flat, not zoomed
MIN_SPAN = 10.0


def width_figure(result, path: Path) -> None:
    """Saved to ``path``: see :func:`build_width_figure`."""
    save(build_width_figure(result), path)


def _labels(sites: list[str]) -> list[str]:
    """The sites' paths less the prefix they all share (``model.layers.0.mlp.up_proj`` ->
    ``layers.0.mlp.up_proj`` where every site starts ``model.``)."""
    if len(sites) < 2:
        return [s or "(model)" for s in sites]
    common = os.path.commonprefix(sites)
    cut = common.rfind(".") + 1 if "." in common else 0
    return [s[cut:] or s or "(model)" for s in sites]


def _span(ax, values: list[float]) -> None:
    lo, hi = min(values), max(values)
    if lo > 0 and hi / lo < MIN_SPAN:
        mid = math.sqrt(lo * hi)
        ax.set_ylim(mid / math.sqrt(MIN_SPAN), mid * math.sqrt(MIN_SPAN))


def build_width_figure(result):
    """One row per parametrization, one panel per step: mean|h| (mup's statistic, mean over
    seeds) against the width on log-log axes, one line per site coloured from the first site to
    the last (viridis, as mup draws them), each panel at least a decade tall; the predicted slope
    dashed from the smallest width's value where theory gives one number (at step 0 the init's
    exponent; later a stable parametrization's); one legend per row, the fitted slopes in the
    table."""
    plt = _pyplot()
    runs, steps, widths = result.runs, result.config["steps"], result.config["widths"]
    fig, axes = plt.subplots(
        len(runs), steps + 1, figsize=(2.9 * (steps + 1) + 2.6, 2.7 * len(runs) + 0.5), squeeze=False
    )
    cmap = plt.get_cmap("viridis")
    for r, run in enumerate(runs):
        sites = list(dict.fromkeys(s.site for s in run.slopes))
        labels = dict(zip(sites, _labels(sites)))
        colour = {s: cmap(i / max(1, len(sites) - 1)) for i, s in enumerate(sites)}
        init = {s.site: s.init for s in run.slopes if s.step == 0}
        for step in range(steps + 1):
            ax = axes[r][step]
            drawn = []
            for s in (s for s in run.slopes if s.step == step):
                ys = s.l1_values
                ax.plot(
                    widths, ys, "o-", color=colour[s.site], ms=3, lw=1.2, label=f"{labels[s.site]} ({s.role})"
                )
                drawn += [y for y in ys if y > 0]
                e = s.init if step == 0 else (s.high if s.low == s.high and s.high is not None else None)
                if e is not None and step > 0:
                    e = max(e, init.get(s.site) or 0.0)
                if e is not None and ys and ys[0] > 0:
                    ax.plot(
                        widths,
                        [ys[0] * (w / widths[0]) ** e for w in widths],
                        "--",
                        color=colour[s.site],
                        lw=0.8,
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            if drawn:
                _span(ax, drawn)
            ax.set_title(f"{run.param}: step {step}" + (" (init)" if step == 0 else ""), fontsize=9)
            ax.set_xlabel("width", fontsize=8)
            if step == 0:
                ax.set_ylabel("mean |h|", fontsize=8)
            ax.tick_params(labelsize=7)
        verdict = "width-stable" if run.width_stable else "not width-stable"
        handles, names = axes[r][steps].get_legend_handles_labels()
        axes[r][steps].legend(
            handles, names, fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False,
            title=f"{run.param}: {verdict}; theory {run.theory}", title_fontsize=7,
        )  # fmt: skip
    fig.suptitle(
        f"coordinate check: {result.config['optimizer']} lr {result.config['lr']:g}, mean over "
        f"{result.config['seeds']} seeds; dashed = theory's slope where it is one number",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
