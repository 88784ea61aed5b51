"""``sigprop check``: one line per (check, init) saying what was expected and what failed, a
summary, JSON and JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from sigprop.report.common import gate_text, to_json, verdict_words


def _gate_verdicts(outcome) -> list[str]:
    """The questions an outcome's gates ask, in words: its verdict, and the correlation bound when set."""
    return list(
        dict.fromkeys([verdict_words(outcome.verdict)] + [verdict_words(c.verdict) for c in outcome.gates])
    )


def _failed(outcome) -> list[str]:
    """The questions whose gates failed, in words."""
    return list(dict.fromkeys(verdict_words(c.verdict) for c in outcome.gates if not c.passed))


def expectation(outcome) -> str:
    """What the check expected and what happened, in words that cannot be read the other way: an
    ``expect = "fail"`` check passes when at least one of its gates fails, and the line says which."""
    asked, failed = _gate_verdicts(outcome), _failed(outcome)
    if outcome.expect == "pass":
        text = "expected to hold: " + " and ".join(asked)
        return text + ("" if not failed else "; failed: " + ", ".join(failed))
    one = asked[0] if len(asked) == 1 else "one of " + ", ".join(asked)
    return f"expected to fail: {one}; " + ("failed: " + ", ".join(failed) if failed else "none failed")


def check_line(outcome) -> str:
    """One line: verdict, check name, init, what was expected and what happened, and every gate
    measured vs band."""
    verdict = "PASS" if outcome.ok else "FAIL"
    gates = "; ".join(gate_text(c) for c in outcome.gates) or "no gate"
    return f"{verdict}  {outcome.name} [{outcome.init}] ({expectation(outcome)}): {gates}"


def check_summary(outcomes, seconds: float) -> str:
    ok = sum(o.ok for o in outcomes)
    return f"{ok} passed, {len(outcomes) - ok} failed in {seconds:.1f} s"


def check_json(report_obj) -> str:
    return to_json(report_obj)


def junit_xml(report_obj) -> str:
    """JUnit XML (one testsuite, one testcase per check and init) for CI systems to display."""
    outcomes = report_obj.outcomes
    suite = ET.Element(
        "testsuite",
        name="sigprop",
        tests=str(len(outcomes)),
        failures=str(sum(not o.ok for o in outcomes)),
        errors="0",
        skipped="0",
        time=f"{report_obj.seconds:.3f}",
    )
    for o in outcomes:
        case = ET.SubElement(
            suite, "testcase", classname=f"sigprop.{o.name}", name=o.init, time=f"{o.seconds:.3f}"
        )
        text = "\n".join(gate_text(c) for c in o.gates)
        if not o.ok:
            fail = ET.SubElement(case, "failure", message=check_line(o), type="SignalCheck")
            fail.text = text
        else:
            ET.SubElement(case, "system-out").text = text
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
