"""The coordinate check (``sigprop width``, ``sigprop.width.v1``): per parametrization, each
site's fitted width slopes per step beside the exponents theory predicts, and two verdicts kept
apart: ``width_stable`` (measured: no activation nor update grows with the width faster than the
gate's slope) and ``theory`` (the slopes agree with the exponents, where derived)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from sigprop.results.common import Document

WIDTH_SCHEMA = "sigprop.width.v1"


@dataclass
class SiteSlope:
    """One site at one step: the fitted slope (and its standard error) of log mean|x| (``l1``)
    and of log rms(h_t - h_0) (``delta``) against log width; the predicted exponents (None: not
    derived): ``init`` for the activation at step 0, [``low``, ``high``] for the update; and the
    measured values per width (mean over seeds)."""

    site: str
    role: str
    step: int
    l1: float | None
    l1_se: float | None
    delta: float | None
    delta_se: float | None
    init: float | None
    low: float | None
    high: float | None
    l1_values: list[float]
    delta_values: list[float]
    #: "=", "≠" or "" (nothing to compare), this site's and step's agreement with theory
    agrees: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class WidthRun:
    """One parametrization: its slopes, its verdicts, and the words for them."""

    param: str
    description: str
    slopes: list[SiteSlope]
    width_stable: bool
    stable_words: str
    theory: str  # "agrees", "differs", "not derived"
    theory_words: str
    loss: list[list[float]] = field(default_factory=list)  # per width, mean over seeds per step

    def to_dict(self) -> dict[str, Any]:
        return {
            "param": self.param,
            "description": self.description,
            "width_stable": self.width_stable,
            "stable_verdict": self.stable_words,
            "theory": self.theory,
            "theory_verdict": self.theory_words,
            "loss": self.loss,
            "slopes": [s.to_dict() for s in self.slopes],
        }


@dataclass
class WidthResult(Document):
    """A coordinate check: its command, configuration and environment, one run per
    parametrization; ``passed`` when every run is width-stable."""

    SCHEMA: ClassVar[str] = WIDTH_SCHEMA
    #: what the run says beside its verdicts: points files' points of other options, attention
    #: calls μP could not rescale, a readout read off the output
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.width_stable for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "width_stable": self.passed, "notes": list(self.notes)}
