"""``sigprop width``: per parametrization, each site's fitted width slopes per step beside the
exponents theory predicts, and the two verdicts (width-stable; agrees with theory)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from sigprop.report.common import _table
from sigprop.theory import width as theory

_exp = theory.fmt_exponent


def _slope(value: float | None, se: float | None) -> str:
    if value is None:
        return "·"
    return f"{value:+.2f}" + ("" if se is None else f"±{se:.2f}")


def _theory(s) -> str:
    """The predicted exponent (step 0: the activation's; later: the update's interval)."""
    if s.step == 0:
        return _exp(s.init)
    if s.low is None:
        return "—"
    return _exp(s.low) if s.low == s.high else f"{_exp(s.low)}..{_exp(s.high)}"


def width_table(run, steps: int):
    """One parametrization's table: per site, per step the slope of log mean|x| on log width
    (``act``) and, from step 1, of log rms(h_t - h_0) (``Δ``), each ± its standard error over
    seeds, with the predicted exponent in parentheses and = / ≠ where it is compared."""
    t = _table(f"[bold]{escape(run.param)}[/bold] — {escape(run.description)}")
    t.add_column("site", justify="left")
    t.add_column("role", justify="left")
    for step in range(steps + 1):
        t.add_column(f"act {step}", justify="right")
        if step:
            t.add_column(f"Δ {step}", justify="right")
    by_site: dict[str, dict[int, object]] = {}
    for s in run.slopes:
        by_site.setdefault(s.site, {})[s.step] = s
    for site, per_step in by_site.items():
        first = per_step[0]
        cells = [escape(site or "(model)"), first.role]
        for step in range(steps + 1):
            s = per_step[step]
            mark = f" {s.agrees}" if s.agrees else ""
            if step == 0:
                cells.append(f"{_slope(s.l1, s.l1_se)} ({_theory(s)}){mark}")
            else:
                cells.append(_slope(s.l1, s.l1_se))
                cells.append(f"{_slope(s.delta, s.delta_se)} ({_theory(s)}){mark}")
        t.add_row(*cells)
    return t


def render_width(result, console: Console) -> None:
    """Each parametrization's table, then its two verdicts, then how to read them."""
    steps = result.config["steps"]
    gate = result.config["max_width_slope"]
    widths = ",".join(str(w) for w in result.config["widths"])
    for note in getattr(result, "notes", ()):
        console.print(f"note: {escape(note)}")
    if result.config.get("shard"):
        env = result.environment
        console.print(
            f"shard {result.config['shard']}: {env['points_in_shard']} of the check's {env['points']} "
            f"points, {env['points_run']} run now, all in {escape(str(result.config['out']))}; when every "
            "part is done, the same command without --shard and with --points PART for each part fits "
            "them all"
        )
        return
    for run in result.runs:
        console.print(width_table(run, steps))
        mark = "[green]✓[/green]" if run.width_stable else "[red]✗[/red]"
        console.print(f"{mark} {escape(run.stable_words)}")
        word = {"agrees": "=", "differs": "≠"}.get(run.theory, "·")
        console.print(f"  theory {word} {escape(run.theory_words)}")
        console.print()
    console.print(
        f"[dim]slopes of log scale on log width over widths {widths} (base {result.config['base_width']}), "
        f"mean ± se over {result.config['seeds']} seeds; act = mean|h| (mup's coordinate statistic), "
        "Δ = rms(h_t - h_0); (theory) = the predicted exponent (step 0: the activation's; later: the "
        "update's, low..high = from the smallest term's exponent to the asymptote; "
        "— = not derived); = / ≠ within / outside 0.2 + 2 se; ✓ = every slope within "
        f"±{gate:g} beyond its se (a readout's or logits' update, and their activations after step 0, down "
        f"to -1/2 - {gate:g}) (docs/theory.md §17)[/dim]"
    )
