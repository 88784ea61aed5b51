"""The curvature at init (``sigprop hessian``, ``sigprop.hessian.v1``): per init and weight draw
the Hessian's largest eigenvalue, its top-k, trace and density."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from sigprop.results.common import Document

HESSIAN_SCHEMA = "sigprop.hessian.v1"


@dataclass
class CurvatureDraw:
    """One weight draw: the eigenvalue of largest magnitude (restarted Lanczos; None: diverged),
    the Hessian-vector products it took (``iterations``), the residual ||Hy - ly||/|l| of its Ritz
    vector and its status, Lanczos' top eigenvalues (``--top``), Hutchinson's
    trace and standard error, the loss at init and the parameter count."""

    draw: int
    eigenvalue: float | None
    iterations: int
    residual: float | None
    status: str
    top: list = field(default_factory=list)
    trace: float | None = None
    trace_se: float | None = None
    loss: float | None = None
    parameters: int = 0
    seconds: float = 0.0
    #: ``--density``: per probe the stochastic Lanczos quadrature's nodes and weights, and its
    #: trace estimate (sigprop/hessian.py, ``slq``)
    density: dict | None = None
    #: ``--per-layer``: per layer (in order) its name, parameter count and the largest-magnitude
    #: eigenvalue of its diagonal block (None: diverged), with the products spent
    blocks: list[dict] | None = None

    def to_dict(self) -> dict[str, Any]:
        f = lambda v: None if v is None or not math.isfinite(v) else v
        return {
            "draw": self.draw,
            "eigenvalue": f(self.eigenvalue),
            "log10_spectral_norm": None if not self.eigenvalue else math.log10(abs(self.eigenvalue)),
            "iterations": self.iterations,
            "residual": f(self.residual),
            "status": self.status,
            "top": [f(v) for v in self.top],
            "trace": f(self.trace),
            "trace_se": f(self.trace_se),
            "loss": f(self.loss),
            "parameters": self.parameters,
            "seconds": round(self.seconds, 3),
            **({"density": self.density} if self.density is not None else {}),
            **({"blocks": self.blocks} if self.blocks is not None else {}),
        }


@dataclass
class CurvatureRun:
    init: str
    description: str
    draws: list[CurvatureDraw]

    @property
    def log10_norms(self) -> list[float]:
        return [math.log10(abs(d.eigenvalue)) for d in self.draws if d.status != "diverged" and d.eigenvalue]

    @property
    def diverged(self) -> bool:
        return not self.log10_norms

    def summary(self) -> tuple[float | None, float | None]:
        """log10 spectral norm: mean and sd over the draws that did not diverge (Table 2's form)."""
        v = self.log10_norms
        if not v:
            return None, None
        return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else None)

    def to_dict(self) -> dict[str, Any]:
        m, sd = self.summary()
        return {
            "init": self.init,
            "description": self.description,
            "log10_spectral_norm_mean": m,
            "log10_spectral_norm_std": sd,
            "diverged": self.diverged,
            "draws": [d.to_dict() for d in self.draws],
        }


class HessianResult(Document):
    """The ``hessian`` document: one ``CurvatureRun`` per init (``Document``)."""

    SCHEMA = HESSIAN_SCHEMA
