"""Rendering only (STYLE.md habit 5): rich tables, JSON, CSV.  Nothing here computes a
statistic; numbers are formatted from the result records as they are."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sigprop.results import ProbeResult, RatioStats, RunResult, TheoryResult

#: the table shows at most this many layers (first, last, evenly spaced); JSON/CSV have all
MAX_TABLE_ROWS = 40


def fmt_log10(x: float | None, digits: int = 3) -> str:
    """Format 10**x without computing it in floating point when it would not fit."""
    if x is None:
        return "—"
    if -4 <= x < 5:
        return f"{10.0 ** x:.{digits}g}"
    e = math.floor(x)
    return f"{10.0 ** (x - e):.{digits - 1}f}e{e:+d}"


def fmt_num(v: float | None, digits: int = 3) -> str:
    """Compact: 3 significant digits between 0.01 and 1000, else scientific (8.38e-04)."""
    if v is None:
        return "—"
    if v == 0.0 or 0.01 <= abs(v) < 1000.0:
        return f"{v:.{digits}g}"
    mantissa, exponent = f"{v:.{digits - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _value(v: float | None, log10: float | None) -> str:
    """A ratio: from its float when it fits, else from its log10 (same quantity)."""
    if v is not None and v != 0.0:
        return fmt_num(v)
    return fmt_log10(log10)


def _mean_std(s: RatioStats) -> str:
    return f"{fmt_num(s.mean)}±{fmt_num(s.std, 2)}"


def _theory_cell(s: RatioStats) -> Text:
    """The prediction with its agreement mark: ✓ within the finite-width band, ✗ outside,
    · no closed form."""
    cell = Text(_value(s.predicted, s.log10_predicted) + " ")
    if s.agrees is None:
        cell.append("·", style="dim")
    else:
        cell.append("✓", style="green") if s.agrees else cell.append("✗", style="bold red")
    return cell


def table_rows(n_layers: int, limit: int = MAX_TABLE_ROWS) -> list[int]:
    """Indices (0-based) of the layers the table shows: all up to ``limit``, else an even subset
    that always includes the first and the last layer."""
    if n_layers <= limit:
        return list(range(n_layers))
    step = (n_layers - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


def run_table(run: RunResult) -> Table:
    t = Table(
        title=f"[bold]{run.init}[/bold] — {run.description}",
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 0, 0, 1),
    )
    t.add_column("layer", justify="right", no_wrap=True, min_width=5)
    t.add_column("n_l", justify="right", no_wrap=True, min_width=4)
    t.add_column("fwd mean±std", justify="right", no_wrap=True)
    t.add_column("rms", justify="right", no_wrap=True)
    t.add_column("theory", justify="right", no_wrap=True)
    t.add_column("bwd mean±std", justify="right", no_wrap=True)
    t.add_column("rms", justify="right", no_wrap=True)
    t.add_column("theory", justify="right", no_wrap=True)
    for i in table_rows(len(run.layers)):
        r = run.layers[i]
        f, b = r.forward, r.backward
        t.add_row(
            str(r.index),
            str(r.width),
            _mean_std(f),
            _value(f.rms, f.log10_rms),
            _theory_cell(f),
            _mean_std(b),
            _value(b.rms, b.log10_rms),
            _theory_cell(b),
        )
    return t


def run_summary(run: RunResult) -> Text:
    ag = run.agreement()
    parts = []
    for c in run.checks:
        status = "[green]pass[/green]" if c.passed else "[red]FAIL[/red]"
        parts.append(f"{c.name} {fmt_log10(c.log10_measured)} in [{fmt_log10(c.log10_low)}, {fmt_log10(c.log10_high)}] {status}")
    agree = ", ".join(
        f"{d} {v['layers_agreeing']}/{v['layers_compared']}" if v["layers_compared"] else f"{d} no closed form"
        for d, v in ag.items()
    )
    return Text.from_markup(f"[bold]{run.init}[/bold]: " + "; ".join(parts) + f"; agrees with theory: {agree}")


def render_table(result: ProbeResult, console: Console) -> None:
    for run in result.runs:
        console.print(run_table(run))
        n = len(run.layers)
        shown = len(table_rows(n))
        if shown < n:
            console.print(f"[dim](showing {shown} of {n} layers; --format json or csv has all)[/dim]")
    console.print(
        "[dim]mean ± std over samples of ||h^l||/||x|| (forward) and ||dl/da^l||/||e|| (backward); "
        "theory = closed-form rms; ✓/✗ = measured rms within the finite-width band of the theory[/dim]"
    )
    for run in result.runs:
        console.print(run_summary(run))
    verdict = "[green]all checks passed[/green]" if result.passed else "[red]some checks failed[/red]"
    console.print(f"checks: {verdict}")


def to_json(obj: Any) -> str:
    return json.dumps(obj.to_dict(), indent=2, allow_nan=False) + "\n"


CSV_FIELDS = ("mean", "std", "rms", "log10_mean", "log10_std", "predicted", "log10_predicted", "agrees")


def to_csv(result: ProbeResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    header = ["init", "layer", "width"] + [f"forward_{k}" for k in CSV_FIELDS] + [f"backward_{k}" for k in CSV_FIELDS]
    w.writerow(header)
    for run in result.runs:
        for r in run.layers:
            row: list[Any] = [run.init, r.index, r.width]
            for s in (r.forward, r.backward):
                d = s.to_dict()
                d["agrees"] = d["agreement"]["agrees"]
                row += ["" if d[k] is None else d[k] for k in CSV_FIELDS]
            w.writerow(row)
    return buf.getvalue()


def render_theory(result: TheoryResult, console: Console) -> None:
    t = Table(title="K_n (Theorem 1, 001 eq. 3 / 9)", title_justify="left", header_style="bold")
    t.add_column("n", justify="right")
    t.add_column("closed form", justify="right")
    t.add_column("quadrature", justify="right")
    t.add_column("|difference|", justify="right")
    for r in result.kn:
        t.add_row(str(r.n), f"{r.closed_form:.15f}", f"{r.quadrature:.15f}", f"{abs(r.closed_form - r.quadrature):.1e}")
    console.print(t)
    if result.resnet:
        t = Table(title="ResNet ratio (1 + 1/B)^{B/2} (Theorems 3-4, 001 eq. 53, 63)", title_justify="left", header_style="bold")
        t.add_column("blocks B", justify="right")
        t.add_column("ratio", justify="right")
        t.add_column("band [sqrt 2, sqrt e]", justify="right")
        for r in result.resnet:
            t.add_row(str(r.blocks), f"{r.ratio:.6f}", f"[{r.lower:.6f}, {r.upper:.6f}] {'✓' if r.inside else '✗'}")
        console.print(t)


def render_inits(rows: Sequence[tuple[str, str, str]], console: Console) -> None:
    t = Table(title="init schemes", title_justify="left", header_style="bold")
    t.add_column("name")
    t.add_column("description")
    t.add_column("paper")
    for row in rows:
        t.add_row(*row)
    console.print(t)
