"""What every figure shares: the formats, the target check, matplotlib loaded on first use (the
``[plot]`` extra), saving, the y-axis scales and the markers.  Rendering only."""

from __future__ import annotations

from pathlib import Path

from sigprop import files
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
    target = files.check_target(path, field)
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
