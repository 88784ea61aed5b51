"""sigprop/report/: rendering only -- numbers formatted as the records hold them (far beyond a
float's range too), the rows a table shows, the words of every verdict, and a net kind's own
labels read from its hints."""

import io

from rich.console import Console

from sigprop import api, report, specs
from sigprop.kinds.resnet import ResNetSpec
from sigprop.results import Check


def test_numbers_beyond_a_float_are_formatted_from_their_log():
    assert report.fmt_log10(0.0) == "1" and report.fmt_log10(-451.5) == "3.16e-452"
    assert report.fmt_log10(None) == "—" and report.fmt_num(8.4e-4) == "8.40e-4"


def test_a_long_table_keeps_its_ends_and_the_rows_asked_for():
    rows = report.table_rows(3000, limit=41, keep=[1234])
    assert rows[0] == 0 and rows[-1] == 2999 and 1234 in rows and len(rows) <= 42
    assert report.table_rows(10) == list(range(10))


def test_every_verdict_has_words_and_a_plug_in_reads_as_its_name():
    for v in ("preserved", "theory", "correlation", "curvature"):
        assert report.verdict_words(v) != v
    assert report.verdict_words("activity") == "activity"
    c = Check("forward ratio at layer 20", False, -3.0, -1.0, 1.0)
    assert report.gate_text(c) == "typical forward ratio at layer 20 0.001 outside [0.1, 10]"


def test_a_kinds_hints_label_its_table():
    r = api.probe(
        ResNetSpec(blocks=2, dim=16, width=specs.WidthSpec(8, 8), inits=("proposed",)),
        specs.ProbeSpec(samples=8, device="cpu"),
    )
    console = Console(file=io.StringIO(), width=200, color_system=None)
    report.render_table(r, console)
    text = console.file.getvalue()
    assert " b " in text and "branch" in text and "band [√2, √e] = [1.414, 1.649] per stage" in text
    header = report.to_csv(r).splitlines()[0].split(",")
    assert header[:4] == ["init", "index", "stage", "width"] and "branch_mean" in header
