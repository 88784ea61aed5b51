"""The one driver: a spec -> its kind's engine -> a result.  The API, the CLI, ``sigprop sweep``,
``sigprop check``, ``sigprop rerun`` and the curvature all run here.

``measure`` hands the spec to its kind's engine (sigprop/engines/: ``plan`` walks sigprop's own
nets, ``model`` probes a user's module) and keeps the observations; ``probe`` has the engine
assemble each init's record from them (statistics beside the kind's predictions, the kind's
verdicts) and the plug-in observers summarise theirs; ``curvature`` and ``spectrum`` are the
engine's, on ``threads`` CPU threads.
"""

from __future__ import annotations

from typing import Callable

from sigprop import engines, kinds, observers, specs, theory
from sigprop.engines.shared import Measured, ProgressFn
from sigprop.kernels import device as dev
from sigprop.observers import correlation
from sigprop.results import HessianResult, ProbeResult, SpectrumResult, probe_config
from sigprop.version import __version__

#: the tolerances a result records (docs/theory.md §4; the band is the kind's)
TOLERANCES = {
    "z_agreement": theory.Z_AGREEMENT,
    "z_check": theory.Z_CHECK,
    "spread_c_gaussian": theory.SPREAD_C_GAUSSIAN,
    "spread_c_orthogonal_base": theory.SPREAD_C_ORTHOGONAL_BASE,
}


def measure(
    spec,
    probe_spec: specs.ProbeSpec,
    progress: ProgressFn | None = None,
    on_start: Callable[[dict], None] | None = None,
    observe=(),
) -> Measured:
    """Walk every init of ``spec`` (any registered kind's) as ``probe_spec`` says, and keep only
    the observations: its kind's engine (``engines.of``) runs the walks or the model.  ``observe``: plug-in
    observers (instances) run beside the kind's and ``probe_spec.observe``'s (by name)."""
    kind = kinds.of(spec)
    observers.check_names(probe_spec.observe)
    extra = [observers.make(n) for n in probe_spec.observe] + list(observe)
    return engines.of(kind).measure(kind, spec, probe_spec, progress, on_start, extra)


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
    engine = engines.of(kind)
    extra = [observers.make(n) for n in probe_spec.observe] + list(observe)
    runs = []
    for name, scheme in zip(m.names, m.schemes):
        a = m.arrays[name]
        run = engine.assemble(kind, name, scheme, spec, plan, a, probe_spec, gate)
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
    config = probe_config(kind.name, spec, probe_spec, gate, **plan.config)
    tolerances = {**TOLERANCES, "band": kind.band(gate)}
    return ProbeResult(
        command=kind.name,
        config=config,
        environment={"sigprop": __version__, **m.environment},
        runs=runs,
        tolerances=tolerances,
    )


def curvature(
    spec, hs: specs.HessianSpec, progress: ProgressFn | None = None, on_start=None
) -> HessianResult:
    """The curvature at init of every init of ``spec`` (any registered kind's): per weight draw the
    largest-magnitude Hessian eigenvalue (restarted Lanczos, ``hessian.largest_eigenvalue``),
    the top-k (ARPACK's Lanczos) and the trace (Hutchinson) as ``hs`` asks; on ``hs.threads``
    CPU threads."""
    kind = kinds.of(spec)
    with dev.using_threads(hs.threads):
        return engines.of(kind).curvature(kind, spec, hs, progress, on_start)


def spectrum(
    spec, ss: specs.SpectrumSpec, progress: ProgressFn | None = None, on_start=None
) -> SpectrumResult:
    """Per init and weight draw the exact Jacobian of the net's last state in its input at
    ``ss.samples`` inputs x ~ N(0, I), its singular values and their summaries
    (sigprop/spectra.py), beside the large-width prediction (``plans.predict_jacobian``)."""
    kind = kinds.of(spec)
    with dev.using_threads(ss.threads):
        return engines.of(kind).spectrum(kind, spec, ss, progress, on_start)
