"""The WN MLP of Arpit et al. 2019, eq. 1-2 (``sigprop mlp``): L layers a^l = g^l * W^l h^{l-1} /
||W^l_i|| + b^l, h^l = ReLU(a^l), widths drawn per layer from a range once per run (the paper's
Figure 1, top: U(150, 250) or U(950, 1050) on inputs in R^500).  Rows: layers 1..L, forward
||h^l||/||x|| after the ReLU, backward ||dl/da^l||/||e|| at the pre-activation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from sigprop import plans, specs, stats, theory
from sigprop.inits import LayerRole
from sigprop.kinds import base
from sigprop.kinds.base import Hints, Kind, Memory, Opt, RunTheory, SweepAxes
from sigprop.plans import graphs
from sigprop.results import NO_TEST, Check, RatioStats
from sigprop.width.spec import WidthNet, widths_of

#: Figure 1 (top) of Arpit et al. 2019, appendix A.1: the three schemes compared there
DEFAULT_INITS = ("he", "proposed", "proposed-gaussian")
#: the default width range (the paper's Figure 1 solid lines)
DEFAULT_WIDTH = "150:250"
#: under the default band no typical ratio outside [1e-2, 1e2] passes, however much the widths
#: change (the width factor sqrt(n_L/n_0) of the reference is honoured up to these limits)
BAND_LIMITS = (1e-2, 1e2)


@dataclass(frozen=True)
class MLPSpec:
    """The WN MLP of Arpit et al. 2019, eq. 1-2: L layers a^l = g^l * W^l h^{l-1} / ||W^l_i|| + b^l, h^l =
    ReLU(a^l)."""

    depth: int = 20
    input_dim: int = 500
    width: specs.WidthSpec = specs.WidthSpec(150, 250)
    inits: tuple[str, ...] = ("proposed",)

    def __post_init__(self) -> None:
        specs.check_size(self.depth, "depth")
        specs.check_size(self.input_dim, "input_dim")
        base.init_tuple(self, MLP.provides, MLP.noun)

    def widths(self, seed: int) -> list[int]:
        """[n_0, n_1, ..., n_L]: drawn once per run, shared by every init of the run."""
        return [self.input_dim] + self.width.draw(self.depth, seed)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["width"] = str(self.width)
        d["inits"] = list(self.inits)
        return d


@dataclass(frozen=True)
class MLPPlan:
    widths: list[int]
    steps: tuple

    @property
    def entries(self) -> list[int]:
        return self.widths[1:]

    @property
    def config(self) -> dict:
        return {"widths": self.widths}


def steps(widths: Sequence[int]) -> tuple:
    """Layer l: Linear(n_{l-1} -> n_l) + ReLU, recorded after each (Arpit et al. 2019, eq. 1-2)."""
    out: list = []
    for l in range(1, len(widths)):
        out += [
            plans.Linear(LayerRole(widths[l - 1], widths[l]), relu=True),
            plans.Record(pre_activation=True),
        ]
    return tuple(out)


def checks(
    widths: Sequence[int],
    fwd: RatioStats,
    bwd: RatioStats,
    cum_f,
    cum_b,
    pred_f: float | None,
    pred_b: float | None,
    band: tuple[float, float] | None = None,
    z: float = theory.Z_CHECK,
    separation: tuple | None = None,
) -> list[Check]:
    """The two verdicts on the forward ratio at layer L and the backward ratio at layer 1, each
    judged on the typical (geometric-mean) ratio over samples and draws (the end-to-end rule,
    ``stats.end_to_end``, the CNN's too):

    * ``preserved``: inside the norm-preserving reference hull (theory.check_reference_ln)
      widened by the factors ``band`` (default specs.DECADE_BAND) -- an absolute band that always
      contains 1, whatever the depth or width;
    * ``theory``: inside the band of this init's own prediction (``pred_*``, ln RMS) moved by
      the exact finite-width drift and widened by z sd with the Cornish-Fisher skew correction
      (theory.cornish_fisher_band; ``cum_*`` = (drift, variance, third cumulant)) -- not testable
      where that band is wider than the step to the prediction with every layer's variance halved or doubled
      (``separation``: per ratio its ln shifts (down, up); stats.theory_gate).
    """
    default = band is None
    refs = theory.check_reference_ln(widths)
    limits = (math.log(BAND_LIMITS[0]), math.log(BAND_LIMITS[1])) if default else (-math.inf, math.inf)
    L = len(widths) - 1
    width = str(widths[1]) if len(set(widths[1:])) == 1 else f"{min(widths[1:])}..{max(widths[1:])}"
    seps = separation or (None, None)
    ends = [
        stats.EndRatio(f"forward ratio at layer {L}", fwd, refs[0], pred_f, tuple(cum_f), seps[0]),
        stats.EndRatio("backward ratio at layer 1", bwd, refs[1], pred_b, tuple(cum_b), seps[1]),
    ]
    checks = stats.end_to_end(ends, band or specs.DECADE_BAND, limits, z)
    for c, e in zip(checks, ends):  # the preserved checks, first: why a failed one failed
        c.note = stats.explain_preserved(c, e.stats, e.pred, e.typical, L, width)
    return checks


@base.register
class MLP(Kind):
    name = "mlp"
    summary = (
        "Probe a weight-normalized ReLU MLP (Arpit et al. 2019, eq. 1-2): forward and backward norm "
        "ratios per layer."
    )
    size_fields = "depth/width/samples"
    spec = MLPSpec
    noun = "the MLP"
    options = (
        Opt("depth", int, 20, "Number of layers L.", min=1),
        Opt("input_dim", int, 500, "Input dimension n_0.", min=1),
        Opt(
            "width",
            str,
            DEFAULT_WIDTH,
            "Layer width: N, or LO:HI to draw each layer's width uniformly from LO..HI (once per run).",
            toml=(str, int),
        ),
    )
    default_inits = DEFAULT_INITS
    init_help = "Init scheme (repeatable). Default: he, proposed, proposed-gaussian (Figure 1 top)."
    hints = Hints(
        footer="mean ± std over samples of ||h^l||/||x|| (forward) and ||dl/da^l||/||e|| (backward); theory "
        "= closed-form "
        "rms; =/≠ = measured rms within/outside the finite-width band of the theory (" + NO_TEST + ")"
    )
    sweep_axes = SweepAxes(width_help="every layer's width (and n_0 unless --input-dim)", input_dim=True)
    band_help = "0.1:10 around norm preservation"

    def make(self, values: dict, inits_) -> MLPSpec:
        v = dict(values)
        if "width" in v:
            v["width"] = specs.WidthSpec.parse(str(v["width"]))
        return MLPSpec(**v, inits=DEFAULT_INITS if inits_ is None else inits_)

    width_options = (
        Opt("widths", str, "64,128,256,512,1024", "The widths n, comma-separated.", parse=widths_of),
        Opt("depth", int, 4, "Number of weight layers L (input, L-2 hidden, readout).", min=2),
        Opt("input_dim", int, 32, "Input dimension n_0 (fixed: it does not grow with the width).", min=1),
        Opt("classes", int, 10, "Outputs (classes of the cross-entropy; fixed).", min=1),
    )

    def width_net(self, values: dict) -> WidthNet:
        """The plain ReLU MLP (no weight normalization: the abc-parametrizations are stated for
        plain weights, Yang & Hu 2021, section 3) at each width, a chain of weight layers."""
        v = self.width_values(values)
        net = {"depth": v["depth"], "input_dim": v["input_dim"], "classes": v["classes"]}
        return WidthNet("sigprop.width.nets:relu_mlp", v["widths"], (v["input_dim"],), net, chain=True)

    def sweep_spec(self, size, width, init, input_dim):
        return MLPSpec(
            depth=size, input_dim=input_dim or width, width=specs.WidthSpec(width, width), inits=(init,)
        )

    def sweep_config(self, spec) -> dict:
        return {"input_dim": spec.input_dim}

    def banner(self, spec) -> str:
        return f"depth {spec.depth}, widths {spec.width}"

    def describe(self, config: dict) -> str:
        return f"depth {config.get('depth')}, widths {config.get('width')}, n_0 = {config.get('input_dim')}"

    def plan(self, spec, seed: int) -> MLPPlan:
        widths = spec.widths(seed)
        return MLPPlan(widths, steps(widths))

    def rows(self, spec) -> int:
        return spec.depth

    def memory(self, spec, probe, itemsize, free, check) -> Memory:
        stream = probe.stream
        # upper bound from the widest possible layers, before anything is drawn or allocated
        widest = [spec.input_dim] + [spec.width.hi] * min(spec.depth, 2)
        bound = plans.memory(steps(widest), probe.samples, itemsize).need
        per_layer = probe.samples * ((spec.width.hi + 7) // 8) + 4 * probe.samples * 8
        weights_hi = (spec.depth - 1) * spec.width.hi**2 * itemsize
        bound += (spec.depth - 1) * per_layer + (0 if stream else weights_hi)
        if stream is not False and bound > 0.8 * free:
            bound -= 0 if stream else weights_hi  # streaming does not keep the weights
            stream = True
        fields = self.size_fields
        check(bound, fields, stream is False)
        return base.planned(self.plan(spec, probe.seed), probe.samples, itemsize, free, check, fields, stream)

    def run_theory(self, scheme, spec, plan, probe) -> RunTheory:
        """The composed prediction (``plans.graphs.graph_predict``, the graph fold) with its exact
        finite-width band (``plans.spread``: the exact per-layer cumulants, its drift the band's centre)."""
        pred = graphs.graph_predict(plan.steps, scheme)
        return RunTheory(
            pred,
            plans.separation(plan.steps, scheme, pred, by=graphs.graph_predict),
            graphs.graph_spread(plan.steps, scheme.orthogonal),
            list(plan.widths),
            scheme.description,
            drift=True,
        )

    def verdicts(self, th, spec, plan, arrays, layers, gate) -> tuple[list[Check], None]:
        """Both verdicts on the end-to-end ratios (``checks``)."""
        (pf, cf, sf), (pb, cb, sb) = th.end(False), th.end(True)
        gates = checks(
            plan.widths,
            layers[-1].forward,
            layers[0].backward,
            cf,
            cb,
            pf,
            pb,
            gate.band,
            separation=(sf, sb),
        )
        return gates, None

    def correlation(self, scheme, spec, plan, c0, batch):
        if scheme.moments is None and not scheme.standardizes:
            return None, stats.NO_CORRELATION_MAP
        return graphs.graph_pair_kernels(plan.steps, scheme, c0, batch), ""
