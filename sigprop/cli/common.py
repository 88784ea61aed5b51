"""What the commands share: the banner a run starts with, a --plot target checked before the run, and
the --probes 1 warning."""

from __future__ import annotations

import functools
import gc
import sys

from sigprop import kinds
from sigprop.cli.output import _say


def core():
    """The core (sigprop/api.py, which loads torch) imported at the CLI's edge, with the
    collector paused while it loads and its objects frozen out of later collections
    (``gc.freeze``): importing torch makes hundreds of thousands of objects that live until the
    process exits, and collecting them as they were made cost 0.19 s of a default ``sigprop mlp``
    (docs/benchmarks.md, "Import").  The collector runs as before for what a command makes; once
    the core is loaded (a second command in one process: the tests') nothing is frozen again."""
    if "sigprop.api" in sys.modules:
        return sys.modules["sigprop.api"]
    enabled = gc.isenabled()
    gc.disable()
    try:
        from sigprop import api  # the lazy torch import at the CLI's edge
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    return api


def _banner(kind: kinds.Kind, spec, seed: int, seeds: int):
    """The line a run starts with, from the environment record: device, dtype, the net, the draws."""
    return lambda env: (
        f"sigprop {kind.name}: device {env['device']} ({env['device_name']}), {env['dtype']}, "
        f"{kind.banner(spec)} "
        f"(seed {seed}), {env['samples']} samples x {seeds} draw(s)"
    )


def announce(banner, **extra):
    """A run's ``on_start``: its ``banner`` line (``_banner``) on stderr, of the environment record
    with ``extra`` entries added.  Built here, not as a lambda in the command's module, so that
    the core calling it back does not re-enter the command (benchmarks/journeys.py)."""
    return functools.partial(_announce, banner, extra)


def _announce(banner, extra: dict, env: dict) -> None:
    _say(banner({**extra, **env}))
    if env.get("fuse") == "on":  # the compile prints nothing for a while: said before it starts
        _say(fuse_note(str(env.get("device", ""))))


def fuse_note(device: str) -> str:
    """What --fuse does before the first layer runs, and about how long (docs/benchmarks.md)."""
    if device.startswith("cuda"):
        how = "Triton kernels, tens of seconds on a first run"
    else:
        how = (
            "Inductor's C++ on a CPU: 24 s with an empty compile cache, 16 s with a warm one on a 2-core "
            "x86-64 (sigprop wrn --blocks 1); minutes on a loaded machine"
        )
    return (
        f"sigprop: --fuse: torch.compile compiles the layers' bookkeeping before the first layer runs "
        f"({how}); "
        "nothing is printed meanwhile"
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
