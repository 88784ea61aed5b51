"""A probe's report: the per-layer tables (a net's, a ResNet's stages, BN statistics, cosines,
plug-in measurements), the verdict lines, the sweep summary and the CSV.  Rendering only:
numbers are formatted from the result records as they are."""

from __future__ import annotations

import csv
import io
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sigprop import kinds, theory
from sigprop.report.common import _table, _value, fmt_log10, fmt_num, gate_text, table_rows, verdict_words
from sigprop.results import ProbeResult, RatioStats, RunResult


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
    tokens = any(r.tokens is not None for r in run.layers)
    if tokens:  # a model's token sequences: the mean cosine between the tokens of one sample
        t.add_column("tok cos", justify="right", no_wrap=True)
        t.add_column("theory", justify="right", no_wrap=True)
        t.add_column("H/theory", justify="right", no_wrap=True)
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
            *(_token_cells(r.tokens) if tokens else ()),
        )
    return t


def _token_cells(c) -> tuple:
    """The token cosine (mean±sd over samples), its theory cell and the attention entropy inside
    the site; blank where the site's output is no token sequence (or holds no attention)."""
    if c is None:
        return ("", "", "")
    spread = "" if c.std != c.std else f"±{c.std:.3f}"
    h = "" if c.entropy is None else f"{c.entropy:.3f}"
    if h and c.entropy_predicted is not None:  # the traced attention's prediction beside it
        h += f"/{c.entropy_predicted:.3f}"
    return (f"{c.mean:.3f}{spread}", _cos_theory_cell(c), h)


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


def power_lines(run: RunResult) -> list[str]:
    """The traced bands that cannot catch a miss of the maps of ``theory.POWER_TARGET`` (25%) in
    ``POWER_LEVEL`` of runs -- a smaller miss there may read "=" -- with what each catches and the
    draws that would narrow every one (docs/theory.md §15, "A band's power"); none: no line."""
    target = theory.POWER_TARGET / theory.LN10
    wide, draws = [], []
    for layer in run.layers:
        for direction in ("forward", "backward"):
            st = getattr(layer, direction)
            if st.log10_power is None or st.log10_power <= target + 1e-12:
                continue
            wide.append(f"{layer.name} {direction} ({10.0**st.log10_power - 1.0:.0%})")
            draws.append(st.draws_for_power)
    if not wide:
        return []
    shown = ", ".join(wide[:6]) + (f" and {len(wide) - 6} more" if len(wide) > 6 else "")
    more = (
        f"--seeds {max(draws)} would catch it at every site"
        if all(d is not None for d in draws)
        else "no number of draws would at every site"
    )
    return [
        f"[dim]{run.init}: {len(wide)} band(s) too wide to catch a {theory.POWER_TARGET_PERCENT}% miss of "
        f"the theory in {theory.POWER_LEVEL:.0%} of runs -- the miss each catches: {escape(shown)}; {more} "
        '(docs/theory.md §15, "A band\'s power")[/dim]'
    ]


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
    # a verdict of passing and failing gates: the failing ones first, each marked
    banded = [c for c in checks if c.has_band]
    mixed = any(c.passed for c in banded) and any(not c.passed for c in banded)
    mark = lambda c: ("✓ " if c.passed else "✗ ") if mixed and c.has_band else ""
    shown = sorted(checks, key=lambda c: c.passed or not c.has_band) if mixed else checks
    parts = [mark(c) + escape(gate_text(c)) for c in shown]
    # why each failed gate failed (a gate without a band already says it in its text)
    notes = dict.fromkeys(
        (c.name.split(" ||")[0], c.note) for c in checks if c.note and not c.passed and c.has_band
    )
    tail = "".join(escape(f"\n    why ({what}): {note}") for what, note in notes)
    return f"  {head}: " + "; ".join(parts) + tail


def run_summary(run: RunResult, draws: int = 1, source: str = "theory") -> Text:
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
    lines += [
        f"  {'[green]' if c.passed else '[red]'}{escape(verdict_words(c.verdict))}[/]: {escape(gate_text(c))}"
        for c in run.verdict_checks("tokens")
    ]
    spread = spread_line(run, draws, source)
    if spread:
        lines.append("  " + spread)
    return Text.from_markup("\n".join(lines))


#: per source of the spread line's sd (``Hints.spread``): how it is said after one draw, the
#: words before it, and how it is said beside a measured spread
SPREAD_WORDS = {
    "theory": ("theory", "about", "theory ≈"),
    "envelope": (
        "the conv nets' upper envelope, docs/theory.md §11",
        "up to about",
        "the conv nets' upper envelope, docs/theory.md §11: up to",
    ),
    "run": (
        "one sample's spread in this run times the draw share, docs/theory.md §13",
        "about",
        "estimated from the samples ≈",
    ),
}


def _decades(x: float) -> str:
    """A spread in decades: two decimals, one significant digit below 0.005 (never "0.00")."""
    return f"{x:.2f}" if x >= 0.005 or x == 0 else f"{x:.1g}"


def spread_line(run: RunResult, draws: int, source: str = "theory") -> str:
    """How far the typical end-to-end ratio moves between weight draws: measured with several
    draws; with one, the sd of the log ratio the kind's ``source`` gives (``SPREAD_WORDS``):
    the theory's (docs/theory.md §4, "Across draws"), which the across-draw spread approaches at
    depth, the conv nets' upper envelope of it (§11), or a traced model's estimate from its
    run's samples (§13) -- said as such."""
    s = run.end_rows[0].forward
    theory_sd = s.log10_std_predicted
    said, about, measured_beside = SPREAD_WORDS[source]
    if draws > 1 and s.log10_draw_std is not None:
        tail = "" if theory_sd is None else f"; {measured_beside} ±{_decades(theory_sd)}"
        return (
            f"across {draws} draws the typical end-to-end forward ratio moved by "
            f"±{_decades(s.log10_draw_std)} decades (sd{tail})"
        )
    if theory_sd is None:
        return (
            "one weight draw: the ± in the table is across samples only; --seeds S measures the spread "
            "across draws"
        )
    return (
        "one weight draw: the ± in the table is across samples only; across draws the typical end-to-end "
        f"forward ratio moves by {about} ±{_decades(theory_sd)} decades "
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
        for line in stage_lines(run) + correlation_lines(run) + power_lines(run):
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
        console.print(run_summary(run, int(result.config.get("seeds", 1)), hints.spread), soft_wrap=True)
    console.print(preserved_line(result), highlight=False)


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
    tokens = any(r.tokens is not None for run in result.runs for r in run.layers)
    header += [f"token_cosine_{k}" for k in ("mean", "std", "predicted", "agrees")] if tokens else []
    header += (
        ["attention_entropy_mean", "attention_entropy_std", "attention_entropy_predicted"] if tokens else []
    )
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
            if tokens:
                c = r.tokens
                vals = (
                    (None,) * 7
                    if c is None
                    else (c.mean, c.std, c.predicted, c.agrees, c.entropy, c.entropy_std, c.entropy_predicted)
                )
                row += ["" if v is None else v for v in vals]
            row += [r.off_path] if named else []
            w.writerow(row)
    return buf.getvalue()
