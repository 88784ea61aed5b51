"""A sweep's grid: its points, each one configuration of a net kind with one init and what is
measured of it (a probe, the curvature, the Jacobian's spectrum), and the key it resumes by.
No torch.

What a kind sweeps is its own (sigprop/kinds/): a kind of sigprop's own nets sweeps its size
axis (``Kind.sweep_size``: depth or blocks) and a width (``Kind.sweep_spec`` says what the
width means for the net); a kind that sweeps otherwise -- a user's model over ``--arg``
values and input shapes -- says so in ``Kind.sweep_configurations``.  ``Kind.sweep_config``
adds the kind's own keys to a point's ``config``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sigprop import inits, kinds, specs
from sigprop.errors import SigpropError

#: what a point measures: ``probe`` (the kind's command), ``hessian``, ``spectrum``
MEASURES = ("probe", "hessian", "spectrum")


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
    e.g. (("depth", 10), ("width", 128))), one init, its spec, the probe's options (their
    samples, seeds, seed and dtype are the key's) and what is measured -- ``curvature`` (the
    options of ``sigprop hessian``) or ``spectrum`` (of ``sigprop spectrum``), else a probe."""

    kind: kinds.Kind
    axes: tuple[tuple[str, Any], ...]
    init: str
    spec: Any
    probe: specs.ProbeSpec
    curvature: specs.HessianSpec | None = None
    spectrum: specs.SpectrumSpec | None = None

    @property
    def measure(self) -> str:
        return (
            "hessian" if self.curvature is not None else "spectrum" if self.spectrum is not None else "probe"
        )

    @property
    def config(self) -> dict[str, Any]:
        d = {
            "command": self.kind.name,
            **dict(self.axes),
            "init": self.init,
            "samples": self.probe.samples,
            "seeds": self.probe.seeds,
            "seed": self.probe.seed,
            "dtype": self.probe.dtype,
            **self.kind.sweep_config(self.spec),
        }
        if self.probe.correlations:  # only then: the keys of rows without cosines stay as they were (resume)
            d["correlations"], d["pairs"] = list(self.probe.correlations), self.probe.pairs
        if self.curvature is not None:
            # the head is part of the key: a 0.6.0 row (each init's own head) is re-measured, not resumed
            d["curvature"] = {
                "iters": self.curvature.iters,
                "tol": self.curvature.tol,
                "head": self.curvature.head,
            }
        if self.spectrum is not None:
            d["spectrum"] = {"path": self.spectrum.path}
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
    if measure == "spectrum":
        return specs.SpectrumSpec.samples
    return kind.probe_defaults.get("samples", specs.ProbeSpec.samples)


def _measured(probe: specs.ProbeSpec, measure: str):
    """The options of what a point measures, from the probe's (samples, seeds, seed, device,
    dtype, threads): (curvature, spectrum), one of them or neither."""
    shared = dict(
        samples=probe.samples,
        seed=probe.seed,
        seeds=probe.seeds,
        device=probe.device,
        dtype=probe.dtype,
        threads=probe.threads,
    )
    if measure == "hessian":
        return specs.HessianSpec(**shared), None
    if measure == "spectrum":
        return None, specs.SpectrumSpec(**shared)
    return None, None


def grid(
    kind: kinds.Kind,
    sizes: list[int],
    widths: list[int],
    names: list[str],
    probe: specs.ProbeSpec,
    input_dim: int | None = None,
    curvature: specs.HessianSpec | None = None,
    spectrum: specs.SpectrumSpec | None = None,
) -> list[Point]:
    """Every point of a size x width x init grid of one of sigprop's nets, validated up front."""
    return [
        Point(
            kind,
            ((kind.sweep_size, size), ("width", width)),
            name,
            kind.sweep_spec(size, width, name, input_dim),
            probe,
            curvature,
            spectrum,
        )
        for size in sizes
        for width in widths
        for name in names
    ]


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
    if measure not in MEASURES:
        raise SigpropError(f"expected one of {', '.join(MEASURES)}, got {measure!r}", field="measure")
    probe = probe or specs.ProbeSpec(samples=default_samples(kind, measure))
    fields = kind.sweep_fields()
    for field, value in given.items():
        if value is not None and value != [] and field not in fields:
            takes = ", ".join("TARGET" if f == "target" else "--" + f.replace("_", "-") for f in fields)
            raise SigpropError(f"does not apply to sweep {kind.name}; it takes {takes}", field=field)
    if measure == "hessian" and not kind.curvature:
        raise SigpropError(f"sigprop hessian does not measure {kind.noun}", field="measure")
    if measure != "probe" and probe.correlations:
        raise SigpropError(f"--measure {measure} measures no cosine; drop --correlation", field="correlation")
    names = parse_inits(specs.joined(init, kind.sweep_inits), kind)
    configurations = kind.sweep_configurations(given)
    curvature, spectrum = _measured(probe, measure)
    return [
        Point(kind, axes, name, make(name), probe, curvature, spectrum)
        for axes, make in configurations
        for name in names
    ]
