"""A coordinate check from a factory of widths (``sigprop.width_check``): every (parametrization,
width, seed) point trained and recorded (sigprop/width/train.py), each site's slopes fitted
(sigprop/width/fit.py) beside the exponents of sigprop/theory/width.py, and the two verdicts
read per parametrization from its own points only (a run reads the same alone and beside
others)."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import torch

from sigprop import files
from sigprop.errors import SigpropError
from sigprop.kernels.device import resolve_device
from sigprop.model.build import build, output_tensor
from sigprop.model.forward import call
from sigprop.results.width import SiteSlope, WidthResult, WidthRun
from sigprop.theory import width as theory
from sigprop.width import cost, fit, optimizers, points, train
from sigprop.width import params as P
from sigprop.width.attention import AttentionScale
from sigprop.width.spec import RUN_OPTIONS, WidthNet, WidthSpec, validate


def _read_nets(factory, widths, base: int, x: torch.Tensor, seed: int, params=()) -> tuple:
    """What the client reads once for every point: the parameters' roles, off the two smallest
    widths of the factory (each point reads its own fan-ins: ``params.at``; a matrix of the
    model's own in the product that gives the output is its readout: ``params.feeding_output``),
    and the head dimension of each attention call at the base width (μP's attention scaling and
    the logits sites read them: sigprop/width/attention.py; empty without attention) -- each
    width built once; the attention calls written out by hand (``AttentionScale.written``); and
    what the run says of them (notes)."""
    built = {w: build(lambda w=w: factory(w), seed, 0) for w in dict.fromkeys([*widths[:2], base])}
    small = built[widths[0]].to(x.device)
    with torch.enable_grad():
        readouts = P.feeding_output(small, output_tensor(call(small, x)))
    rec = AttentionScale()
    with torch.no_grad(), rec:
        call(built[base].to(x.device), x)
    roles = P.roles(built[widths[0]], built[widths[1]], readouts)
    other = widths[1] if widths[0] == base else widths[0]  # not the base width (built above)
    output_site = train.output_is_a_site(built[other].to(x.device), P.at(built[other], roles, other), x)
    notes = [
        f"{r.name!r}, a matrix of the model's own with one dimension growing, gives the output through a "
        f"product: read as the readout (the output role, fan-in its growing dimension, {r.fan_in} at width "
        f"{widths[0]})"
        for r in roles
        if r.fan_axis is not None
    ]
    return roles, rec.dims, rec.written, output_site, notes + _attention_notes(rec, params)


def _attention_notes(rec: AttentionScale, params) -> list[str]:
    """What the run says of the attention it found: under μP how many calls it rescaled, of each
    form; and the softmax calls it did not read as attention."""
    notes = []
    calls, written = len(rec.dims), len(rec.written)
    if "mup" in params and (calls or written or rec.other_softmax):
        notes.append(
            f"μP's attention 1/d: {calls + written} call(s) rescaled by sqrt(d0/d) ({calls} through "
            f"scaled_dot_product_attention or nn.MultiheadAttention, {written} written out: a product of two "
            "activations reaching a softmax" + ("; those have no logits site)" if written else ")")
        )
    if rec.other_softmax:
        mup = (
            " and not rescaled under μP (if one is attention's, its 1/d is not applied)"
            if "mup" in params
            else ""
        )
        notes.append(
            f"{rec.other_softmax} softmax call(s) whose input is no product of two activations: not read as "
            f"attention{mup}"
        )
    return notes


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
            param,
            optimizers.family(spec.optimizer),
            [s.role for s in sites],
            step,
            net.chain,
            spec.zero_readout,
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


#: the lowest update exponent theory allows a readout's (and an attention call's logits') change
#: on a finite grid: the change across its rows, n^(e_prev + 1/2 - omega) (docs/theory.md §17)
READOUT_LOW = -0.5


def gates(spec: WidthSpec, s: SiteSlope, what: str) -> tuple[float, float]:
    """(low, high): the slopes a site may have and be width-stable.  A feature (an input or hidden
    site) may neither grow nor shrink beyond the gate (vanishing features are a width instability
    too).  The readout's and the logits' activations at init are not gated below (μP starts them
    ∝ width^-1/2 by design, a zero readout at 0); their updates, and their activations after
    init, may shrink to theory's lowest, width^-1/2, less the gate."""
    g = spec.max_width_slope
    if s.role in ("output", "logits"):
        return (-math.inf if what == "activations" and s.step == 0 else READOUT_LOW - g), g
    return -g, g


def _drift(spec: WidthSpec, slopes: list[SiteSlope]):
    """The first step at which a slope lies outside its gates beyond its standard error (a slope
    of 0.26 ± 1.02 is not growth), and there the one furthest out: (slope record, "activations"
    or "updates", value, se, the bound it crossed), or None."""
    for step in range(spec.steps + 1):
        found = []
        for s in (s for s in slopes if s.step == step):
            for what, value, se in (("activations", s.l1, s.l1_se), ("updates", s.delta, s.delta_se)):
                if value is None:
                    continue
                low, high = gates(spec, s, what)
                err = se or 0.0
                if value - err > high:
                    found.append((value - err - high, s, what, value, se, high))
                elif value + err < low:
                    found.append((low - value - err, s, what, value, se, low))
        if found:
            _, s, what, value, se, bound = max(found, key=lambda f: f[0])
            return s, what, value, se, bound
    return None


def _moved(slopes: list[SiteSlope]) -> bool:
    """Whether training moved any site: a change from init above float rounding (1e-6 of the
    site's scale) at some step and width.  (One class under cross-entropy: a loss identically 0,
    no gradient, nothing moves.)"""
    for s in slopes:
        if s.step == 0:
            continue
        for d, h in zip(s.delta_values, s.l1_values):
            if math.isfinite(d) and d > 1e-6 * max(abs(h), 1e-30):
                return True
    return False


def _rows_note(rows: int, smallest: int, tail: str = "") -> str:
    """Why updates may read small on this grid: the loss's rows not fewer than the smallest width
    (docs/theory.md §17, "The batch against the width")."""
    return (
        f" (the loss reads {rows} rows, not fewer than the smallest width {smallest}: the first step's "
        f"kernel over them is not yet ∝ width{tail})"
    )


def _site(s: SiteSlope) -> str:
    """A site as the words name it (the model itself, a module owning a readout: "(model)")."""
    return repr(s.site) if s.site else "(model)"


def _interval(low: float | None, high: float | None) -> str:
    return _exp(low) if low == high else f"{_exp(low)} to width^{_exp(high)}"


def _compared(compared: list[SiteSlope], steps: int) -> str:
    """Which slopes the theory verdict compared, in words (the activations after init have no
    exponent: a drift there is the width-stable verdict's, not theory's)."""
    inits = sum(s.step == 0 for s in compared)
    updates = len(compared) - inits
    words = f"{inits} activation(s) at step 0, {updates} update(s) of steps 1-{steps}"
    return words + "; the activations after step 0 have no prediction"


def _stable_words(spec: WidthSpec, slopes: list[SiteSlope], name: str, opt: str, rows: int, smallest: int):
    """(width_stable, its words)."""
    gate = spec.max_width_slope
    if not _moved(slopes):
        return False, (
            f"{name} with {opt}: nothing moved — no site changed from its init through step {spec.steps} "
            "(the "
            "loss gives no gradient: one class under cross-entropy, a loss that ignores the output?); "
            "the slopes say nothing of training: not a coordinate check"
        )
    drift = _drift(spec, slopes)
    if drift is None:
        stable = (
            f"{name} with {opt}: width-stable (every slope within ±{gate:g}, readouts' down to "
            f"{READOUT_LOW - gate:g}, through step {spec.steps})"
        )
        ahead = [s for s in slopes if s.high is not None and s.step > 0 and s.high > gate]
        if ahead:  # measured flat on this grid, but theory's asymptote grows: said beside it
            s = max(ahead, key=lambda s: s.high)
            stable += (
                f" on these widths, though theory's asymptote grows: {s.role} site {_site(s)} updates "
                f"∝ width^{_exp(s.high)} (from ∝ width^{_exp(s.low)} while smaller terms lead)"
            )
        return True, stable
    s, what, value, se, bound = drift
    pred = ""
    if s.high is not None:
        init = 0.0 if s.init is None else s.init
        low, high = (s.low, s.high) if what == "updates" else (max(init, s.low), max(init, s.high))
        pred = f"; theory: ∝ width^{_interval(low, high)}"
    elif s.step == 0 and s.init is not None:
        pred = f"; theory: ∝ width^{_exp(s.init)}"
    way = "grow" if value > bound else "shrink"
    cmp = f"> {bound:g}" if way == "grow" else f"< {bound:g}: vanishing as the width grows"
    words = (
        f"{name} with {opt}: {s.role} site {_site(s)} {what} {way} ∝ width^{value:.2f}"
        f"{'' if se is None else f' ± {se:.2f}'} from step {s.step} ({cmp}{pred})"
    )
    predicted = what == "updates" and s.low is not None and _agree(s) == "="
    if way == "shrink" and predicted:  # NTK's hidden updates, n^-1/2: the limit learns no features
        words += " — as theory predicts: the features stop learning as the width grows (the kernel regime)"
    elif way == "shrink" and what == "updates" and rows >= smallest:
        words += _rows_note(rows, smallest)
    return False, words


def verdicts(
    spec: WidthSpec, param: str, slopes: list[SiteSlope], rows: int = 0, smallest: int = 0
) -> tuple[bool, str, str, str]:
    """(width_stable, its words, theory's "agrees"/"differs"/"not derived", its words): the
    first step at which a slope leaves its gates and the one furthest out there (or that nothing
    moved); the first site and step whose slope differs from its exponent, and which slopes the
    theory compared."""
    name = {"sp": "SP", "mup": "μP", "ntk": "NTK"}.get(param, param)
    known = optimizers.OPTIMIZERS.get(spec.optimizer)
    # the model's own optimizer: its callable's name
    opt = known.words if known is not None else f"its own optimizer {spec.optimizer.rpartition(':')[2]}"
    stable, stable_words = _stable_words(spec, slopes, name, opt, rows, smallest)
    for s in slopes:
        s.agrees = _agree(s)
    compared = [s for s in slopes if s.agrees]
    differ = [s for s in compared if s.agrees == "≠"]
    which = _compared(compared, spec.steps)
    if not compared:
        return stable, stable_words, "not derived", f"{name}: no exponent derived for its sites"
    if not differ:
        return (
            stable,
            stable_words,
            "agrees",
            f"{name}: all {len(compared)} slopes compared agree with theory ({which})",
        )
    s = differ[0]
    if s.step == 0:
        what, measured, pred = "activation", s.l1, _exp(s.init)
    else:
        what, measured, pred = "update", s.delta, _interval(s.low, s.high)
    words = (
        f"{name}: {len(differ)} of {len(compared)} slopes differ from theory ({which}), first {s.role} site "
        f"{_site(s)} step {s.step}: {what} ∝ width^{measured:.2f}, theory width^{pred}"
    )
    if rows >= smallest and any(d.step > 0 for d in differ):
        words += _rows_note(rows, smallest, "; fewer rows show the limit")
    return stable, stable_words, "differs", words


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
    points.optimizer_of(spec)  # the model's own optimizer resolves before any net is built
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
    roles, dims, written, output_site, read_notes = _read_nets(
        factory, widths, base, x, spec.seed, spec.params
    )
    if on_start:  # the net builds at every width: the run starts
        on_start()
    every = points.tasks(net, spec, base, dims, roles, written, output_site)
    have, notes = _read_points(spec, every)
    notes = read_notes + notes
    resumed = len(have)
    config = {
        **points.net_config(net, spec),
        **{name: getattr(spec, name) for name in RUN_OPTIONS},
        "base_width": base,
        "chain": net.chain,
        "attention_calls": len(dims),
        "attention_written": len(written),
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
