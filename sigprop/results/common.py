"""What every result document shares: the schemas' names, a float made JSON-safe, a verdict's
``Check``, a plug-in's ``Measurement``, the runs-document of the curvature and the spectrum
(``Document``), and the leaf-by-leaf comparison of two documents (``sigprop rerun``).  Plain
data; no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

RESULT_SCHEMA = "sigprop.result.v1"


THEORY_SCHEMA = "sigprop.theory.v1"


def _num(x: float | None) -> float | None:
    """JSON-safe float: None for missing or non-finite values."""
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def _pow10(x: float) -> float | None:
    if x > 308.0 or x < -323.0:
        return None
    return 10.0**x


#: the two verdicts a run carries (specs.GATES): ``preserved`` -- the typical ratio lies in an
#: absolute band around norm preservation; ``theory`` -- it agrees with the init's own
#: finite-width prediction.  They answer different questions and are never merged.
VERDICTS = ("preserved", "theory")


@dataclass
class Check:
    """One gate: ``measured`` (the geometric-mean ratio over samples and draws) inside [low, high].
    ``verdict`` says which question it answers (``VERDICTS``); ``note`` explains a failure."""

    name: str
    passed: bool
    log10_measured: float | None
    log10_low: float
    log10_high: float
    verdict: str = "preserved"
    note: str = ""

    @property
    def measured(self) -> float | None:
        return None if self.log10_measured is None else _pow10(self.log10_measured)

    @property
    def has_band(self) -> bool:
        """False for a ``theory`` check of an init without a closed form (its band is NaN)."""
        return not math.isnan(self.log10_low)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "passed": self.passed,
            "note": self.note,
            "measured": _num(self.measured),
            "low": _num(_pow10(self.log10_low)),
            "high": _num(_pow10(self.log10_high)),
            "log10_measured": _num(self.log10_measured),
            "log10_low": _num(self.log10_low),
            "log10_high": _num(self.log10_high),
        }


@dataclass
class Measurement:
    """A plug-in observer's record of one init's run (sigprop/observers/): per row (aligned with
    ``RunResult.layers``) the values of its ``columns`` -- None where it has none -- a title for
    its table, whether the figure draws it on a log axis, and the gates it adds (``checks``,
    their verdict the observer's ``name``; ANDed into ``passed``)."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[float | None]]
    checks: list = field(default_factory=list)
    log: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "columns": list(self.columns),
            "rows": [[_num(v) for v in row] for row in self.rows],
            "checks": [c.to_dict() for c in self.checks],
        }


def compare_documents(old: Any, new: Any, path: str = "") -> tuple[int, list[tuple[str, Any, Any]]]:
    """Compare two JSON documents leaf by leaf: (numbers compared, [(path, old, new)] for every
    leaf that differs).  Used by ``sigprop rerun``; exact comparison, floats included."""
    if isinstance(old, dict) and isinstance(new, dict):
        count, diffs = 0, []
        for k in sorted(set(old) | set(new)):
            c, d = compare_documents(old.get(k), new.get(k), f"{path}.{k}" if path else k)
            count, diffs = count + c, diffs + d
        return count, diffs
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return 1, [(path, f"{len(old)} items", f"{len(new)} items")]
        count, diffs = 0, []
        for i, (a, b) in enumerate(zip(old, new)):
            c, d = compare_documents(a, b, f"{path}[{i}]")
            count, diffs = count + c, diffs + d
        return count, diffs
    number = isinstance(old, (int, float)) and not isinstance(old, bool)
    return (1 if number else 0), ([] if old == new else [(path, old, new)])


def rerun_differences(doc: dict, new) -> tuple[int, list[tuple[str, Any, Any]], list[tuple[str, Any, Any]]]:
    """``sigprop rerun`` of a document ``doc`` as result ``new`` (its ``to_dict`` and
    ``environment``): (numbers compared, numbers that differ as (path, old, new), and the
    environment entries that moved -- sigprop, torch, device name, threads -- as (key, old, new))."""
    count, diffs = compare_documents(doc.get("runs"), new.to_dict()["runs"])
    old_env = doc.get("environment", {})
    moved = [
        (k, old_env.get(k), new.environment.get(k))
        for k in ("sigprop", "torch", "device_name", "threads")
        if old_env.get(k) != new.environment.get(k)
    ]
    return count, diffs, moved


@dataclass
class Document:
    """A document of runs, one per init, as the curvature and the spectrum write it: the
    command, its config and environment records, and the runs (each with its ``to_dict``);
    ``SCHEMA`` names the schema of the subclass."""

    SCHEMA: ClassVar[str] = ""
    command: str
    config: dict
    environment: dict
    runs: list

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "runs": [r.to_dict() for r in self.runs],
        }
