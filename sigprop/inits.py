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
share their directions and ``proposed`` orthogonalises that same G.  Differences between
schemes in one run are then differences of the schemes, not of the draws.
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
    residual branch), ``"projection"`` (linear shortcut).  ``blocks_in_stage`` and
    ``block_index`` (0-based within the stage) are for ResNet schemes.
    """

    fan_in: int
    fan_out: int
    kind: str = "relu"
    blocks_in_stage: int = 1
    block_index: int = 0


@dataclass
class LayerParams:
    """One layer's parameters as the engine uses them: a = scale * (v @ h) + bias.

    For a WN layer scale = g / ||v_i|| (001 eq. 1-2; 003 eq. 2): the normalisation is a per-row
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


INITS: dict[str, InitScheme] = {}


def register(scheme: InitScheme) -> InitScheme:
    if scheme.name in INITS:
        raise ValueError(f"init {scheme.name!r} registered twice")
    INITS[scheme.name] = scheme
    return scheme


def get(name: str) -> InitScheme:
    try:
        return INITS[name]
    except KeyError:
        raise SigpropError(f"unknown init {name!r}; choose from {', '.join(INITS)}", option="--init") from None


def names() -> list[str]:
    return list(INITS)


# --------------------------------------------------------------------------------------------
# samplers
# --------------------------------------------------------------------------------------------
def gaussian(role: LayerRole, gen, device, dtype):
    """The shared Gaussian draw G ~ N(0, 1), shape [fan_out, fan_in]."""
    import torch

    return torch.randn(role.fan_out, role.fan_in, generator=gen, device=device, dtype=dtype)


def orthogonalize(g):
    """Haar-distributed (semi-)orthogonal matrix from a Gaussian one, as torch.nn.init.orthogonal_:
    orthonormal rows when fan_out <= fan_in, orthonormal columns otherwise (QR with sign fix)."""
    import torch

    rows, cols = g.shape
    flat = g.T if rows < cols else g
    q, r = torch.linalg.qr(flat)
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    return q.T if rows < cols else q


def _wn(v, g, bias=None) -> LayerParams:
    import torch

    norms = torch.linalg.vector_norm(v, dim=1)
    return LayerParams(v=v, g=g, bias=bias, scale=g / norms)


def _const_gain(v, value: float) -> LayerParams:
    import torch

    g = torch.full((v.shape[0],), value, device=v.device, dtype=v.dtype)
    return _wn(v, g)


def proposed_gain_sq(role: LayerRole) -> float:
    """g^2 = gamma * fan_in / fan_out with gamma = 2 before a ReLU, 1/B_k for the last layer of a
    residual block in stage k, 1 otherwise (001 section 3 and section 4, implementation details)."""
    gamma = {"relu": 2.0, "block_last": 1.0 / role.blocks_in_stage, "projection": 1.0}[role.kind]
    return gamma * role.fan_in / role.fan_out


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
    g = torch.linalg.vector_norm(v, dim=1)  # weight_norm's initial g = ||v||: w = v exactly
    return _wn(v, g, b)


def _sample_datadep(role, gen, device, dtype):
    import torch

    v = gaussian(role, gen, device, dtype) * 0.05  # 003 section 3: v ~ N(0, 0.05^2)
    ones = torch.ones(role.fan_out, device=device, dtype=dtype)
    return _wn(v, ones, torch.zeros(role.fan_out, device=device, dtype=dtype))


def _calibrate_datadep(params: LayerParams, t) -> LayerParams:
    """003 eq. 5-6: t = v.x/||v|| over the minibatch; g <- 1/sigma[t], b <- -mu[t]/sigma[t]."""
    mu = t.mean(dim=0)
    sigma = t.std(dim=0, unbiased=False)
    if not bool((sigma > 0).all()):
        raise SigpropError(
            "datadep: a unit's pre-activation has zero variance over the probe batch; use more samples",
            option="--samples",
        )
    g = 1.0 / sigma
    return _wn(params.v, g, -mu / sigma)


def _sample_unnormalized_he(role, gen, device, dtype):
    import torch

    w = gaussian(role, gen, device, dtype) * math.sqrt(2.0 / role.fan_in)
    return LayerParams(v=w, g=None, bias=None, scale=torch.ones(role.fan_out, device=device, dtype=dtype))


# --------------------------------------------------------------------------------------------
# the registry
# --------------------------------------------------------------------------------------------
P001 = "001_5ebcd69c068d8a69.txt"
P003 = "003_b3c6644f8b180c42.txt"

register(
    InitScheme(
        name="proposed",
        description="WN, orthogonal directions, g = sqrt(2 n_in/n_out), b = 0",
        paper=f"{P001} section 3, implementation details",
        direction="orthogonal",
        sample=_sample_proposed,
        moments=lambda r: theory.LayerMoments(row_sq=proposed_gain_sq(r)),
    )
)
register(
    InitScheme(
        name="proposed-gaussian",
        description="WN, Gaussian (He) directions, g = sqrt(2 n_in/n_out), b = 0",
        paper=f"{P001} appendix A.1, case (3)",
        direction="gaussian",
        sample=_sample_proposed_gaussian,
        moments=lambda r: theory.LayerMoments(row_sq=proposed_gain_sq(r)),
    )
)
register(
    InitScheme(
        name="he",
        description="WN, He directions, g = 1, b = 0 (the paper's baseline)",
        paper=f"{P001} appendix A.1, case (1)",
        direction="gaussian",
        sample=_sample_he,
        moments=lambda r: theory.LayerMoments(row_sq=1.0),
    )
)
register(
    InitScheme(
        name="pytorch",
        description="weight_norm(nn.Linear) defaults: v, b ~ U(+-1/sqrt(n_in)), g = ||v||",
        paper=f"{P001} section 5 (PyTorch default baseline)",
        direction="uniform",
        sample=_sample_pytorch,
        moments=lambda r: theory.LayerMoments(row_sq=1.0 / 3.0, bias_var=1.0 / (3.0 * r.fan_in)),
    )
)
register(
    InitScheme(
        name="datadep",
        description="WN, v ~ N(0, 0.05^2), g and b standardise each pre-activation on the probe batch",
        paper=f"{P003} section 3, eq. 5-6",
        direction="gaussian",
        sample=_sample_datadep,
        calibrate=_calibrate_datadep,
        ln_forward_override=theory.datadep_ln_forward,
    )
)
register(
    InitScheme(
        name="unnormalized-he",
        description="plain ReLU MLP without WN, W ~ N(0, 2/n_in), b = 0 (reference)",
        paper=f"{P001} ref. [12] (He et al.), for reference",
        direction="gaussian",
        sample=_sample_unnormalized_he,
        moments=lambda r: theory.LayerMoments(row_sq=2.0),
    )
)
