"""``sigprop sweep``'s progress: one line per finished point.  Rendering only."""

from __future__ import annotations

from typing import Any

from sigprop.report.common import fmt_log10


def point_line(i: int, n: int, label: str, line: dict[str, Any]) -> str:
    """The line of the i-th of n finished points (``label``): its end-to-end forward ratio and
    cosines, or its curvature, or its Jacobian's spectrum, and its seconds; or its error."""
    if "error" in line:
        return f"sweep [{i}/{n}] {label}: FAILED: {line['error']}"
    if "spectrum" in line:
        m, top = line["spectrum"]["mean"], line["spectrum"]["sigma_max"]
        what = f"mean sigma^2 {m:.3g}, sigma_max {top:.3g}"
    elif "curvature" in line:
        m = line["curvature"]["log10_spectral_norm_mean"]
        what = "curvature diverged" if m is None else f"log10 spectral norm {m:.2f}"
    else:
        fwd = line["end_to_end"]["forward"]["log10_mean"]
        cos = "".join(f", cosine {c['c0']:g} -> {c['end_mean']:.3f}" for c in line.get("correlation", []))
        what = f"forward {fmt_log10(fwd)}{cos}"
    return f"sweep [{i}/{n}] {label}: {what} ({line['seconds']:.1f} s)"
