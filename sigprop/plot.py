"""Figures (matplotlib, an optional extra: ``pip install 'sigprop[plot]'``).  Rendering only:
every number drawn is read from the result records (STYLE.md layers); nothing is measured here.

``probe_figure``: the paper's Figure 1 layout (001, Figure 1) -- a forward and a backward panel,
one line per init (mean ratio across samples, a band of +-1 std across samples and, with
several draws, a lighter band of +-1 std of the per-draw mean across draws), the closed-form
prediction dashed (the RMS ratio, docs/theory.md), the ResNet band [sqrt 2, sqrt e] dotted, a
log axis when the values span more than two decades.
``sweep_figure``: end-to-end ratio against depth or width, one line per init, from a sweep's
JSON lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from sigprop.errors import SigpropError

FORMATS = ("png", "svg", "pdf")
#: values this far apart (max/min of the plotted means) switch the axis to log
LOG_SPAN_DECADES = 2.0
#: beyond 10^+-300 a float cannot be drawn: the axis shows log10 of the ratio instead
FLOAT_LOG10_LIMIT = 300.0


def check_target(path: Path, option: str = "--plot") -> Path:
    """Fail before any work: matplotlib present, a known extension, an existing directory."""
    ext = path.suffix.lower().lstrip(".")
    if ext not in FORMATS:
        raise SigpropError(f"unknown figure format {path.suffix or '(none)'!r}; use .png, .svg or .pdf", option=option)
    target = path.resolve()
    if target.is_dir() or not target.parent.is_dir():
        raise SigpropError(f"cannot write {path}: {'is a directory' if target.is_dir() else 'no such directory'}", option=option)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SigpropError("plotting needs matplotlib: pip install 'sigprop[plot]'", option=option) from None
    return target


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    """Write the figure whole (temp file + rename), never half."""
    from sigprop import files

    ext = path.suffix.lower().lstrip(".")
    try:
        files.atomic_write(path, lambda tmp: fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight"), suffix=f".{ext}")
    finally:
        _pyplot().close(fig)


def _series(stats_list: Sequence[Any], mode: str) -> tuple[list[float], list[float], list[float], list[float], list[float], list[float | None]]:
    """(centre, low, high, draw_low, draw_high, predicted) per layer for one direction.
    mode "linear": mean +- std; "log": 10^(log10 mean +- log10 std); "log10": the exponents."""
    c, lo, hi, dlo, dhi, pred = [], [], [], [], [], []
    for s in stats_list:
        if mode == "linear":
            m, sd, dsd = s.mean, s.std or 0.0, s.draw_std or 0.0
            c.append(m); lo.append(m - sd); hi.append(m + sd); dlo.append(m - dsd); dhi.append(m + dsd)
            pred.append(s.predicted)
        else:
            m, sd, dsd = s.log10_mean, s.log10_std or 0.0, s.log10_draw_std or 0.0
            if mode == "log":
                c.append(10**m); lo.append(10 ** (m - sd)); hi.append(10 ** (m + sd))
                dlo.append(10 ** (m - dsd)); dhi.append(10 ** (m + dsd))
                pred.append(None if s.log10_predicted is None else 10**s.log10_predicted)
            else:
                c.append(m); lo.append(m - sd); hi.append(m + sd); dlo.append(m - dsd); dhi.append(m + dsd)
                pred.append(s.log10_predicted)
    return c, lo, hi, dlo, dhi, pred


def _mode(result) -> str:
    logs = [s.log10_mean for run in result.runs for r in run.layers for s in (r.forward, r.backward) if s.log10_mean is not None]
    means = [s.mean for run in result.runs for r in run.layers for s in (r.forward, r.backward)]
    if not logs:
        return "linear"
    if max(abs(v) for v in logs) > FLOAT_LOG10_LIMIT or any(m is None for m in means):
        return "log10"
    return "log" if max(logs) - min(logs) > LOG_SPAN_DECADES else "linear"


def probe_figure(result, path: Path) -> None:
    """Figure 1 style: forward and backward panels for every init of one probe, saved to ``path``."""
    save(build_probe_figure(result), path)


def build_probe_figure(result):
    """The matplotlib figure of :func:`probe_figure` (not saved; tests read its axes back)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    resnet = result.command == "resnet"
    mode = _mode(result)
    seeds = int(result.config.get("seeds", 1))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=mode != "linear")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    theory_labelled = False
    for k, run in enumerate(result.runs):
        col = colours[k % len(colours)]
        x = [r.index for r in run.layers]
        for ax, direction in zip(axes, ("forward", "backward")):
            c, lo, hi, dlo, dhi, pred = _series([getattr(r, direction) for r in run.layers], mode)
            ax.plot(x, c, color=col, lw=1.6, label=run.init)
            ax.fill_between(x, lo, hi, color=col, alpha=0.18, lw=0)
            if seeds > 1:
                ax.fill_between(x, dlo, dhi, color=col, alpha=0.35, lw=0)
            pts = [(xi, p) for xi, p in zip(x, pred) if p is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=col, ls="--", lw=1.1,
                        label="theory (dashed; RMS ratio)" if not theory_labelled else None)
                theory_labelled = direction == "backward" or theory_labelled
    if resnet and "band" in result.tolerances:
        low, high = result.tolerances["band"]
        if mode == "log10":
            import math

            low, high = math.log10(low), math.log10(high)
        for ax in axes:
            ax.axhspan(low, high, color="0.5", alpha=0.12, lw=0)
            ax.axhline(low, color="0.35", ls=":", lw=1)
            ax.axhline(high, color="0.35", ls=":", lw=1, label="[√2, √e] (end of a stage)")
    cfg = result.config
    if resnet:
        xlabel = r"block $b$ (state $h^b$)"
        ylab = (r"$\|h^b\| \,/\, \|h^0\|$", r"$\|\partial\ell/\partial h^b\| \,/\, \|\partial\ell/\partial h^B\|$")
        shape = f"{cfg.get('stages', 1)} stage(s) × {cfg.get('blocks')} blocks, d = {cfg.get('dim')}, norm {cfg.get('norm')}"
    else:
        xlabel = r"layer $l$"
        ylab = (r"$\|h^l\| \,/\, \|x\|$", r"$\|\partial\ell/\partial a^l\| \,/\, \|\partial\ell/\partial a^L\|$")
        shape = f"depth {cfg.get('depth')}, widths {_width_text(cfg.get('width'))}, n_0 = {cfg.get('input_dim')}"
    band = "± 1 std across samples" + (f"; darker: ± 1 std across {seeds} draws" if seeds > 1 else "")
    for ax, title, yl in zip(axes, ("forward: activations", "backward: gradients"), ylab):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(("log$_{10}$ " + yl) if mode == "log10" else yl)
        ax.set_title(title)
        if mode == "log":
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(f"sigprop {result.command}: {shape}, N = {cfg.get('samples')} samples (shaded: {band})", fontsize=10)
    fig.tight_layout()
    return fig


def _width_text(width: Any) -> str:
    if isinstance(width, dict):
        lo, hi = width.get("lo"), width.get("hi")
        return str(lo) if lo == hi else f"{lo}:{hi}"
    return str(width)


def sweep_figure(rows: Sequence[dict], x: str, path: Path, direction: str = "forward") -> None:
    """Saved to ``path``: see :func:`build_sweep_figure`."""
    save(build_sweep_figure(rows, x, direction), path)


def build_sweep_figure(rows: Sequence[dict], x: str, direction: str = "forward"):
    """End-to-end typical ratio (geometric mean over samples and draws) against ``x`` ("depth",
    "width", "blocks"): one colour per init, one line style per value of the other axes
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
    other_keys = sorted({g[1] for g in groups}, key=lambda t: [v if isinstance(v, (int, float)) else 0 for _, v in t])
    markers = {o: ["o", "s", "^", "D", "v", "P"][i % 6] for i, o in enumerate(other_keys)}
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    theory_drawn = False
    for (init, other), pts in sorted(groups.items(), key=lambda kv: (inits_seen.index(kv[0][0]), other_keys.index(kv[0][1]))):
        pts = sorted(pts, key=lambda r: r["config"][x])
        xs = [p["config"][x] for p in pts]
        e2e = [p["end_to_end"][direction] for p in pts]
        ys = [e["log10_mean"] for e in e2e]
        sd = [e.get("log10_std") or 0.0 for e in e2e]
        dsd = [e.get("log10_draw_std") or 0.0 for e in e2e]
        label = init + "".join(f", {k} {v}" for k, v in other if k in varying)
        c = colours[init]
        ax.plot(xs, ys, marker=markers[other], ms=4, color=c, label=label)
        ax.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], color=c, alpha=0.12, lw=0)
        if any(dsd):
            ax.errorbar(xs, ys, yerr=dsd, fmt="none", ecolor=c, elinewidth=1.2, capsize=3)
        typ = [e.get("log10_predicted_typical") for e in e2e]
        if all(t is not None for t in typ):
            ax.plot(xs, typ, ls="--", lw=1, color=c)
            theory_drawn = True
    ax.axhline(0.0, color="0.4", lw=0.8, ls=":")
    ax.set_xlabel(x)
    ax.set_ylabel(f"log10 typical end-to-end {direction} ratio")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if theory_drawn:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="0.3", ls="--", lw=1))
        labels.append("theory (typical)")
    handles.append(plt.Rectangle((0, 0), 1, 1, color="0.5", alpha=0.2))
    labels.append("±1 sd across samples (bars: across draws)")
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(f"sigprop sweep: typical end-to-end {direction} ratio vs {x}", fontsize=10)
    fig.tight_layout()
    return fig
