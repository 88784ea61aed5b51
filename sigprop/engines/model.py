"""The model engine: a user's own ``torch.nn.Module`` (a kind that declares ``engine =
"model"``) probed with autograd hooks beside its traced graph's moment maps, its Jacobian's
spectrum read through its own forward, and its loss Hessian's curvature -- each draw built,
initialised and prepared as the others are (``model_draw``)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch

import sigprop.hessian as H  # not ``from sigprop import hessian``: an API name, it loads the API
from sigprop import data as data_mod
from sigprop import specs
from sigprop.engines import shared
from sigprop.engines.registry import Engine, register
from sigprop.engines.shared import Measured
from sigprop.errors import SigpropError
from sigprop.kernels import device as dev
from sigprop.maps import graph
from sigprop.model import build, functions, init, measure, sites, trace
from sigprop.model.ops.norm import is_norm
from sigprop.results import CurvatureRun, HessianResult, RunResult, SpectrumResult, SpectrumRun
from sigprop.version import __version__

MODEL_MEMORY_HINT = ", or run the samples in chunks (--batch-size)"


def _refused(kind, family: str, field: str, more: str = "") -> SigpropError:
    """The refusal of ``field`` in the measurement ``family`` as the kind declares it
    (``Kind.refuses``: the CLI's help and its one-line errors read the same words)."""
    return SigpropError(kind.refuses[family][field] + more, field=field)


def _check_instance_draws(spec, names, seeds: int) -> None:
    if spec.reinitializes_one_instance() and "as-is" in names and seeds > 1:
        raise SigpropError(
            "a model instance has one set of its own weights: pass a factory (a callable that builds "
            "the model) for several as-is draws, or --seeds 1",
            field="seeds",
        )


def _model_inputs(spec, samples: int, seed: int, device, dtype, skip=()):
    """A model kind's inputs: the API's own tensors (their first ``samples`` rows), the user's
    --data, N(0, I) of each --input-shape, or token ids uniform over --vocab less the padding ids
    ``skip`` (``build.padding_ids``) -- one tensor, or a tuple for a forward of several; and the
    --data read (None otherwise), whose labels are checked against the model's outputs once they
    are known (``_check_labels``)."""
    d = None
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
        d = data_mod.take(data_mod.load(spec.data, spec.input_shape, None), samples)
        x = data_mod.inputs(d, device, dtype).reshape(d.count, *spec.input_shape)
    elif spec.vocab is None:  # N(0, I), one tensor per input the forward takes
        xs = tuple(
            torch.randn(samples, *shape, generator=gx, device=device, dtype=dtype) for shape in spec.shapes
        )
        x = xs[0] if len(xs) == 1 else xs
    else:  # token ids, uniform over the vocabulary less its padding ids
        x = build.uniform_ids(spec.vocab, (samples, *spec.input_shape), list(skip), gx, device)
    return x, d


def _check_labels(d, units: int) -> None:
    """--data's labels within the model's outputs (``data.check_labels``; no --data: nothing)."""
    if d is not None:
        data_mod.check_labels(d, units)


def _check_inputs_fit(spec, samples: int, itemsize: int, device, fields: str) -> None:
    """Refuse, before the inputs are drawn, a model kind's inputs that cannot fit: ``samples`` rows
    of every --input-shape, with the leaf outputs of at least that much again a few times over
    (the floor of any forward and backward on them; ``survey`` measures the real cost later)."""
    bound = samples * sum(math.prod(s) for s in spec.shapes) * itemsize * 4
    dev.check_memory(bound, device, fields)


def _model_draw(
    factory, scheme, name: str, seed: int, draw: int, device, dtype, calib, notes: list, built=None
):
    """One draw of a model kind's model, as the probe, the spectrum and the curvature all run it:
    built under its seeded generator (or ``built``, that draw's model built already), the init
    applied (``init.init_``; what it left and what it assumed joins ``notes`` once), prepared
    (``build.prepare``: no stochastic op, training-mode normalisation) and its weights checked
    finite (one line, the same on every path)."""
    model = build.build(factory, seed, draw) if built is None else built
    records = init.init_(model, scheme, seed, draw, batch=calib, quiet=True)
    said = init.init_notes(name, records) + build.prepare_notes(model, dtype)
    notes += [n for n in said if n not in notes]
    model = build.prepare(model, device, dtype)
    build.check_finite_weights(model, f"init {name!r}: the model's weights")
    return model


def _padding_ids(spec, factory, seed: int):
    """(the first draw's model, built once here, or None; the ids sigprop's random token ids
    leave out): a model's padding ids (``build.padding_ids``: a zero row at init, which a real
    input masks) where sigprop draws the ids, none where the user gives the inputs."""
    if spec.vocab is None or spec.inputs is not None or spec.data is not None:
        return None, ()
    first = build.build(factory, seed, 0)
    return first, build.padding_ids(first, spec.vocab)


def _padding_note(vocab: int, skip) -> str:
    return (
        f"inputs: token ids uniform over [0, {vocab}) less the padding id(s) {', '.join(map(str, skip))} "
        "(an embedding's padding_idx: a zero row at init, which a real input puts only where its "
        "attention mask hides it)"
    )


def _measure_model(kind, spec, probe_spec: specs.ProbeSpec, progress, on_start, extra) -> Measured:
    """A kind whose spec builds a ``torch.nn.Module`` (``Kind.engine == "model"``): per init and
    draw, build the model (its factory under a seeded generator), apply the init
    (``init.init_``; ``as-is`` keeps the model's own), measure the sites with autograd on the
    shared inputs and output errors, then trace it and compose its moment maps
    (``graph.predict_graph``) on that draw's weights.  Arrays per init: "fwd", "bwd" [S, E, N],
    "reached" [S, E] (1 where the output's gradient reached the site), "cosine" [S, E, N] (the
    mean cosine between the tokens of one sample; nan: no token sequence), "entropy" [S, E, N]
    (the attention's normalised entropy inside the site; nan: none read) and the predictions
    "pred_fwd", "pred_bwd" [S, E] (ln of the RMS ratio, nan: no map); the run's ``ModulePlan`` holds
    the sites, their units and the notes."""
    for name, given in (
        ("observe", extra),
        ("correlations", probe_spec.correlations),
        ("stream", probe_spec.stream),
        ("graphs", probe_spec.graphs),
        ("fuse", probe_spec.fuse),
    ):
        if given:
            raise _refused(kind, "probe", name)
    device = dev.resolve_device(probe_spec.device)
    dtype = dev.DTYPES[probe_spec.dtype]
    names = kind.inits(spec)
    schemes = [kind.scheme(spec, n) for n in names]
    _check_instance_draws(spec, names, probe_spec.seeds)
    _check_inputs_fit(spec, probe_spec.samples, dev.itemsize(probe_spec.dtype), device, kind.size_fields)
    env = shared.probe_environment(probe_spec, device, stream=False, batch=1)
    factory = spec.factory()
    first, skip = _padding_ids(spec, factory, probe_spec.seed)
    x, data = _model_inputs(spec, probe_spec.samples, probe_spec.seed, device, dtype, skip)
    e_seed = specs.derive_seed(probe_spec.seed, specs.STREAM_ERRORS)
    plan = ModulePlan()
    plan.init_notes += [_padding_note(spec.vocab, skip)] if skip else []
    total, done = len(names) * probe_spec.seeds, 0
    started = False
    arrays: dict[str, dict[str, np.ndarray]] = {}
    # a data-dependent init calibrates on the probe's inputs (a chunk's worth with --batch-size)
    calib = build.rows(x, 0, spec.batch_size) if spec.batch_size else x
    tokens = sequence_length(x)  # an image model's: from its first draw's graph
    for name, scheme in zip(names, schemes):
        got: dict[str, list] = {k: [] for k in (*RECORDED, *PREDICTIONS)}
        for draw in range(probe_spec.seeds):
            model = _model_draw(
                factory, scheme, name, probe_spec.seed, draw, device, dtype, calib, plan.init_notes, first
            )
            first = None
            what = f"init {name!r}: the model"
            traced = trace.trace_graph(model, x, what)
            tokens = tokens or sequence_length(x, traced)
            if not plan.sites:  # one forward of two samples: the input checked, the sites, the memory
                units = _resolve_sites(kind, spec, probe_spec, plan, model, traced, x, what, device)
                _check_labels(data, units)
            got_ = measure.measure(model, x, e_seed, plan.sites, spec.batch_size, what, tokens)
            if not started:  # the banner once the model has run: a model that cannot, says only why
                started = True
                if on_start is not None:
                    on_start(env)
            if not plan.entries:
                plan.entries = list(got_.units)
            got["reached"].append(np.asarray(got_.reached, dtype=np.float64))
            measured = {"fwd": got_.ln_f, "bwd": got_.ln_b, "cosine": got_.cosine, "entropy": got_.entropy}
            for k, v in {**measured, **_model_prediction(traced, x, plan, name)}.items():
                got[k].append(v)
            done += 1
            if progress is not None:
                progress(done, total, f"{name}: draw {draw + 1}")
        arrays[name] = {k: np.stack(v) for k, v in got.items()}
        shared.check_finite(name, arrays[name])
        reached = arrays[name]["reached"].any(axis=0)
        note = kind.off_path_note([s for s, r in zip(plan.sites, reached) if not r])
        if note and note not in plan.site_notes:
            plan.site_notes.append(note)
    return Measured(kind, plan, names, schemes, arrays, env)


@dataclass
class ModulePlan:
    """What a model's probe found, filled in here while the draws run (the model is built only
    here) and read when its records are assembled (``shared.assemble_traced``): the sites'
    names and units per sample (``entries``) and the notes (which op ended the theory, why the
    trace failed; what an init could not set; the sites off the output's path).  What depends
    on an init's weights -- its predictions and their finite-width spread -- is in its arrays,
    not here."""

    sites: list[str] = field(default_factory=list)
    entries: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    init_notes: list[str] = field(default_factory=list)
    #: which output is read, the sites left out (never called), the sites off the output's path
    site_notes: list[str] = field(default_factory=list)
    steps: tuple = ()
    #: the first and the last site that are layers of the model's repeated stack (a transformer's
    #: layers; ``sites.stack_span``), None without one; and whether the last site is a normalisation
    stack: tuple[int, int] | None = None
    final_norm: bool = False

    @property
    def config(self) -> dict:
        return {
            "site_names": list(self.sites),
            "theory_notes": list(self.notes),
            "init_notes": list(self.init_notes),
            "site_notes": list(self.site_notes),
            "layer_sites": None if self.stack is None else [self.sites[i] for i in self.stack],
        }


def _resolve_sites(kind, spec, probe_spec, plan, model, traced, x, what: str, device) -> int:
    """The first draw's sites (``plan.sites``, their notes) from the trace's survey or one forward
    of two samples with hooks, and the batch's memory refused before it runs; the model's output
    units."""
    seen = traced.survey if traced and traced.survey else sites.survey(model, build.rows(x, 0, 2), what)
    plan.sites, plan.site_notes = sites.resolve_sites(
        model, spec.sites, seen.called, seen.not_per_sample, seen.order
    )
    if seen.output:
        plan.site_notes.insert(0, seen.output)
    plan.stack = sites.stack_span(model, plan.sites)
    last = sites.module_of(plan.sites[-1]) if plan.sites else ""
    plan.final_norm = bool(last) and is_norm(model.get_submodule(last))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # the leaf outputs of the batch: 9.2 GiB estimated, 9.0 GiB peak measured for DenseNet121 at
    # 3x224x224 with 64 samples (benchmarks/module.py)
    rows = min(spec.batch_size or probe_spec.samples, probe_spec.samples)
    dev.check_memory(weights + seen.per_sample * rows, device, kind.size_fields, MODEL_MEMORY_HINT)
    return seen.units


def sequence_length(x, traced=None) -> int | None:
    """T of inputs that are sequences of tokens -- token ids [N, T] or float tokens [N, T, d] (the
    first input of several) --, or else of the first attention in the traced graph (a ViT's
    patches and class token), the sites whose outputs are [N, T, d'] read as tokens; else None."""
    first = x[0] if isinstance(x, tuple) else x
    if first.dim() == (3 if first.is_floating_point() else 2):
        return int(first.shape[1])
    nodes = getattr(traced, "nodes", None) or ()
    return next((nd.params.tokens for nd in nodes if nd.op in ("attention", "sdpa")), None)


#: a model's predictions, per site and draw: ln RMS ratios as traced on that draw's weights (an
#: init's record does not depend on the inits run before it; its band is the run's own standard
#: error plus the maps' stated accuracy: ``stats.attach_traced``)
PREDICTIONS = ("pred_fwd", "pred_bwd")
#: what a draw records per site beside them: the measured ratios and token statistics, where the
#: output's gradient reached, and the token cosine's and attention entropy's predictions
RECORDED = ("fwd", "bwd", "reached", "cosine", "entropy", "pred_cosine", "pred_entropy")


def _model_prediction(traced, x, plan, name: str) -> dict[str, np.ndarray]:
    """ln of the predicted RMS ratios at the sites for this draw's weights (``PREDICTIONS``; nan
    where no map reaches) from its trace (``trace.trace_graph``; None: token inputs), the
    token cosine's, and the notes once (sigprop/kinds/module.py)."""
    E = len(plan.sites)
    out = {k: np.full(E, np.nan) for k in (*PREDICTIONS, "pred_cosine", "pred_entropy")}

    def none(why: str) -> dict[str, np.ndarray]:  # measured only, said once
        if why not in plan.notes:
            plan.notes.append(why)
        return out

    xs = x if isinstance(x, tuple) else (x,)
    if traced.nodes is None:
        return none(traced.why)
    nodes, where = traced.nodes, traced.where(plan.sites)
    floating = all(t.is_floating_point() for t in xs)
    # the ratios' reference: all inputs' elements together; each input node starts from its own
    # (token ids: none -- the embedding's map reads its table; the ratios are to the first site)
    if floating:
        q_in = sum(float(t.double().pow(2).sum()) for t in xs) / sum(t.numel() for t in xs)
        moments = ([float(t.double().pow(2).mean()) for t in xs], [float(t.double().mean()) for t in xs])
    else:
        q_in, moments = None, ([1.0] * len(xs), [0.0] * len(xs))
    try:
        pred = graph.predict_graph(nodes, *moments)
    except Exception as exc:  # a map sigprop got wrong must not cost the user the measurement
        return none(f"the moment maps failed ({type(exc).__name__}: {exc}); measured only; please report it")
    if pred.unmapped:
        note = f"no moment map for {pred.unmapped}: measured only from there on"
        if note not in plan.notes:
            plan.notes.append(note)
    if pred.backward_why and pred.backward_why not in plan.notes:
        plan.notes.append(pred.backward_why)
    if pred.shared_draws and not any(n.startswith("shared depth:") for n in plan.notes):
        plan.notes.append(shared_depth_note(pred.shared_draws))
    # informational notes after the one that says why a prediction is missing (the verdicts read
    # the first as the reason)
    if traced.tracer != "torch.fx" and not any(n.startswith("theory traced by") for n in plan.notes):
        plan.notes.append(f"theory traced by {traced.tracer} (ATen ops; torch.fx could not trace the model)")
    if traced.cache_off and not any(n.startswith("theory traced with") for n in plan.notes):
        # the outermost models only (Phi-3's and Falcon's layers hold the config too: every one listed)
        paths = traced.cache_off
        outer = [p for p in paths if not any(q != p and (q == "" or p.startswith(q + ".")) for q in paths)]
        held = ", ".join(repr(p) if p else "the model" for p in outer)
        plan.notes.append(
            f"theory traced with the key/value cache of {held} off (config.use_cache; at init the "
            "cache only concatenates one forward's keys to an empty one); measured as the model runs"
        )
    # each init's regime (its weights' logits), said once for it: not the first init's for all
    under = f"across keys under init {name!r}"
    if pred.regimes and not any(n.startswith("attention:") and under in n for n in plan.notes):
        s2 = pred.regimes
        plan.notes.append(
            f"attention: logits of variance {min(s2):.2g} to {max(s2):.2g} {under} "
            f"({'near-uniform' if max(s2) < 0.1 else 'beyond uniform: softmax moments by quadrature'}; "
            "docs/theory.md §15)"
        )
    tokens = sequence_length(x, traced)
    ref = q_in if floating else (pred.q[where[0]] if where and where[0] is not None else None)
    for i, j in enumerate(where):
        if j is None:
            continue
        if ref and pred.q[j] is not None and pred.q[j] > 0:
            out["pred_fwd"][i] = 0.5 * math.log(pred.q[j] / ref)
        if pred.r[j] is not None and pred.r[j] > 0:
            out["pred_bwd"][i] = 0.5 * math.log(pred.r[j])
        shape = nodes[j].shape  # the mean cosine between the tokens of one sample: t / q
        if tokens and len(shape) == 2 and shape[0] == tokens and pred.q[j] and pred.cosine[j] is not None:
            out["pred_cosine"][i] = pred.cosine[j]
    for i, site in enumerate(plan.sites):  # the attention inside a site: its weights' entropy
        h = [pred.entropy[k] for k in traced.inside(site) if k in pred.entropy]
        if h and all(v == v for v in h):
            out["pred_entropy"][i] = float(np.mean(h))
    return out


def shared_depth_note(shared: dict) -> str:
    """What a user reads where weights are read at several depths: which, how often, and how
    far the infinite-width maps held as measured (docs/theory.md §16)."""
    most = max(shared.values())
    key = max(shared, key=shared.get)
    return (
        f"shared depth: {len(shared)} weight draw(s) read at several nodes ({key} {most} times); "
        "the theory carries their cross moments at infinite width (docs/theory.md §16: measured "
        "within 6% forward, 3% backward, 0.05 cosine for pre-norm blocks at width 128; a post-norm "
        "block's backward up to 26% off at width 128, 11% at 256, 1% at 512)"
    )


def _curvature_model(kind, spec, hs: specs.HessianSpec, progress, on_start) -> HessianResult:
    """The module kind: per init and draw, build the model and apply the init as the probe does,
    then the same estimators on the loss of ``functions.build_module`` (every parameter of the
    model that reaches the loss -- the others are named and left out -- and the 10-way head, the
    output flattened into it)."""
    device = dev.resolve_device(hs.device)
    dtype = dev.DTYPES[hs.dtype]
    if hs.head != "pytorch":
        raise _refused(kind, "hessian", "head", ": --head pytorch")
    if spec.vocab is not None:
        raise _refused(kind, "hessian", "vocab")
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
        samples = kind.curvature_samples if hs.samples is None else hs.samples
        _check_inputs_fit(spec, samples, itemsize, device, kind.size_fields)
    x, y = shared.curvature_data(hs, shape, device, dtype, kind.curvature_samples)
    x = x.reshape(x.shape[0], *shape)
    factory = spec.factory()
    rows = min(x.shape[0], hs.batch_size or x.shape[0])
    env: dict = {}
    notes: list[str] = []
    runs, done = [], 0
    products = shared.Products(progress, hs)
    for name in names:
        scheme = kind.scheme(spec, name)
        draws = []
        for draw in range(hs.seeds):
            t0 = time.perf_counter()
            model = _model_draw(factory, scheme, name, hs.seed, draw, device, dtype, x[:rows], notes)
            if not env:  # one forward of two samples: the input checked before any product
                seen = sites.survey(model, x[: min(2, rows)], f"init {name!r}: the model")
                if seen.output:
                    notes.append(seen.output)
            m = functions.build_module(model, x[:rows], y[:rows], hs.seed, draw)
            if m.left_out:
                note = functions.left_out_note(name, m.left_out)
                notes += [note] if note not in notes else []
            size = sum(p.numel() for p in m.params.values())
            if draw == 0:  # --top and --steps against this init's parameters
                shared.check_parameter_count(hs, {name: size})
            if not env:  # the graph of the gradient, the parameters' vectors, the Lanczos bases
                basis = max(H.LANCZOS_BASIS, hs.steps if hs.density else 0)
                top_basis = H.arpack_basis(hs.top, size) if hs.top else 0
                need = 8 * rows * seen.per_sample + (6 + basis) * size * itemsize
                host = top_basis * size * 8
                env = shared.curvature_environment(
                    hs, device, int(x.shape[0]), need, host, kind.size_fields, size, top_basis
                )
                if on_start is not None:
                    on_start(env)
            h = H.HVP(m, x, y, hs.batch_size)
            products.start(h, f"{name}: draw {draw}", len(names) * hs.seeds - done)
            d = shared.curvature_draw(h, hs, draw, device)
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


#: the bytes the reverse products of one chunk of a model's outputs may hold at once
MODEL_JACOBIAN_CHUNK_BYTES = 2**30


def _model_spectrum_mean(traced, x: torch.Tensor, n_out: int) -> tuple[float | None, str]:
    """The predicted mean sigma^2 of a model's J (``graph.predict_graph`` on this draw's trace,
    ``trace.trace_graph``): r at the input, the gradient's second moment per element for an
    N(0, 1) error at the output, times n_in/n_out (per element to the total: E||J^T e||^2/||e||^2);
    or None and why."""
    nodes = traced.nodes
    if nodes is None:
        return None, traced.why
    try:
        pred = graph.predict_graph(nodes, float(x.double().pow(2).mean()), float(x.double().mean()))
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
    and read J of its output in its input through its own forward (``functions.model_jacobians``,
    or the J^T J operator); exact when S x n_out x n_in fits.  The large-width theory of a
    model's spectrum is not derived (said in ``why``); its mean is its traced graph's."""
    device = dev.resolve_device(ss.device)
    dtype = dev.DTYPES[ss.dtype]
    _check_spectrum(kind, spec, ss)
    names = kind.inits(spec)
    _check_instance_draws(spec, names, ss.seeds)
    _check_inputs_fit(spec, ss.samples, dev.itemsize(ss.dtype), device, kind.size_fields)
    x, data = _model_inputs(spec, ss.samples, ss.seed, device, dtype)
    factory = spec.factory()
    env: dict = {}
    notes: list[str] = []
    runs, tick = [], shared.DrawTicker(progress, len(names) * ss.seeds)
    for name in names:
        scheme = kind.scheme(spec, name)
        draws, pooled, means = [], [], []
        for draw in range(ss.seeds):
            model = _model_draw(factory, scheme, name, ss.seed, draw, device, dtype, x, notes)
            what = f"init {name!r}: the model"
            traced = trace.trace_graph(model, x, what)
            if not env:  # one forward of two samples: the input checked, the sizes, the path, the memory
                seen = traced.survey or sites.survey(model, x[: min(2, ss.samples)], what)
                n_out = seen.units
                _check_labels(data, n_out)
                if seen.output:
                    notes.append(seen.output)
            means.append(_model_spectrum_mean(traced, x, n_out))
            model = functions.functional(model)
            if not env:
                path, chunk, env = _spectrum_plan(
                    kind, ss, model, seen.per_sample, x[0].numel(), n_out, device
                )
                if on_start is not None:
                    on_start(env)
            sample_fns = [functions.model_function(model, x, i) for i in range(ss.samples)]
            summary, lam = shared.spectrum_draw(
                path, lambda: functions.model_jacobians(model, x, chunk), sample_fns, x, ss, draw, n_out
            )
            draws.append(summary)
            pooled.append(lam)
            tick(f"{name}: draw {draw}")
        runs.append(_model_spectrum_run(name, scheme, draws, means, shared.pooled_histogram(path, pooled)))
    config = {"command": kind.name, **spec.to_dict(), **ss.__dict__, "model_notes": notes}
    return SpectrumResult(kind.name, config, {"sigprop": __version__, **env}, runs)


def _check_spectrum(kind, spec, ss: specs.SpectrumSpec) -> None:
    """What a model's spectrum refuses: token ids, the spectrum against depth, several inputs."""
    if spec.vocab is not None:
        raise _refused(kind, "spectrum", "vocab")
    if ss.depths or ss.at:
        raise _refused(kind, "spectrum", "depths" if ss.depths else "at")
    if len(spec.shapes) != 1:
        raise SigpropError(
            f"the spectrum is taken in one input, and this forward takes {len(spec.shapes)}",
            field="input_shape",
        )


def _spectrum_plan(kind, ss: specs.SpectrumSpec, model, per_sample: int, n_in: int, n_out: int, device):
    """(path, chunk, environment): the outputs whose reverse products run at once (within
    ``MODEL_JACOBIAN_CHUNK_BYTES``), the path (exact when the S Jacobians fit), a refusal naming
    the kind's fields when they do not."""
    itemsize = dev.itemsize(ss.dtype)
    rows = ss.samples if functions.batch_dependent(model) else 1
    per_output = per_sample * rows
    chunk = max(1, min(n_out, MODEL_JACOBIAN_CHUNK_BYTES // max(1, per_output)))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    need = weights + ss.samples * n_out * n_in * (itemsize + 16) + chunk * per_output
    path = ss.path if ss.path != "auto" else ("exact" if dev.fits(need, device) else "lanczos")
    shared.check_top(ss, path, n_in, n_out)
    if path == "exact":
        hint = "; the exact Jacobian holds n_out x n_in entries a sample"
        dev.check_memory(need, device, kind.size_fields, hint=hint)
    else:  # one sample's graph at a time
        dev.check_memory(weights + 4 * per_output, device, kind.size_fields, hint=MODEL_MEMORY_HINT)
        shared.check_lanczos_samples(ss, n_in)
    return path, chunk, shared.spectrum_environment(ss, device, n_in, n_out, path, chunk)


def _model_spectrum_run(name, scheme, draws, means, histogram) -> SpectrumRun:
    """One init's record; the mean: the traced graph's backward map at the input, per draw's
    weights, averaged (None, and why, where a draw has none)."""
    mapped = [m for m, _ in means if m is not None]
    why = next((w for m, w in means if m is None), "")
    return SpectrumRun(
        name,
        scheme.description,
        draws,
        statistics.fmean(mapped) if len(mapped) == len(means) else None,
        None,
        "the variance of a model's spectrum is not derived"
        + (f"; no mean either: {why}" if why else " (the mean is its traced graph's)"),
        histogram,
        [],
    )


class ModelEngine(Engine):
    """A user's own model: probed with autograd hooks beside its traced graph's moment maps
    (``measure``, on ``probe_spec.threads`` CPU threads and its matmul precision), its
    curvature and its Jacobian's spectrum read through its own forward."""

    name = "model"

    def measure(self, kind, spec, probe_spec, progress, on_start, extra) -> Measured:
        device = dev.resolve_device(probe_spec.device)
        with dev.using_threads(probe_spec.threads), dev.matmul_precision(probe_spec.precision, device):
            return _measure_model(kind, spec, probe_spec, progress, on_start, extra)

    def assemble(self, kind, name, scheme, spec, plan, arrays, probe, gate) -> RunResult:
        return shared.assemble_traced(kind, name, scheme, spec, plan, arrays, probe, gate)

    def curvature(self, kind, spec, hs, progress, on_start) -> HessianResult:
        return _curvature_model(kind, spec, hs, progress, on_start)

    def spectrum(self, kind, spec, ss, progress, on_start) -> SpectrumResult:
        return _spectrum_model(kind, spec, ss, progress, on_start)


register(ModelEngine())
