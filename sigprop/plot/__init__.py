"""Figures (matplotlib, an optional extra: ``pip install 'sigprop[plot]'``).  Rendering only:
every number drawn is read from the result records (../shared/STYLE.md layers); nothing is
measured here.  One module per feature, every name re-exported here:

``probe``: the paper's Figure 1 layout (Arpit et al. 2019, Figure 1) -- a forward and a
backward panel, one line and marker per init (the typical, geometric-mean ratio; +-1 sd of the
log ratio across samples shaded and, with several draws, across draws darker), the predicted
typical ratio dashed (docs/theory.md §4), the ResNet band [sqrt 2, sqrt e] as a bar where it
applies (at each stage's end: it bounds the stage's end-to-end ratio, not the states inside it),
a log axis when the values span more than a decade and then a linear zoom row for the inits
that stay near 1.  ``sweep``: end-to-end ratio against depth or width, one line per init, from
a sweep's JSON lines.  ``curvature`` and ``spectrum``: the figures of ``sigprop hessian`` and
``sigprop spectrum``; ``compare``: a sweep's configurations side by side; ``common``: formats,
target check, saving, scales.
"""

from sigprop.plot.common import (
    COSINE_STYLES,
    FLOAT_LOG10_LIMIT,
    FORMATS,
    LOG_SPAN_DECADES,
    MARKERS,
    MAX_NAME_TICKS,
    STAGED_LABELS,
    ZOOM_DECADES,
    check_target,
    save,
)
from sigprop.plot.compare import build_compare_figure, compare_figure
from sigprop.plot.curvature import (
    DENSITY_SMOOTHING,
    build_hessian_figure,
    density_curve,
    hessian_figure,
)
from sigprop.plot.probe import (
    _draw,
    build_probe_figure,
    probe_figure,
)
from sigprop.plot.spectrum import (
    build_spectrum_figure,
    spectrum_figure,
)
from sigprop.plot.sweep import (
    build_sweep_figure,
    sweep_figure,
)
from sigprop.plot.width import build_width_figure, width_figure

__all__ = [
    "build_compare_figure",
    "compare_figure",
    "COSINE_STYLES",
    "DENSITY_SMOOTHING",
    "FLOAT_LOG10_LIMIT",
    "FORMATS",
    "LOG_SPAN_DECADES",
    "MARKERS",
    "MAX_NAME_TICKS",
    "STAGED_LABELS",
    "ZOOM_DECADES",
    "_draw",
    "build_hessian_figure",
    "build_probe_figure",
    "build_spectrum_figure",
    "build_sweep_figure",
    "check_target",
    "density_curve",
    "hessian_figure",
    "probe_figure",
    "save",
    "spectrum_figure",
    "sweep_figure",
    "build_width_figure",
    "width_figure",
]
