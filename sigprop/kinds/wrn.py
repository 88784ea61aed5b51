"""The wide residual network of Arpit et al. 2019, supplementary Figure 5 (``sigprop wrn``): conv1 to
16k channels, three groups of N residual blocks [WN conv 3 x 3 -> ReLU -> WN conv 3 x 3] at 16k,
32k, 64k channels, stride 2 and a 1 x 1 projection opening groups 2 and 3; ResNet-164's bottleneck
blocks; plain convs (``--norm none``) or He convs each followed by batch norm (``bn``); the named
nets of its Table 1 (``--preset``).  Rows: the input, conv1's output and every block's output
(the residual stream), forward ||h^b||/||x||, backward ||dl/dh^b||/||dl/dh^end||, and per block
the branch ratio."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sigprop import inits, plans, specs, theory
from sigprop.inits import LayerRole
from sigprop.kinds import base
from sigprop.kinds import cnn as conv
from sigprop.kinds.base import Hints, Kind, Memory, Opt, RunTheory, SweepAxes
from sigprop.plans import graphs
from sigprop.results import NO_TEST, StageInfo

NORMS = ("wn", "bn", "none")
#: named architectures of Arpit et al. 2019, Table 1 (N blocks per group, widening k, bottleneck):
#: WRN-d-k has d = 6 N + 4 layers; ResNet-d with basic blocks d = 6 N + 2, with bottlenecks d = 9 N + 2
PRESETS = {
    "wrn-40-10": {"blocks": 6, "widen": 10, "bottleneck": False},
    "resnet-56": {"blocks": 9, "widen": 1, "bottleneck": False},
    "resnet-110": {"blocks": 18, "widen": 1, "bottleneck": False},
    "resnet-164": {"blocks": 18, "widen": 1, "bottleneck": True},
}
#: the inits of Arpit et al. 2019, Figure 3 (right) and Table 2, on the WRN
DEFAULT_INITS = ("proposed", "pytorch", "datadep", "stage-hanin")
#: Figure 5 of Arpit et al. 2019 (supplementary): conv1's channels before the widening factor k
BASE = 16
#: a bottleneck block's output channels over its inner ones (He et al. 2016, ResNet-164)
BOTTLENECK_EXPANSION = 4
NET = "the WRN"
BN_DESCRIPTION = (
    "He convs each followed by training-mode batch norm (gamma = 1, beta = 0), ReLU after BN, "
    "no ReLU after the sum"
)


@dataclass(frozen=True)
class WRNSpec:
    """The wide residual network of Arpit et al. 2019, supplementary Figure 5 (``steps``): conv1
    to 16 k channels, three groups of ``blocks`` residual blocks at 16 k, 32 k, 64 k channels
    (``bottleneck``: ResNet-164's blocks), WN convs (``norm="wn"``), plain ones (``"none"``: the
    unnormalized schemes; ``he`` means unnormalized He) or plain He convs each followed by
    training-mode batch norm (``"bn"``; init ``he`` only), on ``image``.  ``preset`` names one
    of ``PRESETS`` (its blocks, widening and block type)."""

    blocks: int = 16
    widen: int = 1
    image: tuple[int, int, int] = (3, 32, 32)
    bottleneck: bool = False
    norm: str = "wn"
    preset: str | None = None
    inits: tuple[str, ...] = DEFAULT_INITS

    def __post_init__(self) -> None:
        if self.preset is not None:
            if self.preset not in PRESETS:
                raise specs.SigpropError(
                    f"unknown preset {self.preset!r}; choose from {', '.join(PRESETS)}", field="preset"
                )
            for key, value in PRESETS[self.preset].items():
                if getattr(self, key) != value:
                    raise specs.SigpropError(
                        f"preset {self.preset!r} has {key} = {value}; drop --{key.replace('_', '-')} or the "
                        f"preset",
                        field="preset",
                    )
        specs.check_size(self.blocks, "blocks")
        specs.check_size(self.widen, "widen")
        object.__setattr__(self, "image", specs.image(self.image))
        if self.norm not in NORMS:
            raise specs.SigpropError(f"expected one of {', '.join(NORMS)}, got {self.norm!r}", field="norm")
        base.init_tuple(self, WRN.provides, NET, lambda n: resolve(n, self.norm))

    @classmethod
    def of_preset(cls, preset: str, **kw) -> "WRNSpec":
        """The preset's net; ``kw`` may repeat its blocks/widen/bottleneck (the same values) and set
        the rest (an unknown preset is refused by ``__post_init__``)."""
        return cls(preset=preset, **{**PRESETS.get(preset, {}), **kw})

    def resolved_inits(self) -> tuple[str, ...]:
        return tuple(resolve(name, self.norm) for name in self.inits)

    def to_dict(self) -> dict:
        return {
            "blocks": self.blocks,
            "widen": self.widen,
            "image": specs.image_text(self.image),
            "bottleneck": self.bottleneck,
            "norm": self.norm,
            "preset": self.preset,
            "inits": list(self.resolved_inits()),
        }


def resolve(name: str, norm: str) -> str:
    return inits.resolve_norm(name, norm, WRN.provides, NET, "WRN")


def steps(
    image: tuple[int, int, int],
    blocks: int,
    widen: int = 1,
    bottleneck: bool = False,
    groups: int = 3,
    bn: bool = False,
) -> tuple:
    """Arpit et al. 2019, supplementary Figure 5: conv1, a 3 x 3 WN conv to 16 k channels (no ReLU
    after it: the blocks carry none after their sum and their branch opens with a conv), then
    ``groups`` groups of ``blocks`` residual blocks at 16 k, 32 k, 64 k channels, each block
    h' = S h + F(h) with F = [WN conv 3 x 3 -> ReLU -> WN conv 3 x 3] and no non-linearity after
    the sum.  The first conv of groups 2 and 3 has stride 2, and their first block's skip S is a
    WN 1 x 1 stride-2 projection (the identity elsewhere).  ``bottleneck``: ResNet-164's blocks
    [1 x 1 -> ReLU -> 3 x 3 -> ReLU -> 1 x 1] at 16, 32, 64 inner channels (times k) and
    ``BOTTLENECK_EXPANSION`` times as many out, the stride on the 3 x 3 conv, a projection
    wherever the channels or the size change (also the first block).  Recorded: the input,
    conv1's output, every block's output (the residual stream).  ``bn``: every conv (conv1, the
    branches', the projections) is followed by training-mode batch norm, before its ReLU -- the
    post-activation placement of He et al. 2016 in the paper's block, no ReLU after the sum."""
    if bn:
        return plans.with_bn(steps(image, blocks, widen, bottleneck, groups), True)
    C = image[0]
    stem = plans.Conv(LayerRole(C * 9, BASE * widen, "linear", taps=9), tuple(image), 3, 1, 1, relu=False)
    out: list = [plans.Record(), stem, plans.Record()]
    shape = stem.shape_out
    for g in range(groups):
        inner = BASE * widen * 2**g
        c_out = inner * (BOTTLENECK_EXPANSION if bottleneck else 1)
        for j in range(blocks):
            stride = 2 if (g > 0 and j == 0) else 1
            role = lambda fan_in, fan_out, kind, taps: LayerRole(
                fan_in * taps, fan_out, kind, blocks, j, taps
            )
            if bottleneck:
                c1 = plans.Conv(role(shape[0], inner, "relu", 1), shape, 1, 1, 0)
                c2 = plans.Conv(role(inner, inner, "relu", 9), c1.shape_out, 3, stride, 1)
                branch = [
                    c1,
                    c2,
                    plans.Conv(role(inner, c_out, "block_last", 1), c2.shape_out, 1, 1, 0, relu=False),
                ]
            else:
                c1 = plans.Conv(role(shape[0], c_out, "relu", 9), shape, 3, stride, 1)
                branch = [
                    c1,
                    plans.Conv(role(c_out, c_out, "block_last", 9), c1.shape_out, 3, 1, 1, relu=False),
                ]
            proj = None
            if stride != 1 or shape[0] != c_out:
                proj = plans.Conv(role(shape[0], c_out, "projection", 1), shape, 1, stride, 0, relu=False)
            out += [plans.Open(g + 1, blocks), *branch, plans.Close(blocks, proj), plans.Record()]
            shape = branch[-1].shape_out
    return tuple(out)


@dataclass(frozen=True)
class WRNPlan:
    steps: tuple
    blocks: int
    entries: list[int]

    @property
    def config(self) -> dict:
        return {"units": self.entries}

    @property
    def bn(self) -> bool:
        return any(st.bn for st in plans.layers(self.steps))


def entries(steps_) -> list[int]:
    """The units of the recorded states (the input, conv1's output, every block's output)."""
    shapes = [plans.layers(steps_)[0].shape_in]
    for item in plans.nest(steps_):
        if isinstance(item, plans.Conv):
            shapes.append(item.shape_out)
        elif isinstance(item, plans.Block):
            shapes.append(item.inner[-1].shape_out)
    return [math.prod(sh) for sh in shapes]


@functools.lru_cache(maxsize=16)  # a pure function of the plan: every init of a run reads the same bands
def stage_bands(steps_, blocks: int) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """The ``preserved`` band of each group (ln, forward and backward): Theorem 3's [sqrt 2,
    sqrt e] (Arpit et al. 2019) times the group's unavoidable transition -- what the lossless
    reference (centre-tap rows, proposed gains: ``cnn.LOSSLESS``, which keep every position's
    energy) loses to the stride-2 downsampling, its stage ratio divided by its branches'
    (1 + 1/B)^{B/2} (docs/theory.md §11, "Residual conv nets")."""
    E = len(entries(steps_))
    ref = graphs.graph_predict(plans.with_bn(steps_, False), conv.LOSSLESS)
    branch = 0.5 * blocks * math.log1p(1.0 / blocks)
    lo, hi = math.log(theory.RESNET_LOWER), math.log(theory.RESNET_UPPER)
    out = []
    for g in range((E - 2) // blocks):
        first, last = 1 + g * blocks, 1 + (g + 1) * blocks
        tf = ref.ln_forward[last] - ref.ln_forward[first] - branch
        tb = ref.ln_backward[first] - ref.ln_backward[last] - branch
        out.append(((lo + tf, hi + tf), (lo + tb, hi + tb)))
    return out


def variances(steps_, gains: Sequence[tuple[float, float]] | None) -> plans.Spread:
    """The spread of ln(ratio) at every recorded state, forward (from the input) and backward
    (from the top), and the branch ratio's per block (``plans.spread``): conv1 the conv law's
    envelope (c = 5 over its channels), each block the ResNet's step law with its channels as the
    width of the branch's power fluctuation and its units as the dimension of the skip-branch
    cross term, at the branch-to-skip power ratios ``gains`` [(forward, backward)] per block
    (None: forward and backward 1/B_k, the proposed init's -- the reference of the ``preserved``
    allowance, which measured 1.5-3x wider than the across-draw spread forward: it errs wide)."""
    return graphs.graph_spread(steps_, False, None if gains is None else list(gains))


@functools.lru_cache(maxsize=16)
def reference_variances(steps_) -> tuple[np.ndarray, np.ndarray]:
    """``variances`` at the proposed init's gains (the ``preserved`` allowance), once per plan."""
    return variances(steps_, None).variances


@base.register
class WRN(Kind):
    name = "wrn"
    summary = (
        "Probe the wide residual network of Arpit et al. 2019, supplementary Figure 5 (conv1, three groups "
        "of N blocks "
        "[WN conv 3x3 -> ReLU -> WN conv 3x3], stride 2 and a 1x1 projection opening groups 2 and 3) state "
        "by state."
    )
    size_fields = "blocks/widen/image/samples"
    spec = WRNSpec
    noun = NET
    provides = frozenset({inits.BLOCKS, inits.TAPS})
    options = (
        Opt(
            "blocks",
            int,
            None,
            "Residual blocks per group N (the paper's 1, 16, 166, 1666).",
            min=1,
            shown="16",
        ),
        Opt("widen", int, None, "Widening factor k: groups of 16k, 32k, 64k channels.", min=1, shown="1"),
        Opt(
            "bottleneck",
            bool,
            None,
            "ResNet-164's bottleneck blocks [1x1, 3x3, 1x1], 4x expansion.",
            off="--basic",
            shown="basic",
        ),
        Opt(
            "preset",
            str,
            None,
            "A named net of Arpit et al. 2019, Table 1 (sets N, k and the block type).",
            choices=tuple(PRESETS),
        ),
        Opt("image", str, "3x32x32", "Input shape CxHxW."),
        Opt(
            "norm",
            str,
            "wn",
            "wn (weight-normalized convs), none (plain convs: he, skipinit, skipinit-sqrt) or bn (plain He "
            "convs, each followed by training-mode batch norm; init he).",
            choices=NORMS,
        ),
    )
    init_help = (
        "Init scheme (repeatable). Default: proposed, pytorch, datadep, stage-hanin (Figure 3 right); he "
        "with "
        "--norm none."
    )
    # a conv net's per-sample spread is small (its weights are shared by the positions): draws matter more
    probe_defaults = {"samples": 100}
    #: a WRN-14's product on 512 images took 4.7 s on 2 cores (a --density run: 8 h); on 64, 0.38 s
    curvature_samples = 64
    hints = Hints(
        width="units",
        row="b",
        residual=True,
        energy=True,
        spread="envelope",
        x=r"block $b$ (state $h^b$)",
        forward=r"$\|h^b\| \,/\, \|h^0\|$",
        backward=r"$\|\partial\ell/\partial h^b\| \,/\, \|\partial\ell/\partial h^B\|$",
        units="blocks",
        footer="b = state (0: the input, 1: conv1's output, then each block's); mean ± std over samples of "
        "||h^b||/||x|| "
        "(forward) and ||dl/dh^b||/||dl/dh^end|| (backward) over all units (channels × positions); branch = "
        "rms of "
        "||alpha F_b(h^{b-1})||/||h^{b-1}||; theory = the energy-map rms (zero padding, strides, "
        "projections: "
        "docs/theory.md §11); =/≠ = measured rms within/outside its finite-width band (channels as the "
        "width; an "
        "envelope of the measured spread, it errs wide; " + NO_TEST + "); band = [√2, √e] per "
        "stage "
        "(Arpit et al. 2019, Theorems 3-4) times what a stride-2 group opening costs a lossless net",
    )
    sweep_axes = SweepAxes("blocks", "1,16", "1", "the widening factor k (3 x 32 x 32 inputs)")
    band_help = (
        "1:1, i.e. [sqrt 2, sqrt e] per group times what its stride-2 opening costs a lossless net, with its "
        "finite-width allowance"
    )
    correlation_band = False

    def make(self, values: dict, inits_) -> WRNSpec:
        v = {k: val for k, val in values.items() if val is not None}
        if "image" in v and isinstance(v["image"], str):
            v["image"] = specs.parse_image(v["image"])
        norm = v.get("norm", "wn")
        if inits_ is None:
            inits_ = DEFAULT_INITS if norm == "wn" else ("he",)
        preset = v.pop("preset", None)
        # a --blocks/--widen/--bottleneck that contradicts the preset is refused by the spec
        return WRNSpec(**v, inits=inits_) if preset is None else WRNSpec.of_preset(preset, **v, inits=inits_)

    def sweep_spec(self, size, width, init, input_dim):
        return WRNSpec(blocks=size, widen=width, inits=(init,))

    def sweep_config(self, spec) -> dict:
        return {"image": specs.image_text(spec.image)}

    def banner(self, spec) -> str:
        net = spec.preset if spec.preset is not None else f"WRN N = {spec.blocks}, k = {spec.widen}"
        convs = len(plans.layers(steps(spec.image, spec.blocks, spec.widen, spec.bottleneck)))
        return (
            f"{net} ({'bottleneck' if spec.bottleneck else 'basic'} blocks, {convs} conv layers), "
            f"image {specs.image_text(spec.image)}, norm {spec.norm}"
        )

    def describe(self, config: dict) -> str:
        return (
            f"WRN{' ' + config['preset'] if config.get('preset') else ''} N = {config.get('blocks')}, k = "
            f"{config.get('widen')}"
            f"{', bottleneck' if config.get('bottleneck') else ''}, image {config.get('image')}, norm "
            f"{config.get('norm')}"
        )

    def inits(self, spec) -> tuple[str, ...]:
        return spec.resolved_inits()

    def scheme(self, spec, name: str):
        return inits.INITS["unnormalized-he" if spec.norm == "bn" else name]

    def plan(self, spec, seed: int) -> WRNPlan:
        s = steps(spec.image, spec.blocks, spec.widen, spec.bottleneck, bn=spec.norm == "bn")
        return WRNPlan(s, spec.blocks, entries(s))

    def space(self, spec) -> str:
        return "plain" if spec.norm == "bn" else "log"

    def graphs(self, spec) -> bool:
        return spec.norm != "bn"  # the BN net runs eagerly

    def observers(self, spec) -> tuple[str, ...]:
        return ("fwd", "bwd", "branch")

    def rows(self, spec) -> int:
        return 3 * spec.blocks + 2

    def memory(self, spec, probe, itemsize, free, check) -> Memory:
        C, H, W = spec.image
        small = BASE * spec.widen * max(1, H >> 2) * max(1, W >> 2)
        # a lower bound that needs no plan (cnn.CNN.memory's)
        check(3 * spec.blocks * probe.samples * ((small + 7) // 8 + 16), self.size_fields)
        plan = self.plan(spec, probe.seed)
        return base.planned(plan, probe.samples, itemsize, free, check, self.size_fields, probe.stream)

    def run_theory(self, scheme, spec, plan, probe) -> RunTheory:
        """Per state (input, conv1, each block) the energy-map prediction
        (``plans.graphs.graph_predict``) with its finite-width band (``variances``), per block the
        branch ratio's."""
        pred = plans.Prediction(None, None, None, None)
        sep = plans.Separation(None, None)
        if scheme.moments is not None or scheme.standardizes or plan.bn:
            pred = graphs.graph_predict(plan.steps, scheme)
            sep = plans.separation(plan.steps, scheme, pred, by=graphs.graph_predict)
        entries = len(plan.entries)
        return RunTheory(
            pred,
            sep,
            variances(plan.steps, pred.gains),
            plan.entries,
            BN_DESCRIPTION if plan.bn else scheme.description,
            stages=[0 if i < 2 else 1 + (i - 2) // plan.blocks for i in range(entries)],
            first_branch=2,
        )

    def verdicts(self, th, spec, plan, arrays, layers, gate, z: float = theory.Z_CHECK) -> tuple[list, list]:
        """Per group (stage) the ``preserved`` check -- the typical stage ratio, forward and
        backward, in ``stage_bands`` widened by ``gate.band`` and by z sd of the reference
        allowance (``variances`` with the proposed gains) -- and the ``theory`` check: the same
        typical stage ratio within z sd of the init's own prediction (``_stage_checks``)."""
        infos, checks = _stage_checks(plan, arrays, gate, th.pred, th.sep, th.spread.variances, z)
        return checks, infos

    def correlation(self, scheme, spec, plan, c0, batch):
        return conv.correlation(scheme, plan, c0, batch)

    def correlation_first(self, plan) -> int:
        return 1  # entry 0 is the input itself

    def curvature_description(self, spec, scheme) -> str:
        return "He convs + batch norm" if spec.norm == "bn" else scheme.description

    def band(self, gate) -> list[float]:
        return list(gate.band or (1.0, 1.0))


def _stage_checks(plan, arrays, gate, pred, sep, var, z: float) -> tuple[list[StageInfo], list]:
    """Per group (stage) its record and the ``preserved`` check -- the typical stage ratio, forward
    and backward, in ``stage_bands`` widened by ``gate.band`` and by z sd of the reference
    allowance (``variances`` with the proposed gains) -- then every stage's ``theory`` check: the
    same typical stage ratio within z sd of the init's own prediction."""
    widen = (0.0, 0.0) if gate.band is None else (math.log(gate.band[0]), math.log(gate.band[1]))
    ref = reference_variances(plan.steps)
    infos, checks, own_checks = [], [], []
    for k, bands in enumerate(stage_bands(plan.steps, plan.blocks), 1):
        span = (1 + (k - 1) * plan.blocks, 1 + k * plan.blocks)
        where = "Theorem 3's band [sqrt 2, sqrt e] times the stride-2 transition"
        info, preserved, own = base.stage(
            k, span, bands, plan.blocks, plan, arrays, pred, sep, var, ref, widen, z, where
        )
        infos.append(info)
        checks += preserved
        own_checks += own
    return infos, checks + own_checks
