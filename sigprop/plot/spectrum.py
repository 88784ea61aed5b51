"""``sigprop spectrum``'s figure: the pooled histogram of sigma^2 beside its large-width density,
and the spectrum against depth.  Rendering only."""

from __future__ import annotations

import math
from pathlib import Path

from sigprop import kinds
from sigprop.plot.common import _pyplot, save


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
