"""The Python API: the same result objects the CLI renders, for every registered net kind.

    >>> import sigprop
    >>> r = sigprop.probe_mlp(depth=5, width="64", samples=100, inits=["proposed"], device="cpu")
    >>> r.runs[0].layers[0].forward.mean  # doctest: +SKIP
    >>> r = sigprop.probe_resnet(blocks=40, inits=["proposed", "he"], device="cpu")
    >>> r.runs[0].checks[0].passed  # doctest: +SKIP

``probe(spec, ...)`` and ``hessian(spec, ...)`` take any kind's spec (sigprop/kinds/); the keyword
functions ``probe_<kind>`` (``probe_mlp``, ``probe_resnet``, ``probe_cnn``, ``probe_wrn``, and one
for a kind registered later) are made from the kind's options with the CLI's defaults.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable

from sigprop import kinds, run, specs, sweeps, theory
from sigprop.errors import SigpropError
from sigprop.options import declared_options
from sigprop.public import API
from sigprop.results import RESULT_SCHEMA, Check, CheckOutcome, CheckReport, HessianResult, ProbeResult
from sigprop.width.spec import WidthNet, WidthSpec, widths_of

ProgressFn = run.ProgressFn


def probe_keywords() -> tuple:
    """The probe and gate keywords of every ``probe_<kind>``: the options ``specs.ProbeSpec`` and
    ``specs.GateSpec`` declare for the API (a kind's ``probe_defaults`` override their defaults:
    ``probe_wrn`` takes 100 samples)."""
    return tuple(o for o in specs.probe_options() if o.api)


def probe(
    spec,
    probe_spec: specs.ProbeSpec | None = None,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
    gate: specs.GateSpec | None = None,
    observe=(),
) -> ProbeResult:
    """Probe ``spec`` (any net kind's) for every one of its inits and pair each measurement with
    its theory (sigprop/run.py); ``gate`` says which verdict ``passed`` reports."""
    return run.probe(spec, probe_spec or specs.ProbeSpec(), progress, on_start, gate, observe)


def hessian(
    spec, hs: specs.HessianSpec | None = None, progress: ProgressFn | None = None, on_start=None
) -> HessianResult:
    """The curvature at init of every init of ``spec`` (``sigprop hessian``; sigprop/run.py)."""
    return run.curvature(spec, hs or specs.HessianSpec(), progress, on_start)


def spectrum(spec, ss: specs.SpectrumSpec | None = None, progress: ProgressFn | None = None, on_start=None):
    """The input-output Jacobian's spectrum of every init of ``spec`` (``sigprop spectrum``;
    sigprop/run.py): ``sigprop.spectrum(sigprop.spec("mlp", depth=10, width="200",
    input_dim=200), sigprop.specs.SpectrumSpec(samples=4))``."""
    return run.spectrum(spec, ss or specs.SpectrumSpec(), progress, on_start)


def measure_point(point: sweeps.Point):
    """What a sweep's point measures (``point.measure``: ``sweeps.MEASURES``' runner), wherever it
    runs: a probe, the curvature or the Jacobian's spectrum of its spec."""
    return point.run()


def sweep(
    kind: str,
    out,
    init=None,
    probe_spec: specs.ProbeSpec | None = None,
    measure: str = "probe",
    executor="local",
    workers: int | None = None,
    scheduler: str | None = None,
    worker_threads: int | None = None,
    resources: dict | None = None,
    on_plan=None,
    on_point=None,
    worker_wait: float | None = None,
    scheduler_file: str | None = None,
    shard: str | None = None,
    wait_workers: int | None = None,
    on_note=None,
    **given,
) -> list[dict]:
    """Run or resume a sweep of net kind ``kind`` (``sigprop sweep``; sigprop/sweeps/): the grid of
    ``given`` (the kind's sweep options: ``depth=[10, 20]``, ``width="128,512"``; a model's
    ``target``, ``arg``, ``input_shape``) x ``init`` (None: the kind's defaults), each point probed
    with ``probe_spec`` (None: the kind's sweep samples) or, by ``measure``, its curvature or its
    Jacobian's spectrum with the same samples, seeds, seed, device and dtype; one JSON line
    appended to ``out`` per point, the points already in ``out`` skipped.  ``executor``:
    ``"local"`` (here), ``"dask"`` (``workers`` local processes with ``worker_threads`` torch
    threads each, or the cluster at ``scheduler``; ``resources`` asked per point, {"GPU": 1};
    ``worker_wait`` seconds for a worker, 60 by default; ``scheduler_file``: the JSON file a
    scheduler wrote its address to; ``wait_workers``: the workers a scheduler should have before
    the points are sent, up to ``worker_wait``; ``on_note(text)``: what it says -- while it waits
    for workers, and of the workers it found),
    or a callable ``executor(fn,
    points)``.  ``shard="i/N"``: only the i-th of N disjoint parts of the grid, ``out`` its own
    file (``sigprop sweep merge`` joins the parts).  ``on_plan(total, to_run)``, ``on_point(i,
    to_run, point, line)``: progress.
    Returns the lines this call wrote:
    ``sigprop.sweep("wrn", "r.jsonl", blocks=[16, 40], init="proposed,he", executor="dask", workers=2)``."""
    points = sweep_points(kind, init, probe_spec, measure, **given)
    if shard is not None:  # "i/N": the i-th of N parts of the grid, its own file (sweeps/shard.py)
        points = sweeps.start_shard(Path(out), points, shard)
    if callable(executor):
        return sweeps.run(points, Path(out), measure_point, on_plan, on_point, executor, shard is not None)
    chosen = sweep_executor(
        executor,
        workers=workers,
        scheduler=scheduler,
        worker_threads=worker_threads,
        resources=resources,
        worker_wait=worker_wait,
        scheduler_file=scheduler_file,
        wait_workers=wait_workers,
    )
    chosen.say = on_note
    with chosen as ex:
        for note in ex.notes if on_note is not None else ():
            on_note(note)
        return sweeps.run(points, Path(out), measure_point, on_plan, on_point, ex, shard is not None)


def sweep_points(kind: str, init=None, probe_spec=None, measure: str = "probe", **given) -> list:
    """The points of ``sweep`` (``sweeps.Point``), every one validated."""
    return sweeps.configure(kinds.get(kind), given, init, probe_spec, measure)


def sweep_executor(name="local", **options):
    """The executor a sweep names (``sweeps.executor``, its ``options`` by the names of
    ``sweeps.EXECUTOR_OPTIONS``), to be entered with ``with``; local workers that each ask for a
    GPU need as many GPUs."""
    workers, resources = options.get("workers"), options.get("resources")
    if resources and "GPU" in resources and workers:
        import torch  # only to count the GPUs local workers would share

        if torch.cuda.device_count() < workers:
            raise SigpropError(
                f"{workers} local workers with a GPU each, {torch.cuda.device_count()} GPU(s) visible",
                field="workers",
            )
    return sweeps.executor(name, **options)


def run_sweep(
    kind: str,
    out,
    sizes: dict | None = None,
    width=None,
    init=None,
    input_dim: int | None = None,
    probe_spec: specs.ProbeSpec | None = None,
    curvature: specs.HessianSpec | None = None,
    on_plan=None,
    on_point=None,
    executor=sweeps.serial,
) -> list[dict]:
    """0.12's form of ``sweep``, deprecated since 0.17.0 and removed in 0.19.0 (a
    DeprecationWarning says so): ``sizes`` {"depth": [10, 20]}, ``width``, ``input_dim``,
    ``curvature`` (its options: a curvature sweep), ``executor(fn, points)``."""
    warnings.warn(
        "sigprop.run_sweep is deprecated since 0.17.0 and will be removed in 0.19.0; use "
        "sigprop.sweep(kind, out, depth=[...], measure='hessian', executor=fn)",
        DeprecationWarning,
        stacklevel=2,
    )
    given = {**(sizes or {}), "width": width, "input_dim": input_dim}
    measure = "probe" if curvature is None else "hessian"  # configure refuses cosines beside it
    points = sweeps.configure(kinds.get(kind), given, init, probe_spec, measure)
    if curvature is not None:  # the curvature's own options in place of the probe's copy
        points = [replace(p, options=curvature) for p in points]
    return sweeps.run(points, Path(out), measure_point, on_plan, on_point, executor)


def spec(command: str, inits=None, **options):
    """The spec of net kind ``command`` from its options as keywords (``inits`` None: the kind's
    defaults): ``spec("mlp", depth=50, width=256, inits="proposed")``."""
    kind = kinds.get(command)
    unknown = sorted(set(options) - {o.name for o in kind.options})
    if unknown:
        raise SigpropError(
            f"{command} has no option {unknown[0]!r}; it takes {', '.join(o.name for o in kind.options)}",
            field=unknown[0],
        )
    return kind.make(
        options, None if inits is None else ((inits,) if isinstance(inits, str) else tuple(inits))
    )


def keywords(kind: kinds.Kind) -> Callable[..., ProbeResult]:
    """``probe_<kind>``: a function of the kind's options (its defaults) and the probe and gate
    keywords (``probe_keywords``; ``inits`` one name or a list, None: the kind's defaults)."""
    shared_options = probe_keywords()
    probe_defaults = {o.name: kind.probe_defaults.get(o.name, o.default) for o in shared_options}

    def probe_kind(**kw) -> ProbeResult:
        shared = {name: kw.pop(name, default) for name, default in probe_defaults.items()}
        s = spec(kind.name, kw.pop("inits", None), **kw)
        probe_spec, gate = specs.probe_specs(shared)
        return probe(s, probe_spec, gate=gate)

    own = [
        inspect.Parameter(
            o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=o.type.__name__
        )
        for o in kind.options
    ]
    own.append(
        inspect.Parameter(
            "inits",
            inspect.Parameter.KEYWORD_ONLY,
            default=kind.default_inits,
            annotation="str | Sequence[str] | None",
        )
    )
    shared = [
        inspect.Parameter(
            o.name, inspect.Parameter.KEYWORD_ONLY, default=probe_defaults[o.name], annotation=o.annotation
        )
        for o in shared_options
    ]
    probe_kind.__signature__ = inspect.Signature(own + shared, return_annotation="ProbeResult")
    probe_kind.__name__ = probe_kind.__qualname__ = f"probe_{kind.name.replace('-', '_')}"
    probe_kind.__doc__ = (
        f"{kind.summary}\n\nThe options and defaults of ``sigprop {kind.name}`` as keywords (``inits``: one "
        f"name or a list, None: the command's defaults; the probe and gate keywords as the CLI's)."
    )
    return probe_kind


def __getattr__(name: str):
    """``probe_<kind>`` for every registered kind, made when first asked for; ``init_`` (the
    paper's init for any model, sigprop/model/init.py) imported when first asked for: the model
    package (its traced-op maps, scipy.special) is 80 ms of import a probe of sigprop's own nets
    never needs."""
    if name == "init_":
        from sigprop.model.init import init_  # lazy: the model package is 80 ms a probe never needs

        return init_
    if name.startswith("probe_"):
        for k in kinds.KINDS.values():
            if name == f"probe_{k.name.replace('-', '_')}":
                return keywords(k)
    raise AttributeError(f"module 'sigprop.api' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(keyword_names()) | {"init_"})


# --------------------------------------------------------------------------------------------
# sigprop check, rerun, theory
# --------------------------------------------------------------------------------------------
def run_checks(
    checks,
    source: str = "",
    on_outcome: Callable[[CheckOutcome], None] | None = None,
    on_error: Callable[[object, Exception], None] | None = None,
) -> CheckReport:
    """Run ``sigprop check`` entries (``checks.CheckSpec``) in order; ``on_outcome`` is called
    as each (check, init) finishes (the CLI prints its line then).  A run that raises is
    reported through ``on_error`` and re-raised."""
    t_all = time.perf_counter()
    outcomes: list[CheckOutcome] = []
    results = {}
    for c in checks:
        t0 = time.perf_counter()
        try:
            result = (
                probe(c.spec, c.probe, gate=c.gate) if c.curvature is None else hessian(c.spec, c.curvature)
            )
        except Exception as exc:
            if on_error is not None:
                on_error(c, exc)
            raise
        seconds = (time.perf_counter() - t0) / max(len(result.runs), 1)
        results[c.name] = result.to_dict()
        if c.curvature is not None:
            got = [
                CheckOutcome(
                    c.name,
                    c.command,
                    c.lowest,
                    c.expect,
                    [lowest_curvature(result, c.lowest)],
                    seconds * len(result.runs),
                    c.description,
                    "curvature",
                )
            ]
        else:
            got = [
                CheckOutcome(
                    c.name, c.command, r.init, c.expect, r.gate_checks(), seconds, c.description, r.gate
                )
                for r in result.runs
            ]
        for o in got:
            outcomes.append(o)
            if on_outcome is not None:
                on_outcome(o)
    return CheckReport(source, outcomes, time.perf_counter() - t_all, results)


def lowest_curvature(result: HessianResult, lowest: str) -> Check:
    """The gate of a ``lowest_curvature`` check: ``lowest``'s spectral norm (10^ mean log10 over
    its draws) below every other listed init's; an init that diverged in every draw counts as
    highest."""
    runs = {r.init: r for r in result.runs}
    m = runs[lowest].summary()[0]
    others = [r.summary()[0] for name, r in runs.items() if name != lowest]
    top = min((v for v in others if v is not None), default=math.inf)
    passed = m is not None and m < top
    names = ", ".join(n for n in runs if n != lowest)
    note = (
        "" if passed else ("it diverged in every draw" if m is None else "another init's curvature is lower")
    )
    return Check(
        f"spectral norm of the loss Hessian (below {names})", passed, m, -math.inf, top, "curvature", note
    )


#: the probe options every ``sigprop.result.v1`` document records in its config (the ones added
#: later take their defaults where a document lacks them)
RECORDED_ALWAYS = ("samples", "seed", "seeds", "dtype")


def rerun_specs(doc: dict) -> tuple[object, specs.ProbeSpec, specs.GateSpec, int | None]:
    """The specs (and torch thread count) that reproduce a ``sigprop.result.v1`` document: its
    config -- the net (read by its kind), the probe and the gate, every option as recorded
    (``specs.probe_options``: ``recorded``) -- on the device, stream mode and draw batching its
    environment records.  Keys a document of an older sigprop lacks take their defaults then (no
    cosines, 256 pairs, no observers)."""
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        raise SigpropError(
            f"not a {RESULT_SCHEMA} document (a probe command's --format json)", field="result"
        )
    cfg, env = doc.get("config", {}), doc.get("environment", {})
    kind = kinds.get(str(doc.get("command")), field="result")
    try:
        net = kind.from_config(cfg)
        values = {}
        for o in specs.probe_options():
            if o.recorded == "environment" and env.get(o.name) is not None:
                values[o.name] = env[o.name]
            elif o.recorded and o.name in cfg:
                values[o.name] = cfg[o.name]
        values.update({k: cfg[k] for k in RECORDED_ALWAYS})  # KeyError: not a probe's document
        if "device" in cfg and not specs.DEVICE_RE.match(str(cfg["device"])):
            raise SigpropError(
                f"the result's config records device {cfg['device']!r}, which no sigprop run takes (edited?"
                "): expected auto, cpu, cuda or cuda:K",
                field="result",
            )
        probe_spec, gate = specs.probe_specs(values)
    except (KeyError, TypeError) as exc:
        raise SigpropError(f"the document lacks {exc} in its config or environment", field="result") from None
    except SigpropError as exc:
        raise _of_result(exc, env) from None
    return net, probe_spec, gate, env.get("threads")


def _of_result(exc: SigpropError, env: dict) -> SigpropError:
    """A refusal of a recorded option (the device it ran on) as the result's: ``sigprop rerun``
    has no --device; the result records where it ran."""
    if exc.field in ("result", None):
        return exc
    where = f" (it ran on {env.get('device')!r})" if exc.field == "device" else ""
    return SigpropError(f"the result's {exc.field}{where}: {exc.message}", field="result")


def rerun(doc: dict, progress: ProgressFn | None = None, on_start=None) -> ProbeResult:
    """Run again what a result document records (same config, seed, device, thread count)."""
    net, probe_spec, gate, threads = rerun_specs(doc)
    if threads:  # the recorded count, where this machine has the cores (--threads is refused above them)
        probe_spec = replace(probe_spec, threads=min(int(threads), specs.available_cores()))
    try:
        return probe(net, probe_spec, progress=progress, on_start=on_start, gate=gate)
    except SigpropError as exc:
        if exc.field == "device":  # where it ran is not here (a CUDA result on a CPU machine)
            raise _of_result(exc, doc.get("environment", {})) from None
        raise


theory_table = theory.table


#: the API's names besides ``probe_<kind>`` (one per registered kind: ``keyword_names``), as
#: ``sigprop.NAME`` reaches them (declared once, in sigprop/public.py)
PUBLIC = API


def keyword_names() -> list[str]:
    """``probe_<kind>`` of every kind registered now."""
    return [f"probe_{n.replace('-', '_')}" for n in kinds.KINDS]


__all__ = [*PUBLIC, *keyword_names()]


def width_check_of(net, spec, command: str = "", progress=None, on_start=None):
    """The coordinate check of a ``WidthNet`` under a ``WidthSpec`` (sigprop/width/)."""
    from sigprop.width import check  # the training loop (sigprop.model's build): loaded when a check runs

    return check.width_check(net, spec, command=command, progress=progress, on_start=on_start)


def width_check(
    net,
    /,
    *,
    widths=None,
    input_shape=None,
    vocab: int | None = None,
    width_arg: str = "width",
    args: dict | None = None,
    chain: bool = False,
    progress=None,
    **options,
):
    """The coordinate check (``sigprop width``; Yang et al. 2021, section 6) from Python.

    ``net``: a net kind's name with its width options as keywords
    (``sigprop.width_check("mlp", depth=4, widths=[64, 128, 256])``), or a factory called as
    ``net(**args, width=w)`` (``width_arg`` names the keyword) at each of ``widths``, fed
    ``input_shape`` Gaussians or token ids below ``vocab``; ``chain``: its weight layers are a
    chain (SP's exponents are then derived along it).  The other keywords are ``WidthSpec``'s
    (``params``, ``optimizer``, ``lr``, ``steps``, ``seeds``, ``seed``, ``batch_size``, ``loss``,
    ``base_width``, ``max_width_slope``, ``device``).  Returns a ``WidthResult``: ``passed`` is
    True when every run is width-stable."""
    spec_names = {o.name for o in declared_options(WidthSpec)}
    if isinstance(net, str):
        kind = kinds.KINDS.get(net)
        if kind is None or kind.width_options is None:
            have = [k.name for k in kinds.KINDS.values() if k.width_options is not None]
            raise SigpropError(
                f"no coordinate check for {net!r}; choose from {', '.join(have)}", field="kind"
            )
        own = {o.name for o in kind.width_options}
        values = {k: options.pop(k) for k in list(options) if k in own and k not in spec_names}
        if widths is not None:
            values["widths"] = tuple(widths)
        the_net = kind.width_net(values)
    elif callable(net):
        if widths is None or input_shape is None:
            raise SigpropError("a factory needs widths= and input_shape=", field="widths")
        shape = (int(input_shape),) if isinstance(input_shape, int) else tuple(int(d) for d in input_shape)
        the_net = WidthNet(net, widths_of(list(widths)), shape, dict(args or {}), width_arg, vocab, chain)
    else:
        raise SigpropError(
            f"expected a kind's name or a factory of widths, got {type(net).__name__}", field="net"
        )
    unknown = sorted(set(options) - spec_names)
    if unknown:
        raise SigpropError(
            f"unknown keyword {unknown[0]!r}; choose from {', '.join(sorted(spec_names))}", field=unknown[0]
        )
    spec = WidthSpec(**options)
    return width_check_of(the_net, spec, progress=progress)
