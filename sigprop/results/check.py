"""``sigprop check``'s records (``sigprop.check.v1``): one outcome per entry of a TOML file, and
the report over them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sigprop.results.common import Check

CHECK_SCHEMA = "sigprop.check.v1"


@dataclass
class CheckOutcome:
    """One init of one ``sigprop check`` entry: its gates and whether they met the expectation
    (``expect`` "pass": every gate passed; "fail": at least one failed)."""

    name: str
    command: str
    init: str
    expect: str
    gates: list[Check]
    seconds: float = 0.0
    description: str = ""
    #: the verdict the gates answer: "preserved" or "theory"
    verdict: str = "preserved"

    @property
    def signal_passed(self) -> bool:
        return bool(self.gates) and all(c.passed for c in self.gates)

    @property
    def ok(self) -> bool:
        return self.signal_passed == (self.expect == "pass")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "init": self.init,
            "expect": self.expect,
            "verdict": self.verdict,
            "signal_passed": self.signal_passed,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "description": self.description,
            "gates": [c.to_dict() for c in self.gates],
        }


@dataclass
class CheckReport:
    source: str
    outcomes: list[CheckOutcome]
    seconds: float
    results: dict[str, Any] = field(default_factory=dict)  # name -> ProbeResult.to_dict()

    @property
    def passed(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": CHECK_SCHEMA,
            "source": self.source,
            "passed": self.passed,
            "summary": {
                "passed": sum(o.ok for o in self.outcomes),
                "failed": sum(not o.ok for o in self.outcomes),
                "seconds": round(self.seconds, 3),
            },
            "checks": [o.to_dict() for o in self.outcomes],
            "results": self.results,
        }
