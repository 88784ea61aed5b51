"""Rendering only (../shared/STYLE.md habit 5): rich tables, JSON, CSV.  Nothing here computes a
statistic; numbers are formatted from the result records as they are."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import xml.etree.ElementTree as ET
from typing import Any, Sequence

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sigprop import kinds, specs
from sigprop.results import ProbeResult, RatioStats, RunResult, TheoryResult

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


def _mean_std(s: RatioStats) -> str:
    """mean±std over samples; with one sample there is no spread: ``0.85 (1 sample)``."""
    if s.std is None and s.log10_std is None:
        return f"{fmt_num(s.mean)} (1 sample)"
    return f"{fmt_num(s.mean)}±{fmt_num(s.std, 2)}"


def _theory_cell(s: RatioStats) -> Text:
    """The prediction with its agreement mark: = within the finite-width band, ≠ outside, ~
    within a band too wide to test the init (``RatioStats.informative``), · no closed form (not green/red:
    those colours belong to the 'preserved' verdict)."""
    cell = Text(_value(s.predicted, s.log10_predicted) + " ")
    if s.agrees is None:
        cell.append("·", style="dim")
    elif not s.agrees:
        cell.append("≠", style="bold yellow")
    else:
        cell.append("=", style="cyan") if s.informative is not False else cell.append("~", style="dim")
    return cell


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


def run_table(run: RunResult, units: str = "n_l") -> Table:
    t = _table(f"[bold]{run.init}[/bold] — {run.description}")
    named = any(r.name is not None for r in run.layers)
    t.add_column("layer", justify="right", no_wrap=True, min_width=5)
    if named:  # a model's sites: the module path beside the row's index
        t.add_column("site", justify="left", no_wrap=True)
    t.add_column(units, justify="right", no_wrap=True, min_width=4)
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
            *([escape(r.name or "")] if named else []),
            str(r.width),
            _mean_std(f),
            _value(f.rms, f.log10_rms),
            _theory_cell(f),
            *(
                ("off path", "—", "—")
                if r.off_path
                else (_mean_std(b), _value(b.rms, b.log10_rms), _theory_cell(b))
            ),
        )
    return t


def _stage_bounds(run: RunResult) -> list[int]:
    """Rows the ResNet table always shows: every stage's first and last state (and x^1, the
    stem's output, in the BN net)."""
    keep = {i for st in run.stages or [] for i in (st.first, st.last)}
    if any(r.bn is not None for r in run.layers):
        keep.add(1)
    return sorted(keep)


def resnet_table(run: RunResult, width_label: str = "d") -> Table:
    """One row per residual-stream state h^b; a rule closes each stage."""
    t = _table(f"[bold]{run.init}[/bold] — {run.description}")
    for name in ("b", "stage", width_label):
        t.add_column(name, justify="right", no_wrap=True)
    for name in ("fwd mean±std", "rms", "theory", "bwd mean±std", "rms", "theory", "branch", "theory"):
        t.add_column(name, justify="right", no_wrap=True)
    rows = table_rows(len(run.layers), keep=_stage_bounds(run))
    lasts = {st.last for st in run.stages or []}
    for i in rows:
        r = run.layers[i]
        f, b, br = r.forward, r.backward, r.branch
        t.add_row(
            str(r.index),
            "in" if r.stage == 0 else str(r.stage),
            str(r.width),
            _mean_std(f),
            _value(f.rms, f.log10_rms),
            _theory_cell(f),
            _mean_std(b),
            _value(b.rms, b.log10_rms),
            _theory_cell(b),
            "" if br is None else _value(br.rms, br.log10_rms),
            "" if br is None else _theory_cell(br),
            end_section=r.index in lasts and r.index != run.layers[-1].index,
        )
    return t


def bn_table(run: RunResult) -> Table:
    """The batch statistics of the BN net (De & Smith 2020, appendix C) beside l, l(1 - 1/pi), l/pi."""
    t = _table(f"[bold]{run.init}[/bold] — batch statistics of x^l (De & Smith 2020, appendix C)")
    t.add_column("l", justify="right", no_wrap=True)
    for name in ("skip var", "theory l", "moving var", "theory l(1-1/π)", "moving mean²", "theory l/π"):
        t.add_column(name, justify="right", no_wrap=True)
    for i in table_rows(len(run.layers), keep=[1]):  # keep the stem's output x^1
        r = run.layers[i]
        if r.bn is None:
            continue
        s = r.bn
        t.add_row(
            str(r.index),
            fmt_num(s.skip_variance),
            fmt_num(s.predicted_skip_variance),
            fmt_num(s.moving_variance),
            fmt_num(s.predicted_moving_variance),
            fmt_num(s.moving_squared_mean),
            fmt_num(s.predicted_moving_squared_mean),
        )
    return t


def _cos_theory_cell(c) -> Text:
    cell = Text(("·" if c.predicted is None else f"{c.predicted:.4f}") + " ")
    if c.agrees is None:
        cell.append("·", style="dim")
    else:
        cell.append("=", style="cyan") if c.agrees else cell.append("≠", style="bold yellow")
    return cell


def correlation_table(run: RunResult, resnet: bool) -> Table:
    """Per layer (or state) and input cosine c0: the mean ± sd over pairs (and draws) of the
    cosine of the two forward states, beside the infinite-width prediction (docs/theory.md §10)."""
    t = _table(f"[bold]{run.init}[/bold] — cosine of two inputs' forward states")
    t.add_column("b" if resnet else "layer", justify="right", no_wrap=True)
    for c in run.correlations:
        t.add_column(f"c0={c.c0:g} mean±sd", justify="right", no_wrap=True)
        t.add_column("theory", justify="right", no_wrap=True)
    keep = _stage_bounds(run) if resnet else ()
    for i in table_rows(len(run.layers), keep=keep):
        r = run.layers[i]
        cells: list[Any] = [str(r.index)]
        for c in r.correlation:
            cells += [f"{c.mean + 0.0:.4f}±{c.std:.3f}", _cos_theory_cell(c)]
        t.add_row(*cells)
    return t


def measurement_table(run: RunResult, m, row_label: str) -> Table:
    """A plug-in measurement (sigprop/observers/): per row its columns, as the observer summarized them."""
    t = _table(f"[bold]{escape(run.init)}[/bold] — {escape(m.title)}")
    t.add_column(row_label, justify="right", no_wrap=True)
    for c in m.columns:
        t.add_column(escape(c), justify="right", no_wrap=True)
    keep = _stage_bounds(run) if run.stages is not None else ()
    for i in table_rows(len(run.layers), keep=keep):
        t.add_row(str(run.layers[i].index), *(fmt_num(v) for v in m.rows[i]))
    return t


def measurement_lines(run: RunResult) -> list[str]:
    """The gates of plug-in measurements, one line each, named by their verdict."""
    return [
        f"  {'[green]' if c.passed else '[red]'}{escape(verdict_words(c.verdict))}[/]: {escape(gate_text(c))}"
        for m in run.measurements
        for c in m.checks
    ]


def correlation_lines(run: RunResult) -> list[str]:
    """Per input cosine: where it ends, and the depth scale (layers until 1 - c falls by e)."""
    out = []
    unit = "blocks" if run.stages is not None else "layers"
    for c in run.correlations:
        pred = "no prediction: " + c.reason if c.end_predicted is None else f"theory {c.end_predicted:.4f}"
        scale = lambda k: f"within {k} {unit}" if k is not None else "never"
        depth = f"; 1 - cosine falls by e {scale(c.depth_scale)}"
        if c.end_predicted is not None:
            depth += f" (theory: {scale(c.predicted_depth_scale)})"
        out.append(f"  inputs of cosine {c.c0:g} end at cosine {c.end_mean:.4f} ({pred}){depth}")
    return out


def stage_lines(run: RunResult) -> list[str]:
    """Per stage: the predicted stage ratios beside the --check band (before widening)."""
    out = []
    for st in run.stages or []:
        proj = f", projection {st.d_in}->{st.d_out}" if st.d_in != st.d_out else ""
        band = lambda b: f"[{fmt_num(b[0], 4)}, {fmt_num(b[1], 4)}]"
        if st.forward_band == st.backward_band:
            bands = f"band {band(st.forward_band)}"
        else:
            bands = f"band forward {band(st.forward_band)}, backward {band(st.backward_band)}"
        out.append(
            f"  stage {st.stage} (h^{st.first}..h^{st.last}, {st.blocks} blocks{proj}): theory forward "
            f"{fmt_num(st.predicted_forward)}, backward {fmt_num(st.predicted_backward)}; {bands}"
        )
    return out


#: how each verdict reads (one meaning per word and colour: green/red are the 'preserved' verdict
#: only; agreement with theory is cyan '=' / yellow '≠')
VERDICT_WORDS = {
    "preserved": "signal preserved",
    "theory": "agrees with finite-width theory",
    "correlation": "inputs kept apart (--max-correlation)",
    "curvature": "lowest curvature of the inits listed",
}


def verdict_words(verdict: str) -> str:
    """How a verdict reads; a plug-in measurement's gate reads as its name."""
    return VERDICT_WORDS.get(verdict, verdict)


def _verdict_line(run: RunResult, verdict: str) -> str:
    checks = run.verdict_checks(verdict)
    ok = run.verdict(verdict)
    if verdict == "preserved":
        head = "[green]signal preserved[/green]" if ok else "[red]signal NOT preserved[/red]"
    else:
        if ok:
            head = "[cyan]= agrees with finite-width theory[/cyan]"
        elif run.untestable:  # no band failed; some quantity has no prediction to test
            head = "[dim]· not testable against finite-width theory[/dim]"
        else:
            head = "[yellow]≠ disagrees with finite-width theory[/yellow]"
    reasons = {c.note for c in checks if not c.has_band}
    if (
        verdict == "theory"
        and not ok
        and run.untestable
        and len(reasons) == 1
        and all(not c.has_band for c in checks)
    ):
        return f"  {head}: {escape(reasons.pop())}"  # one reason for every check: said once
    parts = [escape(gate_text(c)) for c in checks]
    # why each failed gate failed (a gate without a band already says it in its text)
    notes = dict.fromkeys(
        (c.name.split(" ||")[0], c.note) for c in checks if c.note and not c.passed and c.has_band
    )
    tail = "".join(escape(f"\n    why ({what}): {note}") for what, note in notes)
    return f"  {head}: " + "; ".join(parts) + tail


def run_summary(run: RunResult, draws: int = 1, envelope: bool = False) -> Text:
    """Both verdicts of one init, each named, with the reason when one fails."""
    ag = run.agreement()
    predicted = {
        d: any(getattr(r, d) is not None and getattr(r, d).predicted is not None for r in run.layers)
        for d in ag
    }
    agree = ", ".join(
        (
            f"{d} {v['layers_agreeing']}/{v['layers_compared']}"
            + (f" ({v['layers_uninformative']} ~: no test)" if v["layers_uninformative"] else "")
        )
        if v["layers_compared"]
        else (f"{d} not tested (a prediction, no band)" if predicted[d] else f"{d} no closed form")
        for d, v in ag.items()
    )
    lines = [f"[bold]{escape(run.init)}[/bold] (layers agreeing with theory: {agree})"]
    lines += [_verdict_line(run, v) for v in ("preserved", "theory")]
    spread = spread_line(run, draws, envelope)
    if spread:
        lines.append("  " + spread)
    return Text.from_markup("\n".join(lines))


def spread_line(run: RunResult, draws: int, envelope: bool = False) -> str:
    """How far the typical end-to-end ratio moves between weight draws: measured with several
    draws; with one, the theory's sd of the log ratio (docs/theory.md §4, "Across draws"),
    which the across-draw spread approaches at depth -- or, ``envelope`` (the conv nets' law,
    §11), an upper envelope of it, said as such."""
    s = run.end_rows[0].forward
    theory_sd = s.log10_std_predicted
    envelope_words = "the conv nets' upper envelope, docs/theory.md §11"
    said, about, measured_beside = (
        (envelope_words, "up to about", f"{envelope_words}: up to")
        if envelope
        else ("theory", "about", "theory ≈")
    )
    if draws > 1 and s.log10_draw_std is not None:
        tail = "" if theory_sd is None else f"; {measured_beside} ±{theory_sd:.2f}"
        return (
            f"across {draws} draws the typical end-to-end forward ratio moved by ±{s.log10_draw_std:.2f} "
            f"decades (sd{tail})"
        )
    if theory_sd is None:
        return (
            "one weight draw: the ± in the table is across samples only; --seeds S measures the spread "
            "across draws"
        )
    return (
        "one weight draw: the ± in the table is across samples only; across draws the typical end-to-end "
        f"forward ratio moves by {about} ±{theory_sd:.2f} decades "
        f"(sd, {said}); --seeds S measures it"
    )


def render_table(result: ProbeResult, console: Console) -> None:
    """Every init's table (rows as the net kind's hints name them), its extra tables (BN
    statistics, cosines, plug-in measurements), its verdict lines, then the kind's footer."""
    hints = kinds.get(result.command, field="result").hints
    resnet = any(run.stages is not None for run in result.runs)
    for run in result.runs:
        if run.stages is not None:
            console.print(resnet_table(run, hints.width))
            shown = len(table_rows(len(run.layers), keep=_stage_bounds(run)))
        else:
            console.print(run_table(run, hints.width))
            shown = len(table_rows(len(run.layers)))
        n = len(run.layers)
        if shown < n:
            console.print(
                f"[dim](showing {shown} of {n} {'states' if resnet else 'layers'}; --format json or csv has "
                f"all)[/dim]"
            )
        if any(r.bn is not None for r in run.layers):
            console.print(bn_table(run))
        if run.correlations:
            console.print(correlation_table(run, run.stages is not None))
        for m in run.measurements:
            console.print(measurement_table(run, m, hints.row))
        for line in stage_lines(run) + correlation_lines(run):
            console.print(line, highlight=False, soft_wrap=True)
        for line in measurement_lines(run):
            console.print(line, highlight=False, soft_wrap=True)
    for note in result.config.get("theory_notes") or ():  # what the theory could not follow, said once
        console.print(f"[yellow]theory: {escape(note)}[/yellow]", soft_wrap=True)
    for note in result.config.get("init_notes") or ():  # what an init could not set, said once
        console.print(f"[yellow]{escape(note)}[/yellow]", soft_wrap=True)
    for note in result.config.get("site_notes") or ():  # the output read, sites left out or off its path
        console.print(f"[yellow]sites: {escape(note)}[/yellow]", soft_wrap=True)
    console.print(f"[dim]{escape(hints.footer)}[/dim]", soft_wrap=True)
    for run in result.runs:
        console.print(
            run_summary(run, int(result.config.get("seeds", 1)), hints.spread_envelope), soft_wrap=True
        )
    console.print(preserved_line(result), highlight=False)


def count(n: int, word: str) -> str:
    """``1 thread``, ``2 threads``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def preserved_line(result: ProbeResult) -> str:
    """The closing line: which inits preserve the signal, in words that read right when all or
    none of them do."""
    kept = [r.init for r in result.runs if r.preserved]
    lost = [r.init for r in result.runs if not r.preserved]
    if not lost:
        return (
            "signal preserved (typical ratio in the band) by "
            f"{'the only init' if len(kept) == 1 else 'every init'}: {', '.join(kept)}"
        )
    if not kept:
        return (
            "signal NOT preserved (typical ratio outside the band) by "
            f"{'the only init' if len(lost) == 1 else 'any init'}: {', '.join(lost)}"
        )
    return (
        f"signal preserved (typical ratio in the band) by: {', '.join(kept)}; not preserved by: "
        f"{', '.join(lost)}"
    )


def to_json(obj: Any) -> str:
    return json.dumps(obj.to_dict(), indent=2, allow_nan=False) + "\n"


def to_json_line(obj: Any) -> str:
    """One result as one JSON line (a sweep of ``--arg``: one line per configuration)."""
    return json.dumps(obj.to_dict(), allow_nan=False) + "\n"


def render_sweep_summary(labels: Sequence[str], results: Sequence[ProbeResult], console: Console) -> None:
    """After a sweep's tables: per configuration and init the typical end-to-end ratios (forward
    at the last site, backward at the first: what the verdicts read) and both verdicts."""
    t = _table("[bold]sweep[/bold] — typical end-to-end ratios per configuration")
    for name in ("configuration", "init", "forward", "backward", "preserved", "theory"):
        t.add_column(name, justify="left" if name in ("configuration", "init") else "right")
    for label, result in zip(labels, results):
        for run in result.runs:
            fwd, bwd = run.end_rows[0].forward, run.end_rows[1].backward
            theory = "·" if run.agrees_with_theory is None else ("=" if run.agrees_with_theory else "≠")
            t.add_row(
                escape(label),
                escape(run.init),
                fmt_log10(fwd.log10_mean),
                fmt_log10(bwd.log10_mean),
                "yes" if run.preserved else "NO",
                theory,
            )
    console.print(t)


CSV_FIELDS = ("mean", "std", "rms", "log10_mean", "log10_std", "predicted", "log10_predicted", "agrees")


def _csv_cells(s: RatioStats | None) -> list[Any]:
    if s is None:
        return [""] * len(CSV_FIELDS)
    d = s.to_dict()
    d["agrees"] = d["agreement"]["agrees"]
    return ["" if d[k] is None else d[k] for k in CSV_FIELDS]


def to_csv(result: ProbeResult) -> str:
    """One row per layer (MLP), per state h^b (ResNet: with stage, branch and BN columns) or per
    site (a model: with the site's module path)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    resnet = any(run.stages is not None for run in result.runs)
    bn = any(r.bn is not None for run in result.runs for r in run.layers)
    named = any(r.name is not None for run in result.runs for r in run.layers)
    header = ["init", "index" if resnet else "layer"] + (["site"] if named else [])
    header += (["stage"] if resnet else []) + ["width"]
    header += [f"forward_{k}" for k in CSV_FIELDS] + [f"backward_{k}" for k in CSV_FIELDS]
    if resnet:
        header += [f"branch_{k}" for k in CSV_FIELDS]
    if bn:
        header += [
            f"bn_{k}{suffix}"
            for k in ("skip_variance", "moving_variance", "moving_squared_mean")
            for suffix in ("", "_predicted")
        ]
    c0s = [c.c0 for c in result.runs[0].correlations] if result.runs else []
    header += [f"cos_{c0:g}_{k}" for c0 in c0s for k in ("mean", "std", "predicted", "agrees")]
    measured = result.runs[0].measurements if result.runs else []
    header += [f"{m.name}_{c}" for m in measured for c in m.columns]
    header += ["off_output_path"] if named else []
    w.writerow(header)
    for run in result.runs:
        for r_i, r in enumerate(run.layers):
            row: list[Any] = [run.init, r.index] + ([r.name] if named else [])
            row += ([r.stage] if resnet else []) + [r.width]
            row += _csv_cells(r.forward) + _csv_cells(r.backward)
            if resnet:
                row += _csv_cells(r.branch)
            if bn:
                b = r.bn
                for k in ("skip_variance", "moving_variance", "moving_squared_mean"):
                    row += ["", ""] if b is None else [getattr(b, k), getattr(b, f"predicted_{k}")]
            for c in r.correlation:
                row += ["" if v is None else v for v in (c.mean, c.std, c.predicted, c.agrees)]
            for m in run.measurements:
                row += ["" if v is None else v for v in m.rows[r_i]]
            row += [r.off_path] if named else []
            w.writerow(row)
    return buf.getvalue()


def render_theory(result: TheoryResult, console: Console) -> None:
    t = Table(
        title="K_n (Theorem 1, Arpit et al. 2019, eq. 3 / 9)", title_justify="left", header_style="bold"
    )
    t.add_column("n", justify="right")
    t.add_column("closed form", justify="right")
    t.add_column("quadrature", justify="right")
    t.add_column("|difference|", justify="right")
    for r in result.kn:
        t.add_row(
            str(r.n),
            f"{r.closed_form:.15f}",
            f"{r.quadrature:.15f}",
            f"{abs(r.closed_form - r.quadrature):.1e}",
        )
    console.print(t)
    if result.resnet:
        t = Table(
            title="ResNet ratio (1 + 1/B)^{B/2} (Theorems 3-4, Arpit et al. 2019, eq. 53, 63)",
            title_justify="left",
            header_style="bold",
        )
        t.add_column("blocks B", justify="right")
        t.add_column("ratio", justify="right")
        t.add_column("band [sqrt 2, sqrt e]", justify="right")
        for r in result.resnet:
            t.add_row(
                str(r.blocks), f"{r.ratio:.6f}", f"[{r.lower:.6f}, {r.upper:.6f}] {'✓' if r.inside else '✗'}"
            )
        console.print(t)


def render_inits(rows: Sequence[tuple[str, str, str]], console: Console) -> None:
    t = Table(title="init schemes", title_justify="left", header_style="bold")
    t.add_column("name")
    t.add_column("description")
    t.add_column("paper")
    for row in rows:
        t.add_row(*row)
    console.print(t)


# --------------------------------------------------------------------------------------------
# sigprop check: one line per (check, init), a summary, JSON and JUnit XML
# --------------------------------------------------------------------------------------------
def gate_text(c) -> str:
    """``typical forward ratio at layer 20 1.02 in [0.5, 2]`` for one gate (a ``results.Check``):
    the measured value is the geometric mean over samples and draws."""
    if c.verdict == "correlation":
        word = "<=" if c.passed else ">"
        return f"{c.name} {c.cosine:.4f} {word} {c.high:g}"
    if c.verdict == "curvature":
        other = "none" if not math.isfinite(c.log10_high) else fmt_log10(c.log10_high)
        return (
            f"{c.name}: {'diverged' if c.log10_measured is None else fmt_log10(c.log10_measured)} "
            f"{'<' if c.passed else '>='} {other} (the lowest other, mean over draws)"
        )
    if not c.has_band:
        return f"typical {c.name} {fmt_log10(c.log10_measured)}: {c.note}"
    word = "in" if c.passed else "outside"
    return (
        f"typical {c.name} {fmt_log10(c.log10_measured)} {word} [{fmt_log10(c.log10_low)}, "
        f"{fmt_log10(c.log10_high)}]"
    )


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


# --------------------------------------------------------------------------------------------
# the curvature at init (``sigprop hessian``)
# --------------------------------------------------------------------------------------------
#: Lanczos' top eigenvalues the table shows per draw (JSON has all of them)
TOP_SHOWN = 5


def hessian_banner(probe_banner: str, env: dict, hs) -> str:
    """The probe command's banner as ``sigprop hessian``'s, with what the search costs: the
    parameters, and the fewest Hessian-vector products --top's Lanczos takes per draw."""
    line = probe_banner.replace("sigprop ", "sigprop hessian ", 1) + f", {env['parameters']} parameters"
    if hs.top:
        line += f"; --top {hs.top}: at least {env['top_products']} Hessian-vector products per draw"
    return line


def hessian_table(result) -> Table:
    """One row per init and weight draw: the eigenvalue of largest magnitude (restarted Lanczos),
    log10 of its magnitude (the spectral norm, Arpit et al. 2019, Table 2), iterations, residual,
    status; Lanczos' top eigenvalues and Hutchinson's trace when asked.  A rule closes each init."""
    cfg = result.config
    t = _table(
        f"[bold]curvature at init[/bold] — the loss Hessian's largest-magnitude eigenvalue λ, "
        f"{cfg.get('samples')} samples, {cfg.get('seeds')} draw(s)"
    )
    for name in ("init", "draw", "λ", "log10 |λ|", "products", "residual", "status"):
        t.add_column(name, justify="left" if name in ("init", "status") else "right", no_wrap=True)
    top = max((len(d.top) for r in result.runs for d in r.draws), default=0)
    trace = any(d.trace is not None for r in result.runs for d in r.draws)
    if top:
        t.add_column("top eigenvalues (Lanczos)", ratio=1)  # wraps: the other columns keep their width
    if trace:
        t.add_column("trace ± se (Hutchinson)", justify="right", no_wrap=True)
    for k, run in enumerate(result.runs):
        for j, d in enumerate(run.draws):
            row = [
                run.init if j == 0 else "",
                str(d.draw),
                "—" if d.eigenvalue is None else fmt_num(d.eigenvalue),
                "—" if not d.eigenvalue else f"{math.log10(abs(d.eigenvalue)):.2f}",
                str(d.iterations),
                "—" if d.residual is None else f"{d.residual:.1e}",
                d.status,
            ]
            if top:
                more = f", … (all {len(d.top)}: --format json)" if len(d.top) > TOP_SHOWN else ""
                row.append(", ".join(fmt_num(v) for v in d.top[:TOP_SHOWN]) + more)
            if trace:
                se = "" if d.trace_se is None else f" ± {fmt_num(d.trace_se)}"
                row.append("—" if d.trace is None else f"{fmt_num(d.trace)}{se}")
            t.add_row(*row, end_section=j == len(run.draws) - 1 and k < len(result.runs) - 1)
    return t


def model_notes(result, console: Console) -> None:
    """A model's notes (the spectrum's and the curvature's): what an init left or assumed, which
    output was read, the parameters the curvature left out."""
    for note in result.config.get("model_notes") or ():
        console.print(f"[yellow]{escape(note)}[/yellow]", soft_wrap=True, highlight=False)


def render_hessian(result, console: Console) -> None:
    console.print(hessian_table(result))
    for run in result.runs:
        m, sd = run.summary()
        text = "diverged in every draw" if m is None else f"{m:.2f}" + ("" if sd is None else f" ± {sd:.2f}")
        over = (
            "one draw: --seeds S gives the spread"
            if len(run.draws) == 1
            else f"mean ± sd over {len(run.draws)} draws"
        )
        console.print(
            f"{run.init}: log10 spectral norm {text} ({over}) [dim]— {escape(run.description)}[/dim]",
            highlight=False,
            soft_wrap=True,
        )
    for run in result.runs:
        dens = [d.density for d in run.draws if d.density is not None]
        if dens:
            nodes = [v for q in dens for probe in q["nodes"] for v in probe]
            products = sum(q["products"] for q in dens)
            console.print(
                f"{run.init}: eigenvalue density (stochastic Lanczos quadrature, {products} products over "
                f"{len(dens)} draw(s)): its nodes from {fmt_num(min(nodes))} to {fmt_num(max(nodes))}, "
                f"trace ≈ {fmt_num(statistics.fmean(q['trace'] for q in dens))} (--format json: every node "
                "and weight; --plot draws it)",
                highlight=False,
                soft_wrap=True,
            )
    for run in result.runs:
        per = [d.blocks for d in run.draws if d.blocks]
        if per:
            layers = [b["layer"] for b in per[0]]
            mean = {
                name: statistics.fmean(abs(b[k]["eigenvalue"]) for b in per if b[k]["eigenvalue"] is not None)
                for k, name in enumerate(layers)
                if any(b[k]["eigenvalue"] is not None for b in per)
            }
            top = sorted(mean, key=mean.get, reverse=True)[:TOP_SHOWN]
            more = f"; all {len(layers)} layers: --format json" if len(layers) > TOP_SHOWN else ""
            console.print(
                f"{run.init}: largest |eigenvalue| of each layer's diagonal block (mean over draws), the "
                f"largest first: " + ", ".join(f"{name} {fmt_num(mean[name])}" for name in top) + more,
                highlight=False,
                soft_wrap=True,
            )
    done = [r for r in result.runs if not r.diverged]
    order = sorted(done, key=lambda r: r.summary()[0])
    if order:
        console.print(
            "lowest to highest curvature (mean log10 spectral norm): "
            + " < ".join(f"{r.init} {r.summary()[0]:.2f}" for r in order)
            + (
                ""
                if len(done) == len(result.runs)
                else "; diverged: " + ", ".join(r.init for r in result.runs if r.diverged)
            ),
            highlight=False,
            soft_wrap=True,
        )
    model_notes(result, console)
    head = specs.HEADS.get(result.config.get("head", "pytorch"), "the head")
    parameters = kinds.get(result.command, field="result").hints.curvature_parameters.format(head=head)
    console.print(
        "[dim]λ by restarted Lanczos on Hessian-vector products (double backward) of the 10-way "
        "cross-entropy at "
        f"init, {escape(parameters)}; converged: its "
        f"residual "
        "||Hy - λy||/|λ| is within --tol (an eigenvalue lies that close); 'not converged': --iters products "
        "ran out, "
        "λ is the best Ritz value with its residual; synthetic data unless --data (docs/cli.md, sigprop "
        "hessian)[/dim]",
        soft_wrap=True,
    )


# --------------------------------------------------------------------------------------------
# the input-output Jacobian's spectrum (``sigprop spectrum``)
# --------------------------------------------------------------------------------------------
def _ratio_cell(measured: float | None, predicted: float | None) -> str:
    if measured is None:
        return "—"
    if predicted is None or predicted == 0:
        return fmt_num(measured)
    return f"{fmt_num(measured)} ({fmt_num(predicted)})"


def render_spectrum(result, console: Console) -> None:
    """Per init the eigenvalues sigma^2 of J J^T (mean over draws of each draw's summaries) with
    the large-width prediction in parentheses, then what was not derived."""
    t = _table("[bold]input-output Jacobian[/bold] — eigenvalues σ² of J Jᵀ, mean over draws (theory)")
    for name in ("init", "mean σ²", "var σ²", "var/mean²", "σ_max", "σ_min", "cond (median)", "σ² in [½, 2]"):
        t.add_column(name, justify="left" if name == "init" else "right")
    # the lanczos path's sigma_min is the smallest Ritz value: an upper bound
    bound = "≤ " if result.environment.get("path") == "lanczos" else ""
    for run in result.runs:
        d = run.to_dict()
        mean, var = d["mean"], d["variance"]
        pm, pv = run.predicted_mean, run.predicted_variance
        norm = None if not mean else var / (mean * mean)
        pnorm = None if pv is None or not pm else pv / (pm * pm)
        t.add_row(
            escape(run.init),
            _ratio_cell(mean, pm),
            _ratio_cell(var, pv),
            _ratio_cell(norm, pnorm),
            fmt_num(d["sigma_max"]),
            bound + fmt_num(d["sigma_min"]),
            "∞" if d["condition"] is None else ("≥ " if bound else "") + fmt_num(d["condition"]),
            f"{100 * d['near_one']:.1f}%"
            + (f" ({100 * run.predicted_density['near_one']:.1f}%)" if run.predicted_density else ""),
        )
    console.print(t)
    for run in result.runs:
        if "top" in run.draws[0]:  # --top K: the extreme singular values, mean over draws
            top = [statistics.fmean(d["top"][i] for d in run.draws) for i in range(len(run.draws[0]["top"]))]
            bottom = [
                statistics.fmean(d["bottom"][i] for d in run.draws)
                for i in range(len(run.draws[0]["bottom"]))
            ]
            console.print(
                f"{escape(run.init)}: largest σ {', '.join(fmt_num(v) for v in top)}; smallest σ "
                f"{', '.join(fmt_num(v) for v in bottom)} (mean over samples and draws)",
                highlight=False,
            )
    dense = [run.init for run in result.runs if run.predicted_density]
    if dense:
        console.print(
            f"theory: the whole density for {', '.join(dense)} from the free-probability fixed point "
            "(dense layers): --plot draws it over the histogram, --format json holds it",
            highlight=False,
        )
    env = result.environment
    notes = sorted({run.why for run in result.runs if run.why})
    for why in notes:
        console.print(f"theory: {escape(why)}", highlight=False, soft_wrap=True)
    model_notes(result, console)
    inputs = "inputs from --data" if result.config.get("data") else "inputs x ~ N(0, I)"
    how = (
        f"exactly at {env['samples']} {inputs} per draw ({env['output_units']} × "
        f"{env['input_units']}, {env['reverse_products']} reverse products a sample), singular values in "
        "float64"
        if env.get("path") != "lanczos"
        else f"as the operator JᵀJ at {env['samples']} inputs per draw ({env['output_units']} × "
        f"{env['input_units']}, not formed): σ_max by Lanczos, the rest by stochastic Lanczos "
        f"quadrature ({env['products_per_sample']} products a sample; σ_min the smallest Ritz value, an "
        "upper bound)"
    )
    hints = kinds.get(result.command, field="result").hints
    console.print(
        f"[dim]J = ∂h^L/∂x {how}; mean σ² = tr(J Jᵀ)/n_out = E‖Jᵀe‖²/‖e‖², the squared "
        f"backward ratio; {escape(hints.spectrum_theory)}[/dim]",
        soft_wrap=True,
    )
