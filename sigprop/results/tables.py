"""``sigprop theory``'s tables (``sigprop.theory.v1``): K_n per width and the ResNet ratio per
number of blocks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from sigprop.results.common import THEORY_SCHEMA


@dataclass
class KnRow:
    n: int
    closed_form: float
    quadrature: float


@dataclass
class ResnetRow:
    blocks: int
    ratio: float
    lower: float
    upper: float
    inside: bool


@dataclass
class TheoryResult:
    kn: list[KnRow]
    resnet: list[ResnetRow]

    def to_dict(self) -> dict[str, Any]:
        """``sigprop.theory.v1``: a list of rows per table, each keyed by the record's fields."""
        return {
            "schema": THEORY_SCHEMA,
            **{f.name: [asdict(row) for row in getattr(self, f.name)] for f in fields(self)},
        }
