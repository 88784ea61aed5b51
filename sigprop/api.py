"""Python API: the same result objects the CLI renders.

    >>> import sigprop
    >>> r = sigprop.probe_mlp(depth=5, width="64", samples=100, inits=["proposed"], device="cpu")
    >>> r.runs[0].layers[0].forward.mean  # doctest: +SKIP
    >>> r = sigprop.probe_resnet(blocks=40, inits=["proposed", "he"], device="cpu")
    >>> r.runs[0].checks[0].passed  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Callable, Sequence

from sigprop import __version__, engine, inits, specs, stats, theory
from sigprop.results import CheckOutcome, CheckReport, ProbeResult


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
) -> ProbeResult:
    """Run the probe (MLP or ResNet) for every init of ``spec``; pair each measurement with its theory."""
    if isinstance(spec, specs.ResNetSpec):
        return _probe_resnet(spec, probe_spec, progress, on_start)
    widths, arrays, env = engine.run_mlp(spec, probe_spec, progress=progress, on_start=on_start)
    runs = [stats.mlp_run(inits.get(name), widths, *arrays[name]) for name in spec.inits]
    config = {"command": "mlp", **spec.to_dict(), **probe_spec.__dict__, "widths": widths}
    return ProbeResult(command="mlp", config=config, environment={"sigprop": __version__, **env}, runs=runs, tolerances=dict(TOLERANCES))


def _probe_resnet(spec, probe_spec, progress, on_start) -> ProbeResult:
    plan, arrays, env = engine.run_resnet(spec, probe_spec, progress=progress, on_start=on_start)
    runs = [
        stats.resnet_run(inits.get(name), plan, arrays[name], probe_spec.samples, probe_spec.dtype)
        for name in spec.resolved_inits()
    ]
    config = {
        "command": "resnet",
        **spec.to_dict(),
        **probe_spec.__dict__,
        "stage_dims": list(plan.stage_dims),
        "hidden_widths": plan.hidden_widths(),
    }
    return ProbeResult(
        command="resnet",
        config=config,
        environment={"sigprop": __version__, **env},
        runs=runs,
        tolerances={**TOLERANCES, "band": [theory.RESNET_LOWER, theory.RESNET_UPPER]},
    )


def probe_mlp(
    depth: int = 20,
    input_dim: int = 500,
    width: str | int = "150:250",
    inits: Sequence[str] = ("proposed",),
    samples: int = 1000,
    seed: int = 0,
    seeds: int = 1,
    device: str = "auto",
    dtype: str = "float32",
    stream: bool | None = None,
    precision: str = "fp32",
    graphs: bool | None = None,
) -> ProbeResult:
    """Keyword-friendly wrapper of :func:`probe` for the WN MLP (the options of ``sigprop mlp``)."""
    spec = specs.MLPSpec(depth=depth, input_dim=input_dim, width=specs.WidthSpec.parse(str(width)), inits=tuple(inits))
    return probe(spec, specs.ProbeSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype,
                                       stream=stream, precision=precision, graphs=graphs))


def probe_resnet(
    blocks: int = 40,
    stages: int = 1,
    dim: int = 500,
    width: str | int = "150:250",
    block_depth: int = 1,
    norm: str = "wn",
    inits: Sequence[str] = ("proposed",),
    samples: int = 1000,
    seed: int = 0,
    seeds: int = 1,
    device: str = "auto",
    dtype: str = "float32",
    stream: bool | None = None,
    precision: str = "fp32",
    graphs: bool | None = None,
) -> ProbeResult:
    """Keyword-friendly wrapper of :func:`probe` for the ResNet (001 eq. 6; 004 appendix C with
    ``norm="bn"``); the options of ``sigprop resnet``."""
    spec = specs.ResNetSpec(
        blocks=blocks, stages=stages, dim=dim, width=specs.WidthSpec.parse(str(width)),
        block_depth=block_depth, norm=norm, inits=tuple(inits),
    )
    return probe(spec, specs.ProbeSpec(samples=samples, seed=seed, seeds=seeds, device=device, dtype=dtype,
                                       stream=stream, precision=precision, graphs=graphs))


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
            result = probe(c.spec, c.probe)
        except Exception as exc:
            if on_error is not None:
                on_error(c, exc)
            raise
        seconds = (time.perf_counter() - t0) / max(len(result.runs), 1)
        results[c.name] = result.to_dict()
        for run in result.runs:
            o = CheckOutcome(c.name, c.command, run.init, c.expect, list(run.checks), seconds, c.description)
            outcomes.append(o)
            if on_outcome is not None:
                on_outcome(o)
    return CheckReport(source, outcomes, time.perf_counter() - t_all, results)


def rerun_specs(doc: dict) -> tuple[specs.MLPSpec | specs.ResNetSpec, specs.ProbeSpec, int | None]:
    """The specs (and torch thread count) that reproduce a ``sigprop.result.v1`` document:
    its config, on the device, precision, stream mode and draw batching it recorded."""
    from sigprop.errors import SigpropError
    from sigprop.results import RESULT_SCHEMA

    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        raise SigpropError(f"not a {RESULT_SCHEMA} document (sigprop mlp/resnet --format json)", option="RESULT")
    cfg, env = doc.get("config", {}), doc.get("environment", {})
    try:
        if doc.get("command") == "mlp":
            spec = specs.MLPSpec(depth=cfg["depth"], input_dim=cfg["input_dim"], width=specs.WidthSpec.parse(cfg["width"]),
                                 inits=tuple(cfg["inits"]))
        elif doc.get("command") == "resnet":
            spec = specs.ResNetSpec(
                blocks=cfg["blocks"], stages=cfg["stages"], dim=cfg["dim"],
                width=specs.WidthSpec.parse(cfg["width"] or "150:250"), block_depth=cfg["block_depth"],
                norm=cfg["norm"], inits=tuple(cfg["inits"]),
            )
        else:
            raise SigpropError(f"unknown command {doc.get('command')!r}", option="RESULT")
        probe_spec = specs.ProbeSpec(
            samples=cfg["samples"], seed=cfg["seed"], seeds=cfg["seeds"], device=env.get("device", cfg["device"]),
            dtype=cfg["dtype"], stream=env.get("stream", cfg.get("stream")), precision=cfg.get("precision", "fp32"),
            batch=env.get("batch"), graphs=cfg.get("graphs"),
        )
    except (KeyError, TypeError) as exc:
        raise SigpropError(f"the document lacks {exc} in its config or environment", option="RESULT") from None
    return spec, probe_spec, env.get("threads")


def rerun(doc: dict, progress: engine.ProgressFn | None = None, on_start=None) -> ProbeResult:
    """Run again what a result document records (same config, seed, device, thread count)."""
    import torch

    spec, probe_spec, threads = rerun_specs(doc)
    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        return probe(spec, probe_spec, progress=progress, on_start=on_start)
    finally:
        torch.set_num_threads(saved)
