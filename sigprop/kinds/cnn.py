"""The plain CNN of Arpit et al. 2019, section 5.1, after Xiao et al. 2018 (``sigprop cnn``):
``depth`` 3 x 3 WN convs of ``channels`` channels with zero padding 1, the first ``strided`` with
stride 2, a ReLU after each, on inputs of shape ``image``; measured up to the last conv over all
units (channels x positions).  Rows: layers 1..L as the MLP's (forward after the ReLU, backward
at the pre-activation).  Also the conv pieces the WRN shares: the memory plan of a conv net, the
lossless reference, the finite-width spread of conv layers."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sigprop import inits, plans, specs, stats, theory
from sigprop.inits import LayerRole
from sigprop.kinds import base
from sigprop.kinds.base import Hints, Kind, Memory, Opt, RunTheory, SweepAxes
from sigprop.plans import graphs
from sigprop.results import NO_TEST
from sigprop.width.spec import WidthNet, widths_of

#: Arpit et al. 2019, section 5.1 compare the proposed init on this CNN; delta-orthogonal is what
#: Xiao et al. 2018 (whose architecture it is) use for deep CNNs
DEFAULT_INITS = ("proposed", "delta-orthogonal")


@dataclass(frozen=True)
class CNNSpec:
    """The plain CNN of Arpit et al. 2019, section 5.1 (after Xiao et al. 2018): ``depth`` 3 x 3
    WN convs of ``channels`` channels with zero padding 1, the first ``strided`` with stride 2,
    a ReLU after each, on inputs of shape ``image`` (C, H, W); measured up to the last conv."""

    depth: int = 20
    channels: int = 64
    image: tuple[int, int, int] = (3, 32, 32)
    strided: int = 2
    inits: tuple[str, ...] = DEFAULT_INITS

    def __post_init__(self) -> None:
        specs.check_size(self.depth, "depth")
        specs.check_size(self.channels, "channels")
        object.__setattr__(self, "image", specs.image(self.image))
        if not 0 <= self.strided <= self.depth:
            raise specs.SigpropError(
                f"must be in [0, depth = {self.depth}], got {self.strided}", field="strided"
            )
        base.init_tuple(self, CNN.provides, CNN.noun)

    def to_dict(self) -> dict:
        return {
            "depth": self.depth,
            "channels": self.channels,
            "image": specs.image_text(self.image),
            "strided": self.strided,
            "inits": list(self.inits),
        }


def steps(image: tuple[int, int, int], channels: int, depth: int, strided: int = 2, kernel: int = 3) -> tuple:
    """``depth`` k x k convolutions of ``channels`` channels, padding (k - 1)/2, the first
    ``strided`` with stride 2, a ReLU after each, each recorded as the MLP's layers: forward
    after its ReLU, backward at its pre-activation."""
    out: list = []
    shape = tuple(image)
    for l in range(depth):
        role = LayerRole(shape[0] * kernel * kernel, channels, taps=kernel * kernel)
        conv = plans.Conv(role, shape, kernel, 2 if l < strided else 1, (kernel - 1) // 2)
        out += [conv, plans.Record(pre_activation=True)]
        shape = conv.shape_out
    return tuple(out)


@dataclass(frozen=True)
class ConvPlan:
    """A conv net's plan: its steps and the units (channels x positions) of each recorded state."""

    steps: tuple
    entries: list[int]

    @property
    def config(self) -> dict:
        return {"units": self.entries}


#: the lossless reference of a conv net: centre-tap rows with the proposed gains keep every
#: position's energy (docs/theory.md §11)
LOSSLESS = replace(inits.INITS["proposed"], name="lossless reference", taps="centre")


@base.register
class CNN(Kind):
    name = "cnn"
    summary = (
        "Probe the plain CNN of Arpit et al. 2019, section 5.1 (3x3 WN convs + ReLU, zero padding, the first "
        "two with "
        "stride 2) layer by layer."
    )
    size_fields = "depth/channels/image/samples"
    #: an image net's Hessian-vector product costs ~100x a dense net's a sample (``Kind``)
    curvature_samples = 64
    spec = CNNSpec
    noun = "the CNN"
    provides = frozenset({inits.TAPS})
    options = (
        Opt("depth", int, 20, "Number of 3x3 conv layers L.", min=1),
        Opt("channels", int, 64, "Channels of every conv (the fixed width; the paper's CNN has 512).", min=1),
        Opt("image", str, "3x32x32", "Input shape CxHxW."),
        Opt("strided", int, 2, "How many of the first layers have stride 2.", min=0),
    )
    default_inits = DEFAULT_INITS
    init_help = "Init scheme (repeatable). Default: proposed, delta-orthogonal."
    hints = Hints(
        width="units",
        energy=True,
        spread="envelope",
        footer="mean ± std over samples of ||h^l||/||x|| (forward) and ||dl/da^l||/||e|| (backward) over all "
        "units "
        "(channels × positions); theory = the energy-map rms (zero padding and strides, docs/theory.md §11); "
        "=/≠ = "
        "measured rms within/outside its finite-width band (channels as the width; an envelope of the "
        "measured "
        "spread, it errs wide; " + NO_TEST + "); preserved = within --band of "
        "the "
        "lossless reference (1/2 per stride-2 layer forward: a quarter of the positions)",
    )
    sweep_axes = SweepAxes(widths="32,64", width_help="the channels (3 x 32 x 32 inputs)")
    band_help = "0.1:10 around the lossless reference"
    correlation_band = False

    def make(self, values: dict, inits_) -> CNNSpec:
        v = dict(values)
        if "image" in v:
            v["image"] = specs.parse_image(v["image"]) if isinstance(v["image"], str) else v["image"]
        return CNNSpec(**v, inits=DEFAULT_INITS if inits_ is None else inits_)

    width_options = (
        Opt(
            "widths",
            str,
            "16,32,64,128,256",
            "The channels n of every conv, comma-separated.",
            parse=widths_of,
        ),
        Opt(
            "depth", int, 3, "Number of 3x3 conv layers L (then a global average pool and a readout).", min=1
        ),
        Opt("image", str, "3x16x16", "Input shape CxHxW."),
        Opt("classes", int, 10, "Outputs (classes of the cross-entropy; fixed).", min=1),
    )

    def width_net(self, values: dict) -> WidthNet:
        """The plain ReLU conv net (no weight normalization, stride 1, padding 1) at each channel
        count, a global average pool and a linear readout: a chain of weight layers (the pool is
        linear), its conv fan-ins 9 n."""
        v = self.width_values(values)
        image = specs.image(v["image"])
        net = {"depth": v["depth"], "channels_in": image[0], "classes": v["classes"]}
        return WidthNet("sigprop.width.nets:relu_cnn", v["widths"], image, net, chain=True)

    def sweep_spec(self, size, width, init, input_dim):
        return CNNSpec(depth=size, channels=width, inits=(init,))

    def sweep_config(self, spec) -> dict:
        return {"image": specs.image_text(spec.image)}

    def banner(self, spec) -> str:
        return (
            f"depth {spec.depth}, {spec.channels} channels, image {specs.image_text(spec.image)}, "
            f"{spec.strided} strided"
        )

    def describe(self, config: dict) -> str:
        return (
            f"CNN depth {config.get('depth')}, {config.get('channels')} channels, image "
            f"{config.get('image')}, {config.get('strided')} strided"
        )

    def plan(self, spec, seed: int) -> ConvPlan:
        s = steps(spec.image, spec.channels, spec.depth, spec.strided)
        return ConvPlan(s, [math.prod(spec.image)] + [st.units_out for st in plans.layers(s)])

    def rows(self, spec) -> int:
        return spec.depth

    def memory(self, spec, probe, itemsize, free, check) -> Memory:
        C, H, W = spec.image
        small = spec.channels * max(1, H >> spec.strided) * max(1, W >> spec.strided)
        # a lower bound that needs no plan (10^9 layers of steps would themselves exhaust memory):
        # the bit-packed masks of the layers at the smallest map and the float64 ln-ratio buffers
        check(spec.depth * probe.samples * ((small + 7) // 8 + 16), self.size_fields)
        plan = self.plan(spec, probe.seed)
        return base.planned(plan, probe.samples, itemsize, free, check, self.size_fields, probe.stream)

    def run_theory(self, scheme, spec, plan, probe) -> RunTheory:
        """The energy-map prediction (``plans.graphs.graph_predict``, the graph fold; none for an
        init without moments) with its finite-width band (``plans.spread``: a conv's law, the
        i.i.d. rows' envelope; the typical ratio var below the RMS, +- z sd)."""
        pred = graphs.graph_predict(plan.steps, scheme) if scheme.moments is not None else None
        sep = (
            plans.Separation(None, None)
            if pred is None
            else plans.separation(plan.steps, scheme, pred, by=graphs.graph_predict)
        )
        return RunTheory(
            pred or plans.Prediction(None, None, None, None),
            sep,
            graphs.graph_spread(plan.steps, False),
            plan.entries,
            scheme.description,
        )

    def verdicts(self, th, spec, plan, arrays, layers, gate, z: float = theory.Z_CHECK) -> tuple[list, None]:
        """* ``preserved``: the typical forward ratio at layer L and backward ratio at layer 1 inside
          ``gate.band`` (default specs.DECADE_BAND) times the lossless reference -- the prediction
          of centre-tap rows with the proposed gain (``LOSSLESS``), which keep every position's
          energy: a stride-2 layer then halves the norm over all units (a quarter of the
          positions), so the reference is 1/2 per strided layer forward and 1 backward;
        * ``theory``: the same typical ratios inside the init's own band, [pred - var - z sd,
          pred - var + z sd] (``theory.log_band``); not testable for an init without a prediction."""
        return _end_checks(plan, layers, gate, th, z), None

    def correlation(self, scheme, spec, plan, c0, batch):
        return correlation(scheme, plan, c0, batch)


def correlation(scheme, plan, c0: float, batch: int):
    """A conv net's cosines (the per-position kernel map, docs/theory.md §11), shown without a
    band; none for standardised convs (a data-dependent init, batch norm)."""
    if any(st.bn for st in plans.layers(plan.steps)):
        return None, "no correlation map for batch-normalized conv nets"
    if scheme.moments is None:
        return None, stats.NO_CORRELATION_MAP
    return graphs.graph_pair_kernels(plan.steps, scheme, c0, batch), ""


def _end_checks(plan, layers, gate, th: RunTheory, z: float) -> list:
    """The end-to-end rule (``stats.end_to_end``): the ``preserved`` checks (the typical forward
    ratio at layer L, backward at layer 1, inside ``gate.band`` times the lossless reference),
    then the ``theory`` ones (inside the init's own log-normal band; not testable without a
    prediction)."""
    convs = plans.layers(plan.steps)
    L = len(convs)
    ref = graphs.graph_predict(plan.steps, LOSSLESS)
    r_f, r_b = ref.ln_forward[-1], ref.ln_backward[0]
    ends = [  # a conv's spread is a log-normal envelope (th.drift False): the band of theory.log_band
        stats.EndRatio(f"forward ratio at layer {L}", layers[-1].forward, (r_f, r_f), *th.end(False)),
        stats.EndRatio("backward ratio at layer 1", layers[0].backward, (r_b, r_b), *th.end(True)),
    ]
    channels = convs[0].role.fan_out
    checks = stats.end_to_end(ends, gate.band or specs.DECADE_BAND, z=z)
    for c, e in zip(checks, ends):  # the preserved checks, first: why a failed one failed
        if not c.passed:
            c.note = _outside_note(e.stats, e.reference[0], e.pred, e.cumulants[1], c, channels, L)
    return checks


def _outside_note(st, r: float, p: float | None, v: float, c, channels: int, L: int) -> str:
    """Why a ``preserved`` check failed: dead samples, no prediction, the border's energy loss, or
    the finite-width drift of the typical ratio."""
    if st.dead_fraction > 0:
        return f"{st.dead_fraction:.1%} of the samples died (ratio 0)"
    if p is None:
        return (
            f"outside the band around the lossless reference {stats.fmt(r / stats.LN10)}; "
            "no prediction for this init"
        )
    if not c.log10_low <= p / stats.LN10 <= c.log10_high:
        return (
            f"the theory predicts an RMS ratio of {stats.fmt(p / stats.LN10)} against the "
            f"lossless "
            f"{stats.fmt(r / stats.LN10)}: zero padding loses energy at the borders every layer "
            f"(docs/theory.md §11)"
        )
    return (
        f"the theory's RMS ratio {stats.fmt(p / stats.LN10)} is inside the band but its "
        f"typical ratio, "
        f"{stats.fmt((p - v) / stats.LN10)}, is not: finite-width drift "
        f"({channels} channels "
        f"over {L} layers); more channels or fewer layers move it"
    )
