"""sigprop/results/: the records and the JSON contract -- what each verdict means, how plug-in
gates join ``passed``, and the keys of the documents (one source for each)."""

import json
import math

from sigprop import results
from sigprop.results import Check, CosineCheck, LayerRecord, Measurement, RatioStats, RunResult


def _stats(**kw) -> RatioStats:
    base = dict(
        mean=1.0,
        std=0.1,
        rms=1.0,
        log10_mean=0.0,
        log10_std=0.04,
        log10_rms=0.0,
        draw_std=None,
        log10_draw_std=None,
        dead_fraction=0.0,
    )
    return RatioStats(**{**base, **kw})


def _run(checks, gate="preserved", measurements=()) -> RunResult:
    layer = LayerRecord(index=1, width=8, forward=_stats(), backward=_stats())
    return RunResult("proposed", [8], [layer], list(checks), gate=gate, measurements=list(measurements))


def _check(verdict, passed, low=-1.0):
    return Check(f"{verdict} gate", passed, 0.0, low, 1.0, verdict)


def test_the_two_verdicts_answer_different_questions():
    run = _run([_check("preserved", True), _check("theory", False)])
    assert run.preserved and not run.agrees_with_theory and run.passed  # the gate is 'preserved'
    assert not _run(run.checks, gate="theory").passed


def test_a_missing_prediction_is_untestable_not_a_disagreement():
    run = _run([_check("preserved", True), _check("theory", True), _check("theory", False, low=math.nan)])
    assert run.untestable and not run.agrees_with_theory
    assert not _run([_check("theory", False), _check("theory", False, low=math.nan)]).untestable


def test_extra_gates_join_passed_whatever_the_gate():
    cos = CosineCheck("mean cosine at the last state", False, 0.95, 0.9)
    plugin = Check("fraction of units active", True, -0.3, -0.5, 0.0, "activity")
    run = _run([_check("preserved", True), _check("theory", True), cos, plugin])
    assert run.extra_checks() == [cos, plugin] and not run.passed
    assert run.gate_checks() == [run.checks[0], cos, plugin]


def test_documents_are_json_with_their_schema():
    m = Measurement("activity", "fraction of units active", ["active"], [[0.5]], [], log=False)
    run = _run([_check("preserved", True)], measurements=[m])
    doc = results.ProbeResult("mlp", {"depth": 1}, {"device": "cpu"}, [run]).to_dict()
    assert doc["schema"] == results.RESULT_SCHEMA and doc["passed"] is True
    assert doc["runs"][0]["measurements"] == [
        {
            "name": "activity",
            "title": "fraction of units active",
            "columns": ["active"],
            "rows": [[0.5]],
            "checks": [],
        }
    ]
    json.dumps(doc, allow_nan=False)  # no nan or inf reaches a document
    assert set(doc["runs"][0]["layers"][0]["forward"]) >= {
        "mean",
        "rms",
        "log10_mean",
        "predicted",
        "agreement",
    }


def test_non_finite_numbers_become_null():
    s = _stats(mean=math.inf, log10_rms=math.nan)
    d = s.to_dict()
    assert d["mean"] is None and d["log10_rms"] is None


def test_theory_document_keys_are_the_records_fields():
    doc = results.TheoryResult(
        [results.KnRow(2, 1.0, 1.0)], [results.ResnetRow(1, 1.5, 1.4, 1.6, True)]
    ).to_dict()
    assert doc == {
        "schema": results.THEORY_SCHEMA,
        "kn": [{"n": 2, "closed_form": 1.0, "quadrature": 1.0}],
        "resnet": [{"blocks": 1, "ratio": 1.5, "lower": 1.4, "upper": 1.6, "inside": True}],
    }


def test_compare_documents_counts_numbers_and_lists_what_moved():
    count, diffs = results.compare_documents(
        {"a": [1, 2.0, {"b": 3}], "c": "x"}, {"a": [1, 2.5, {"b": 3}], "c": "x"}
    )
    assert count == 3 and diffs == [("a[1]", 2.0, 2.5)]
    assert results.compare_documents([1, 2], [1])[1] == [("", "2 items", "1 items")]
