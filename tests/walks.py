"""Test helpers: a plan walked by the walker directly (sigprop/walker/, no driver), in the
shapes the oracle tests compare with torch.autograd, and a run assembled by the engine from
arrays with its net kind's theory and verdicts -- so tests see the same numbers the product
computes, with no walker of their own."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sigprop import engines, inits, kinds, run, specs, walker
from sigprop.engines import plan as plan_engine
from sigprop.kernels import logspace as ls
from sigprop.kinds import mlp as mlp_kind

#: ``steps`` compiled for ``scheme`` and walked for ``draws`` with the named observers: the
#: driver's own walk of one plan
walk = plan_engine.walk_plan


def mlp(scheme, widths, x, e, seed: int, draws, stream: bool = False, runner=None, progress=None):
    """S = len(draws) draws through the MLP of ``widths``: (ln forward [S, L, N], ln backward
    [S, L, N], per layer the parameters stacked over draws; ``v`` None when streamed)."""
    r = walk(
        mlp_kind.steps(widths), scheme, x, e, seed, draws, stream=stream, runner=runner, progress=progress
    )
    return r.observed["fwd"], r.observed["bwd"], [k.params for k in r.kept]


def mlp_draw(scheme, widths, x, e, seed: int, draw: int, stream: bool = False):
    """One draw: (ln forward [L, N], ln backward [L, N], per layer its parameters)."""
    f, b, params = mlp(scheme, widths, x, e, seed, [draw], stream)
    return f[0], b[0], [ls.unstack(p, 0) for p in params]


@dataclass
class Draw:
    """ln ratios: forward/backward per entry [(S,) E, N], branch per block [(S,) B, N], BN statistics [(S,)
    E, 3]."""

    ln_fwd: torch.Tensor
    ln_bwd: torch.Tensor
    ln_branch: torch.Tensor
    bn: torch.Tensor | None = None


def resnet(scheme, plan, x, e, seed: int, draws, stream: bool = False, runner=None):
    """S draws through a residual plan (``kinds.resnet.resnet_plan``): (``Draw``, per block its
    ``walker.BlockParams`` stacked over draws)."""
    r = walk(plan.steps, scheme, x, e, seed, draws, ("fwd", "bwd", "branch"), stream=stream, runner=runner)
    o = r.observed
    return Draw(o["fwd"], o["bwd"], o["branch"]), [k.params for k in r.kept]


def resnet_draw(scheme, plan, x, e, seed: int, draw: int, stream: bool = False):
    d, params = resnet(scheme, plan, x, e, seed, [draw], stream)
    one = [
        walker.BlockParams([ls.unstack(p, 0) for p in b.branch], ls.unstack(b.projection, 0), b.alpha)
        for b in params
    ]
    return Draw(d.ln_fwd[0], d.ln_bwd[0], d.ln_branch[0]), one


def bn(plan, x, e, seed: int, draws, stream: bool = False):
    """The BN ResNet (De & Smith 2020, appendix C; a plan with its stem: ``resnet_plan(...,
    stem=True)``) in plain floats: (``Draw`` with the statistics, per layer its parameters stacked)."""
    scheme = inits.get("unnormalized-he")
    r = walk(
        plan.steps, scheme, x, e, seed, draws, ("fwd", "bwd", "branch", "bn"), space="plain", stream=stream
    )
    o = r.observed
    return Draw(o["fwd"], o["bwd"], o["branch"], o["bn"]), [k.params for k in r.kept]


def bn_draw(plan, x, e, seed: int, draw: int, stream: bool = False):
    d, params = bn(plan, x, e, seed, [draw], stream)
    return Draw(d.ln_fwd[0], d.ln_bwd[0], d.ln_branch[0], d.bn[0]), [ls.unstack(p, 0) for p in params]


def measure(spec, probe: specs.ProbeSpec):
    """The driver's walks without statistics: (plan, {init: {observer: array}}, environment)."""
    m = run.measure(spec, probe)
    return m.plan, m.arrays, m.environment


def assemble(
    command: str,
    scheme,
    plan,
    arrays: dict,
    spec=None,
    probe: specs.ProbeSpec | None = None,
    band=None,
    gate: str = "preserved",
):
    """The run the engine assembles from arrays with the kind's theory and verdicts
    (``Engine.assemble``), as the driver does."""
    kind = kinds.get(command)
    return engines.of(kind).assemble(
        kind, scheme.name, scheme, spec, plan, arrays, probe or specs.ProbeSpec(), specs.GateSpec(gate, band)
    )


def mlp_run(scheme, widths, fwd, bwd, band=None, gate: str = "preserved"):
    """An MLP run from its arrays [S, L, N] (``kinds.mlp.MLP``'s theory and verdicts)."""
    return assemble(
        "mlp",
        scheme,
        mlp_kind.MLPPlan(list(widths), mlp_kind.steps(widths)),
        {"fwd": fwd, "bwd": bwd},
        band=band,
        gate=gate,
    )


def trace(model, x, sites: list[str]):
    """A model's graph of moment maps and each site's node (None where the site is not in the
    graph), or (None, None, why) when neither tracer reads it (``model.trace.trace_graph``):
    the tests' view of a trace (0.16.0 kept it in sigprop/model/trace.py, used only here)."""
    from sigprop.model.trace import trace_graph

    t = trace_graph(model, x)
    return (None, None, t.why) if t.nodes is None else (t.nodes, t.where(sites), "")


def grid(kind, sizes, widths, names, probe) -> list:
    """The probe points of a size x width x init grid of one of sigprop's nets, each a
    ``sweeps.Point`` as ``sigprop sweep`` makes it (without ``sweeps.configure``'s checks: sizes
    and widths given as numbers)."""
    from sigprop import sweeps

    return [
        sweeps.Point(
            kind,
            ((kind.sweep_axes.size, size), ("width", width)),
            name,
            kind.sweep_spec(size, width, name, None),
            probe,
        )
        for size in sizes
        for width in widths
        for name in names
    ]
