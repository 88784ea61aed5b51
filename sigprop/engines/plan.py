"""The plan engine: sigprop's own nets (the kinds that declare ``engine = "plan"``) walked by
sigprop/walker/ -- a probe (the kind's memory plan, then every init walked batch of draws by
batch with the kind's observers, and the input pairs with the correlation observer), the
curvature (the walked units as a differentiable function, sigprop/hessian.py) and the
input-output Jacobian's spectrum (sigprop/spectra.py)."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import numpy as np
import torch

import sigprop.hessian as H  # not ``from sigprop import hessian``: an API name, it loads the API
from sigprop import kinds, observers, plans, specs, spectra, walker
from sigprop.engines import shared
from sigprop.engines.registry import Engine, register
from sigprop.engines.shared import Measured, ProgressFn
from sigprop.errors import SigpropError
from sigprop.kernels import device as dev
from sigprop.kernels import replay, sampling
from sigprop.observers import bn, correlation, ratios  # noqa: F401  (importing them registers the walks' collectors)
from sigprop.plans import graphs
from sigprop.results import CurvatureRun, HessianResult, RunResult, SpectrumResult, SpectrumRun
from sigprop.version import __version__


def graph_pool_bytes(biggest: int, widest: int, samples: int, itemsize: int, layers: int = 1) -> int:
    """What the captured steps of one draw keep in their private memory pools: per step (at most
    ``replay.MAX_GRAPHS``) one layer's draw temporaries, the step's ``layers`` static weight
    buffers and a few activation buffers."""
    return (
        replay.MAX_GRAPHS * ((sampling.HAAR_TEMPORARIES + layers) * biggest + 6 * samples * widest) * itemsize
    )


def graphs_status(runners) -> str:
    """One line for the environment record: ``off`` (eager runners only), the first fallback's
    reason, or ``on (K captured steps)`` -- K = 0 when no step shape repeated (random widths)."""
    runners = [r for r in runners if isinstance(r, replay.Replayed)]
    if not runners:
        return "off"
    for r in runners:
        if r.status.startswith("fell back"):
            return r.status
    return f"on ({sum(r.captured for r in runners)} captured steps)"


def _inputs_units(plan) -> tuple[int, int]:
    """The units of the input and of the top state (where the error vectors are given)."""
    return math.prod(plans.input_shape(plan.steps)), plan.entries[-1]


def measure(
    kind, spec, probe_spec: specs.ProbeSpec, progress: ProgressFn | None, on_start, extra
) -> Measured:
    """Walk every init of ``spec`` as ``probe_spec`` says, and keep only the observations: the
    kind plans the memory, then ``_walk_all``.  ``extra``: plug-in observers (instances) run
    beside the kind's."""
    with dev.using_threads(probe_spec.threads):
        shared.check_rows(kind, spec)
        device = dev.resolve_device(probe_spec.device)
        precision = dev.matmul_precision(probe_spec.precision, device)
        itemsize = dev.itemsize(probe_spec.dtype)
        mem = kind.memory(spec, probe_spec, itemsize, dev.available_bytes(device), shared.checker(device))
        plan = mem.plan
        names = kind.inits(spec)
        schemes = [kind.scheme(spec, n) for n in names]
        kinds.need_two_samples(schemes, probe_spec, bn=kind.space(spec) == "plain")
        need = mem.need
        graphs = dev.use_graphs(probe_spec.graphs, device) and kind.graphs(spec)
        if graphs:
            need += graph_pool_bytes(
                mem.steps.biggest, mem.steps.widest, probe_spec.samples, itemsize, layers=mem.steps.layers
            )
        n_in, n_out = _inputs_units(plan)
        for c0 in probe_spec.correlations:
            if n_in < 2 and abs(c0) < 1:
                raise SigpropError(
                    f"an input cosine of {c0:g} needs inputs of dimension >= 2 (the input has {n_in})",
                    field="correlation",
                )
        if probe_spec.correlations:  # the pair walks: forward only, nothing stored; 2P rows
            need += 8 * 2 * probe_spec.pairs * max(mem.steps.widest, max(plan.entries)) * itemsize
        arrays, env = _walk_all(
            kind,
            spec,
            plan,
            names,
            schemes,
            probe_spec,
            need,
            mem.fields,
            mem.stream,
            graphs,
            device,
            precision,
            progress,
            on_start,
            extra,
        )
    return Measured(kind, plan, names, schemes, arrays, env)


def _walk_all(
    kind,
    spec,
    plan,
    names,
    schemes,
    probe_spec,
    need: int,
    fields: str,
    stream: bool,
    graphs: bool,
    device,
    precision,
    progress,
    on_start,
    extra,
) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
    """How many draws run at once (all when they fit in half the free memory, else as many as do,
    at least one, which must fit in 80%), the environment record (``on_start`` sees it before
    anything is drawn), the inputs x and errors e, then every init walked batch of draws by
    batch: {init: {observer: float64 array with the draws first}}.  Per batch, the probe's
    observers on (x, e), then for each input cosine a forward walk of its pairs with the
    correlation observer: "correlation" [S, C, E, P].  Only the observations are kept: each
    walk's weights are freed before the next one allocates its own (holding them doubled the
    peak memory)."""
    dev.check_memory(need, device, fields)
    batch = max(1, min(probe_spec.seeds, int(0.5 * dev.available_bytes(device) // max(need, 1))))
    if probe_spec.batch is not None:
        batch = min(probe_spec.batch, probe_spec.seeds)
    elif walker.one_draw_at_a_time(plan.steps, device):
        batch = 1
    env = shared.probe_environment(probe_spec, device, bool(stream), batch)
    if on_start is not None:
        on_start(env)
    dtype = dev.DTYPES[probe_spec.dtype]
    n_in, n_out = _inputs_units(plan)
    x, e = sampling.probe_inputs(probe_spec.seed, probe_spec.samples, n_in, n_out, device, dtype)
    runners: list[replay.Eager] = []
    out: dict[str, dict[str, np.ndarray]] = {}
    with torch.no_grad(), precision:
        pairs = [
            sampling.pair_inputs(probe_spec.seed, probe_spec.pairs, n_in, c0, device, dtype)
            for c0 in probe_spec.correlations
        ]
        chunks = [list(range(s, min(s + batch, probe_spec.seeds))) for s in range(0, probe_spec.seeds, batch)]
        tick = None
        for name, scheme in zip(names, schemes):
            units, record_input = walker.compile_plan(plan.steps, scheme)
            if tick is None:
                steps = len(units)
                phases = [
                    ("forward", steps),
                    ("backward", steps - 1 + record_input),
                    ("correlation", steps * len(pairs)),
                ]
                tick = shared.Ticker(progress, len(names) * len(chunks), phases)
            tick.name = name
            walks = _Walks(units, scheme, record_input, probe_spec, walker.SPACES[kind.space(spec)], tick)
            walks.stream, walks.graphs, walks.runners = stream, graphs, runners
            observe = lambda: [observers.make(o) for o in kind.observers(spec)] + [o.fresh() for o in extra]
            out[name] = walks.arrays(x, e, pairs, chunks, observe)
            shared.check_finite(name, out[name])
    env["graphs"] = graphs_status(runners)
    return out, env


class _Walks:
    """The walks of one init: per batch of draws the probe's observers on (x, e), then for each
    input cosine a forward walk of its pairs with the correlation observer; each walk's weights
    are freed before the next one allocates its own (holding them doubled the peak memory)."""

    def __init__(self, units, scheme, record_input: bool, probe_spec, space, tick) -> None:
        self.units, self.scheme, self.record_input = units, scheme, record_input
        self.probe_spec, self.space, self.tick = probe_spec, space, tick
        self.stream, self.graphs, self.runners = False, False, []

    def run(self, inputs, errors, obs, draws) -> dict[str, np.ndarray]:
        """One walk of ``draws`` with the observers ``obs``: their arrays on the host."""
        self.runners.append(replay.CudaGraphs() if self.graphs else replay.Eager())
        r = walker.walk(
            self.units,
            self.scheme,
            inputs,
            errors,
            self.probe_spec.seed,
            draws,
            obs,
            self.record_input,
            space=self.space(),
            progress=self.tick,
            stream=self.stream,
            runner=self.runners[-1],
            fuse=self.probe_spec.fuse,
        )
        self.runners[-1].release()
        return {k: v.cpu().numpy() for k, v in r.observed.items()}

    def arrays(self, x, e, pairs, chunks, observe) -> dict[str, np.ndarray]:
        """{observer: float64 array with the draws first} over every batch of draws ``chunks``;
        "correlation" [S, C, E, P]."""
        parts = []
        for draws in chunks:
            got = self.run(x, e, observe(), draws)
            if pairs:
                got["correlation"] = np.stack(
                    [self.run(xp, None, [correlation.Correlation()], draws)["correlation"] for xp in pairs],
                    axis=1,
                )
            parts.append(got)
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def walk_plan(
    steps,
    scheme,
    x,
    e,
    seed: int,
    draws,
    observe=("fwd", "bwd"),
    space: str = "log",
    stream: bool = False,
    runner=None,
    progress=None,
    fuse: bool = False,
) -> walker.Walked:
    """One walk of a plan outside a probe -- the benchmarks', the golden grid's, the tests' --: the
    steps compiled for ``scheme`` (sigprop/walker/), the named observers, the draws ``draws``
    at once; no memory plan, no statistics; the observations stay tensors.  ``fuse``: the
    layers' bookkeeping compiled (kernels/fused.py)."""
    units, record_input = walker.compile_plan(steps, scheme)
    with torch.no_grad():
        return walker.walk(
            units,
            scheme,
            x,
            e,
            seed,
            list(draws),
            [observers.make(n) for n in observe],
            record_input,
            space=walker.SPACES[space](),
            progress=progress,
            stream=stream,
            runner=runner,
            fuse=fuse,
        )


def curvature(kind, spec, hs: specs.HessianSpec, progress, on_start) -> HessianResult:
    """The curvature at init of every init of ``spec``: per weight draw the loss of the units the
    walker drew (``hessian.build``) and the estimators of ``shared.curvature_draw``."""
    device = dev.resolve_device(hs.device)
    dtype = dev.DTYPES[hs.dtype]
    shared.check_rows(kind, spec)
    plan = kind.plan(spec, hs.seed)
    shape = plans.input_shape(plan.steps)
    shape = shape if shape[1:] != (1, 1) else (shape[0],)
    x, y = shared.curvature_data(hs, shape, device, dtype, kind.curvature_samples)
    names = kind.inits(spec)
    schemes = {n: kind.scheme(spec, n) for n in names}
    itemsize = dev.itemsize(hs.dtype)
    # --top K: Lanczos needs K below the parameter count, which the plan gives before any draw
    counts = {n: H.parameter_count(plan.steps, schemes[n], hs.head) for n in names}
    params = max(counts.values())
    shared.check_parameter_count(hs, counts)
    # the graph of the gradient keeps ~8 copies of every activation (of one minibatch with
    # --batch-size); parameters, gradient, product; the largest-eigenvalue search's Lanczos
    # basis (hessian.LANCZOS_BASIS parameter vectors); --top's ARPACK basis of max(2K + 1, 20)
    # float64 vectors (on the host)
    layers = plans.layers(plan.steps)
    units = [math.prod(shape)] + [st.units_out for st in layers]
    weights = sum(st.role.fan_in * st.role.fan_out for st in layers)
    fields = kind.size_fields
    rows = min(x.shape[0], hs.batch_size or x.shape[0])
    basis = max(H.LANCZOS_BASIS, hs.steps if hs.density else 0)  # --density keeps --steps vectors
    need = (8 * rows * sum(units) + 6 * weights + basis * params) * itemsize
    top_basis = H.arpack_basis(hs.top, params) if hs.top else 0
    host = top_basis * params * 8
    env = shared.curvature_environment(hs, device, int(x.shape[0]), need, host, fields, params, top_basis)
    if on_start is not None:
        on_start(env)
    runs, done = [], 0
    products = shared.Products(progress, hs)
    for name in names:
        scheme = schemes[name]
        draws = []
        for draw in range(hs.seeds):
            t0 = time.perf_counter()
            # the weights: drawn as the probe draws them; a data-dependent init calibrated on the
            # first minibatch with --batch-size (the authors' code calibrates on one training batch)
            m = H.build(plan.steps, scheme, kind.space(spec), x[:rows], hs.seed, draw, hs.head)
            h = H.HVP(m, x, y, hs.batch_size)
            products.start(h, f"{name}: draw {draw}", len(names) * hs.seeds - done)
            d = shared.curvature_draw(h, hs, draw, device)
            products.finish()
            d.seconds = time.perf_counter() - t0
            draws.append(d)
            done += 1
        description = kind.curvature_description(spec, scheme)
        runs.append(CurvatureRun(name, description, draws))
    # the data actually measured: a file's own count (or the first --samples of it)
    config = {"command": kind.name, **spec.to_dict(), **hs.__dict__, "samples": int(x.shape[0])}
    return HessianResult(kind.name, config, {"sigprop": __version__, **env}, runs)


def spectrum(kind, spec, ss: specs.SpectrumSpec, progress, on_start) -> SpectrumResult:
    """Per init and weight draw the exact Jacobian of the net's last state in its input at
    ``ss.samples`` inputs x ~ N(0, I) (or its J^T J operator on the lanczos path), its singular
    values and their summaries, beside the large-width prediction (``plans.graphs.graph_jacobian``)."""
    device = dev.resolve_device(ss.device)
    dtype = dev.DTYPES[ss.dtype]
    shared.check_rows(kind, spec)
    plan = kind.plan(spec, ss.seed)
    n_in, n_out = _inputs_units(plan)
    shared.check_spectrum_inputs(ss, n_in, device)
    path, chosen = _spectrum_path(kind, plan, ss, device)
    gx = torch.Generator(device=device).manual_seed(specs.derive_seed(ss.seed, specs.STREAM_INPUTS))
    x = torch.randn(ss.samples, n_in, generator=gx, device=device, dtype=dtype)  # the probe's inputs
    names = kind.inits(spec)
    env = shared.spectrum_environment(ss, device, n_in, n_out, path, ss.batch_size or ss.samples)
    if on_start is not None:
        on_start(env)
    runs = []
    tick = shared.DrawTicker(progress, len(names) * ss.seeds)
    for name in names:
        scheme = kind.scheme(spec, name)
        draws, pooled, per_depth = [], [], []
        for draw in range(ss.seeds):
            summary, lam, rows = _spectrum_draw(kind, spec, plan, scheme, x, ss, draw, path, chosen, n_out)
            draws.append(summary)
            pooled.append(lam)
            per_depth += [rows] if chosen else []
            tick(f"{name}: draw {draw}")
        runs.append(_spectrum_run(plan, name, scheme, draws, path, pooled, chosen, per_depth))
    # the plan's own record beside the spec (the drawn widths of --width LO:HI)
    config = {"command": kind.name, **spec.to_dict(), **ss.__dict__, **plan.config}
    return SpectrumResult(kind.name, config, {"sigprop": __version__, **env}, runs)


def _spectrum_path(kind, plan, ss: specs.SpectrumSpec, device) -> tuple[str, list[int]]:
    """The path (exact when S x n_out x n_in fits, else the J^T J operator for Lanczos, or as
    ``ss.path`` says) and the recorded states whose Jacobians --depths (all) or --at (some) asks
    for; a run that cannot fit is refused naming the kind's fields."""
    n_in, n_out = _inputs_units(plan)
    # the exact path: J for every sample (float32, and float64 for the SVD), and the reverse pass
    # of all n_out outputs at once over one sample's activations (jacrev, vectorised)
    layers = plans.layers(plan.steps)
    activations = n_in + sum(st.units_out for st in layers)
    itemsize = dev.itemsize(ss.dtype)
    n_states = sum(isinstance(st, plans.Record) for st in plan.steps[1:])
    if ss.at and max(ss.at) > n_states:
        raise SigpropError(f"at most {n_states}: the net has {n_states} recorded states", field="at")
    chosen = list(range(1, n_states + 1)) if ss.depths else list(ss.at)
    widest = max([n_out] + ([st.units_out for st in layers] if chosen else []))
    # drawn and kept, and the temporaries of drawing the largest layer (its Gaussian, QR and
    # Householder product: 60000^2 on an 80 GiB H100 passed an estimate without them, then ran out)
    weights = (
        sum(st.role.fan_in * st.role.fan_out for st in layers) * 2
        + sampling.HAAR_TEMPORARIES * max(st.role.fan_in * st.role.fan_out for st in layers)
    ) * itemsize
    # the Jacobians themselves, and the reverse products of a batch of samples at once
    rows = min(ss.samples, ss.batch_size or ss.samples)
    jacobians = ss.samples * widest * n_in * (itemsize + 8 + 8) + 4 * rows * widest * activations * itemsize
    need = weights + jacobians
    path = ss.path
    if path == "auto":
        path = "exact" if dev.fits(need, device) else "lanczos"
    if path == "lanczos" and chosen:
        raise SigpropError(
            "the exact Jacobians do not fit in memory, and the spectrum against depth needs them",
            field="depths" if ss.depths else "at",
        )
    if path == "exact":
        dev.check_memory(
            need, device, kind.size_fields, hint="; the exact Jacobian holds n_out x n_in entries a sample"
        )
    else:  # one sample's graph at a time, and the Lanczos basis of --steps input vectors
        lanczos_need = weights + (8 * activations + (ss.steps + 4) * n_in) * itemsize
        dev.check_memory(lanczos_need, device, kind.size_fields, hint="")
        shared.check_lanczos_samples(ss, n_in)
    shared.check_top(ss, path, n_in, n_out)
    return path, chosen


def _spectrum_draw(kind, spec, plan, scheme, x, ss: specs.SpectrumSpec, draw: int, path, chosen, n_out):
    """One weight draw: its summary and eigenvalues (``shared.spectrum_draw``) and, with
    --depths/--at, the mean and variance of sigma^2 of each chosen state's Jacobian.  A batch norm
    normalises over the batch: each sample's J is taken inside it."""
    together = plans.batch_dependent(plan.steps)
    fn = walker.as_function(plan.steps, scheme, x, ss.seed, draw, kind.space(spec))
    functions = (
        [spectra.batch_function(fn, x, i) for i in range(ss.samples)]
        if together
        else [spectra.sample_function(fn)] * ss.samples
    )
    summary, lam = shared.spectrum_draw(
        path,
        lambda: spectra.jacobian(fn, x, batch=ss.batch_size, together=together).detach(),
        functions,
        x,
        ss,
        draw,
        n_out,
    )
    rows = []
    for depth in chosen:  # the units' outputs in the input: the spectrum against depth
        Jl = spectra.jacobian(fn, x, depth, ss.batch_size, together).detach()
        lam_l = spectra.eigenvalues(Jl)
        rows.append((float(lam_l.mean()), float(lam_l.var())))
    return summary, lam, rows


def _spectrum_run(plan, name, scheme, draws, path, pooled, chosen, per_depth) -> SpectrumRun:
    """One init's record: the draws, the large-width prediction of the mean and variance of sigma^2
    and its density, the pooled histogram, and the spectrum against depth beside its prediction."""
    pred = graphs.graph_jacobian(plan.steps, scheme)
    density = graphs.graph_density(plan.steps, scheme)
    mean = None if pred is None or not math.isfinite(pred.mean) else pred.mean
    depths = []
    for k, depth in enumerate(chosen):
        p = graphs.graph_jacobian(plans.upto(plan.steps, depth), scheme)
        depths.append(
            {
                "depth": depth,
                "mean": statistics.fmean(r[k][0] for r in per_depth),
                "variance": statistics.fmean(r[k][1] for r in per_depth),
                "predicted_mean": p.mean if math.isfinite(p.mean) else None,
                "predicted_variance": p.variance,
            }
        )
    return SpectrumRun(
        name,
        scheme.description,
        draws,
        mean,
        None if pred is None else pred.variance,
        "" if pred is None else pred.why,
        shared.pooled_histogram(path, pooled),
        depths,
        None if density is None else dataclasses.asdict(density),
    )


class PlanEngine(Engine):
    """sigprop's own nets, walked (``measure``, ``curvature``, ``spectrum`` above)."""

    name = "plan"

    def measure(self, kind, spec, probe_spec, progress, on_start, extra) -> Measured:
        return measure(kind, spec, probe_spec, progress, on_start, extra)

    def assemble(self, kind, name, scheme, spec, plan, arrays, probe, gate) -> RunResult:
        return shared.assemble(kind, name, scheme, spec, plan, arrays, probe, gate)

    def curvature(self, kind, spec, hs, progress, on_start) -> HessianResult:
        return curvature(kind, spec, hs, progress, on_start)

    def spectrum(self, kind, spec, ss, progress, on_start) -> SpectrumResult:
        return spectrum(kind, spec, ss, progress, on_start)


register(PlanEngine())
