"""``sigprop hessian``: the banner, the per-init table of the curvature at init, its lines."""

from __future__ import annotations

import math
import statistics

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sigprop import kinds, specs
from sigprop.report.common import _table, fmt_num, model_notes

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
