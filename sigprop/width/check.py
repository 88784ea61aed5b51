"""A coordinate check from a factory of widths (``sigprop.width_check``): every (parametrization,
width, seed) point trained and recorded (sigprop/width/train.py), each site's slopes fitted
(sigprop/width/fit.py) beside the exponents of sigprop/theory/width.py, and the two verdicts
read per parametrization from its own points only (a run reads the same alone and beside
others)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import torch

from sigprop import files
from sigprop.errors import SigpropError
from sigprop.kernels.device import resolve_device
from sigprop.model.build import build
from sigprop.model.forward import call
from sigprop.results.width import SiteSlope, WidthResult, WidthRun
from sigprop.theory import width as theory
from sigprop.width import cost, fit, points, train
from sigprop.width import params as P
from sigprop.width.attention import AttentionScale
from sigprop.width.spec import RUN_OPTIONS, WidthNet, WidthSpec, validate


def _read_nets(factory, widths, base: int, x: torch.Tensor, seed: int) -> tuple[list[P.Role], list[int]]:
    """What the client reads once for every point: the parameters' roles, off the two smallest
    widths of the factory (each point reads its own fan-ins: ``params.at``), and the head
    dimension of each attention call at the base width (μP's attention scaling and the logits
    sites read them: sigprop/width/attention.py; empty without attention) -- each width built
    once."""
    built = {w: build(lambda w=w: factory(w), seed, 0) for w in dict.fromkeys([*widths[:2], base])}
    rec = AttentionScale()
    with torch.no_grad(), rec:
        call(built[base].to(x.device), x)
    return P.roles(built[widths[0]], built[widths[1]]), rec.dims


def _mean(values: list[list[float]]) -> list[float]:
    """The mean over seeds (rows) at each width (column)."""
    return [sum(col) / len(col) for col in zip(*values)]


def _f(x: Fraction | None) -> float | None:
    return None if x is None else float(x)


def _slopes(
    spec: WidthSpec, net: WidthNet, param: str, points: dict, sites: list[train.Site]
) -> list[SiteSlope]:
    widths = sorted(net.widths)
    out = []
    for step in range(spec.steps + 1):
        predicted = theory.site_exponents(
            param, spec.optimizer, [s.role for s in sites], step, net.chain, spec.zero_readout
        )
        for i, site in enumerate(sites):
            l1s, deltas = (
                [[points[(w, k)].stats[stat][i][step] for w in widths] for k in range(spec.seeds)]
                for stat in ("l1", "delta")
            )
            l1, l1_se = fit.slope(widths, l1s)
            delta, delta_se = (None, None) if step == 0 else fit.slope(widths, deltas)
            e = predicted[i]
            out.append(
                SiteSlope(
                    site.name,
                    site.role,
                    step,
                    l1,
                    l1_se,
                    delta,
                    delta_se,
                    _f(e.init) if step == 0 else None,
                    _f(e.low),
                    _f(e.high),
                    _mean(l1s),
                    _mean(deltas),
                )
            )
    return out


def _agree(s: SiteSlope) -> str:
    """ "=" where the slope lies within its band (theory.SLOPE_BAND + 2 se) of the predicted
    exponent or interval, "≠" where not, "" where nothing is predicted or measurable."""
    band = float(theory.SLOPE_BAND)
    if s.step == 0 and s.init is not None and s.l1 is not None:
        return "=" if abs(s.l1 - s.init) <= band + 2 * (s.l1_se or 0.0) else "≠"
    if s.step > 0 and s.low is not None and s.delta is not None:
        slack = band + 2 * (s.delta_se or 0.0)
        return "=" if s.low - slack <= s.delta <= s.high + slack else "≠"
    return ""


_exp = theory.fmt_exponent


def _drift(spec: WidthSpec, slopes: list[SiteSlope]):
    """The first step at which a slope exceeds the gate, and there the largest: (slope record,
    "activations" or "updates", value, se), or None."""
    for step in range(spec.steps + 1):
        found = [
            (value, s, what, se)
            for s in slopes
            if s.step == step
            for what, value, se in (("activations", s.l1, s.l1_se), ("updates", s.delta, s.delta_se))
            if value is not None and value > spec.max_width_slope
        ]
        if found:
            value, s, what, se = max(found, key=lambda f: f[0])
            return s, what, value, se
    return None


def _interval(low: float | None, high: float | None) -> str:
    return _exp(low) if low == high else f"{_exp(low)} to width^{_exp(high)}"


def verdicts(
    spec: WidthSpec, param: str, slopes: list[SiteSlope], rows: int = 0, smallest: int = 0
) -> tuple[bool, str, str, str]:
    """(width_stable, its words, theory's "agrees"/"differs"/"not derived", its words): the
    first step at which a slope drifts above the gate and its largest there; the first site
    and step whose slope differs from its exponent."""
    gate = spec.max_width_slope
    drift = _drift(spec, slopes)
    name = {"sp": "SP", "mup": "μP", "ntk": "NTK"}.get(param, param)
    opt = {"sgd": "SGD", "adam": "Adam"}[spec.optimizer]
    if drift is None:
        stable = f"{name} with {opt}: width-stable (every slope <= {gate:g} through step {spec.steps})"
        ahead = [s for s in slopes if s.high is not None and s.step > 0 and s.high > gate]
        if ahead:  # measured flat on this grid, but theory's asymptote grows: said beside it
            s = max(ahead, key=lambda s: s.high)
            stable += (
                f" on these widths, though theory's asymptote grows: {s.role} site {s.site!r} updates "
                f"∝ width^{_exp(s.high)} (from ∝ width^{_exp(s.low)} while smaller terms lead)"
            )
    else:
        s, what, value, se = drift
        pred = ""
        if s.high is not None:
            init = 0.0 if s.init is None else s.init
            low, high = (s.low, s.high) if what == "updates" else (max(init, s.low), max(init, s.high))
            pred = f"; theory: ∝ width^{_interval(low, high)}"
        stable = (
            f"{name} with {opt}: {s.role} site {s.site!r} {what} grow ∝ width^{value:.2f}"
            f"{'' if se is None else f' ± {se:.2f}'} from step {s.step} (> {gate:g}{pred})"
        )
    for s in slopes:
        s.agrees = _agree(s)
    compared = [s for s in slopes if s.agrees]
    differ = [s for s in compared if s.agrees == "≠"]
    if not compared:
        return drift is None, stable, "not derived", f"{name}: no exponent derived for its sites"
    if not differ:
        return (
            drift is None,
            stable,
            "agrees",
            f"{name}: all {len(compared)} slopes compared agree with theory",
        )
    s = differ[0]
    if s.step == 0:
        what, measured, pred = "activation", s.l1, _exp(s.init)
    else:
        what, measured, pred = "update", s.delta, _interval(s.low, s.high)
    words = (
        f"{name}: {len(differ)} of {len(compared)} slopes differ from theory, first {s.role} site "
        f"{s.site!r} step {s.step}: {what} ∝ width^{measured:.2f}, theory width^{pred}"
    )
    if rows >= smallest and any(d.step > 0 for d in differ):  # docs/theory.md §17, "The batch ..."
        words += (
            f" (the loss reads {rows} rows, not fewer than the smallest width {smallest}: the first "
            "step's kernel over them is not yet ∝ width; fewer rows show the limit)"
        )
    return drift is None, stable, "differs", words


def _sizes(net: WidthNet, spec: WidthSpec, factory, widths: list[int], x: torch.Tensor) -> dict[int, int]:
    """Each width's parameter count (the clock's model of a point's time), the widest point's
    memory refused before any is built (sigprop/width/cost.py)."""

    def small() -> cost.Built:
        model = build(lambda: factory(widths[0]), spec.seed, 0)
        count, weights = cost.parameters(model)
        return cost.Built(widths[0], count, weights, cost.activations(model, x) or 0)

    return cost.sizes(factory, widths, x, spec.optimizer, resolve_device(spec.device), net.field, small)


def _read_points(spec: WidthSpec, every: list) -> tuple[dict, list[str]]:
    """The points already measured: each ``--points`` file's (refused when missing or not sigprop
    width's), then ``--out``'s (a part's file only with its ``--shard``); points of other options
    are not read, and said."""
    have: dict = {}
    notes = []
    given = [(Path(p), "points") for p in spec.points] + ([(Path(spec.out), "out")] if spec.out else [])
    for path, field in given:
        found = points.read(path, every, field)
        if field == "out" and found.header is not None and spec.shard is None:
            part = f"{found.header.get('shard')}/{found.header.get('of')}"
            raise SigpropError(
                f"{path} is part {part} of a check (its first line is a part's header): give --shard {part}, "
                f"or read it with --points {path} and give another --out",
                field="out",
            )
        if found.others:
            notes.append(
                f"--{field} {path}: {found.others} point(s) of other options, not read ({found.differs})"
            )
        have.update(found.points)
    return have, notes


def width_check(
    net: WidthNet, spec: WidthSpec, *, command: str = "", progress=None, on_start=None
) -> WidthResult:
    """Run the coordinate check of ``net`` under ``spec``: per parametrization, width and seed a
    fresh draw trained ``spec.steps`` steps (sigprop/width/points.py: by the spec's executor,
    resumed from ``spec.out``); the slopes, the exponents and the verdicts."""
    validate(spec, net)
    if spec.out:
        files.check_target(Path(spec.out), "out", append=True)
    for path in spec.points:  # each file there and sigprop width's before any net is built
        points.read(Path(path), [], "points")
    if spec.data:  # the file read and its size checked before any net is built
        points.rows_of(spec, net, 0)
    factory = points.factory_of(net)
    widths = sorted(net.widths)
    base = spec.base_width or widths[0]
    device = resolve_device(spec.device)
    x = points.batch(spec, net, 0, device)
    counts = _sizes(net, spec, factory, sorted({*widths, base}), x)
    roles, dims = _read_nets(factory, widths, base, x, spec.seed)
    if on_start:  # the net builds at every width: the run starts
        on_start()
    every = points.tasks(net, spec, base, dims, roles)
    have, notes = _read_points(spec, every)
    resumed = len(have)
    config = {
        **points.net_config(net, spec),
        **{name: getattr(spec, name) for name in RUN_OPTIONS},
        "base_width": base,
        "chain": net.chain,
        "attention_calls": len(dims),
    }
    if spec.shard is not None:  # the i-th of N parts into --out; the fit reads them all later
        part = points.start_part(Path(spec.out), every, spec.shard)
        todo = [t for t in part if t.key not in have]
        points.run_all(todo, spec, progress, counts)
        environment = {"torch": torch.__version__, "device": str(device), "points": len(every),
                       "points_in_shard": len(part), "points_run": len(todo)}  # fmt: skip
        return WidthResult(command=command, config=config, environment=environment, runs=[], notes=notes)
    have.update(points.run_all([t for t in every if t.key not in have], spec, progress, counts))
    runs = []
    rows = 0
    for param in spec.params:
        got = {(t.width, t.seed): have[t.key] for t in every if t.param == param}
        sites = got[(widths[0], 0)].sites
        if any(p.sites != sites for p in got.values()):
            raise SigpropError("the model's sites differ between its widths or seeds", field="arg")
        slopes = _slopes(spec, net, param, got, sites)
        rows = got[(widths[0], 0)].rows
        stable, stable_words, agrees, theory_words = verdicts(spec, param, slopes, rows, widths[0])
        loss = [
            [sum(got[(w, k)].loss[t] for k in range(spec.seeds)) / spec.seeds for t in range(spec.steps + 1)]
            for w in widths
        ]
        description = theory.PARAMETRIZATIONS.get(param, "the model's own parametrization, read, not changed")
        runs.append(WidthRun(param, description, slopes, stable, stable_words, agrees, theory_words, loss))
    config["loss_rows"] = rows
    environment = {
        "torch": torch.__version__,
        "device": str(device),
        "points": len(every),
        "points_resumed": resumed,  # read from --out, not run again
    }
    return WidthResult(command=command, config=config, environment=environment, runs=runs, notes=notes)
