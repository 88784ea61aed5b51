"""Result records and the JSON contract (../shared/STYLE.md habit 5): this package, and nowhere
else, decides the keys of every document sigprop writes -- one module per feature: ``probe``
(``sigprop.result.v1``), ``curvature`` (``sigprop.hessian.v1``), ``spectrum``
(``sigprop.spectrum.v1``), ``check`` (``sigprop.check.v1``), ``sweep`` (``sigprop.sweep.v1``;
``sigprop.sweep.failed.v1``: a point that raised), ``tables`` (``sigprop.theory.v1``), ``width``
(``sigprop.width.v1``), and what they share (``common``).  Every name is re-exported here.
Plain data; no torch."""

from sigprop.results.check import (
    CHECK_SCHEMA,
    CheckOutcome,
    CheckReport,
)
from sigprop.results.common import (
    RESULT_SCHEMA,
    THEORY_SCHEMA,
    VERDICTS,
    Check,
    Measurement,
    compare_documents,
    rerun_differences,
)
from sigprop.results.curvature import (
    HESSIAN_SCHEMA,
    CurvatureDraw,
    CurvatureRun,
    HessianResult,
)
from sigprop.results.probe import (
    INFORMATIVE_DECADES,
    NO_TEST,
    BNStats,
    CorrelationStats,
    CorrelationSummary,
    CosineCheck,
    LayerRecord,
    ProbeResult,
    RatioStats,
    RunResult,
    StageInfo,
    TokenStats,
    probe_config,
    separates,
)
from sigprop.results.spectrum import (
    SPECTRUM_KEYS,
    SPECTRUM_SCHEMA,
    SpectrumResult,
    SpectrumRun,
)
from sigprop.results.sweep import (
    FAILED_SCHEMA,
    SHARD_SCHEMA,
    SWEEP_SCHEMA,
    curvature_row,
    spectrum_row,
    sweep_row,
)
from sigprop.results.tables import (
    KnRow,
    ResnetRow,
    TheoryResult,
)
from sigprop.results.width import WIDTH_SCHEMA, SiteSlope, WidthResult, WidthRun

__all__ = [
    "BNStats",
    "CHECK_SCHEMA",
    "Check",
    "CheckOutcome",
    "CheckReport",
    "CorrelationStats",
    "TokenStats",
    "CorrelationSummary",
    "CosineCheck",
    "CurvatureDraw",
    "CurvatureRun",
    "HESSIAN_SCHEMA",
    "HessianResult",
    "INFORMATIVE_DECADES",
    "KnRow",
    "LayerRecord",
    "Measurement",
    "NO_TEST",
    "ProbeResult",
    "RESULT_SCHEMA",
    "RatioStats",
    "ResnetRow",
    "RunResult",
    "SPECTRUM_KEYS",
    "SPECTRUM_SCHEMA",
    "SHARD_SCHEMA",
    "SWEEP_SCHEMA",
    "FAILED_SCHEMA",
    "SpectrumResult",
    "SpectrumRun",
    "StageInfo",
    "THEORY_SCHEMA",
    "TheoryResult",
    "VERDICTS",
    "compare_documents",
    "curvature_row",
    "probe_config",
    "rerun_differences",
    "separates",
    "spectrum_row",
    "sweep_row",
    "WIDTH_SCHEMA",
    "SiteSlope",
    "WidthResult",
    "WidthRun",
]
