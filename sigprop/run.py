"""The one driver (torch): a spec -> its kind's plan -> walks with observers -> a result.  The API,
the CLI, ``sigprop sweep``, ``sigprop check``, ``sigprop rerun`` and the curvature all run here.

``probe``: the kind plans the memory (sigprop/kinds/), then every init is walked batch of draws by
batch -- the probe's observers on the inputs and error vectors, then for each input cosine a
forward walk of its pairs with the correlation observer -- and the kind assembles each init's
record from the arrays (statistics beside predictions, verdicts).  ``curvature``: the same plan,
its weights as the probe draws them, the units as a differentiable function
(sigprop/hessian.py), the loss Hessian's largest eigenvalue (and on request its top-k and trace)
per init and draw.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from sigprop import data as data_mod
from sigprop import hessian as H
from sigprop import kinds, observers, plans, specs, spectra, theory, walker
from sigprop.errors import SigpropError
from sigprop.kernels import device as dev
from sigprop.kernels import modules, replay, sampling
from sigprop.observers import bn, correlation, ratios
from sigprop.results import (
    CurvatureDraw,
    CurvatureRun,
    HessianResult,
    ProbeResult,
    SpectrumResult,
    SpectrumRun,
)
from sigprop.version import __version__

#: the built-in observers' files: importing them registers their collectors (observers.COLLECTORS)
BUILT_IN = (ratios, bn, correlation)
#: progress(done, total, label): steps done of the run's total, and what runs now ("he: forward")
ProgressFn = Callable[[int, int, str], None]
MODEL_MEMORY_HINT = ", or run the samples in chunks (--batch-size)"
STREAM_HINT = ", or stream the weights (--stream; stream=True in the API: redrawn, not stored)"
#: the tolerances a result records (docs/theory.md §4; the band is the kind's)
TOLERANCES = {
    "z_agreement": theory.Z_AGREEMENT,
    "z_check": theory.Z_CHECK,
    "spread_c_gaussian": theory.SPREAD_C_GAUSSIAN,
    "spread_c_orthogonal_base": theory.SPREAD_C_ORTHOGONAL_BASE,
}


class Ticker:
    """The walks' progress: called once per step of every pass (one init, one batch of draws),
    it reports ``progress(done, total, "init: phase")``; a pass is its phases in order, each
    (name, steps): forward, backward, then one forward walk per input cosine ("correlation")."""

    def __init__(self, progress: ProgressFn | None, passes: int, phases: list[tuple[str, int]]) -> None:
        self.progress, self.phases = progress, [p for p in phases if p[1] > 0]
        self.per_pass = sum(n for _, n in self.phases)
        self.total, self.done, self.name = passes * self.per_pass, 0, ""

    def __call__(self) -> None:
        self.done += 1
        if self.progress is not None:
            at, phase = (self.done - 1) % self.per_pass, self.phases[-1][0]
            for name, n in self.phases:
                if at < n:
                    phase = name
                    break
                at -= n
            self.progress(self.done, self.total, f"{self.name}: {phase}")


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


def _checker(device: torch.device):
    """The ``check`` a kind's memory plan calls: refuse a need beyond 80% of the free memory."""

    def check(need: int, fields: str, offer_stream: bool = False) -> None:
        dev.check_memory(need, device, fields, STREAM_HINT if offer_stream else "")

    return check


def check_rows(kind, spec) -> None:
    """Refuse, before a plan is built, a run whose records cannot fit in the host's memory: the
    kind's rows (``Kind.rows``) times its inits times ``kinds.ROW_BYTES`` (a net of 10^8 layers
    was an OOM kill at 22.8 GB: its estimate counted the width, not the depth)."""
    need = kind.rows(spec) * len(kind.inits(spec)) * kinds.ROW_BYTES
    dev.check_memory(need, torch.device("cpu"), kind.fields.split("/")[0])


def _inputs_units(plan) -> tuple[int, int]:
    """The units of the input and of the top state (where the error vectors are given)."""
    return math.prod(plans.input_shape(plan.steps)), plan.entries[-1]


@dataclass
class Measured:
    """What the walks of a probe measured, before any statistic: the kind and its plan, the init
    names and the schemes that ran, per init {observer: float64 array, draws first} ("fwd",
    "bwd" [S, E, N], "branch", "bn", "correlation" [S, C, E, P], plug-ins'), and the
    environment record."""

    kind: kinds.Kind
    plan: object
    names: tuple[str, ...]
    schemes: list
    arrays: dict[str, dict[str, np.ndarray]]
    environment: dict


def measure(
    spec,
    probe_spec: specs.ProbeSpec,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
    observe=(),
) -> Measured:
    """Walk every init of ``spec`` (any registered kind's) as ``probe_spec`` says, and keep only
    the observations: the kind plans the memory, then ``_walk_all``.  ``observe``: plug-in
    observers (instances) run beside the kind's and ``probe_spec.observe``'s (by name)."""
    kind = kinds.of(spec)
    observers.check_names(probe_spec.observe)
    extra = [observers.make(n) for n in probe_spec.observe] + list(observe)
    if kind.engine == "model":
        device = dev.resolve_device(probe_spec.device)
        with dev.using_threads(probe_spec.threads), dev.matmul_precision(probe_spec.precision, device):
            return _measure_model(kind, spec, probe_spec, progress, on_start, extra)
    with dev.using_threads(probe_spec.threads):
        check_rows(kind, spec)
        device = dev.resolve_device(probe_spec.device)
        precision = dev.matmul_precision(probe_spec.precision, device)
        itemsize = dev.itemsize(probe_spec.dtype)
        mem = kind.memory(spec, probe_spec, itemsize, dev.available_bytes(device), _checker(device))
        plan = mem.plan
        names = kind.inits(spec)
        schemes = [kind.scheme(spec, n) for n in names]
        kinds.need_two_samples(schemes, probe_spec, bn=kind.space(spec) == "plain")
        need = mem.need
        graphs = dev.use_graphs(probe_spec.graphs, device) and kind.graphs(spec)
        if graphs:
            need += graph_pool_bytes(
                *mem.graph_args[:2], probe_spec.samples, itemsize, layers=mem.graph_args[2]
            )
        n_in, n_out = _inputs_units(plan)
        for c0 in probe_spec.correlations:
            if n_in < 2 and abs(c0) < 1:
                raise SigpropError(
                    f"an input cosine of {c0:g} needs inputs of dimension >= 2 (the input has {n_in})",
                    field="correlation",
                )
        if probe_spec.correlations:  # the pair walks: forward only, nothing stored; 2P rows
            need += 8 * 2 * probe_spec.pairs * max(mem.graph_args[1], max(plan.entries)) * itemsize
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


def probe(
    spec,
    probe_spec: specs.ProbeSpec,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
    gate: specs.GateSpec | None = None,
    observe=(),
) -> ProbeResult:
    """Run the probe of ``spec`` (any registered kind's) for each of its inits and pair every
    measurement with its theory.  Every run carries both verdicts (``preserved``, ``theory``);
    ``gate`` says which one ``passed`` reports, the band of ``preserved`` and the correlation
    bound.  ``observe``: plug-in observers (sigprop/observers/) to run beside the kind's; with
    ``probe_spec.observe`` they are named in the config (``sigprop rerun`` runs them again).
    ``on_start(env)`` sees the environment record once every input has been validated, before
    any allocation."""
    gate = gate or specs.GateSpec()
    probe_spec = gate.probe(probe_spec)
    m = measure(spec, probe_spec, progress, on_start, observe)
    kind, plan = m.kind, m.plan
    extra = [observers.make(n) for n in probe_spec.observe] + list(observe)
    runs = []
    for name, scheme in zip(m.names, m.schemes):
        a = m.arrays[name]
        run = kind.assemble(name, scheme, spec, plan, a, probe_spec, gate)
        correlation.attach(
            run,
            kind,
            scheme,
            spec,
            plan,
            a.get("correlation"),
            probe_spec.correlations,
            probe_spec.pairs,
            gate.max_correlation,
            probe_spec.dtype,
        )
        for obs in extra:
            record = obs.summarize(a[obs.name], run)
            run.measurements.append(record)
            run.checks.extend(record.checks)
        runs.append(run)
    config = {"command": kind.name, **spec.to_dict(), **probe_spec.__dict__, **gate.to_dict(), **plan.config}
    tolerances = {**TOLERANCES, "band": kind.band(gate)}
    return ProbeResult(
        command=kind.name,
        config=config,
        environment={"sigprop": __version__, **m.environment},
        runs=runs,
        tolerances=tolerances,
    )


def _environment(probe_spec: specs.ProbeSpec, device, stream: bool, batch: int) -> dict:
    """The environment record of a probe (``graphs`` is filled in once the walks have run)."""
    return {
        "torch": torch.__version__,
        "device": str(device),
        "device_name": dev.device_name(device),
        "dtype": probe_spec.dtype,
        "precision": probe_spec.precision,
        "threads": torch.get_num_threads(),
        "stream": stream,
        "batch": batch,
        "graphs": "off",
    }


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
    env = _environment(probe_spec, device, bool(stream), batch)
    if on_start is not None:
        on_start(env)
    dtype = dev.DTYPES[probe_spec.dtype]
    n_in, n_out = _inputs_units(plan)
    x, e = sampling.probe_inputs(probe_spec.seed, probe_spec.samples, n_in, n_out, device, dtype)
    space = walker.SPACES[kind.space(spec)]
    with torch.no_grad(), precision:
        pairs = [
            sampling.pair_inputs(probe_spec.seed, probe_spec.pairs, n_in, c0, device, dtype)
            for c0 in probe_spec.correlations
        ]
        chunks = [list(range(s, min(s + batch, probe_spec.seeds))) for s in range(0, probe_spec.seeds, batch)]
        runners: list[replay.Eager] = []
        out: dict[str, dict[str, np.ndarray]] = {}
        tick = None
        for name, scheme in zip(names, schemes):
            units, record_input = walker.compile_plan(plan.steps, scheme)
            if tick is None:
                steps = len(units)
                tick = Ticker(
                    progress,
                    len(names) * len(chunks),
                    [
                        ("forward", steps),
                        ("backward", steps - 1 + record_input),
                        ("correlation", steps * len(pairs)),
                    ],
                )
            tick.name = name

            def run(inputs, errors, obs, draws):
                runners.append(replay.CudaGraphs() if graphs else replay.Eager())
                r = walker.walk(
                    units,
                    scheme,
                    inputs,
                    errors,
                    probe_spec.seed,
                    draws,
                    obs,
                    record_input,
                    space=space(),
                    progress=tick,
                    stream=stream,
                    runner=runners[-1],
                )
                runners[-1].release()
                return {k: v.cpu().numpy() for k, v in r.observed.items()}

            parts = []
            for draws in chunks:
                got = run(
                    x,
                    e,
                    [observers.make(o) for o in kind.observers(spec)] + [type(o)() for o in extra],
                    draws,
                )
                if pairs:
                    got["correlation"] = np.stack(
                        [run(xp, None, [correlation.Correlation()], draws)["correlation"] for xp in pairs],
                        axis=1,
                    )
                parts.append(got)
            out[name] = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            check_finite(name, out[name])
    env["graphs"] = graphs_status(runners)
    return out, env


def _check_instance_draws(spec, names, seeds: int) -> None:
    if spec.reinitializes_one_instance() and "as-is" in names and seeds > 1:
        raise SigpropError(
            "a model instance has one set of its own weights: pass a factory (a callable that builds "
            "the model) for several as-is draws, or --seeds 1",
            field="seeds",
        )


def _model_inputs(spec, samples: int, seed: int, device, dtype):
    """A model kind's inputs: the API's own tensors (their first ``samples`` rows), the user's
    --data, N(0, I) of each --input-shape, or token ids uniform over --vocab (one tensor, or a
    tuple for a forward of several)."""
    gx = torch.Generator(device=device).manual_seed(specs.derive_seed(seed, specs.STREAM_INPUTS))
    x: torch.Tensor | tuple
    if spec.inputs is not None:  # the API's own tensors: their first `samples` rows
        given = [
            torch.as_tensor(t)
            for t in (spec.inputs if isinstance(spec.inputs, (tuple, list)) else [spec.inputs])
        ]
        if given[0].shape[0] < samples:
            raise SigpropError(
                f"inputs= have {given[0].shape[0]} rows for {samples} samples: pass "
                f"samples={given[0].shape[0]} or more rows",
                field="inputs",
            )
        xs = tuple(
            t[:samples].to(device=device, dtype=dtype if t.is_floating_point() else t.dtype) for t in given
        )
        x = xs[0] if len(xs) == 1 else xs
    elif spec.data is not None:  # the user's inputs, checked before anything is built
        d = data_mod.take(data_mod.load(spec.data, spec.input_shape, 2**62), samples)
        x = data_mod.inputs(d, device, dtype).reshape(d.count, *spec.input_shape)
    elif spec.vocab is None:  # N(0, I), one tensor per input the forward takes
        xs = tuple(
            torch.randn(samples, *shape, generator=gx, device=device, dtype=dtype) for shape in spec.shapes
        )
        x = xs[0] if len(xs) == 1 else xs
    else:  # token ids, uniform over the vocabulary
        x = torch.randint(spec.vocab, (samples, *spec.input_shape), generator=gx, device=device)
    return x


def _check_inputs_fit(spec, samples: int, itemsize: int, device, fields: str) -> None:
    """Refuse, before the inputs are drawn, a model kind's inputs that cannot fit: ``samples`` rows
    of every --input-shape, with the leaf outputs of at least that much again a few times over
    (the floor of any forward and backward on them; ``survey`` measures the real cost later)."""
    bound = samples * sum(math.prod(s) for s in spec.shapes) * itemsize * 4
    dev.check_memory(bound, device, fields)


def _model_draw(factory, scheme, init: str, seed: int, draw: int, device, dtype, calib, notes: list):
    """One draw of a model kind's model, as the probe, the spectrum and the curvature all run it:
    built under its seeded generator, the init applied (``modules.init_``; what it left and what
    it assumed joins ``notes`` once), prepared (``modules.prepare``: no stochastic op, training-mode
    normalisation) and its weights checked finite (one line, the same on every path)."""
    model = modules.build(factory, seed, draw)
    records = modules.init_(model, scheme, seed, draw, batch=calib)
    notes += [n for n in modules.init_notes(init, records) if n not in notes]
    model = modules.prepare(model, device, dtype)
    modules.check_finite_weights(model, f"init {init!r}: the model's weights")
    return model


def _measure_model(kind, spec, probe_spec: specs.ProbeSpec, progress, on_start, extra) -> Measured:
    """A kind whose spec builds a ``torch.nn.Module`` (``Kind.engine == "model"``): per init and
    draw, build the model (its factory under a seeded generator), apply the init
    (``modules.init_``; ``as-is`` keeps the model's own), measure the sites with autograd on the
    shared inputs and output errors, then trace it and compose its moment maps
    (``plans.predict_graph``) on that draw's weights.  Arrays per init: "fwd", "bwd" [S, E, N],
    "reached" [S, E] (1 where the output's gradient reached the site) and the predictions
    "pred_fwd", "pred_bwd" [S, E] (ln of the RMS ratio, nan: no map); the kind's plan learns the
    sites, their units, the finite-width spread and the notes."""
    if extra:
        raise SigpropError(
            "plug-in measurements read sigprop's own walks, not a model's (yet)", field="observe"
        )
    if probe_spec.correlations:
        raise SigpropError("input cosines are not measured for a model yet", field="correlation")
    if probe_spec.stream:
        raise SigpropError("a model keeps its own weights: nothing to stream", field="stream")
    if probe_spec.graphs:
        raise SigpropError("a model runs eagerly: no CUDA graphs", field="graphs")
    device = dev.resolve_device(probe_spec.device)
    dtype = dev.DTYPES[probe_spec.dtype]
    names = kind.inits(spec)
    schemes = [kind.scheme(spec, n) for n in names]
    _check_instance_draws(spec, names, probe_spec.seeds)
    _check_inputs_fit(spec, probe_spec.samples, dev.itemsize(probe_spec.dtype), device, kind.fields)
    env = _environment(probe_spec, device, stream=False, batch=1)
    factory = spec.factory()
    x = _model_inputs(spec, probe_spec.samples, probe_spec.seed, device, dtype)
    e_seed = specs.derive_seed(probe_spec.seed, specs.STREAM_ERRORS)
    plan = kind.plan(spec, probe_spec.seed)
    total, done = len(names) * probe_spec.seeds, 0
    started = False
    arrays: dict[str, dict[str, np.ndarray]] = {}
    # a data-dependent init calibrates on the probe's inputs (a chunk's worth with --batch-size)
    calib = modules.rows(x, 0, spec.batch_size) if spec.batch_size else x
    floating = all(t.is_floating_point() for t in (x if isinstance(x, tuple) else (x,)))
    for name, scheme in zip(names, schemes):
        got: dict[str, list] = {k: [] for k in ("fwd", "bwd", "reached", *PREDICTIONS)}
        for draw in range(probe_spec.seeds):
            model = _model_draw(
                factory, scheme, name, probe_spec.seed, draw, device, dtype, calib, plan.init_notes
            )
            what = f"init {name!r}: the model"
            traced = modules.trace_graph(model, x, what) if floating else None
            if not plan.sites:  # one forward of two samples: the input checked, the sites, the memory
                seen = (
                    traced.survey
                    if traced and traced.survey
                    else modules.survey(model, modules.rows(x, 0, 2), what)
                )
                plan.sites, plan.site_notes = modules.resolve_sites(model, spec.sites, seen.called)
                if seen.output:
                    plan.site_notes.insert(0, seen.output)
                weights = sum(p.numel() * p.element_size() for p in model.parameters())
                # the leaf outputs of the batch: 9.2 GiB estimated, 9.0 GiB peak measured for
                # DenseNet121 at 3x224x224 with 64 samples (benchmarks/module.py)
                rows = min(spec.batch_size or probe_spec.samples, probe_spec.samples)
                dev.check_memory(weights + seen.per_sample * rows, device, kind.fields, MODEL_MEMORY_HINT)
            ln_f, ln_b, numels, reached = modules.measure(model, x, e_seed, plan.sites, spec.batch_size, what)
            if not started:  # the banner once the model has run: a model that cannot, says only why
                started = True
                if on_start is not None:
                    on_start(env)
            if not plan.entries:
                plan.entries = list(numels)
            got["reached"].append(np.asarray(reached, dtype=np.float64))
            for k, v in (("fwd", ln_f), ("bwd", ln_b), *_model_prediction(traced, x, plan, kind).items()):
                got[k].append(v)
            done += 1
            if progress is not None:
                progress(done, total, f"{name}: draw {draw + 1}")
        arrays[name] = {k: np.stack(v) for k, v in got.items()}
        check_finite(name, arrays[name])
    return Measured(kind, plan, names, schemes, arrays, env)


#: a model's predictions, per site and draw: ln RMS ratios as traced, and with every weight
#: layer's variance halved and doubled (``plans.SEPARATION_FACTOR``: the theory verdict's test)
PREDICTIONS = ("pred_fwd", "pred_bwd", "pred_fwd_down", "pred_bwd_down", "pred_fwd_up", "pred_bwd_up")


def _model_prediction(traced, x, plan, kind) -> dict[str, np.ndarray]:
    """ln of the predicted RMS ratios at the sites for this draw's weights (``PREDICTIONS``; nan
    where no map reaches) from its trace (``modules.trace_graph``; None: token inputs), and,
    once, the sites' finite-width spread and the notes (sigprop/kinds/module.py)."""
    E = len(plan.sites)
    out = {k: np.full(E, np.nan) for k in PREDICTIONS}

    def none(why: str) -> dict[str, np.ndarray]:  # measured only, said once
        if why not in plan.notes:
            plan.notes.append(why)
        if not plan.spread_forward:
            plan.spread_forward, plan.spread_backward = [0.0] * E, [0.0] * E
        return out

    xs = x if isinstance(x, tuple) else (x,)
    if traced is None:  # token ids: no moment map for the embedding yet
        return none("token inputs: the theory starts at a float input, measured only")
    if traced.nodes is None:
        return none(traced.why)
    nodes, where = traced.nodes, traced.where(plan.sites)
    # the ratios' reference: all inputs' elements together; each input node starts from its own
    q_in = sum(float(t.double().pow(2).sum()) for t in xs) / sum(t.numel() for t in xs)
    moments = ([float(t.double().pow(2).mean()) for t in xs], [float(t.double().mean()) for t in xs])
    factor = plans.SEPARATION_FACTOR
    try:
        preds = {
            suffix: plans.predict_graph(nodes, *moments, weight_factor=w)
            for suffix, w in (("", 1.0), ("_down", 1.0 / factor), ("_up", factor))
        }
    except Exception as exc:  # a map sigprop got wrong must not cost the user the measurement
        return none(f"the moment maps failed ({type(exc).__name__}: {exc}); measured only; please report it")
    if preds[""].unmapped:
        note = f"no moment map for {preds[''].unmapped}: measured only from there on"
        if note not in plan.notes:
            plan.notes.append(note)
    for suffix, pred in preds.items():
        pf, pb = out["pred_fwd" + suffix], out["pred_bwd" + suffix]
        for i, j in enumerate(where):
            if j is None:
                continue
            if pred.q[j] is not None and pred.q[j] > 0:
                pf[i] = 0.5 * math.log(pred.q[j] / q_in)
            if pred.r[j] is not None and pred.r[j] > 0:
                pb[i] = 0.5 * math.log(pred.r[j])
    if not plan.spread_forward:
        widths = [(k, nd.width) for k, nd in enumerate(nodes) if nd.op in ("dense", "standardized")]
        before = [[w for k, w in widths if j is not None and k <= j] for j in where]
        after = [[w for k, w in widths if j is not None and k > j] for j in where]
        plan.spread_forward, plan.spread_backward = kind.spreads(before, after)
    return out


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
) -> walker.Walked:
    """One walk of a plan outside a probe -- the benchmarks', the golden grid's, the tests' --: the
    steps compiled for ``scheme`` (sigprop/walker.py), the named observers, the draws ``draws``
    at once; no memory plan, no statistics; the observations stay tensors."""
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
        )


def check_finite(name: str, arrays: dict) -> None:
    """The ratios' ln are finite or -inf (a dead ReLU: ratio exactly 0), never nan or +inf: an
    internal error otherwise (no nan reaches the output)."""
    for arr in (arrays["fwd"], arrays["bwd"]):
        if np.isnan(arr).any() or np.isposinf(arr).any():
            raise SigpropError(f"internal error: init {name!r} produced a non-finite log ratio")


# --------------------------------------------------------------------------------------------
# the curvature at init
# --------------------------------------------------------------------------------------------
def _curvature_data(hs: specs.HessianSpec, shape, device, dtype):
    """(x [N, prod(shape)], y [N]): synthetic (``hs.samples`` or ``specs.HESSIAN_SAMPLES`` points), or the
    first ``hs.samples`` of the user's file (all of it when None; ``sigprop.data`` checks it)."""
    if hs.data is None:
        n = specs.HESSIAN_SAMPLES if hs.samples is None else hs.samples
        return H.data(hs.seed, n, shape, device, dtype)
    d = data_mod.take(data_mod.load(hs.data, shape, H.CLASSES), hs.samples)
    return data_mod.inputs(d, device, dtype), torch.as_tensor(d.y, device=device, dtype=torch.long)


def curvature(
    spec, hs: specs.HessianSpec, progress: ProgressFn | None = None, on_start=None
) -> HessianResult:
    """The curvature at init of every init of ``spec`` (any registered kind's): per weight draw the
    largest-magnitude Hessian eigenvalue (restarted Lanczos, ``hessian.largest_eigenvalue``),
    the top-k (ARPACK's Lanczos) and the trace (Hutchinson) as ``hs`` asks; on ``hs.threads``
    CPU threads."""
    with dev.using_threads(hs.threads):
        return _curvature(spec, hs, progress, on_start)


def _curvature_environment(
    hs: specs.HessianSpec,
    device,
    samples: int,
    need: int,
    host: int,
    fields: str,
    params: int,
    top_basis: int,
) -> dict:
    """Refuse a curvature that does not fit -- ``need`` bytes on the device (with --top's host
    basis ``host`` on a CPU), the host basis on the host otherwise -- naming ``fields`` (or
    --batch-size's), and return the environment record."""
    whole = hs.batch_size is None
    dev.check_memory(
        need + (host if device.type == "cpu" else 0),
        device,
        fields if whole else fields.replace("samples", "batch_size"),
        hint="; or take the data in minibatches with --batch-size" if whole else "",
    )
    if host and device.type != "cpu":
        dev.check_memory(host, torch.device("cpu"), "top")
    return {
        "torch": torch.__version__,
        "device": str(device),
        "device_name": dev.device_name(device),
        "dtype": hs.dtype,
        "threads": torch.get_num_threads(),
        "samples": samples,
        "parameters": params,
        "top_products": top_basis,
    }


def _check_parameter_count(hs: specs.HessianSpec, counts: dict[str, int]) -> None:
    """--top and --steps against the fewest trainable parameters an init gives the net."""
    fewest = min(counts, key=counts.get)
    if hs.density and hs.steps > counts[fewest]:
        raise SigpropError(
            f"at most {counts[fewest]}: the net has {counts[fewest]} trainable parameters under init "
            f"{fewest!r} (a Lanczos run has at most that many steps)",
            field="steps",
        )
    if hs.top >= counts[fewest]:
        raise SigpropError(
            f"at most {counts[fewest] - 1}: the net has {counts[fewest]} trainable parameters under init "
            f"{fewest!r} (Lanczos finds fewer eigenvalues than the dimension)",
            field="top",
        )


def _curvature_model(kind, spec, hs: specs.HessianSpec, progress, on_start) -> HessianResult:
    """The module kind: per init and draw, build the model and apply the init as the probe does,
    then the same estimators on the loss of ``hessian.build_module`` (every parameter of the
    model that reaches the loss -- the others are named and left out -- and the 10-way head, the
    output flattened into it)."""
    device = dev.resolve_device(hs.device)
    dtype = dev.DTYPES[hs.dtype]
    if hs.head != "pytorch":
        raise SigpropError("a model's head is PyTorch's default nn.Linear: --head pytorch", field="head")
    if spec.vocab is not None:
        raise SigpropError("token ids: a model's curvature is measured on floating inputs", field="vocab")
    if len(spec.shapes) != 1:
        raise SigpropError(
            f"the curvature is measured on one input, and this forward takes {len(spec.shapes)}",
            field="input_shape",
        )
    names = kind.inits(spec)
    _check_instance_draws(spec, names, hs.seeds)
    shape = tuple(spec.shapes[0])
    itemsize = dev.itemsize(hs.dtype)
    if hs.data is None:  # synthetic inputs: refused before they are drawn when they cannot fit
        samples = specs.HESSIAN_SAMPLES if hs.samples is None else hs.samples
        _check_inputs_fit(spec, samples, itemsize, device, kind.fields)
    x, y = _curvature_data(hs, shape, device, dtype)
    x = x.reshape(x.shape[0], *shape)
    factory = spec.factory()
    rows = min(x.shape[0], hs.batch_size or x.shape[0])
    env: dict = {}
    notes: list[str] = []
    runs, done = [], 0
    products = Products(progress, hs)
    for name in names:
        scheme = kind.scheme(spec, name)
        draws = []
        for draw in range(hs.seeds):
            t0 = time.perf_counter()
            model = _model_draw(factory, scheme, name, hs.seed, draw, device, dtype, x[:rows], notes)
            if not env:  # one forward of two samples: the input checked before any product
                seen = modules.survey(model, x[: min(2, rows)], f"init {name!r}: the model")
                if seen.output:
                    notes.append(seen.output)
            m = H.build_module(model, x[:rows], y[:rows], hs.seed, draw)
            if m.left_out:
                note = H.left_out_note(name, m.left_out)
                notes += [note] if note not in notes else []
            size = sum(p.numel() for p in m.params.values())
            if draw == 0:  # --top and --steps against this init's parameters
                _check_parameter_count(hs, {name: size})
            if not env:  # the graph of the gradient, the parameters' vectors, the Lanczos bases
                basis = max(H.LANCZOS_BASIS, hs.steps if hs.density else 0)
                top_basis = H.arpack_basis(hs.top, size) if hs.top else 0
                need = 8 * rows * seen.per_sample + (6 + basis) * size * itemsize
                host = top_basis * size * 8
                env = _curvature_environment(
                    hs, device, int(x.shape[0]), need, host, kind.fields, size, top_basis
                )
                if on_start is not None:
                    on_start(env)
            h = H.HVP(m, x, y, hs.batch_size)
            products.start(h, f"{name}: draw {draw}", len(names) * hs.seeds - done)
            d = _curvature_draw(h, hs, draw, device)
            products.finish()
            d.seconds = time.perf_counter() - t0
            draws.append(d)
            done += 1
        runs.append(CurvatureRun(name, kind.curvature_description(spec, scheme), draws))
    config = {
        "command": kind.name,
        **spec.to_dict(),
        **hs.__dict__,
        "samples": int(x.shape[0]),
        "model_notes": notes,
    }
    return HessianResult(kind.name, config, {"sigprop": __version__, **env}, runs)


class Products:
    """The curvature's progress in its unit of time, the Hessian-vector product: ``progress(done,
    total, "init: draw k")`` after every product, the total being each draw's planned products
    (``hessian.planned_products``, an upper bound: Lanczos stops when it converges) over the
    draws still to run, so that the first product's time and the total make an estimate."""

    def __init__(self, progress: ProgressFn | None, hs: specs.HessianSpec) -> None:
        self.progress, self.hs = progress, hs
        self.done = self.total = self.end = 0
        self.label = ""

    def start(self, h, label: str, draws_left: int) -> None:
        """A draw begins on ``h`` (its products now counted); ``draws_left`` with it."""
        planned = H.planned_products(self.hs, len(H.layer_blocks(h)) if self.hs.per_layer else 0, h.size)
        self.total = self.done + planned * draws_left
        self.end, self.label = self.done + planned, label
        h.tick = self.tick

    def tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, self.label)

    def finish(self) -> None:
        """The draw is done: the products it did not need leave the total."""
        self.total -= self.end - self.done
        if self.progress is not None:
            self.progress(self.done, self.total, self.label)


def _curvature_draw(h, hs: specs.HessianSpec, draw: int, device) -> CurvatureDraw:
    """One draw's curvature from its Hessian-vector product ``h``: the largest eigenvalue, and as
    ``hs`` asks the top-k, the trace, each layer's block and the density."""
    gen = torch.Generator(device=device)
    gen.manual_seed(specs.derive_seed(hs.seed, specs.STREAM_POWER, draw))
    if not math.isfinite(h.loss):
        d = CurvatureDraw(draw, None, 0, None, "diverged", loss=h.loss, parameters=h.size)
    else:
        pr = H.largest_eigenvalue(h, gen, hs.iters, hs.tol)
        top = H.lanczos_top(h, hs.top, seed=draw) if hs.top and pr.status != "diverged" else []
        tr, se = (
            H.hutchinson_trace(h, hs.trace, gen) if hs.trace and pr.status != "diverged" else (None, None)
        )
        d = CurvatureDraw(
            draw, pr.eigenvalue, pr.iterations, pr.residual, pr.status, top, tr, se, h.loss, h.size
        )
        if hs.per_layer and pr.status != "diverged":
            d.blocks = []
            for layer, start, stop in H.layer_blocks(h):
                b = H.largest_eigenvalue(H.Block(h, start, stop), gen, hs.iters, hs.tol)
                d.blocks.append(
                    {
                        "layer": layer,
                        "parameters": stop - start,
                        "eigenvalue": b.eigenvalue,
                        "status": b.status,
                        "products": b.iterations,
                    }
                )
        if hs.density and pr.status != "diverged":
            g = torch.Generator(device=device)
            g.manual_seed(specs.derive_seed(hs.seed, specs.STREAM_DENSITY, draw))
            q = H.slq(h, hs.probes, hs.steps, g)
            d.density = {
                "nodes": q.nodes,
                "weights": q.weights,
                "trace": q.trace,
                "products": q.products,
            }
    return d


def _curvature(spec, hs: specs.HessianSpec, progress, on_start) -> HessianResult:
    kind = kinds.of(spec)
    if kind.engine == "model":
        return _curvature_model(kind, spec, hs, progress, on_start)
    device = dev.resolve_device(hs.device)
    dtype = dev.DTYPES[hs.dtype]
    check_rows(kind, spec)
    plan = kind.plan(spec, hs.seed)
    shape = plans.input_shape(plan.steps)
    shape = shape if shape[1:] != (1, 1) else (shape[0],)
    x, y = _curvature_data(hs, shape, device, dtype)
    names = kind.inits(spec)
    schemes = {n: kind.scheme(spec, n) for n in names}
    itemsize = dev.itemsize(hs.dtype)
    # --top K: Lanczos needs K below the parameter count, which the plan gives before any draw
    counts = {n: H.parameter_count(plan.steps, schemes[n], hs.head) for n in names}
    params = max(counts.values())
    _check_parameter_count(hs, counts)
    # the graph of the gradient keeps ~8 copies of every activation (of one minibatch with
    # --batch-size); parameters, gradient, product; the largest-eigenvalue search's Lanczos
    # basis (hessian.LANCZOS_BASIS parameter vectors); --top's ARPACK basis of max(2K + 1, 20)
    # float64 vectors (on the host)
    layers = plans.layers(plan.steps)
    units = [math.prod(shape)] + [st.units_out for st in layers]
    weights = sum(st.role.fan_in * st.role.fan_out for st in layers)
    fields = kind.fields
    rows = min(x.shape[0], hs.batch_size or x.shape[0])
    basis = max(H.LANCZOS_BASIS, hs.steps if hs.density else 0)  # --density keeps --steps vectors
    need = (8 * rows * sum(units) + 6 * weights + basis * params) * itemsize
    top_basis = H.arpack_basis(hs.top, params) if hs.top else 0
    host = top_basis * params * 8
    env = _curvature_environment(hs, device, int(x.shape[0]), need, host, fields, params, top_basis)
    if on_start is not None:
        on_start(env)
    runs, done = [], 0
    products = Products(progress, hs)
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
            d = _curvature_draw(h, hs, draw, device)
            products.finish()
            d.seconds = time.perf_counter() - t0
            draws.append(d)
            done += 1
        description = kind.curvature_description(spec, scheme)
        runs.append(CurvatureRun(name, description, draws))
    # the data actually measured: a file's own count (or the first --samples of it)
    config = {"command": kind.name, **spec.to_dict(), **hs.__dict__, "samples": int(x.shape[0])}
    return HessianResult(kind.name, config, {"sigprop": __version__, **env}, runs)


# --------------------------------------------------------------------------------------------
# the input-output Jacobian's spectrum (``sigprop spectrum``, issue 30)
# --------------------------------------------------------------------------------------------
def spectrum(
    spec, ss: specs.SpectrumSpec, progress: ProgressFn | None = None, on_start=None
) -> SpectrumResult:
    """Per init and weight draw the exact Jacobian of the net's last state in its input at
    ``ss.samples`` inputs x ~ N(0, I), its singular values and their summaries
    (sigprop/spectra.py), beside the large-width prediction (``plans.predict_jacobian``)."""
    with dev.using_threads(ss.threads):
        return _spectrum(spec, ss, progress, on_start)


def _spectrum_draw(
    path: str, jacobians, functions: list, x: torch.Tensor, ss: specs.SpectrumSpec, draw: int, n_out: int
):
    """One draw's summaries and its eigenvalues (exact: [N, n_out]; lanczos: the quadrature's
    nodes and their weights): ``jacobians()`` the exact J [N, n_out, n_in], ``functions`` per
    sample the map its input -> the output, flattened (for the J^T J operator)."""
    n_in = x[0].numel()
    k = min(n_in, n_out)
    if path == "exact":
        lam = spectra.eigenvalues(jacobians())
        extra = spectra.extremes_exact(lam, k, ss.top) if ss.top else {}
        return {"draw": draw, **spectra.summary(lam, k), **extra}, lam.reshape(-1)
    gen = torch.Generator(device=x.device).manual_seed(specs.derive_seed(ss.seed, specs.STREAM_DENSITY, draw))
    grams = [spectra.Gram(f, x[i]) for i, f in enumerate(functions)]
    largest, nodes, weights = [], [], []
    for g in grams:
        top = H.largest_eigenvalue(g, gen, 100, 1e-3)
        largest.append(top.eigenvalue or 0.0)
        q = H.slq(g, ss.probes, ss.steps, gen)
        nodes += q.nodes
        weights += q.weights
    summary, lam, mass = spectra.lanczos_summary(grams, largest, nodes, weights)
    extra = spectra.extremes_lanczos(grams, ss.top, H.lanczos_top) if ss.top else {}
    return {"draw": draw, **summary, **extra}, (lam, mass)


def _spectrum_environment(
    ss: specs.SpectrumSpec, device, n_in: int, n_out: int, path: str, chunk: int | None = None
) -> dict:
    """The environment record of a spectrum: the machine, the sizes, the path's products and how
    the exact path chunked its reverse passes (``chunk``: samples at once for sigprop's nets,
    --batch-size; outputs at once for a model's J, sized to the memory)."""
    return {
        "torch": torch.__version__,
        "device": str(device),
        "device_name": dev.device_name(device),
        "dtype": ss.dtype,
        "threads": torch.get_num_threads(),
        "samples": ss.samples,
        "input_units": n_in,
        "output_units": n_out,
        "path": path,
        "reverse_products": n_out if path == "exact" else None,
        "products_per_sample": None if path == "exact" else 2 * ss.probes * ss.steps,
        "chunk": chunk if path == "exact" else None,
    }


def _check_top(ss: specs.SpectrumSpec, path: str, n_in: int, n_out: int) -> None:
    """--top against J's min(n_in, n_out) singular values (Lanczos finds fewer than the size)."""
    k = min(n_in, n_out)
    most = k if path == "exact" else k - 1
    if ss.top > most:
        raise SigpropError(
            f"at most {most}: J has min(n_in, n_out) = {k} singular values"
            + ("" if path == "exact" else " (the lanczos path finds fewer than that)"),
            field="top",
        )


def _pooled_histogram(path: str, pooled: list) -> dict:
    if path == "exact":
        return spectra.histogram(np.concatenate(pooled))
    return spectra.histogram(
        np.concatenate([p[0] for p in pooled]), weights=np.concatenate([p[1] for p in pooled])
    )


#: the bytes the reverse products of one chunk of a model's outputs may hold at once
MODEL_JACOBIAN_CHUNK_BYTES = 2**30


def _model_spectrum_mean(traced, x: torch.Tensor, n_out: int) -> tuple[float | None, str]:
    """The predicted mean sigma^2 of a model's J (``plans.predict_graph`` on this draw's trace,
    ``modules.trace_graph``): r at the input, the gradient's second moment per element for an
    N(0, 1) error at the output, times n_in/n_out (per element to the total: E||J^T e||^2/||e||^2);
    or None and why."""
    nodes = traced.nodes
    if nodes is None:
        return None, traced.why
    try:
        pred = plans.predict_graph(nodes, float(x.double().pow(2).mean()), float(x.double().mean()))
    except Exception as exc:  # a map sigprop got wrong must not cost the user the measurement
        return None, f"the moment maps failed ({type(exc).__name__}: {exc})"
    if pred.unmapped:
        return None, f"no moment map for {pred.unmapped}"
    r = next(pred.r[i] for i, nd in enumerate(nodes) if nd.op == "input")
    if r is None:
        return None, "no backward map reaches the input"
    return r * x[0].numel() / n_out, ""


def _spectrum_model(kind, spec, ss: specs.SpectrumSpec, progress, on_start) -> SpectrumResult:
    """The module kind: per init and draw, build the model, apply the init (as the probe does),
    and read J of its output in its input through its own forward (``spectra.model_jacobians``,
    or the J^T J operator); exact when S x n_out x n_in fits.  The large-width theory of a
    model's spectrum is not derived (said in ``why``)."""
    device = dev.resolve_device(ss.device)
    dtype = dev.DTYPES[ss.dtype]
    if spec.vocab is not None:
        raise SigpropError("token ids have no Jacobian: the spectrum needs a floating input", field="vocab")
    if ss.depths or ss.at:
        raise SigpropError(
            "the spectrum against depth is measured for sigprop's own nets only",
            field="depths" if ss.depths else "at",
        )
    if len(spec.shapes) != 1:
        raise SigpropError(
            f"the spectrum is taken in one input, and this forward takes {len(spec.shapes)}",
            field="input_shape",
        )
    names = kind.inits(spec)
    _check_instance_draws(spec, names, ss.seeds)
    itemsize = dev.itemsize(ss.dtype)
    _check_inputs_fit(spec, ss.samples, itemsize, device, kind.fields)
    x = _model_inputs(spec, ss.samples, ss.seed, device, dtype)
    factory = spec.factory()
    n_in = x[0].numel()
    env: dict = {}
    notes: list[str] = []
    runs, total, done = [], len(names) * ss.seeds, 0
    for name in names:
        scheme = kind.scheme(spec, name)
        draws, pooled, means = [], [], []
        for draw in range(ss.seeds):
            model = _model_draw(factory, scheme, name, ss.seed, draw, device, dtype, x, notes)
            what = f"init {name!r}: the model"
            traced = modules.trace_graph(model, x, what)
            if not env:  # one forward of two samples: the input checked, the sizes, the path, the memory
                seen = traced.survey or modules.survey(model, x[: min(2, ss.samples)], what)
                n_out = seen.units
                if seen.output:
                    notes.append(seen.output)
            means.append(_model_spectrum_mean(traced, x, n_out))
            model = spectra.functional(model)
            if not env:
                rows = ss.samples if spectra.batch_dependent(model) else 1
                per_output = seen.per_sample * rows
                chunk = max(1, min(n_out, MODEL_JACOBIAN_CHUNK_BYTES // max(1, per_output)))
                weights = sum(p.numel() * p.element_size() for p in model.parameters())
                need = weights + ss.samples * n_out * n_in * (itemsize + 16) + chunk * per_output
                path = ss.path if ss.path != "auto" else ("exact" if dev.fits(need, device) else "lanczos")
                _check_top(ss, path, n_in, n_out)
                if path == "exact":
                    dev.check_memory(
                        need,
                        device,
                        kind.fields,
                        hint="; the exact Jacobian holds n_out x n_in entries a sample",
                    )
                env = _spectrum_environment(ss, device, n_in, n_out, path, chunk)
                if on_start is not None:
                    on_start(env)
            functions = [spectra.model_function(model, x, i) for i in range(ss.samples)]
            summary, lam = _spectrum_draw(
                path, lambda: spectra.model_jacobians(model, x, chunk), functions, x, ss, draw, n_out
            )
            draws.append(summary)
            pooled.append(lam)
            done += 1
            if progress is not None:
                progress(done, total, f"{name}: draw {draw}")
        # the mean: the traced graph's backward map at the input, per draw's weights, averaged
        mapped = [m for m, _ in means if m is not None]
        why = next((w for m, w in means if m is None), "")
        runs.append(
            SpectrumRun(
                name,
                scheme.description,
                draws,
                statistics.fmean(mapped) if len(mapped) == len(means) else None,
                None,
                "the variance of a model's spectrum is not derived"
                + (f"; no mean either: {why}" if why else " (the mean is its traced graph's)"),
                _pooled_histogram(path, pooled),
                [],
            )
        )
    config = {"command": kind.name, **spec.to_dict(), **ss.__dict__, "model_notes": notes}
    return SpectrumResult(kind.name, config, {"sigprop": __version__, **env}, runs)


def _spectrum(spec, ss: specs.SpectrumSpec, progress, on_start) -> SpectrumResult:
    kind = kinds.of(spec)
    if kind.engine == "model":
        return _spectrum_model(kind, spec, ss, progress, on_start)
    device = dev.resolve_device(ss.device)
    dtype = dev.DTYPES[ss.dtype]
    check_rows(kind, spec)
    plan = kind.plan(spec, ss.seed)
    n_in, n_out = _inputs_units(plan)
    # the exact path: J for every sample (float32, and float64 for the SVD), and the reverse pass
    # of all n_out outputs at once over one sample's activations (jacrev, vectorised)
    layers = plans.layers(plan.steps)
    activations = n_in + sum(st.units_out for st in layers)
    itemsize = dev.itemsize(ss.dtype)
    # the recorded states whose Jacobians --depths (all) or --at (some) asks for
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
            need, device, kind.fields, hint="; the exact Jacobian holds n_out x n_in entries a sample"
        )
    else:  # one sample's graph at a time, and the Lanczos basis of --steps input vectors
        lanczos_need = weights + (8 * activations + (ss.steps + 4) * n_in) * itemsize
        dev.check_memory(lanczos_need, device, kind.fields, hint="")
    _check_top(ss, path, n_in, n_out)
    # a batch norm normalises over the batch: each sample's J is taken inside it
    together = plans.batch_dependent(plan.steps)
    gx = torch.Generator(device=device).manual_seed(specs.derive_seed(ss.seed, specs.STREAM_INPUTS))
    x = torch.randn(ss.samples, n_in, generator=gx, device=device, dtype=dtype)  # the probe's inputs
    names = kind.inits(spec)
    env = _spectrum_environment(ss, device, n_in, n_out, path, ss.batch_size or ss.samples)
    if on_start is not None:
        on_start(env)
    runs = []
    total, done = len(names) * ss.seeds, 0
    for name in names:
        scheme = kind.scheme(spec, name)
        draws, pooled, per_depth = [], [], []
        for draw in range(ss.seeds):
            fn = walker.as_function(plan.steps, scheme, x, ss.seed, draw, kind.space(spec))
            functions = (
                [spectra.batch_function(fn, x, i) for i in range(ss.samples)]
                if together
                else [spectra.sample_function(fn)] * ss.samples
            )
            summary, lam = _spectrum_draw(
                path,
                lambda: spectra.jacobian(fn, x, batch=ss.batch_size, together=together).detach(),
                functions,
                x,
                ss,
                draw,
                n_out,
            )
            draws.append(summary)
            pooled.append(lam)
            if chosen:  # the units' outputs in the input: the spectrum against depth
                rows = []
                for depth in chosen:
                    Jl = spectra.jacobian(fn, x, depth, ss.batch_size, together).detach()
                    lam_l = spectra.eigenvalues(Jl)
                    rows.append((float(lam_l.mean()), float(lam_l.var())))
                per_depth.append(rows)
            done += 1
            if progress is not None:
                progress(done, total, f"{name}: draw {draw}")
        pred = plans.predict_jacobian(plan.steps, scheme)
        density = plans.predict_density(plan.steps, scheme)
        mean = None if pred is None or not math.isfinite(pred.mean) else pred.mean
        depths = []
        for k, depth in enumerate(chosen):
            p = plans.predict_jacobian(plans.upto(plan.steps, depth), scheme)
            depths.append(
                {
                    "depth": depth,
                    "mean": statistics.fmean(r[k][0] for r in per_depth),
                    "variance": statistics.fmean(r[k][1] for r in per_depth),
                    "predicted_mean": p.mean if math.isfinite(p.mean) else None,
                    "predicted_variance": p.variance,
                }
            )
        runs.append(
            SpectrumRun(
                name,
                scheme.description,
                draws,
                mean,
                None if pred is None else pred.variance,
                "" if pred is None else pred.why,
                _pooled_histogram(path, pooled),
                depths,
                None if density is None else dataclasses.asdict(density),
            )
        )
    # the plan's own record beside the spec (the drawn widths of --width LO:HI)
    config = {"command": kind.name, **spec.to_dict(), **ss.__dict__, **plan.config}
    return SpectrumResult(kind.name, config, {"sigprop": __version__, **env}, runs)
