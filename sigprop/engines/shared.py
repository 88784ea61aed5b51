"""What the engines share (sigprop/engines/): the measured arrays of a probe before any statistic
(``Measured``), a run's record assembled from them (``assemble``: the rows of sigprop's nets
beside the kind's ``RunTheory``, one loop for every kind -- until 0.17 each kind wrote its own;
``assemble_traced``: a user's model's sites beside their traced predictions, the module kind's
until 0.17), the one environment record of every run, the host memory a run's records need,
and the curvature's and the spectrum's per-draw estimators, checks and progress, which run on
any engine's differentiable function."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

import sigprop.hessian as H  # not ``from sigprop import hessian``: an API name, it loads the API
from sigprop import data as data_mod
from sigprop import kinds, plans, specs, spectra, stats, theory
from sigprop.errors import SigpropError
from sigprop.kernels import device as dev
from sigprop.kinds.base import RunTheory
from sigprop.results import CurvatureDraw, LayerRecord, RunResult

#: progress(done, total, label): steps done of the run's total, and what runs now ("he: forward")
ProgressFn = Callable[[int, int, str], None]
STREAM_HINT = ", or stream the weights (--stream; stream=True in the API: redrawn, not stored)"


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


def checker(device: torch.device):
    """The ``check`` a kind's memory plan calls: refuse a need beyond 80% of the free memory."""

    def check(need: int, fields: str, offer_stream: bool = False) -> None:
        dev.check_memory(need, device, fields, STREAM_HINT if offer_stream else "")

    return check


def check_rows(kind, spec) -> None:
    """Refuse, before a plan is built, a run whose records cannot fit in the host's memory: the
    kind's rows (``Kind.rows``) times its inits times ``kinds.ROW_BYTES`` (a net of 10^8 layers
    was an OOM kill at 22.8 GB: its estimate counted the width, not the depth)."""
    need = kind.rows(spec) * len(kind.inits(spec)) * kinds.ROW_BYTES
    dev.check_memory(need, torch.device("cpu"), kind.size_fields.split("/")[0])


def environment(device, dtype: str, **run) -> dict:
    """The environment record of every run -- what a bug report needs: torch, the device and its
    name, the dtype, the CPU threads -- and the run's own (``run``: a probe's precision, stream,
    draw batch and CUDA graphs; a curvature's samples and parameters; a spectrum's sizes and
    path)."""
    return {
        "torch": torch.__version__,
        "device": str(device),
        "device_name": dev.device_name(device),
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        **run,
    }


def probe_environment(probe_spec: specs.ProbeSpec, device, stream: bool, batch: int) -> dict:
    """A probe's environment record (``graphs`` is filled in once the walks have run; ``fuse``:
    the layers' bookkeeping compiled, kernels/fused.py)."""
    return environment(
        device,
        probe_spec.dtype,
        precision=probe_spec.precision,
        stream=stream,
        batch=batch,
        graphs="off",
        fuse="on" if probe_spec.fuse else "off",
    )


def check_finite(name: str, arrays: dict) -> None:
    """The ratios' ln are finite or -inf (a dead ReLU: ratio exactly 0), never nan or +inf: an
    internal error otherwise (no nan reaches the output)."""
    for arr in (arrays["fwd"], arrays["bwd"]):
        if np.isnan(arr).any() or np.isposinf(arr).any():
            raise SigpropError(f"internal error: init {name!r} produced a non-finite log ratio")


def curvature_data(hs: specs.HessianSpec, shape, device, dtype, default: int = specs.HESSIAN_SAMPLES):
    """(x [N, prod(shape)], y [N]): synthetic (``hs.samples`` or the kind's ``default`` points), or the
    first ``hs.samples`` of the user's file (all of it when None; ``sigprop.data`` checks it)."""
    if hs.data is None:
        n = default if hs.samples is None else hs.samples
        return H.data(hs.seed, n, shape, device, dtype)
    d = data_mod.take(data_mod.load(hs.data, shape, H.CLASSES), hs.samples)
    return data_mod.inputs(d, device, dtype), torch.as_tensor(d.y, device=device, dtype=torch.long)


def curvature_environment(
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
    return environment(device, hs.dtype, samples=samples, parameters=params, top_products=top_basis)


def check_parameter_count(hs: specs.HessianSpec, counts: dict[str, int]) -> None:
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
        first = self.total == 0
        self.total = self.done + planned * draws_left
        self.end, self.label = self.done + planned, label
        h.tick = self.tick
        prior = getattr(self.progress, "prior", None)  # the CLI's: the estimate before the first product
        if first and prior is not None:
            what = "the gradient's" if h.batches is None else "the minibatches' loss"
            prior(self.total, h.guess, f"rough, from {what} time")

    def tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, self.label)

    def finish(self) -> None:
        """The draw is done: the products it did not need leave the total."""
        self.total -= self.end - self.done
        if self.progress is not None:
            self.progress(self.done, self.total, self.label)


def curvature_draw(h, hs: specs.HessianSpec, draw: int, device) -> CurvatureDraw:
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


def spectrum_draw(
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
    largest, nodes, weights, extremes = [], [], [], []
    for i, f in enumerate(functions):  # one sample's operator (its forward's graph) alive at a time
        g = spectra.Gram(f, x[i])
        top = H.largest_eigenvalue(g, gen, 100, 1e-3)
        largest.append(top.eigenvalue or 0.0)
        q = H.slq(g, ss.probes, ss.steps, gen)
        nodes += q.nodes
        weights += q.weights
        if ss.top:
            extremes.append(spectra.extremes_one(g, ss.top, H.lanczos_top))
        n_out = g.n_out
    summary, lam, mass = spectra.lanczos_summary(n_in, n_out, largest, nodes, weights)
    extra = spectra.extremes_mean(extremes) if ss.top else {}
    return {"draw": draw, **summary, **extra}, (lam, mass)


#: host bytes a sample of the Lanczos path keeps beyond its quadrature: its per-sample function and
#: its largest eigenvalue (a list slot and a Python object each; rounded up)
LANCZOS_SAMPLE_BYTES = 256
#: a Python float in a list: the object and the list's slot
PY_FLOAT_BYTES = 32


def check_spectrum_inputs(ss: specs.SpectrumSpec, n_in: int, device) -> None:
    """The samples' inputs (S x n_in on the device), refused naming --samples before they are
    drawn, whatever the path (the paths' own estimates are their engines')."""
    dev.check_memory(ss.samples * n_in * dev.itemsize(ss.dtype), device, "samples")


def check_lanczos_samples(ss: specs.SpectrumSpec, n_in: int) -> None:
    """What the Lanczos path keeps of every sample on the host, refused naming --samples: its
    quadrature for the pooled density (2 x probes x steps nodes and weights, at most n_in steps,
    as Python floats while a draw runs and as float64 for every draw) and its bookkeeping (its
    operator, one sample's forward graph, is alive one at a time: ``spectrum_draw``)."""
    quadrature = 2 * ss.probes * min(ss.steps, n_in) * (PY_FLOAT_BYTES + 8 * ss.seeds)
    need = ss.samples * (quadrature + LANCZOS_SAMPLE_BYTES)
    hint = " (the Lanczos path keeps each one's quadrature)"
    dev.check_memory(need, torch.device("cpu"), "samples", hint=hint)


def spectrum_environment(
    ss: specs.SpectrumSpec, device, n_in: int, n_out: int, path: str, chunk: int | None = None
) -> dict:
    """The environment record of a spectrum: the machine, the sizes, the path's products and how
    the exact path chunked its reverse passes (``chunk``: samples at once for sigprop's nets,
    --batch-size; outputs at once for a model's J, sized to the memory)."""
    return environment(
        device,
        ss.dtype,
        samples=ss.samples,
        input_units=n_in,
        output_units=n_out,
        path=path,
        reverse_products=n_out if path == "exact" else None,
        products_per_sample=None if path == "exact" else 2 * ss.probes * ss.steps,
        chunk=chunk if path == "exact" else None,
    )


def check_top(ss: specs.SpectrumSpec, path: str, n_in: int, n_out: int) -> None:
    """--top against J's min(n_in, n_out) singular values (Lanczos finds fewer than the size)."""
    k = min(n_in, n_out)
    most = k if path == "exact" else k - 1
    if ss.top > most:
        raise SigpropError(
            f"at most {most}: J has min(n_in, n_out) = {k} singular values"
            + ("" if path == "exact" else " (the lanczos path finds fewer than that)"),
            field="top",
        )


def pooled_histogram(path: str, pooled: list) -> dict:
    if path == "exact":
        return spectra.histogram(np.concatenate(pooled))
    return spectra.histogram(
        np.concatenate([p[0] for p in pooled]), weights=np.concatenate([p[1] for p in pooled])
    )


class Ticker:
    """The walks' progress: called once per step of every pass (one init, one batch of draws),
    it reports ``progress(done, total, "init: phase")``; a pass is its phases in order, each
    (name, steps): forward, backward, then one forward walk per input cosine ("correlation").
    Here, not in the plan engine: the walker calls it back, and a call from the walker enters a
    room it is not already in (benchmarks/journeys.py)."""

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


class DrawTicker:
    """``progress(done, total, label)`` once per finished draw."""

    def __init__(self, progress: ProgressFn | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, label)


# --------------------------------------------------------------------------------------------
# a run's record: the rows beside the kind's theory, then the kind's verdicts
# --------------------------------------------------------------------------------------------
def _at(values, i: int):
    """values[i], or None where the theory has none."""
    return None if values is None or len(values) == 0 else values[i]


def rows(arrays: dict, th, dtype: str) -> list[LayerRecord]:
    """Per recorded row i (arrays ``fwd``/``bwd`` [S, R, draws]) its forward and backward
    statistics beside the prediction at i with the spread's variance there (and its exact drift
    where ``th.drift``), the separation and the rounding allowance of the probe's ``dtype`` over the
    rows (``stats.rounding_ln``: one rule for every kind); a residual net's row with its
    stage and, from ``th.first_branch`` on, the branch ratio of the block that produced it.  Row
    i's index is its position in ``th.widths`` (the last R of them: an MLP's and a CNN's widths
    begin with the input, which has no row)."""
    ln_f, ln_b = arrays["fwd"], arrays["bwd"]
    R = ln_f.shape[1]
    off, rounding = len(th.widths) - R, stats.rounding_ln(dtype, R)
    pred, sep, spread = th.pred, th.sep, th.spread
    ways = ((pred.ln_forward, spread.forward, sep.forward), (pred.ln_backward, spread.backward, sep.backward))
    layers = []
    for i in range(R):
        f, b = stats.ratio_stats(ln_f[:, i, :]), stats.ratio_stats(ln_b[:, i, :])
        for st, (ln_pred, cum, separation) in zip((f, b), ways):
            stats.attach_prediction(
                st,
                _at(ln_pred, i),
                float(cum[i, 1]),
                rounding=rounding,
                drift=float(cum[i, 0]) if th.drift else None,
                separation=_at(separation, i),
            )
        br = None
        k = -1 if th.first_branch is None else i - th.first_branch  # the block producing row i
        if k >= 0:
            br = stats.ratio_stats(arrays["branch"][:, k, :])
            stats.attach_prediction(br, _at(pred.ln_branch, k), spread.branch[k], rounding=rounding)
        rec = LayerRecord(index=i + off, width=th.widths[i + off], forward=f, backward=b, branch=br)
        if th.stages is not None:  # a residual net's row: its stage
            rec.stage, rec.resnet = th.stages[i], True
        layers.append(rec)
    return layers


def assemble(kind, name: str, scheme, spec, plan, arrays: dict, probe, gate) -> RunResult:
    """One init's ``RunResult``: the kind's theory of the run, its rows paired with it (``rows``),
    the kind's additions to them and its verdicts."""
    th = kind.run_theory(scheme, spec, plan, probe)
    layers = rows(arrays, th, probe.dtype)
    kind.annotate(layers, arrays, probe)
    return _judged(kind, name, th, spec, plan, arrays, layers, gate)


def _judged(kind, name: str, th, spec, plan, arrays: dict, layers: list, gate, ends=None) -> RunResult:
    """The ``RunResult`` of assembled rows with the kind's verdicts on them."""
    checks, stages = kind.verdicts(th, spec, plan, arrays, layers, gate)
    return RunResult(
        init=name,
        widths=list(th.widths),
        layers=layers,
        checks=checks,
        description=th.description,
        stages=stages,
        gate=gate.gate,
        ends=ends,
    )


def rms_over_draws(ln_pred) -> list[float | None]:
    """Per site the ln of the RMS over draws of each draw's predicted RMS ratio (None: no map)."""
    out: list[float | None] = []
    for col in np.asarray(ln_pred, dtype=np.float64).T:
        out.append(None if not np.all(np.isfinite(col)) else 0.5 * math.log(float(np.mean(np.exp(2 * col)))))
    return out


def site_rows(plan, arrays: dict, probe, reached, preds, z: float = theory.Z_CHECK) -> list[LayerRecord]:
    """One row per site of a user's model: the measured ratios with their traced predictions
    (``preds``: RMS over draws) and bands (``stats.attach_traced``: z standard errors of the run
    plus the maps' stated accuracy, docs/theory.md §15), the token statistics; a site off the
    output's path (``reached`` False: a side head) has no backward ratio."""
    pf, pb = preds
    rounding = stats.rounding_ln(probe.dtype, len(plan.sites))
    layers = []
    for i, site in enumerate(plan.sites):
        f = stats.ratio_stats(arrays["fwd"][:, i, :])
        b = stats.ratio_stats(arrays["bwd"][:, i, :]) if reached[i] else stats.no_ratio()
        fd, bd = (arrays[k][:, i] if k in arrays else None for k in ("pred_fwd", "pred_bwd"))
        stats.attach_traced(f, arrays["fwd"][:, i, :], pf[i], theory.MAP_ACCURACY_FORWARD, rounding, z, fd)
        if reached[i]:
            stats.attach_traced(
                b, arrays["bwd"][:, i, :], pb[i], theory.MAP_ACCURACY_BACKWARD, rounding, z, bd
            )
        layers.append(
            LayerRecord(
                i + 1, plan.entries[i], f, b, name=site, off_path=not reached[i], tokens=_tokens(arrays, i, z)
            )
        )
    return layers


def _tokens(arrays: dict, i: int, z: float):
    """Site i's token statistics (None: the run measured no token sequence there)."""
    if "cosine" not in arrays:
        return None
    entropy = arrays["entropy"][:, i, :] if "entropy" in arrays else None
    pred = arrays["pred_cosine"][:, i] if "pred_cosine" in arrays else None
    pred_h = arrays["pred_entropy"][:, i] if "pred_entropy" in arrays else None
    return stats.token_stats(arrays["cosine"][:, i, :], entropy, pred, z, pred_h)


def assemble_traced(kind, name: str, scheme, spec, plan, arrays: dict, probe, gate) -> RunResult:
    """One init's ``RunResult`` of a user's model: per site the ratios beside the traced
    prediction (the model engine's per-draw composed maps, ``arrays["pred_fwd"]``/``pred_bwd``)
    with its band (``site_rows``), then the kind's verdicts; the rows they read (``ends``: the
    last and the first site on the output's path)."""
    E = len(plan.sites)
    pf, pb = rms_over_draws(arrays["pred_fwd"]), rms_over_draws(arrays["pred_bwd"])
    reached = np.asarray(arrays.get("reached", np.ones((1, E)))).any(axis=0)
    layers = site_rows(plan, arrays, probe, reached, (pf, pb))
    th = RunTheory(
        plans.Prediction(pf, pb, None, None),
        plans.Separation(None, None),
        None,
        list(plan.entries),
        scheme.description,
    )
    on = [i for i in range(E) if reached[i]]
    return _judged(kind, name, th, spec, plan, arrays, layers, gate, (on[-1], on[0]) if on else None)
