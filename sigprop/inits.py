"""The one registry of init schemes (STYLE.md habits 2-3).

An init scheme is data plus two small functions: ``sample`` draws one layer's parameters from
its role (fan-in, fan-out, what follows the layer) and a ``torch.Generator``; ``moments`` gives
the second moments the closed-form theory needs (``None`` where no closed form exists).  A
data-dependent scheme also has ``calibrate``, which sets g and b from the layer's pre-activations
on the probe batch.

This module does not import torch at import time, so ``sigprop --help`` and ``sigprop inits``
start fast; torch is imported inside the sampling functions.

Common random numbers: every scheme draws its Gaussian matrix G from the same per-layer
generator, so within a run ``he``, ``proposed-gaussian``, ``unnormalized-he`` and ``datadep``
share their directions and ``proposed`` builds its Haar directions from that same G
(sigprop/haar.py).  Differences between schemes in one run are then differences of the
schemes, not of the draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from sigprop import theory
from sigprop.errors import SigpropError

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class LayerRole:
    """Where a layer sits: its fan-in/fan-out and what follows it.

    ``kind``: ``"relu"`` (followed by a ReLU; every MLP layer), ``"block_last"`` (last layer of a
    residual branch), ``"projection"`` (linear shortcut), ``"linear"`` (no ReLU after it: a conv
    net's stem).  ``blocks_in_stage`` and
    ``block_index`` (0-based within the stage) are for ResNet schemes.  ``taps``: k^2 for a
    k x k convolution, whose rows are [c_out, c_in k^2] (fan_in = c_in k^2, fan_out = c_out);
    the paper counts fans as c k^2 on both sides (Arpit et al. 2019, footnote 3), so its gains
    read fan_in / (fan_out taps) = c_in / c_out.
    """

    fan_in: int
    fan_out: int
    kind: str = "relu"
    blocks_in_stage: int = 1
    block_index: int = 0
    taps: int = 1


@dataclass
class LayerParams:
    """One layer's parameters as the engine uses them: a = scale * (v @ h) + bias.

    For a WN layer scale = g / ||v_i|| (Arpit et al. 2019, eq. 1-2; Salimans & Kingma 2016, eq. 2): the normalisation is a per-row
    scale of the matmul output, never a materialised g v/||v||.  ``g`` is kept for the oracle.
    """

    v: "torch.Tensor"  # [fan_out, fan_in]
    g: "torch.Tensor | None"  # [fan_out] WN gains, None for an unnormalised layer
    bias: "torch.Tensor | None"  # [fan_out] or None (zero)
    scale: "torch.Tensor"  # [fan_out]


@dataclass(frozen=True)
class InitScheme:
    name: str
    description: str
    paper: str
    direction: str  # "orthogonal", "gaussian" or "uniform": used by the finite-width spread model
    sample: Callable[[LayerRole, Any, Any, Any], LayerParams] = field(repr=False)
    moments: Callable[[LayerRole], theory.LayerMoments] | None = field(default=None, repr=False)
    calibrate: Callable[[LayerParams, Any], LayerParams] | None = field(default=None, repr=False)
    #: closed-form MLP forward prediction when ``moments`` is None (approximate schemes)
    ln_forward_override: Callable[[Sequence[int]], list[float] | None] | None = field(default=None, repr=False)
    #: which networks the scheme is defined for ("mlp", "resnet")
    applies_to: frozenset = frozenset({"mlp", "resnet"})
    #: False for schemes whose layers are not weight-normalized (g = None)
    normalized: bool = True
    #: the registry name of this scheme's unnormalized counterpart (``--norm none``/``bn``)
    unnormalized: str | None = None
    #: residual-branch multiplier alpha as a function of B_k (1: alpha absorbed into g)
    alpha: Callable[[int], float] = field(default=lambda blocks: 1.0, repr=False)
    #: how a conv row's energy sits on the kernel's taps (theory.ConvMoments.taps):
    #: "isotropic" (every tap alike) or "centre" (delta-orthogonal)
    taps: str = "isotropic"
    #: BibTeX keys (sigprop/citations.py) of the papers behind the scheme (``sigprop cite``)
    cites: tuple[str, ...] = ("arpit2019initialize",)
    #: True when ``sample`` depends on ``LayerRole.block_index``: residual blocks that differ only
    #: in their index then run as different CUDA-graph steps (sigprop/replay.py; a test checks
    #: the flag against ``sample`` for every scheme)
    by_block_index: bool = False
    #: for schemes whose layer is "Haar directions with a constant gain" (``sample`` =
    #: _const_gain(orthogonalize(gaussian), sqrt(haar_gain_sq(role)))): the gain, so that the
    #: engine can orthogonalize many layers or draws in one batched call (sigprop/haar.py)
    haar_gain_sq: Callable[[LayerRole], float] | None = field(default=None, repr=False)

    @property
    def orthogonal(self) -> bool:
        return self.direction == "orthogonal"

    def predict_mlp(self, widths: Sequence[int]) -> theory.MLPPrediction:
        """Closed-form ln-RMS predictions for an MLP with these widths (theory.py)."""
        if self.moments is not None:
            roles = [LayerRole(widths[i - 1], widths[i]) for i in range(1, len(widths))]
            return theory.mlp_rms_prediction(widths, [self.moments(r) for r in roles])
        fwd = self.ln_forward_override(widths) if self.ln_forward_override else None
        return theory.MLPPrediction(ln_forward=fwd, ln_backward=None)

    def block_moments(self, block) -> theory.BlockMoments:
        """The theory's view of one residual block (``nets.Block``) under this scheme."""
        assert self.moments is not None
        lin = lambda r: theory.LinearMoments(r.fan_in, r.fan_out, self.moments(r).row_sq, self.moments(r).bias_var)
        proj = block.projection_role()
        return theory.BlockMoments(
            branch=tuple(lin(r) for r in block.branch_roles()),
            skip=None if proj is None else lin(proj),
            alpha_sq=self.alpha(block.blocks_in_stage) ** 2,
        )

    def predict_resnet(self, plan) -> theory.ResNetPrediction:
        """Closed-form ln-RMS predictions for a WN / unnormalized ResNet (``nets.ResNetPlan``)."""
        if self.moments is not None:
            return theory.resnet_rms_prediction(plan.dim, [self.block_moments(b) for b in plan.blocks])
        if self.calibrate is not None:  # data-dependent: forward only, approximate
            fwd, gains = theory.datadep_resnet_ln_forward(plan.dim, [b.d_out for b in plan.blocks], [b.projection for b in plan.blocks])
            return theory.ResNetPrediction(fwd, None, None, gains, gains)
        n = len(plan.blocks)
        return theory.ResNetPrediction(None, None, None, [1.0] * n, [1.0] * n)


INITS: dict[str, InitScheme] = {}


def register(scheme: InitScheme) -> InitScheme:
    if scheme.name in INITS:
        raise ValueError(f"init {scheme.name!r} registered twice")
    INITS[scheme.name] = scheme
    return scheme


def get(name: str, arch: str | None = None) -> InitScheme:
    """The scheme ``name``; with ``arch`` ("mlp", "resnet", "cnn", "wrn") it must be defined for that net.
    Unknown names raise a SigpropError with the closest valid name and the full list."""
    valid = names(arch)
    if name in valid:
        return INITS[name]
    if arch is not None and name in INITS:
        raise SigpropError(f"init {name!r} is not defined for the {arch.upper()}; choose from {', '.join(valid)}", field="init")
    import difflib

    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if isinstance(name, str) and "," in name:
        hint = "; name several inits by repeating the option: --init he --init proposed"
    raise SigpropError(f"unknown init {name!r}{hint}; choose from {', '.join(valid)}", field="init")


def names(arch: str | None = None) -> list[str]:
    """Registry names, optionally only those defined for ``arch`` ("mlp", "resnet", "cnn" or "wrn")."""
    return [n for n, s in INITS.items() if arch is None or arch in s.applies_to]


def resolve_resnet(name: str, norm: str, arch: str = "resnet") -> str:
    """The scheme that runs for ``--init name --norm norm`` in a ResNet.

    ``wn``: every ResNet scheme (the unnormalized ones, e.g. SkipInit, stay unnormalized);
    ``none``: unnormalized schemes, and ``he`` becomes ``unnormalized-he``;
    ``bn``: the BN net of De & Smith 2020, appendix C has He-initialised W (N(0, 2/w), no WN): ``he`` (or
    ``unnormalized-he``), reported as ``he``.
    """
    scheme = get(name)
    if arch not in scheme.applies_to:
        what = "ResNets" if arch == "resnet" else "the WRN"
        raise SigpropError(f"init {name!r} is not defined for {what}; choose from {', '.join(names(arch))}", field="init")
    if norm == "wn":
        return name
    target = name if not scheme.normalized else scheme.unnormalized
    if norm == "bn":
        if target != "unnormalized-he":
            net = "ResNet (De & Smith 2020, appendix C)" if arch == "resnet" else "WRN"
            raise SigpropError(f"the batch-normalized {net} uses He init (--init he); got {name!r}", field="init")
        return "he"
    if target is None:
        valid = [n for n, s in INITS.items() if arch in s.applies_to and (not s.normalized or s.unnormalized)]
        raise SigpropError(f"init {name!r} needs weight normalization; with --norm none choose from {', '.join(valid)}", field="init")
    return target


# --------------------------------------------------------------------------------------------
# samplers
# --------------------------------------------------------------------------------------------
def gaussian(role: LayerRole, gen, device, dtype):
    """The shared Gaussian draw G ~ N(0, 1), shape [fan_out, fan_in]."""
    import torch

    return torch.randn(role.fan_out, role.fan_in, generator=gen, device=device, dtype=dtype)


def orthogonalize(g):
    """Haar-distributed (semi-)orthogonal matrix from the Gaussian G, shaped as
    torch.nn.init.orthogonal_ (orthonormal rows when fan_out <= fan_in, columns otherwise), built
    from Householder reflectors drawn from G's entries without a QR factorization: see
    sigprop/haar.py (Stewart 1980) and docs/theory.md section 9."""
    from sigprop.haar import orthogonalize as _haar

    return _haar(g)


def _wn(v, g, bias=None) -> LayerParams:
    import torch

    norms = torch.linalg.vector_norm(v, dim=1)
    return LayerParams(v=v, g=g, bias=bias, scale=g / norms)


def _weight_norm_default(v, bias=None) -> LayerParams:
    """torch.nn.utils.weight_norm's initial g = ||v|| (per row): w = v exactly; bias None = 0."""
    import torch

    if bias is None:
        bias = torch.zeros(v.shape[0], device=v.device, dtype=v.dtype)
    return _wn(v, torch.linalg.vector_norm(v, dim=1), bias)


def _const_gain(v, value: float) -> LayerParams:
    import torch

    g = torch.full((v.shape[0],), value, device=v.device, dtype=v.dtype)
    return _wn(v, g)


def proposed_gain_sq(role: LayerRole) -> float:
    """g^2 = gamma * fan_in / fan_out with gamma = 2 before a ReLU, 1/B_k for the last layer of a
    residual block in stage k, 1 otherwise (Arpit et al. 2019, section 3 and section 4, implementation details)."""
    gamma = {"relu": 2.0, "block_last": 1.0 / role.blocks_in_stage, "projection": 1.0, "linear": 1.0}[role.kind]
    return gamma * role.fan_in / (role.fan_out * role.taps)


def _sample_proposed(role, gen, device, dtype):
    return _const_gain(orthogonalize(gaussian(role, gen, device, dtype)), math.sqrt(proposed_gain_sq(role)))


def _sample_proposed_gaussian(role, gen, device, dtype):
    return _const_gain(gaussian(role, gen, device, dtype), math.sqrt(proposed_gain_sq(role)))


def _sample_he(role, gen, device, dtype):
    return _const_gain(gaussian(role, gen, device, dtype) * math.sqrt(2.0 / role.fan_in), 1.0)


def pytorch_linear_bound(fan_in: int) -> float:
    """nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt 5) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    for the weight, and the bias is drawn from the same interval."""
    return 1.0 / math.sqrt(fan_in)


def _sample_pytorch(role, gen, device, dtype):
    import torch

    bound = pytorch_linear_bound(role.fan_in)
    v = (torch.rand(role.fan_out, role.fan_in, generator=gen, device=device, dtype=dtype) * 2 - 1) * bound
    b = (torch.rand(role.fan_out, generator=gen, device=device, dtype=dtype) * 2 - 1) * bound
    return _weight_norm_default(v, b)


def _sample_pytorch_he(role, gen, device, dtype):
    """weight_norm's default g = ||v|| over He directions v ~ N(0, 2/fan_in), b = 0: the PyTorch-default
    baseline of Arpit et al. 2019, section 5.1 ("initializes g_i = ||W_i||") as the authors' released code
    builds it (kaiming_normal_ weights, zero biases, then weight_norm).  w = v exactly: a He net at init,
    parameterized by g, v, b (which the curvature sees)."""
    return _weight_norm_default(gaussian(role, gen, device, dtype) * math.sqrt(2.0 / role.fan_in))


def _sample_pytorch_orthogonal(role, gen, device, dtype):
    """weight_norm's default g = ||v|| over orthogonal_ directions (orthonormal rows when fan_out <= fan_in,
    orthonormal columns otherwise), b = 0: the authors' code's other PyTorch-default variant
    ("orthogonal"); w = v, so row norms are 1 except in expanding layers."""
    return _weight_norm_default(orthogonalize(gaussian(role, gen, device, dtype)))


def pytorch_orthogonal_row_sq(role: LayerRole) -> float:
    """E||w_i||^2 of an orthogonal_ matrix [fan_out, fan_in]: 1 with orthonormal rows, fan_in/fan_out with orthonormal columns."""
    return min(1.0, role.fan_in / role.fan_out)


def _sample_datadep(role, gen, device, dtype):
    import torch

    v = gaussian(role, gen, device, dtype) * 0.05  # Salimans & Kingma 2016, section 3: v ~ N(0, 0.05^2)
    ones = torch.ones(role.fan_out, device=device, dtype=dtype)
    return _wn(v, ones, torch.zeros(role.fan_out, device=device, dtype=dtype))


def _calibrate_datadep(params: LayerParams, t) -> LayerParams:
    """Salimans & Kingma 2016, eq. 5-6: t = v.x/||v|| over the minibatch; g <- 1/sigma[t], b <- -mu[t]/sigma[t]."""
    mu = t.mean(dim=0)
    sigma = t.std(dim=0, unbiased=False)
    if not bool((sigma > 0).all()):
        raise SigpropError(
            "datadep: a unit's pre-activation has zero variance over the probe batch; use more samples",
            field="samples",
        )
    g = 1.0 / sigma
    return _wn(params.v, g, -mu / sigma)


def _sample_unnormalized_he(role, gen, device, dtype):
    """He init for every layer, W ~ N(0, 2/fan_in), as De & Smith 2020 use for all its layers (also the last
    layer of a branch and the projection shortcut: docs/theory.md explains what that implies)."""
    import torch

    w = gaussian(role, gen, device, dtype) * math.sqrt(2.0 / role.fan_in)
    return LayerParams(v=w, g=None, bias=None, scale=torch.ones(role.fan_out, device=device, dtype=dtype))


def _sample_delta_orthogonal(role, gen, device, dtype):
    """Xiao et al. 2018: an orthogonal c_out x c_in matrix at the kernel's centre tap, zeros at the
    other taps; WN with the proposed gain sqrt(2 c_in / c_out).  The orthogonal matrix comes from
    the centre-tap columns of the shared Gaussian G (common random numbers with the other
    schemes), orthogonalized as ``proposed`` does (sigprop/haar.py)."""
    import torch

    k = math.isqrt(role.taps)
    centre = (k // 2) * k + k // 2
    g = gaussian(role, gen, device, dtype)
    v = torch.zeros_like(g)
    v[:, centre::role.taps] = orthogonalize(g[:, centre::role.taps].contiguous())
    return _const_gain(v, math.sqrt(proposed_gain_sq(role)))


def stage_hanin_gain_sq(role: LayerRole) -> float:
    """Stage-wise Hanin (Arpit et al. 2019, section 5.1, adapted as the issue specifies): the last layer of block
    b = 1..B_k of a stage gets g = 0.9^b sqrt(fan_in/fan_out); every other layer as proposed."""
    if role.kind == "block_last":
        return 0.81 ** (role.block_index + 1) * role.fan_in / (role.fan_out * role.taps)
    return proposed_gain_sq(role)


def _sample_stage_hanin(role, gen, device, dtype):
    return _const_gain(orthogonalize(gaussian(role, gen, device, dtype)), math.sqrt(stage_hanin_gain_sq(role)))


# --------------------------------------------------------------------------------------------
# the registry
# --------------------------------------------------------------------------------------------
#: how users read the papers (author-year; the papers' file names are for developers only)
P001 = "Arpit et al. 2019,"
P003 = "Salimans & Kingma 2016,"
P004 = "De & Smith 2020,"

register(
    InitScheme(
        name="proposed",
        cites=("arpit2019initialize",),
        description="WN, orthogonal directions, g = sqrt(2 n_in/n_out), b = 0",
        paper=f"{P001} section 3, implementation details",
        direction="orthogonal",
        sample=_sample_proposed,
        moments=lambda r: theory.LayerMoments(row_sq=proposed_gain_sq(r)),
        haar_gain_sq=proposed_gain_sq,
        applies_to=frozenset({"mlp", "resnet", "cnn", "wrn"}),
    )
)
register(
    InitScheme(
        name="proposed-gaussian",
        cites=("arpit2019initialize",),
        description="WN, Gaussian (He) directions, g = sqrt(2 n_in/n_out), b = 0",
        paper=f"{P001} appendix A.1, case (3)",
        direction="gaussian",
        sample=_sample_proposed_gaussian,
        moments=lambda r: theory.LayerMoments(row_sq=proposed_gain_sq(r)),
        applies_to=frozenset({"mlp", "resnet", "cnn", "wrn"}),
    )
)
register(
    InitScheme(
        name="he",
        cites=("arpit2019initialize", "he2015delving"),
        description="WN, He directions, g = 1, b = 0 (the paper's baseline)",
        paper=f"{P001} appendix A.1, case (1)",
        direction="gaussian",
        sample=_sample_he,
        moments=lambda r: theory.LayerMoments(row_sq=1.0),
        unnormalized="unnormalized-he",
        applies_to=frozenset({"mlp", "resnet", "cnn", "wrn"}),
    )
)
register(
    InitScheme(
        name="pytorch",
        cites=("arpit2019initialize", "paszke2019pytorch"),
        description="weight_norm over nn.Linear/nn.Conv2d defaults: v, b ~ U(+-1/sqrt(fan_in)), g = ||v|| (the paper's code: pytorch-he)",
        paper="PyTorch's nn.Linear/nn.Conv2d defaults (the PyTorch default of Arpit et al. 2019 draws W otherwise: pytorch-he, pytorch-orthogonal)",
        direction="uniform",
        sample=_sample_pytorch,
        moments=lambda r: theory.LayerMoments(row_sq=1.0 / 3.0, bias_var=1.0 / (3.0 * r.fan_in)),
        applies_to=frozenset({"mlp", "resnet", "cnn", "wrn"}),
    )
)
register(
    InitScheme(
        name="pytorch-he",
        cites=("arpit2019initialize", "he2015delving"),
        description="weight_norm default g = ||v|| over He v ~ N(0, 2/n_in), b = 0 (the paper's code's PyTorch default)",
        paper=f"{P001} section 5.1 (PyTorch default g_i = ||W_i||, W drawn He as in the authors' code)",
        direction="gaussian",
        sample=_sample_pytorch_he,
        moments=lambda r: theory.LayerMoments(row_sq=2.0),
        applies_to=frozenset({"mlp", "resnet", "cnn", "wrn"}),
    )
)
register(
    InitScheme(
        name="pytorch-orthogonal",
        cites=("arpit2019initialize", "paszke2019pytorch"),
        description="weight_norm default g = ||v|| over orthogonal v, b = 0 (the paper's code's other PyTorch default)",
        paper=f"{P001} section 5.1 (PyTorch default g_i = ||W_i||, W drawn orthogonal as in the authors' code)",
        direction="orthogonal",
        sample=_sample_pytorch_orthogonal,
        moments=lambda r: theory.LayerMoments(row_sq=pytorch_orthogonal_row_sq(r)),
        applies_to=frozenset({"mlp", "resnet", "cnn", "wrn"}),
    )
)
register(
    InitScheme(
        name="datadep",
        cites=("salimans2016weight",),
        description="WN, v ~ N(0, 0.05^2), g and b standardise each pre-activation on the probe batch",
        paper=f"{P003} section 3, eq. 5-6",
        direction="gaussian",
        sample=_sample_datadep,
        calibrate=_calibrate_datadep,
        ln_forward_override=theory.datadep_ln_forward,
        applies_to=frozenset({"mlp", "resnet", "cnn", "wrn"}),
    )
)
register(
    InitScheme(
        name="delta-orthogonal",
        cites=("xiao2018dynamical",),
        description="WN conv: orthogonal c_out x c_in matrix at the centre tap, zero elsewhere; g = sqrt(2 c_in/c_out)",
        paper="Xiao et al. 2018 (delta-orthogonal); gain of Arpit et al. 2019, section 3",
        direction="orthogonal",
        sample=_sample_delta_orthogonal,
        moments=lambda r: theory.LayerMoments(row_sq=proposed_gain_sq(r)),
        applies_to=frozenset({"cnn", "wrn"}),
        taps="centre",
    )
)
register(
    InitScheme(
        name="unnormalized-he",
        cites=("he2015delving", "de2020batch"),
        description="no WN: every layer W ~ N(0, 2/n_in), b = 0 (He; the --norm none/bn weights)",
        paper="He et al. 2015; De & Smith 2020, appendix C",
        direction="gaussian",
        sample=_sample_unnormalized_he,
        moments=lambda r: theory.LayerMoments(row_sq=2.0),
        applies_to=frozenset({"mlp", "resnet", "wrn"}),
        normalized=False,
    )
)
register(
    InitScheme(
        name="stage-hanin",
        cites=("arpit2019initialize", "hanin2018start"),
        description="as proposed, but the last layer of block b of a stage has g = 0.9^b sqrt(n_in/n_out)",
        paper=f"{P001} section 5.1 (stage-wise Hanin baseline)",
        direction="orthogonal",
        sample=_sample_stage_hanin,
        haar_gain_sq=stage_hanin_gain_sq,
        moments=lambda r: theory.LayerMoments(row_sq=stage_hanin_gain_sq(r)),
        applies_to=frozenset({"resnet", "wrn"}),
        by_block_index=True,
    )
)
register(
    InitScheme(
        name="skipinit",
        cites=("de2020batch",),
        description="no WN: He-init branch times a scalar alpha = 0 (the net is the identity at init)",
        paper="De & Smith 2020 (SkipInit)",
        direction="gaussian",
        sample=_sample_unnormalized_he,
        moments=lambda r: theory.LayerMoments(row_sq=2.0),
        applies_to=frozenset({"resnet", "wrn"}),
        normalized=False,
        alpha=lambda blocks: 0.0,
    )
)
register(
    InitScheme(
        name="skipinit-sqrt",
        cites=("de2020batch",),
        description="no WN: He-init branch times a scalar alpha = 1/sqrt(B_k)",
        paper="De & Smith 2020 (SkipInit, alpha = 1/sqrt(d))",
        direction="gaussian",
        sample=_sample_unnormalized_he,
        moments=lambda r: theory.LayerMoments(row_sq=2.0),
        applies_to=frozenset({"resnet", "wrn"}),
        normalized=False,
        alpha=lambda blocks: 1.0 / math.sqrt(blocks),
    )
)
