"""A model's token row of the probe figure: per site the mean cosine between the tokens of one
sample (rank collapse: 1 is every token the same vector) and, where the sites hold attention, its
normalised entropy (1: uniform over the keys a query may read, 0: one key).  Rendering only."""

from __future__ import annotations

from sigprop.plot.common import _name_ticks


def has_tokens(result) -> bool:
    return any(r.tokens is not None for run in result.runs for r in run.layers)


def _series(run, field: str):
    """(site index, mean, sd, predicted) of one token quantity at the sites that have it."""
    out = []
    for r in run.layers:
        t = r.tokens
        v = None if t is None else getattr(t, field, None)
        if v is not None and v == v:
            sd = t.std if field == "mean" else getattr(t, "entropy_std", None)
            pred = t.predicted if field == "mean" else getattr(t, "entropy_predicted", None)
            out.append((r.index, v, sd if sd is not None and sd == sd else 0.0, pred))
    return out


def draw_tokens(row, result, colours: dict, xlabel: str) -> None:
    """Left: the token cosine per site, ±1 sd over samples shaded, the theory dashed where a map
    gives it; right: the attention entropy per site where measured (else the panel says so), its
    prediction dashed where the traced maps give it."""
    left, right = row
    entropy = False
    for run in result.runs:
        colour, marker = colours[run.init]
        pts = _series(run, "mean")
        if pts:
            x, m, sd, pred = zip(*pts)
            left.plot(x, m, color=colour, marker=marker, markersize=4, label=run.init)
            left.fill_between(
                x, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], color=colour, alpha=0.15
            )
            given = [(i, p) for i, p in zip(x, pred) if p is not None]
            if given:
                left.plot(*zip(*given), color=colour, linestyle="--", linewidth=1)
        ent = _series(run, "entropy")
        if ent:
            entropy = True
            x, m, sd, pred = zip(*ent)
            right.plot(x, m, color=colour, marker=marker, markersize=4, label=run.init)
            right.fill_between(
                x, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], color=colour, alpha=0.15
            )
            given = [(i, p) for i, p in zip(x, pred) if p is not None and p == p]
            if given:
                right.plot(*zip(*given), color=colour, linestyle="--", linewidth=1)
    left.set_title("tokens: mean cosine within a sample (1: collapsed)", fontsize=10)
    left.set_ylabel("token cosine")
    left.set_ylim(min(-0.05, left.get_ylim()[0]), 1.05)
    right.set_title("attention: entropy / ln(keys) (1: uniform)", fontsize=10)
    right.set_ylabel("normalised entropy")
    if entropy:
        right.set_ylim(-0.05, 1.05)
    else:
        right.text(
            0.5, 0.5, "no attention inside the sites", ha="center", va="center", transform=right.transAxes
        )
    for ax in row:
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        _name_ticks(ax, result.runs[0].layers)
    left.legend(fontsize=8, loc="upper left")
