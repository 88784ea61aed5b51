"""``sigprop sweep``'s lines (``sigprop.sweep.v1``): per point and init the end-to-end ratios,
the curvature's spectral norm, or the Jacobian's spectrum; a point that raised is a
``sigprop.sweep.failed.v1`` line (sigprop/sweeps/run.py); a part's file begins with its header
(``sigprop.sweep.shard.v2``)."""

from __future__ import annotations

from typing import Any

from sigprop.results.curvature import HessianResult
from sigprop.results.probe import ProbeResult
from sigprop.results.spectrum import SPECTRUM_KEYS, SpectrumResult

SWEEP_SCHEMA = "sigprop.sweep.v1"
FAILED_SCHEMA = "sigprop.sweep.failed.v1"
#: the first line of a part's file (``--shard i/N``, sigprop/sweeps/shard.py); v2 (0.18.1) carries
#: the whole grid's identity, so that a merge refuses a part of another grid or other options
SHARD_SCHEMA = "sigprop.sweep.shard.v2"


def _end_to_end(result: "ProbeResult") -> dict[str, Any]:
    """The end-to-end ratios of a one-init probe: forward at the last layer/state, backward at
    the first (read from the result records, not recomputed)."""
    run = result.runs[0]
    pick = {"forward": run.end_rows[0].forward, "backward": run.end_rows[1].backward}
    return {
        k: {
            "mean": s.mean,
            "log10_mean": s.log10_mean,
            "log10_std": s.log10_std,
            "log10_draw_std": s.log10_draw_std,
            "rms": s.rms,
            "log10_rms": s.log10_rms,
            "predicted": s.predicted,
            "log10_predicted": s.log10_predicted,
            "log10_predicted_typical": s.log10_predicted_typical,
            "log10_low": s.log10_low,
            "log10_high": s.log10_high,
            "agrees": s.agrees,
        }
        for k, s in pick.items()
    }


def sweep_row(config: dict[str, Any], init: str, result: "ProbeResult", seconds: float) -> dict[str, Any]:
    """One line of ``sigprop sweep`` (``sigprop.sweep.v1``, docs/cli.md)."""
    run = result.runs[0]
    return {
        "schema": SWEEP_SCHEMA,
        "config": config,
        "init": init,
        "end_to_end": _end_to_end(result),
        "passed": result.passed,
        "preserved": run.preserved,
        "agrees_with_theory": run.agrees_with_theory,
        **({"correlation": [c.to_dict() for c in run.correlations]} if run.correlations else {}),
        "seconds": round(seconds, 3),
        "environment": result.environment,
    }


def curvature_row(
    config: dict[str, Any], init: str, result: "HessianResult", seconds: float
) -> dict[str, Any]:
    """One line of ``sigprop sweep --curvature`` (``sigprop.sweep.v1`` with ``curvature`` in
    place of the end-to-end ratios): the init's log10 spectral norm over its draws."""
    run = result.runs[0]
    m, sd = run.summary()
    return {
        "schema": SWEEP_SCHEMA,
        "config": config,
        "init": init,
        "curvature": {
            "log10_spectral_norm_mean": m,
            "log10_spectral_norm_std": sd,
            "diverged": run.diverged,
            "draws": [d.to_dict() for d in run.draws],
        },
        "seconds": round(seconds, 3),
        "environment": result.environment,
    }


def spectrum_row(
    config: dict[str, Any], init: str, result: "SpectrumResult", seconds: float
) -> dict[str, Any]:
    """One line of ``sigprop sweep --measure spectrum`` (``sigprop.sweep.v1`` with ``spectrum`` in
    place of the end-to-end ratios): the means over draws of the summaries of sigma^2, beside the
    large-width prediction, and each draw's."""
    run = result.runs[0]
    return {
        "schema": SWEEP_SCHEMA,
        "config": config,
        "init": init,
        "spectrum": {
            **{key: run.averaged(key) for key in SPECTRUM_KEYS},
            "predicted_mean": run.predicted_mean,
            "predicted_variance": run.predicted_variance,
            "theory_note": run.why,
            "draws": run.draws,
        },
        "seconds": round(seconds, 3),
        "environment": result.environment,
    }
