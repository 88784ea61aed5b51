"""Rendering only (../shared/STYLE.md habit 5): rich tables, JSON, CSV -- one module per feature
(``probe``, ``curvature``, ``spectrum``, ``check``, ``tables``, ``width``) and what they share
(``common``).  Nothing here computes a statistic; numbers are formatted from the result records
as they are.  Every name is re-exported here."""

from sigprop.report.check import (
    check_json,
    check_line,
    check_summary,
    expectation,
    junit_xml,
)
from sigprop.report.common import (
    MAX_TABLE_ROWS,
    VERDICT_WORDS,
    count,
    fmt_log10,
    fmt_num,
    gate_text,
    model_notes,
    table_rows,
    to_json,
    to_json_line,
    verdict_words,
)
from sigprop.report.curvature import (
    TOP_SHOWN,
    hessian_banner,
    hessian_table,
    render_hessian,
)
from sigprop.report.probe import (
    CSV_FIELDS,
    bn_table,
    correlation_lines,
    correlation_table,
    measurement_lines,
    measurement_table,
    preserved_line,
    render_sweep_summary,
    render_table,
    resnet_table,
    run_summary,
    run_table,
    spread_line,
    stage_lines,
    to_csv,
)
from sigprop.report.spectrum import (
    render_spectrum,
)
from sigprop.report.sweep import point_line
from sigprop.report.tables import (
    render_inits,
    render_theory,
)
from sigprop.report.width import render_width, width_table

__all__ = [
    "CSV_FIELDS",
    "MAX_TABLE_ROWS",
    "TOP_SHOWN",
    "VERDICT_WORDS",
    "bn_table",
    "check_json",
    "check_line",
    "check_summary",
    "correlation_lines",
    "correlation_table",
    "count",
    "expectation",
    "fmt_log10",
    "fmt_num",
    "gate_text",
    "hessian_banner",
    "hessian_table",
    "junit_xml",
    "measurement_lines",
    "measurement_table",
    "model_notes",
    "point_line",
    "preserved_line",
    "render_hessian",
    "render_inits",
    "render_spectrum",
    "render_sweep_summary",
    "render_table",
    "render_theory",
    "resnet_table",
    "run_summary",
    "run_table",
    "spread_line",
    "stage_lines",
    "table_rows",
    "to_csv",
    "to_json",
    "to_json_line",
    "verdict_words",
    "render_width",
    "width_table",
]
