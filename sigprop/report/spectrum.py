"""``sigprop spectrum``: the Jacobian's spectrum per init beside its large-width prediction."""

from __future__ import annotations

import statistics

from rich.console import Console
from rich.markup import escape

from sigprop import kinds
from sigprop.report.common import _table, fmt_num, model_notes


def _ratio_cell(measured: float | None, predicted: float | None) -> str:
    if measured is None:
        return "—"
    if predicted is None or predicted == 0:
        return fmt_num(measured)
    return f"{fmt_num(measured)} ({fmt_num(predicted)})"


def depth_table(result):
    """--at / --depths: per init and recorded state the mean and variance of sigma^2 of the
    Jacobian of that state in the input (mean over draws), the large-width prediction beside."""
    t = _table("[bold]against depth[/bold] — σ² of ∂h^l/∂x at the states asked for, mean over draws (theory)")
    for name in ("init", "depth", "mean σ²", "var σ²", "var/mean²"):
        t.add_column(name, justify="left" if name == "init" else "right")
    for run in result.runs:
        for i, d in enumerate(run.depths):
            pm, pv = d["predicted_mean"], d["predicted_variance"]
            norm = None if not d["mean"] else d["variance"] / (d["mean"] * d["mean"])
            pnorm = None if pv is None or not pm else pv / (pm * pm)
            t.add_row(
                escape(run.init) if i == 0 else "",
                str(d["depth"]),
                _ratio_cell(d["mean"], pm),
                _ratio_cell(d["variance"], pv),
                _ratio_cell(norm, pnorm),
            )
    return t


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
    if any(run.depths for run in result.runs):
        console.print(depth_table(result))
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
