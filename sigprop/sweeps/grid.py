"""A sweep's grid: its points, each one configuration of a net kind with one init and what is
measured of it (a probe, the curvature, the Jacobian's spectrum), and the key it resumes by.
No torch.

What a kind sweeps is its own (sigprop/kinds/): a kind of sigprop's own nets sweeps its size
axis (``SweepAxes.size``: depth or blocks) and a width (``Kind.sweep_spec`` says what the
width means for the net); a kind that sweeps otherwise -- a user's model over ``--arg``
values and input shapes -- says so in ``Kind.sweep_configurations``.  ``Kind.sweep_config``
adds the kind's own keys to a point's ``config``.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from sigprop import inits, specs
from sigprop.errors import SigpropError
from sigprop.options import declared_options, keyed
from sigprop.registry import Registry
from sigprop.results import curvature_row, spectrum_row, sweep_row

if TYPE_CHECKING:  # the kinds are above the sweep's loop: named in annotations only (arrows down)
    from sigprop import kinds


@dataclass(frozen=True)
class Measurement:
    """What a sweep's point can measure, declared once: ``options`` -- the spec of its own
    options (``specs.HessianSpec``), built from the probe's shared ones (samples, seed, seeds,
    device, dtype, threads), None for the probe itself; ``key(options)`` -- their part of the
    point's resume key; ``row(config, init, result, seconds)`` -- its JSON line
    (sigprop/results/; schema ``sigprop.sweep.v1`` with its config, which a sweep resumes by);
    ``run`` -- ``"module:function"`` measuring ``(spec, options)`` where the point runs (imported
    there: no torch here), or that function; ``cosines`` -- whether it measures input cosines;
    ``needs`` -- the kind attribute it needs (``curvature``: a kind whose curvature sigprop
    measures), and ``default_samples`` where its own differ from the kind's."""

    name: str
    options: type | None
    key: Callable[[Any], dict]
    row: Callable[..., dict]
    run: str | Callable
    cosines: bool = False
    needs: str | None = None
    default_samples: int | None = None

    def runner(self) -> Callable:
        if callable(self.run):
            return self.run
        module, _, name = self.run.partition(":")
        return getattr(importlib.import_module(module), name)


#: what a point measures, by ``--measure``'s name (``register_measurement``)
MEASURES: Registry[Measurement] = Registry("measurement", field="measure", skip=(__name__,))


def register_measurement(m: Measurement) -> Measurement:
    """Add a measurement a sweep can make (a name taken is refused, naming both)."""
    return MEASURES.add(m.name, m)


register_measurement(Measurement("probe", None, lambda o: {}, sweep_row, "sigprop.api:probe", cosines=True))
register_measurement(
    Measurement(
        "hessian",
        specs.HessianSpec,
        # the head is part of the key: a 0.6.0 row (each init's own head) is re-measured, not resumed
        lambda o: {"curvature": {"iters": o.iters, "tol": o.tol, "head": o.head}},
        curvature_row,
        "sigprop.api:hessian",
        needs="curvature",
    )
)
register_measurement(
    Measurement(
        "spectrum",
        specs.SpectrumSpec,
        lambda o: {"spectrum": {"path": o.path}},
        spectrum_row,
        "sigprop.api:spectrum",
        default_samples=specs.SpectrumSpec.samples,
    )
)


#: ``10,20,50`` -> [10, 20, 50] (specs.py's, where the kinds read their axes too)
parse_ints = specs.parse_ints


def parse_inits(text: str, kind: kinds.Kind) -> list[str]:
    """``proposed,he`` -> the names, each defined for the kind's net, none twice."""
    names = [p.strip() for p in str(text).split(",") if p.strip()]
    if not names:
        raise SigpropError("give at least one init", field="init")
    for n in names:
        inits.get(n, kind.provides, kind.noun)  # defined for this net, or one line with a did-you-mean
    if len(set(names)) != len(names):
        raise SigpropError("an init is named twice", field="init")
    return names


def config_key(config: dict) -> str:
    """A point's resume key: its config as JSON with sorted keys (a line's ``config`` alike)."""
    return json.dumps(config, sort_keys=True)


@dataclass(frozen=True)
class Point:
    """One task of a sweep: a configuration (``axes``: the swept values in the order of the key,
    e.g. (("depth", 10), ("width", 128))), one init, its spec, the probe's options (the key
    holds those their declarations say: ``Opt.keyed``), what is measured (``MEASURES``' name) and
    its own options (``Measurement.options``: those of ``sigprop hessian``, ``sigprop
    spectrum``; None for a probe)."""

    kind: kinds.Kind
    axes: tuple[tuple[str, Any], ...]
    init: str
    spec: Any
    probe: specs.ProbeSpec
    measure: str = "probe"
    options: Any = None

    @property
    def measurement(self) -> Measurement:
        return MEASURES[self.measure]

    def run(self):
        """Measure the point (where it runs): its measurement's runner on (spec, options)."""
        return self.measurement.runner()(self.spec, self.probe if self.options is None else self.options)

    @property
    def config(self) -> dict[str, Any]:
        d = {
            "command": self.kind.name,
            **dict(self.axes),
            "init": self.init,
            **keyed(self.probe),  # the probe options it is keyed by (their declarations say which)
            **self.kind.sweep_config(self.spec),
        }
        if self.options is not None:
            d.update(self.measurement.key(self.options))
        return d

    @property
    def key(self) -> str:
        return config_key(self.config)

    def label(self) -> str:
        words = [self.kind.name]
        for name, value in self.axes:
            if name == "args":
                words += value
            elif name != "target":
                words += [name.replace("_", " "), str(value)]
        return " ".join(words + [self.init])


def default_samples(kind: kinds.Kind, measure: str) -> int:
    """The samples of a sweep's points when none are given: its command's (a probe, the
    curvature: 1000, a WRN 100, a model 64), the spectrum's exact Jacobians at 8 inputs."""
    own = MEASURES.lookup(measure).default_samples
    return own if own is not None else kind.probe_defaults.get("samples", specs.ProbeSpec.samples)


def _options(probe: specs.ProbeSpec, measure: Measurement):
    """The options of what a point measures, from the probe's it declares too (samples, seeds,
    seed, device, dtype, threads); None for a probe."""
    if measure.options is None:
        return None
    own = {o.name for o in declared_options(measure.options)}
    shared = [o.name for o in declared_options(type(probe)) if o.name in own]
    return measure.options(**{k: getattr(probe, k) for k in shared})


def configure(
    kind: kinds.Kind,
    given: dict[str, Any],
    init=None,
    probe: specs.ProbeSpec | None = None,
    measure: str = "probe",
) -> list[Point]:
    """The points of a sweep of ``kind`` from what a user gives: ``given`` {option: values} (a
    list of values or a comma-separated string; only the kind's ``sweep_fields`` apply), the
    inits (None: the kind's own defaults), the probe's options and what is measured
    (``MEASURES``).  Every refusal names its option, before anything runs."""
    m = MEASURES.lookup(measure)
    probe = probe or specs.ProbeSpec(samples=default_samples(kind, measure))
    fields = kind.sweep_fields()
    for field, value in given.items():
        if value is not None and value != [] and field not in fields:
            takes = ", ".join("TARGET" if f == "target" else "--" + f.replace("_", "-") for f in fields)
            raise SigpropError(f"does not apply to sweep {kind.name}; it takes {takes}", field=field)
    if m.needs is not None and not getattr(kind, m.needs):
        raise SigpropError(f"sigprop {measure} does not measure {kind.noun}", field="measure")
    if not m.cosines and probe.correlations:
        raise SigpropError(f"--measure {measure} measures no cosine; drop --correlation", field="correlation")
    names = parse_inits(specs.joined(init, kind.sweep_axes.inits), kind)
    configurations = kind.sweep_configurations(given)
    options = _options(probe, m)
    return [
        Point(kind, axes, name, make(name), probe, measure, options)
        for axes, make in configurations
        for name in names
    ]
