"""What the commands share: the banner a run starts with, a --plot target checked before the run, and
the --probes 1 warning."""

from __future__ import annotations

from sigprop import kinds


def _banner(kind: kinds.Kind, spec, seed: int, seeds: int):
    """The line a run starts with, from the environment record: device, dtype, the net, the draws."""
    return lambda env: (
        f"sigprop {kind.name}: device {env['device']} ({env['device_name']}), {env['dtype']}, "
        f"{kind.banner(spec)} "
        f"(seed {seed}), {env['samples']} samples x {seeds} draw(s)"
    )


def _plot_target(path):
    """A --plot target checked before the run (the plot extra imported only when asked for)."""
    if path is None:
        return None
    from sigprop import plot as plot_mod  # optional extra (matplotlib): only with --plot

    plot_mod.check_target(path)
    return plot_mod


#: --probes 1: said, not refused (a quick look is a fair use), so that nobody reads one probe's
#: quadrature as the density
ONE_PROBE = (
    "sigprop: warning: --probes 1: the density is one probe's quadrature (a single random sample "
    "of the spectral measure), not an average"
)
