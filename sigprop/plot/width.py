"""``sigprop width``'s figure: the coordinate check as users know it from ``mup`` (Yang et al.
2021, Figure 5), with the theory beside it.  Rendering only."""

from __future__ import annotations

from pathlib import Path

from sigprop.plot.common import _pyplot, save


def width_figure(result, path: Path) -> None:
    """Saved to ``path``: see :func:`build_width_figure`."""
    save(build_width_figure(result), path)


def build_width_figure(result):
    """One row per parametrization, one panel per step: mean|h| (mup's statistic, mean over
    seeds) against the width on log-log axes, one line per site; the predicted slope dashed from
    the smallest width's value where theory gives one number (at step 0 the init's exponent;
    later a stable parametrization's), with the fitted slope in the legend."""
    plt = _pyplot()
    runs = result.runs
    steps = result.config["steps"]
    widths = result.config["widths"]
    fig, axes = plt.subplots(
        len(runs), steps + 1, figsize=(3.0 * (steps + 1) + 0.6, 2.7 * len(runs) + 0.4), squeeze=False
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r, run in enumerate(runs):
        init_by_site = {s.site: s.init for s in run.slopes if s.step == 0}
        for step in range(steps + 1):
            ax = axes[r][step]
            here = [s for s in run.slopes if s.step == step]
            for k, s in enumerate(here):
                c = colours[k % len(colours)]
                label = f"{s.site or 'out'} ({s.role})" + ("" if s.l1 is None else f" {s.l1:+.2f}")
                ax.plot(widths, s.l1_values, "o-", color=c, ms=3.5, lw=1.3, label=label)
                s_init = s.init if step == 0 else init_by_site.get(s.site)
                e = (
                    s.init
                    if step == 0
                    else (None if s.low is None or s.low != s.high else max(s.high, s_init or 0))
                )
                if e is not None and s.l1_values and s.l1_values[0] > 0:
                    y0 = s.l1_values[0]
                    ax.plot(
                        widths, [y0 * (w / widths[0]) ** e for w in widths], "--", color=c, lw=0.9, alpha=0.8
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{run.param}: step {step}" + (" (init)" if step == 0 else ""), fontsize=9)
            if r == len(runs) - 1:
                ax.set_xlabel("width")
            if step == 0:
                ax.set_ylabel("mean |h|")
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6, loc="best", title="site (role) slope", title_fontsize=6)
    opt = result.config["optimizer"]
    fig.suptitle(
        f"coordinate check: {opt} lr {result.config['lr']:g}, mean over {result.config['seeds']} seeds; "
        "dashed = theory's slope where it is one number",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
