"""Python API: the same result objects the CLI renders.

    >>> import sigprop
    >>> r = sigprop.probe_mlp(depth=5, width="64", samples=100, inits=["proposed"], device="cpu")
    >>> r.runs[0].layers[0].forward.mean  # doctest: +SKIP
    >>> r = sigprop.probe_resnet(blocks=40, inits=["proposed", "he"], device="cpu")
    >>> r.runs[0].checks[0].passed  # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from sigprop import __version__, engine, inits, plans, specs, stats, theory
from sigprop.errors import SigpropError
from sigprop.results import CheckOutcome, CheckReport, ProbeResult, probe_config


TOLERANCES = {
    "z_agreement": theory.Z_AGREEMENT,
    "z_check": theory.Z_CHECK,
    "spread_c_gaussian": theory.SPREAD_C_GAUSSIAN,
    "spread_c_orthogonal_base": theory.SPREAD_C_ORTHOGONAL_BASE,
}


def probe(
    spec: specs.MLPSpec | specs.ResNetSpec,
    probe_spec: specs.ProbeSpec,
    progress: engine.ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
    gate: specs.GateSpec | None = None,
) -> ProbeResult:
    """Run the probe (MLP or ResNet) for every init of ``spec``; pair each measurement with its
    theory.  Every run carries both verdicts (``preserved``, ``theory``); ``gate`` says which
    one ``passed`` reports and the band of ``preserved``."""
    gate = gate or specs.GateSpec()
    probe_spec = gate.probe(probe_spec)
    with engine.using_threads(probe_spec.threads):
        if isinstance(spec, specs.ResNetSpec):
            return _probe_resnet(spec, probe_spec, progress, on_start, gate)
        if isinstance(spec, (specs.CNNSpec, specs.WRNSpec)):
            return _probe_conv(spec, probe_spec, progress, on_start, gate)
        return _probe_mlp(spec, probe_spec, progress, on_start, gate)


def _probe_mlp(spec, probe_spec, progress, on_start, gate) -> ProbeResult:
    widths, arrays, env = engine.run_mlp(spec, probe_spec, progress=progress, on_start=on_start)
    runs = []
    for name in spec.inits:
        scheme, a = inits.get(name), arrays[name]
        run = stats.mlp_run(scheme, widths, a["fwd"], a["bwd"], band=gate.band, gate=gate.gate)
        stats.attach_correlations(run, scheme, widths, a.get("correlation"), probe_spec.correlations, probe_spec.pairs,
                                  gate.max_correlation, probe_spec.dtype)
        runs.append(run)
    config = probe_config("mlp", spec, probe_spec, gate, widths=widths)
    tolerances = {**TOLERANCES, "band": list(gate.default_band(resnet=False))}
    return ProbeResult(command="mlp", config=config, environment={"sigprop": __version__, **env}, runs=runs, tolerances=tolerances)


def _probe_conv(spec, probe_spec, progress, on_start, gate) -> ProbeResult:
    """The plain CNN (``specs.CNNSpec``) or the WRN (``specs.WRNSpec``): one engine path
    (``engine.run_conv``), their own verdicts (``stats.cnn_run``: layers; ``stats.wrn_run``: stages)."""
    wrn = isinstance(spec, specs.WRNSpec)
    steps, arrays, env = engine.run_conv(spec, probe_spec, progress=progress, on_start=on_start)
    runs = []
    kind_name, names = engine.kind_of(spec)
    kind = engine._net_kind(kind_name)
    for name in names:
        scheme, a = kind.scheme(name), arrays[name]
        if wrn:
            run = stats.wrn_run(scheme, steps, spec.blocks, a, band=gate.band, gate=gate.gate, init=name)
        else:
            run = stats.cnn_run(scheme, steps, a["fwd"], a["bwd"], band=gate.band, gate=gate.gate)
        stats.attach_correlations(run, scheme, steps, a.get("correlation"), probe_spec.correlations, probe_spec.pairs,
                                  gate.max_correlation, probe_spec.dtype)
        runs.append(run)
    command = "wrn" if wrn else "cnn"
    config = probe_config(command, spec, probe_spec, gate, units=runs[0].widths)
    tolerances = {**TOLERANCES, "band": list(gate.default_band(resnet=wrn))}
    return ProbeResult(command=command, config=config, environment={"sigprop": __version__, **env}, runs=runs, tolerances=tolerances)


def _probe_resnet(spec, probe_spec, progress, on_start, gate) -> ProbeResult:
    plan, arrays, env = engine.run_resnet(spec, probe_spec, progress=progress, on_start=on_start)
    runs = []
    for name in spec.resolved_inits():
        scheme = inits.get(name)
        run = stats.resnet_run(scheme, plan, arrays[name], probe_spec.samples, probe_spec.dtype, band=gate.band, gate=gate.gate)
        stats.attach_correlations(run, None if spec.norm == "bn" else scheme, plan, arrays[name].get("correlation"),
                                  probe_spec.correlations, probe_spec.pairs, gate.max_correlation, probe_spec.dtype)
        runs.append(run)
    config = probe_config("resnet", spec, probe_spec, gate, stage_dims=list(plan.stage_dims), hidden_widths=plan.hidden_widths())
    return ProbeResult(
        command="resnet",
        config=config,
        environment={"sigprop": __version__, **env},
        runs=runs,
        tolerances={**TOLERANCES, "band": [theory.RESNET_LOWER * gate.default_band(resnet=True)[0],
                                           theory.RESNET_UPPER * gate.default_band(resnet=True)[1]]},
    )


from sigprop.front import probe_mlp, probe_resnet  # noqa: E402,F401  (the keyword wrappers live torch-free)


def run_checks(checks, source: str = "", on_outcome: Callable[[CheckOutcome], None] | None = None,
               on_error: Callable[[object, Exception], None] | None = None) -> CheckReport:
    """Run ``sigprop check`` entries (``checks.CheckSpec``) in order; ``on_outcome`` is called
    as each (check, init) finishes (the CLI prints its line then).  A run that raises
    SigpropError is reported through ``on_error`` and re-raised."""
    import time

    t_all = time.perf_counter()
    outcomes: list[CheckOutcome] = []
    results = {}
    for c in checks:
        t0 = time.perf_counter()
        try:
            result = probe(c.spec, c.probe, gate=c.gate) if c.curvature is None else hessian(c.spec, c.curvature)
        except Exception as exc:
            if on_error is not None:
                on_error(c, exc)
            raise
        seconds = (time.perf_counter() - t0) / max(len(result.runs), 1)
        results[c.name] = result.to_dict()
        if c.curvature is not None:
            o = CheckOutcome(c.name, c.command, c.lowest, c.expect, [_lowest_curvature(result, c.lowest)], seconds * len(result.runs),
                             c.description, "curvature")
            outcomes.append(o)
            if on_outcome is not None:
                on_outcome(o)
            continue
        for run in result.runs:
            o = CheckOutcome(c.name, c.command, run.init, c.expect, run.gate_checks(), seconds, c.description, run.gate)
            outcomes.append(o)
            if on_outcome is not None:
                on_outcome(o)
    return CheckReport(source, outcomes, time.perf_counter() - t_all, results)


def _lowest_curvature(result, lowest: str):
    """The gate of a ``lowest_curvature`` check: ``lowest``'s spectral norm (10^ mean log10 over
    its draws) below every other listed init's; an init that diverged in every draw counts as
    highest."""
    from sigprop.results import Check

    runs = {r.init: r for r in result.runs}
    m = runs[lowest].summary()[0]
    others = [r.summary()[0] for name, r in runs.items() if name != lowest]
    top = min((v for v in others if v is not None), default=math.inf)
    passed = m is not None and m < top
    names = ", ".join(n for n in runs if n != lowest)
    note = "" if passed else ("it diverged in every draw" if m is None else "another init's curvature is lower")
    return Check(f"spectral norm of the loss Hessian (below {names})", passed, m, -math.inf, top, "curvature", note)


def rerun_specs(doc: dict) -> tuple[specs.MLPSpec | specs.ResNetSpec, specs.ProbeSpec, specs.GateSpec, int | None]:
    """The specs (and torch thread count) that reproduce a ``sigprop.result.v1`` document:
    its config -- the net, the probe with its input cosines, the gate with its band and
    correlation bound -- on the device, precision, stream mode and draw batching it recorded.
    Keys a document of an older sigprop lacks take their defaults then (none, 256 pairs)."""
    from sigprop.errors import SigpropError
    from sigprop.results import RESULT_SCHEMA

    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        raise SigpropError(f"not a {RESULT_SCHEMA} document (sigprop mlp/resnet --format json)", field="result")
    cfg, env = doc.get("config", {}), doc.get("environment", {})
    try:
        if doc.get("command") == "mlp":
            spec = specs.MLPSpec(depth=cfg["depth"], input_dim=cfg["input_dim"], width=specs.WidthSpec.parse(cfg["width"]),
                                 inits=tuple(cfg["inits"]))
        elif doc.get("command") == "cnn":
            spec = specs.CNNSpec(depth=cfg["depth"], channels=cfg["channels"], image=cfg["image"], strided=cfg["strided"],
                                 inits=tuple(cfg["inits"]))
        elif doc.get("command") == "wrn":
            spec = specs.WRNSpec(blocks=cfg["blocks"], widen=cfg["widen"], image=cfg["image"], bottleneck=cfg["bottleneck"],
                                 norm=cfg["norm"], preset=cfg["preset"], inits=tuple(cfg["inits"]))
        elif doc.get("command") == "resnet":
            spec = specs.ResNetSpec(
                blocks=cfg["blocks"], stages=cfg["stages"], dim=cfg["dim"],
                width=specs.WidthSpec.parse(cfg["width"] or "150:250"), block_depth=cfg["block_depth"],
                norm=cfg["norm"], inits=tuple(cfg["inits"]),
            )
        else:
            raise SigpropError(f"unknown command {doc.get('command')!r}", field="result")
        probe_spec = specs.ProbeSpec(
            samples=cfg["samples"], seed=cfg["seed"], seeds=cfg["seeds"], device=env.get("device", cfg["device"]),
            dtype=cfg["dtype"], stream=env.get("stream", cfg.get("stream")), precision=cfg.get("precision", "fp32"),
            batch=env.get("batch"), graphs=cfg.get("graphs"), correlations=tuple(cfg.get("correlations") or ()),
            pairs=cfg.get("pairs", 256),
        )
        band = cfg.get("band")
        gate = specs.GateSpec(cfg.get("gate", "preserved"), None if band is None else tuple(band), cfg.get("max_correlation"))
    except (KeyError, TypeError) as exc:
        raise SigpropError(f"the document lacks {exc} in its config or environment", field="result") from None
    return spec, probe_spec, gate, env.get("threads")


def rerun(doc: dict, progress: engine.ProgressFn | None = None, on_start=None) -> ProbeResult:
    """Run again what a result document records (same config, seed, device, thread count)."""
    spec, probe_spec, gate, threads = rerun_specs(doc)
    if threads:
        probe_spec = replace(probe_spec, threads=int(threads))
    return probe(spec, probe_spec, progress=progress, on_start=on_start, gate=gate)


def _curvature_net(spec, seed: int):
    """(net kind, plan, init names, input shape) of a probe spec for ``hessian``."""
    kind, names = engine.kind_of(spec)
    if isinstance(spec, specs.MLPSpec):
        return kind, spec.widths(seed), list(names), (spec.input_dim,)
    if isinstance(spec, specs.ResNetSpec):
        return kind, spec.plan(seed), list(names), (spec.dim,)
    return kind, spec.steps(), list(names), tuple(spec.image)


def _hessian_data(hs: specs.HessianSpec, shape, device, dtype):
    """(x [N, prod(shape)], y [N]): synthetic (``hs.samples`` or ``specs.HESSIAN_SAMPLES`` points), or the
    first ``hs.samples`` of the user's file (all of it when None; ``sigprop.data`` checks it)."""
    import torch

    from sigprop import data as data_mod
    from sigprop import hessian as H

    if hs.data is None:
        n = specs.HESSIAN_SAMPLES if hs.samples is None else hs.samples
        return H.data(hs.seed, n, shape, device, dtype)
    d = data_mod.take(data_mod.load(hs.data, shape, H.CLASSES), hs.samples)
    return torch.as_tensor(d.x, device=device, dtype=dtype), torch.as_tensor(d.y, device=device, dtype=torch.long)


def hessian(spec, hs: specs.HessianSpec, progress=None, on_start=None):
    """The curvature at init of every init of ``spec`` (any probe spec): per weight draw the largest-magnitude Hessian eigenvalue (restarted Lanczos, ``hessian.largest_eigenvalue``), the top-k (ARPACK's Lanczos)
    and the trace (Hutchinson) as ``hs`` asks; a ``results.HessianResult``, on ``hs.threads`` CPU threads."""
    with engine.using_threads(hs.threads):
        return _hessian(spec, hs, progress, on_start)


def _hessian(spec, hs: specs.HessianSpec, progress, on_start):
    import time

    import torch

    from sigprop import hessian as H
    from sigprop import walker
    from sigprop.results import CurvatureDraw, CurvatureRun, HessianResult

    device = engine.resolve_device(hs.device)
    dtype = engine.DTYPES[hs.dtype]
    kind_name, net, names, shape = _curvature_net(spec, hs.seed)
    x, y = _hessian_data(hs, shape, device, dtype)
    kind = walker.NET_KINDS[kind_name]
    # double backward keeps every activation and its graph: ~8 copies of the units of one pass, and the parameters
    if kind_name == "mlp":
        units, weights, fields = list(net), engine.mlp_weight_bytes(net, 1), "depth/width/samples"
    elif kind_name in ("resnet", "bn-resnet"):
        units = [net.dim] * (1 + net.stem) + [w for b in net.blocks for w in b.widths[1:]]
        weights = engine.resnet_weight_count(net) + net.dim**2 * (len(net.blocks) + 1) * net.stem
        fields = "blocks/stages/dim/width/samples"
    else:
        units = [math.prod(shape)] + [math.prod(st.shape_out) for st in plans.convs(net)]
        weights = sum(st.role.fan_in * st.role.fan_out for st in plans.convs(net))
        fields = "depth/channels/image/samples" if kind_name == "cnn" else "blocks/widen/image/samples"
    itemsize = torch.finfo(dtype).bits // 8
    # --top K: Lanczos needs K below the parameter count, which the plan gives before any draw
    counts = {name: H.parameter_count(kind_name, net, kind.scheme(name), hs.head) for name in names}
    params = max(counts.values())
    fewest = min(names, key=counts.get)
    if hs.top >= counts[fewest]:
        raise SigpropError(f"at most {counts[fewest] - 1}: the net has {counts[fewest]} trainable parameters under init "
                           f"{fewest!r} (Lanczos finds fewer eigenvalues than the dimension)", field="top")
    # the graph of the gradient keeps ~8 copies of every activation (of one minibatch with
    # --batch-size); parameters, gradient, product; the largest-eigenvalue search's Lanczos
    # basis (hessian.LANCZOS_BASIS parameter vectors); --top's ARPACK basis of max(2K + 1, 20)
    # float64 vectors (on the host)
    rows = min(x.shape[0], hs.batch_size or x.shape[0])
    whole = hs.batch_size is None
    need = (8 * rows * sum(units) + 6 * weights + H.LANCZOS_BASIS * params) * itemsize
    top_basis = H.arpack_basis(hs.top, params) if hs.top else 0
    host = top_basis * params * 8
    engine.check_memory(need + (host if device.type == "cpu" else 0), device,
                        fields if whole else fields.replace("samples", "batch_size"),
                        hint="; or take the data in minibatches with --batch-size" if whole else "")
    if host and device.type != "cpu":
        engine.check_memory(host, torch.device("cpu"), "top")
    env = {"torch": torch.__version__, "device": str(device), "device_name": engine.device_name(device), "dtype": hs.dtype,
           "threads": torch.get_num_threads(), "samples": int(x.shape[0]), "parameters": params,
           "top_products": top_basis}
    if on_start is not None:
        on_start(env)
    runs = []
    total, done = len(names) * hs.seeds, 0
    for name in names:
        scheme = kind.scheme(name)
        draws = []
        for draw in range(hs.seeds):
            t0 = time.perf_counter()
            # the weights: drawn as the probe draws them; a data-dependent init calibrated on the
            # first minibatch with --batch-size (the authors' code calibrates on one training batch)
            m = H.build(kind_name, net, scheme, x[:rows], hs.seed, draw, hs.head)
            h = H.HVP(m, x, y, hs.batch_size)
            gen = torch.Generator(device=device)
            gen.manual_seed(specs.derive_seed(hs.seed, specs.STREAM_POWER, draw))
            if not math.isfinite(h.loss):
                d = CurvatureDraw(draw, None, 0, None, "diverged", loss=h.loss, parameters=h.size)
            else:
                pr = H.largest_eigenvalue(h, gen, hs.iters, hs.tol)
                top = H.lanczos_top(h, hs.top, seed=draw) if hs.top and pr.status != "diverged" else []
                tr, se = H.hutchinson_trace(h, hs.trace, gen) if hs.trace and pr.status != "diverged" else (None, None)
                d = CurvatureDraw(draw, pr.eigenvalue, pr.iterations, pr.residual, pr.status, top, tr, se, h.loss, h.size)
            d.seconds = time.perf_counter() - t0
            draws.append(d)
            done += 1
            if progress is not None:
                progress(done, total, f"{name}: draw {draw}")
        description = {"wrn-bn": "He convs + batch norm", "bn-resnet": "x + W BN(x)^+, He W (De & Smith 2020, appendix C)"}.get(
            kind_name, scheme.description)
        runs.append(CurvatureRun(name, description, draws))
    # the data actually measured: a file's own count (or the first --samples of it)
    config = {"command": {"wrn-bn": "wrn", "bn-resnet": "resnet"}.get(kind_name, kind_name), **spec.to_dict(), **hs.__dict__,
              "samples": int(x.shape[0])}
    return HessianResult(config["command"], config, {"sigprop": __version__, **env}, runs)
