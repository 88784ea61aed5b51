"""``sigprop hessian``'s figure: the curvature per init and draw, per layer, and the Hessian's
eigenvalue density.  Rendering only (the density's smoothing of the quadrature nodes is a
drawing choice, said in the caption)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from sigprop.plot.common import _pyplot, save


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
