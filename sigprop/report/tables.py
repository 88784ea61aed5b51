"""``sigprop theory`` and ``sigprop inits``: the K_n and ResNet tables, the init registry."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.table import Table

from sigprop.results import TheoryResult


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
