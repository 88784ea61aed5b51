"""What every report shares: number formats, the table frame and its rows, the verdicts' words
and a gate's, JSON, and a model's notes.  Rendering only: nothing here computes a statistic."""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

#: the table shows at most this many rows (41: a 40-block ResNet's states h^0..h^40) (first, last, evenly
#: spaced); JSON/CSV have all
MAX_TABLE_ROWS = 41


def fmt_log10(x: float | None, digits: int = 3) -> str:
    """Format 10**x without computing it in floating point when it would not fit."""
    if x is None:
        return "—"
    if -4 <= x < 5:
        return f"{10.0**x:.{digits}g}"
    e = math.floor(x)
    return f"{10.0 ** (x - e):.{digits - 1}f}e{e:+d}"


def fmt_num(v: float | None, digits: int = 3) -> str:
    """Compact: 3 significant digits between 0.01 and 1000, else scientific (8.38e-4)."""
    if v is None:
        return "—"
    if v == 0.0 or 0.01 <= abs(v) < 1000.0:
        text = f"{v:.{digits}g}"
        return text if "e" not in text else f"{v:.0f}"  # 850 with 2 digits: '8.5e+02' -> '850'

    mantissa, exponent = f"{v:.{digits - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _value(v: float | None, log10: float | None) -> str:
    """A ratio: from its float when it fits, else from its log10 (same quantity)."""
    if v is not None and v != 0.0:
        return fmt_num(v)
    return fmt_log10(log10)


def table_rows(n_layers: int, limit: int = MAX_TABLE_ROWS, keep: Sequence[int] = ()) -> list[int]:
    """Indices (0-based) of the rows the table shows: all up to ``limit``, else an even subset
    that always includes the first and the last row and every index in ``keep`` (stage bounds)."""
    if n_layers <= limit:
        return list(range(n_layers))
    step = (n_layers - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)} | {k for k in keep if 0 <= k < n_layers})


class _Titled:
    """A table under its title line: the title is printed at the console's width, not wrapped to
    the table's (a long init description folded into the table's width read as two lines)."""

    def __init__(self, title: str, table: Table) -> None:
        self.title, self.table = title, table

    def __rich_console__(self, console, options):
        yield Text.from_markup(self.title)
        yield self.table

    def __getattr__(self, name):  # add_column, add_row, columns, ... are the table's
        return getattr(self.table, name)


def _table(title: str) -> "_Titled":
    """The probe tables' one style: a title line, bold header, a rule under it, no outer padding."""
    return _Titled(
        title, Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
    )


#: how each verdict reads (one meaning per word and colour: green/red are the 'preserved' verdict
#: only; agreement with theory is cyan '=' / yellow '≠')
VERDICT_WORDS = {
    "preserved": "signal preserved",
    "theory": "agrees with finite-width theory",
    "correlation": "inputs kept apart (--max-correlation)",
    "tokens": "tokens kept apart (--max-token-cosine)",
    "curvature": "lowest curvature of the inits listed",
}


def verdict_words(verdict: str) -> str:
    """How a verdict reads; a plug-in measurement's gate reads as its name."""
    return VERDICT_WORDS.get(verdict, verdict)


def count(n: int, word: str) -> str:
    """``1 thread``, ``2 threads``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def to_json(obj: Any) -> str:
    return json.dumps(obj.to_dict(), indent=2, allow_nan=False) + "\n"


def to_json_line(obj: Any) -> str:
    """One result as one JSON line (a sweep of ``--arg``: one line per configuration)."""
    return json.dumps(obj.to_dict(), allow_nan=False) + "\n"


def gate_text(c) -> str:
    """``typical forward ratio at layer 20 1.02 in [0.5, 2]`` for one gate (a ``results.Check``):
    the measured value is the geometric mean over samples and draws."""
    if c.verdict in ("correlation", "tokens"):
        if c.cosine != c.cosine:  # nan: nothing measured there
            return f"{c.name}: {c.note}"
        word = "<=" if c.passed else ">"
        return f"{c.name} {c.cosine:.4f} {word} {c.high:g}"
    if c.verdict == "curvature":
        other = "none" if not math.isfinite(c.log10_high) else fmt_log10(c.log10_high)
        return (
            f"{c.name}: {'diverged' if c.log10_measured is None else fmt_log10(c.log10_measured)} "
            f"{'<' if c.passed else '>='} {other} (the lowest other, mean over draws)"
        )
    lead = "" if c.name.startswith("RMS ") else "typical "  # a traced model's theory reads the RMS
    if not c.has_band:
        return f"{lead}{c.name} {fmt_log10(c.log10_measured)}: {c.note}"
    aside = f" ({c.note})" if c.passed and c.note else ""  # where it was read, when not at the end
    if math.isinf(c.log10_high):  # a floor only (tokens kept apart)
        word = ">=" if c.passed else "<"
        return f"{lead}{c.name} {fmt_log10(c.log10_measured)} {word} {fmt_log10(c.log10_low)}{aside}"
    word = "in" if c.passed else "outside"
    return (
        f"{lead}{c.name} {fmt_log10(c.log10_measured)} {word} [{fmt_log10(c.log10_low)}, "
        f"{fmt_log10(c.log10_high)}]{aside}"
    )


def model_notes(result, console: Console) -> None:
    """A model's notes (the spectrum's and the curvature's): what an init left or assumed, which
    output was read, the parameters the curvature left out."""
    for note in result.config.get("model_notes") or ():
        console.print(f"[yellow]{escape(note)}[/yellow]", soft_wrap=True, highlight=False)
