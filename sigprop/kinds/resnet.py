"""The residual network of Arpit et al. 2019, eq. 6 (``sigprop resnet``): K stages of B blocks
h^b = S_b h^{b-1} + alpha F_b(h^{b-1}), F_b = D x [WN-FC -> ReLU ->] WN-FC, S_b the identity or, opening
stage k > 1, a WN projection that doubles the width (section 4, "Implementation details",
footnote 4) -- weight-normalized (``--norm wn``), plain (``none``), or the batch-normalized ReLU
ResNet of De & Smith 2020, appendix C (``bn``: a stem x^1 = W^0 BN(x^0)^+ and blocks
x + W BN(x)^+ of width d, He W).  Rows: the states of the residual stream h^0..h^{KB} (x^0..x^{B+1}
for BN), forward ||h^b||/||h^0||, backward ||dl/dh^b||/||dl/dh^end||, and per block the branch
ratio ||alpha F_b(h^{b-1})||/||h^{b-1}||."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sigprop import inits, plans, specs, stats, theory
from sigprop.inits import LayerRole
from sigprop.kinds import base
from sigprop.kinds.base import Hints, Kind, Memory, Opt, RunTheory, SweepAxes
from sigprop.plans import graphs
from sigprop.results import NO_TEST, BNStats, StageInfo

NORMS = ("wn", "bn", "none")
#: Figure 1 (bottom) of Arpit et al. 2019, appendix A.2: the three schemes compared there
DEFAULT_INITS = ("he", "proposed", "proposed-gaussian")
DEFAULT_WIDTH = "150:250"
#: torch.nn.BatchNorm1d's default
BN_EPS = theory.BN_EPS
BN_NET = "ResNet (De & Smith 2020, appendix C)"
BN_DESCRIPTION = (
    "batch-normalized ReLU ResNet x + W BN(x)^+, He W, stem W^0 BN(x^0)^+ (De & Smith 2020, appendix C)"
)


@dataclass(frozen=True)
class ResNetSpec:
    """A residual network: Arpit et al. 2019, eq. 6 with K stages of B blocks (``norm="wn"`` or ``"none"``),
    or
    the batch-normalized ReLU ResNet of De & Smith 2020, appendix C (``norm="bn"``: one stage, a stem and B
    blocks x + W BN(x)^+ of width ``dim``)."""

    blocks: int = 40
    stages: int = 1
    dim: int = 500
    width: specs.WidthSpec = specs.WidthSpec(150, 250)
    block_depth: int = 1
    norm: str = "wn"
    inits: tuple[str, ...] = DEFAULT_INITS

    def __post_init__(self) -> None:
        for field, value in (
            ("blocks", self.blocks),
            ("stages", self.stages),
            ("dim", self.dim),
            ("block_depth", self.block_depth),
        ):
            specs.check_size(value, field)
        if self.norm not in NORMS:
            raise specs.SigpropError(f"expected one of {', '.join(NORMS)}, got {self.norm!r}", field="norm")
        if self.norm == "bn":
            if self.stages != 1:
                raise specs.SigpropError(f"the batch-normalized {BN_NET} has one stage", field="stages")
            if self.block_depth != 1:
                raise specs.SigpropError(
                    f"the batch-normalized {BN_NET} has one layer per block", field="block_depth"
                )
        if self.stages > 16:
            raise specs.SigpropError(
                f"each stage doubles the width; {self.stages} stages is beyond any memory", field="stages"
            )
        base.init_tuple(self, ResNet.provides, ResNet.noun, lambda n: resolve(n, self.norm))

    def resolved_inits(self) -> tuple[str, ...]:
        """The registry names that actually run under ``norm`` (``he`` means unnormalized He
        weights with ``--norm none`` or ``bn``)."""
        return tuple(resolve(name, self.norm) for name in self.inits)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["width"] = None if self.norm == "bn" else str(self.width)
        d["inits"] = list(self.resolved_inits())
        return d


def resolve(name: str, norm: str) -> str:
    return inits.resolve_norm(name, norm, ResNet.provides, ResNet.noun, BN_NET)


# --------------------------------------------------------------------------------------------
# the net as data
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    """Residual block ``index`` (1-based over the whole net) maps h^{index-1} to h^{index}."""

    index: int
    stage: int  # 1-based
    index_in_stage: int  # 0-based
    blocks_in_stage: int
    widths: tuple[int, ...]  # (d_in, n_1, ..., n_D, d_out): the branch's layer widths
    projection: bool  # the skip path is a WN linear projection d_in -> d_out

    @property
    def d_in(self) -> int:
        return self.widths[0]

    @property
    def d_out(self) -> int:
        return self.widths[-1]

    def branch_roles(self) -> list[LayerRole]:
        w = self.widths
        return [
            LayerRole(
                w[j - 1],
                w[j],
                "block_last" if j == len(w) - 1 else "relu",
                self.blocks_in_stage,
                self.index_in_stage,
            )
            for j in range(1, len(w))
        ]

    def projection_role(self) -> LayerRole | None:
        if not self.projection:
            return None
        return LayerRole(self.d_in, self.d_out, "projection", self.blocks_in_stage, self.index_in_stage)


@dataclass(frozen=True)
class ResNetPlan:
    """Everything about the net that is decided before any weight is drawn: the residual-stream
    width of each stage, the hidden widths inside each block (drawn from ``--width`` with the
    seed), which block opens a stage with a projection, the role of every layer, and its steps."""

    dim: int
    stage_dims: tuple[int, ...]
    blocks: tuple[Block, ...]
    #: the BN net of De & Smith 2020, appendix C starts with a stem x^1 = W^0 BN(x^0)^+ (entry 1)
    stem: bool = False

    @property
    def stages(self) -> int:
        return len(self.stage_dims)

    @property
    def entries(self) -> list[int]:
        """Width of h^0 .. h^{K B}."""
        return [self.dim] * (1 + self.stem) + [b.d_out for b in self.blocks]

    def entry_stages(self) -> list[int]:
        """Stage of the block that produced each entry (0 for the input h^0)."""
        return [0] + [1] * self.stem + [b.stage for b in self.blocks]

    def stage_span(self, k: int) -> tuple[int, int]:
        """(first, last) entry indices of stage k (1-based): h^first is the stage input."""
        idx = [b.index for b in self.blocks if b.stage == k]
        first = 0 if (k == 1 and self.stem) else idx[0] - 1
        return first, idx[-1]

    @property
    def config(self) -> dict:
        return {
            "stage_dims": list(self.stage_dims),
            "hidden_widths": [list(b.widths[1:-1]) for b in self.blocks],
        }

    @property
    def steps(self) -> tuple:
        """h^0 recorded, then per block: Open, the branch's layers (a ReLU after all but the last),
        Close (with the projection of a stage's first block), Record (Arpit et al. 2019, eq. 6);
        the BN net: the stem BN -> W^0 and blocks Open, BN, W, Close (De & Smith 2020, appendix C)."""
        if self.stem:
            d, B = self.dim, len(self.blocks)
            out: list = [
                plans.Record(),
                plans.BatchNorm(BN_EPS, d),
                plans.Linear(LayerRole(d, d, "relu", B, 0), relu=False),
                plans.Record(),
            ]
            for l in range(1, B + 1):
                out += [
                    plans.Open(1, B),
                    plans.BatchNorm(BN_EPS, d),
                    plans.Linear(LayerRole(d, d, "block_last", B, l - 1), relu=False),
                    plans.Close(B),
                    plans.Record(),
                ]
            return tuple(out)
        out = [plans.Record()]
        for blk in self.blocks:
            roles = blk.branch_roles()
            proj = blk.projection_role()
            out.append(plans.Open(blk.stage, blk.blocks_in_stage))
            out += [plans.Linear(r, relu=j < len(roles) - 1) for j, r in enumerate(roles)]
            out += [
                plans.Close(blk.blocks_in_stage, None if proj is None else plans.Linear(proj, relu=False)),
                plans.Record(),
            ]
        return tuple(out)


def resnet_plan(
    dim: int, stages: int, blocks: int, block_depth: int, hidden: list[int], stem: bool = False
) -> ResNetPlan:
    """Build the plan; ``hidden`` holds stages * blocks * block_depth widths, block by block.
    With ``stem`` (the BN net) entry 1 is the stem's output and block b produces entry b + 1."""
    if len(hidden) != stages * blocks * block_depth:
        raise ValueError("one hidden width per ReLU layer of every block")
    stage_dims = tuple(dim * 2**k for k in range(stages))
    out = []
    it = iter(hidden)
    index = int(stem)
    for k in range(stages):
        for j in range(blocks):
            index += 1
            d_out = stage_dims[k]
            d_in = stage_dims[k - 1] if (k > 0 and j == 0) else d_out
            widths = (d_in, *[next(it) for _ in range(block_depth)], d_out)
            out.append(Block(index, k + 1, j, blocks, widths, projection=d_in != d_out))
    return ResNetPlan(dim=dim, stage_dims=stage_dims, blocks=tuple(out), stem=stem)


def weight_count(plan: ResNetPlan) -> int:
    """Elements of the stored weights of one draw (branches, projections; the BN net's W^l)."""
    total = sum(b.widths[j] * b.widths[j - 1] for b in plan.blocks for j in range(1, len(b.widths)))
    total += sum(b.d_in * b.d_out for b in plan.blocks if b.projection)
    return total + plan.dim**2 * plan.stem


# --------------------------------------------------------------------------------------------
# the verdicts
# --------------------------------------------------------------------------------------------
def variances(orthogonal: bool, plan: ResNetPlan, gains) -> plans.Spread:
    """The spread of every entry and block (``plans.spread``: docs/theory.md §7) at the blocks'
    branch-to-skip ``gains`` [(forward, backward)]."""
    return graphs.graph_spread(plan.steps, orthogonal, gains)


def bn_record(arr: np.ndarray, l: int, batch: int) -> BNStats:
    """The batch statistics of x^l beside l, l(1 - 1/pi), l/pi (De & Smith 2020, appendix C)."""
    pred = theory.bn_statistics_prediction(l, batch)
    mean = arr[:, l, :].mean(axis=0)
    std = arr[:, l, :].std(axis=0, ddof=1) if arr.shape[0] > 1 else [None] * 3
    return BNStats(
        float(mean[0]), float(mean[1]), float(mean[2]), *pred, *(None if v is None else float(v) for v in std)
    )


def prediction(scheme, plan: ResNetPlan) -> plans.Prediction:
    """The composed prediction (``plans.graphs.graph_predict``; the branch-to-skip gains at the
    state's power with ||x||^2 = d, docs/theory.md §7), or for the BN net De & Smith's mean-field recursion
    (``theory.bn_resnet_prediction``: batch norm has no per-sample energy map).  With biases in
    the branch its ratio depends on the state's norm: no branch prediction then."""
    if plan.stem:
        p = theory.bn_resnet_prediction(plan.dim, len(plan.blocks))
        return plans.Prediction(
            p.ln_forward, p.ln_backward, p.ln_branch, list(zip(p.gain_forward, p.gain_backward))
        )
    pred = graphs.graph_predict(plan.steps, scheme, gains_at_d=True)
    if pred.ln_branch is not None:
        biased = [
            scheme.moments is not None and any(scheme.moments(r).bias_var for r in b.branch_roles())
            for b in plan.blocks
        ]
        pred.ln_branch = [None if bad else v for v, bad in zip(pred.ln_branch, biased)]
    return pred


def separation(scheme, plan: ResNetPlan, pred: plans.Prediction) -> plans.Separation:
    """How far the prediction moves with every weight layer's variance halved and doubled
    (``plans.separation``): for the BN net nowhere -- batch norm undoes its layer's scale."""
    if plan.stem:
        zero = lambda rows: None if not rows else [(0.0, 0.0)] * len(rows)
        return plans.Separation(zero(pred.ln_forward), zero(pred.ln_backward))
    return plans.separation(plan.steps, scheme, pred, by=graphs.graph_predict, gains_at_d=True)


@base.register
class ResNet(Kind):
    name = "resnet"
    summary = (
        "Probe a residual network h^b = h^{b-1} + alpha F_b(h^{b-1}) (Arpit et al. 2019, eq. 6) state "
        "by state."
    )
    size_fields = "blocks/stages/dim/width/samples"
    spec = ResNetSpec
    noun = "ResNets"
    provides = frozenset({inits.BLOCKS})
    options = (
        Opt("blocks", int, 40, "Residual blocks per stage B.", min=1),
        Opt(
            "stages",
            int,
            1,
            "Stages K; stage k > 1 opens with a WN projection that doubles the width.",
            min=1,
        ),
        Opt("dim", int, 500, "Residual-stream width of stage 1 (the input dimension) d.", min=1),
        Opt(
            "width",
            str,
            None,
            "Hidden width inside each block: N, or LO:HI drawn per hidden layer (once per run).",
            shown=DEFAULT_WIDTH,
            toml=(str, int),
        ),
        Opt("block_depth", int, 1, "D: a block is D x [WN-FC -> ReLU ->] WN-FC.", min=1),
        Opt(
            "norm",
            str,
            "wn",
            "wn (weight norm), bn (the BN ResNet of De & Smith, appendix C) or none.",
            choices=NORMS,
        ),
    )
    init_help = (
        "Init scheme (repeatable). Default: he, proposed, proposed-gaussian (Figure 1 bottom); he "
        "with --norm none/bn."
    )
    hints = Hints(
        width="d",
        row="b",
        residual=True,
        x=r"block $b$ (state $h^b$)",
        forward=r"$\|h^b\| \,/\, \|h^0\|$",
        backward=r"$\|\partial\ell/\partial h^b\| \,/\, \|\partial\ell/\partial h^B\|$",
        units="blocks",
        footer="mean ± std over samples of ||h^b||/||x|| (forward) and ||dl/dh^b||/||dl/dh^end|| (backward); "
        "branch = rms "
        "of ||alpha F_b(h^{b-1})||/||h^{b-1}||; theory = closed-form rms; =/≠ = measured rms within/outside "
        "the "
        "finite-width band of the theory (" + NO_TEST + "); band [√2, √e] = "
        "[1.414, 1.649] per stage (Arpit et al. 2019, Theorems 3-4)",
    )
    sweep_axes = SweepAxes("blocks", "10,40,100", width_help="the residual width d and the hidden width")
    band_help = "1:1, i.e. Theorem 3's [sqrt 2, sqrt e] per stage with its finite-width allowance"

    def make(self, values: dict, inits_) -> ResNetSpec:
        v = dict(values)
        norm = v.get("norm", "wn")
        if v.get("width") is not None and norm == "bn":
            raise specs.SigpropError(
                f"the batch-normalized {BN_NET} has no hidden layer; its width is --dim", field="width"
            )
        v["width"] = specs.WidthSpec.parse(str(v.get("width") or DEFAULT_WIDTH))
        if inits_ is None:
            inits_ = DEFAULT_INITS if norm == "wn" else ("he",)
        return ResNetSpec(**v, inits=inits_)

    def from_config(self, config: dict) -> ResNetSpec:
        values = {o.name: config[o.name] for o in self.options if o.name in config}
        if values.get("norm") == "bn":
            values.pop("width", None)
        return self.make(values, tuple(config["inits"]))

    def sweep_spec(self, size, width, init, input_dim):
        return ResNetSpec(blocks=size, dim=width, width=specs.WidthSpec(width, width), inits=(init,))

    def sweep_config(self, spec) -> dict:
        return {"dim": spec.dim}

    def banner(self, spec) -> str:
        shape = f"{spec.stages} stage(s) x {spec.blocks} blocks, d {spec.dim}"
        return shape + (
            ", batch norm"
            if spec.norm == "bn"
            else f", hidden {spec.width} x {spec.block_depth}, norm {spec.norm}"
        )

    def describe(self, config: dict) -> str:
        return (
            f"{config.get('stages', 1)} stage(s) × {config.get('blocks')} blocks, d = "
            f"{config.get('dim')}, norm {config.get('norm')}"
        )

    def inits(self, spec) -> tuple[str, ...]:
        return spec.resolved_inits()

    def scheme(self, spec, name: str):
        return inits.INITS["unnormalized-he" if spec.norm == "bn" else name]

    def plan(self, spec, seed: int) -> ResNetPlan:
        if spec.norm == "bn":
            return resnet_plan(spec.dim, 1, spec.blocks, 0, [], stem=True)
        hidden = spec.width.draw(spec.stages * spec.blocks * spec.block_depth, seed)
        return resnet_plan(spec.dim, spec.stages, spec.blocks, spec.block_depth, hidden)

    def space(self, spec) -> str:
        return "plain" if spec.norm == "bn" else "log"

    def graphs(self, spec) -> bool:
        return spec.norm != "bn"  # the BN net runs eagerly

    def observers(self, spec) -> tuple[str, ...]:
        return ("fwd", "bwd", "branch", "bn") if spec.norm == "bn" else ("fwd", "bwd", "branch")

    def rows(self, spec) -> int:
        return spec.stages * spec.blocks + 2

    def memory(self, spec, probe, itemsize, free, check) -> Memory:
        bn = spec.norm == "bn"
        fields = self.size_fields
        # a lower bound that needs no plan (a plan of 10^9 blocks would itself exhaust memory): the
        # bit-packed masks, BN's saved inputs and the float64 ln-ratio buffers, with widths at LO
        layers = spec.stages * spec.blocks * (1 if bn else spec.block_depth)
        per_layer = probe.samples * (
            (spec.dim * itemsize + spec.dim // 8) if bn else (spec.width.lo + 7) // 8
        )
        check(layers * per_layer + 3 * spec.stages * spec.blocks * probe.samples * 8, fields)
        # upper bound with every hidden width at HI, before anything is drawn or allocated
        hi = resnet_plan(
            spec.dim,
            spec.stages,
            spec.blocks,
            0 if bn else spec.block_depth,
            [] if bn else [spec.width.hi] * (spec.stages * spec.blocks * spec.block_depth),
            stem=bn,
        )
        stream = probe.stream
        bound = plans.memory(hi.steps, probe.samples, itemsize).need
        if stream is None and bound > 0.8 * free:
            stream = True
        if stream:
            bound = plans.memory(hi.steps, probe.samples, itemsize, stream=True).need
        check(bound, fields, stream is False)
        return base.planned(self.plan(spec, probe.seed), probe.samples, itemsize, free, check, fields, stream)

    def run_theory(self, scheme, spec, plan, probe) -> RunTheory:
        """Per entry the init's prediction (``prediction``) with its own spread (``variances``),
        per block the branch ratio's."""
        pred = prediction(scheme, plan)
        bn = plan.stem
        return RunTheory(
            pred,
            separation(scheme, plan, pred),
            variances(not bn and scheme.orthogonal, plan, pred.gains),
            list(plan.entries),
            BN_DESCRIPTION if bn else scheme.description,
            stages=plan.entry_stages(),
            first_branch=2 if bn else 1,
        )

    def annotate(self, layers, arrays, probe) -> None:
        """The BN net's batch statistics per entry (``bn_record``)."""
        if "bn" in arrays:
            for i, rec in enumerate(layers):
                rec.bn = bn_record(arrays["bn"], i, probe.samples)

    def verdicts(self, th, spec, plan, arrays, layers, gate, z: float = theory.Z_CHECK) -> tuple[list, list]:
        """Per stage the ``preserved`` check (the typical stage ratio in Theorem 3's band [sqrt 2,
        sqrt e], widened by ``gate.band`` and by z sd of the proposed reference net's spread) and
        the ``theory`` check (within z sd of the init's own predicted stage ratio):
        ``_stage_checks``."""
        infos, checks = _stage_checks(plan, arrays, gate, th.pred, th.sep, th.spread, z)
        return checks, infos

    def correlation(self, scheme, spec, plan, c0, batch):
        if scheme.moments is None and not scheme.standardizes:
            return None, stats.NO_CORRELATION_MAP
        return graphs.graph_pair_kernels(
            plan.steps, scheme, c0, batch
        ), ""  # the BN net: batch norm's standardised map

    def correlation_first(self, plan) -> int:
        return 1  # entry 0 is the input itself

    def curvature_description(self, spec, scheme) -> str:
        return (
            "x + W BN(x)^+, He W (De & Smith 2020, appendix C)" if spec.norm == "bn" else scheme.description
        )

    def band(self, gate) -> list[float]:
        lo, hi = gate.band or (1.0, 1.0)
        return [theory.RESNET_LOWER * lo, theory.RESNET_UPPER * hi]


def _stage_checks(plan, arrays, gate, pred, sep, own, z: float) -> tuple[list[StageInfo], list]:
    """Per stage its record (``StageInfo``: the band, the predicted stage ratios) and its checks:
    the ``preserved`` ones of every stage, then the ``theory`` ones.  The --check tolerance is the
    spread of a net that sits in the band: the proposed gains (branch-to-skip power 1/B_k both
    ways, Theorem 3) with i.i.d. rows, on this plan -- not the init's own spread, which for an
    exploding init is so wide that it would drag the band far from [sqrt 2, sqrt e]."""
    reference = [(1.0 / b.blocks_in_stage, 1.0 / b.blocks_in_stage) for b in plan.blocks]
    ref = variances(False, plan, reference)
    widen = (0.0, 0.0) if gate.band is None else (math.log(gate.band[0]), math.log(gate.band[1]))
    infos, checks, theory_checks = [], [], []
    for k in range(1, plan.stages + 1):
        first, last = plan.stage_span(k)
        bands = theory.stage_band_ln(plan.entries[first], plan.entries[last])
        blocks = sum(1 for blk in plan.blocks if blk.stage == k)
        where = "Theorem 3's band [sqrt 2, sqrt e]"
        span, variances_ = (first, last), (own.variances, ref.variances)
        info, preserved, own_checks = base.stage(
            k, span, bands, blocks, plan, arrays, pred, sep, *variances_, widen, z, where
        )
        infos.append(info)
        checks += preserved
        theory_checks += own_checks
    return infos, checks + theory_checks
