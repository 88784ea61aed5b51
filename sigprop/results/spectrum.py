"""The input-output Jacobian's spectrum (``sigprop spectrum``, ``sigprop.spectrum.v1``): per init
and weight draw the summaries of sigma^2, beside the large-width prediction."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from sigprop.results.common import Document

SPECTRUM_SCHEMA = "sigprop.spectrum.v1"


#: the per-draw summaries of the eigenvalues sigma^2 of J J^T (sigprop/spectra.py)
SPECTRUM_KEYS = ("mean", "variance", "sigma_max", "sigma_min", "condition", "near_one")


@dataclass
class SpectrumRun:
    """One init: per weight draw the summaries (``SPECTRUM_KEYS``), the large-width prediction of
    the mean and variance of sigma^2 (None where not derived: ``why``) and, for dense chains (MLPs), its
    density, and a histogram of the eigenvalues pooled over draws and samples (log10 bin edges and
    counts)."""

    init: str
    description: str
    draws: list[dict]
    predicted_mean: float | None
    predicted_variance: float | None
    why: str
    histogram: dict
    #: with ``depths``: per unit output (depth l = 1..L) the mean over draws of the mean and
    #: variance of sigma^2 of d h^l/d x, and their predictions (None: not derived)
    depths: list[dict] = field(default_factory=list)
    #: the large-width density of sigma^2 (``theory.SpectralDensity`` as a dict: log10_lambda,
    #: per_log10, zeros, continuous), None where not derived
    predicted_density: dict | None = None

    def averaged(self, key: str) -> float | None:
        """The mean over draws (None when a draw has none: a singular J's condition number)."""
        values = [d[key] for d in self.draws]
        return None if any(v is None for v in values) else statistics.fmean(values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "init": self.init,
            "description": self.description,
            **{key: self.averaged(key) for key in SPECTRUM_KEYS},
            "predicted_mean": self.predicted_mean,
            "predicted_variance": self.predicted_variance,
            "theory_note": self.why,
            "draws": self.draws,
            "histogram": self.histogram,
            "predicted_density": self.predicted_density,
            **({"depths": self.depths} if self.depths else {}),
        }


class SpectrumResult(Document):
    """The ``spectrum`` document: one ``SpectrumRun`` per init (``Document``)."""

    SCHEMA = SPECTRUM_SCHEMA
