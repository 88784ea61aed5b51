"""The one registry of init schemes (../shared/STYLE.md habits 2-3).  No torch here.

A scheme is what the theory and the user need to know of it: its gains as functions of a layer's
role, the second moments every prediction reads (``moments``; None where no closed form exists),
its direction law, whether it is weight-normalized, its residual-branch multiplier, the papers
behind it, and which net structure it needs (``needs``: ``"blocks"`` -- residual blocks, for the
schemes that set a block's branch by its place in the stage; ``"taps"`` -- a conv kernel's centre
tap).  A net kind says what it ``provides`` (sigprop/kinds/); a scheme is defined for a kind when
its needs are among them.  How a scheme's weights are drawn is torch's business:
``sigprop.kernels.sampling`` holds one sampler per name (a test checks that every scheme has one).

Common random numbers: every scheme draws its Gaussian matrix G from the same per-layer
generator, so within a run ``he``, ``proposed-gaussian``, ``unnormalized-he`` and ``datadep``
share their directions and ``proposed`` builds its Haar directions from that same G
(sigprop/kernels/haar.py).  Differences between schemes in one run are then differences of the
schemes, not of the draws.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Callable, Collection

from sigprop import theory
from sigprop.errors import SigpropError
from sigprop.registry import Registry


@dataclass(frozen=True)
class LayerRole:
    """Where a layer sits: its fan-in/fan-out and what follows it.

    ``kind``: ``"relu"`` (followed by a ReLU; every MLP layer), ``"block_last"`` (last layer of a
    residual branch), ``"projection"`` (linear shortcut), ``"linear"`` (no ReLU after it: a conv
    net's stem).  ``blocks_in_stage`` and ``block_index`` (0-based within the stage) are for
    ResNet schemes.  ``taps``: k^2 for a k x k convolution, whose rows are [c_out, c_in k^2]
    (fan_in = c_in k^2, fan_out = c_out); the paper counts fans as c k^2 on both sides (Arpit et
    al. 2019, footnote 3), so its gains read fan_in / (fan_out taps) = c_in / c_out.
    """

    fan_in: int
    fan_out: int
    kind: str = "relu"
    blocks_in_stage: int = 1
    block_index: int = 0
    taps: int = 1
    #: how many heads read each output unit: a grouped-query attention's key or value projection,
    #: whose kv heads the H query heads read H/kv times each (1 otherwise; docs/theory.md §18)
    reads: int = 1


@dataclass(frozen=True)
class InitScheme:
    name: str
    description: str
    paper: str
    direction: str  # "orthogonal", "gaussian" or "uniform": used by the finite-width spread model
    moments: Callable[[LayerRole], theory.LayerMoments] | None = field(default=None, repr=False)
    #: True for a data-dependent scheme: g and b standardise each pre-activation on the probe
    #: batch (its forward law is the standardised one, docs/theory.md §3; no backward law)
    standardizes: bool = False
    #: what net structure the scheme needs ("blocks", "taps"); a kind provides some of them
    needs: frozenset = frozenset()
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
    #: True when the draw depends on ``LayerRole.block_index``: residual blocks that differ only
    #: in their index then run as different CUDA-graph steps (sigprop/kernels/replay.py)
    by_block_index: bool = False
    #: a model's embedding tables (``sigprop.init_``): rows N(0, embedding_std^2 I); a function
    #: of the table's width where the scheme's std depends on it
    embedding_std: float | Callable[[int], float] = 1.0
    #: for schemes whose layer is "Haar directions with a constant gain": the gain squared, so
    #: that many layers or draws can be orthogonalized in one batched call (kernels/haar.py)
    haar_gain_sq: Callable[[LayerRole], float] | None = field(default=None, repr=False)

    @property
    def orthogonal(self) -> bool:
        return self.direction == "orthogonal"

    def defined_for(self, provides: Collection[str]) -> bool:
        return self.needs <= frozenset(provides)


INITS: Registry[InitScheme] = Registry("init", field="init", skip=(__name__,))


def register(scheme: InitScheme) -> InitScheme:
    """Add an init scheme (a name taken is refused, naming both)."""
    return INITS.add(scheme.name, scheme)


def names(provides: Collection[str] | None = None) -> list[str]:
    """Registry names, optionally only those whose needs are in ``provides``."""
    return [n for n, s in INITS.items() if provides is None or s.defined_for(provides)]


def get(name: str, provides: Collection[str] | None = None, net: str = "this net") -> InitScheme:
    """The scheme ``name``; with ``provides`` it must be defined for a net that provides those
    structures (``net`` names it in the message).  Unknown names raise a SigpropError with the
    closest valid name and the full list."""
    valid = names(provides)
    if name in valid:
        return INITS[name]
    if provides is not None and name in INITS:
        raise SigpropError(
            f"init {name!r} is not defined for {net}; choose from {', '.join(valid)}", field="init"
        )
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if isinstance(name, str) and "," in name:
        hint = "; name several inits by repeating the option: --init he --init proposed"
    raise SigpropError(f"unknown init {name!r}{hint}; choose from {', '.join(valid)}", field="init")


def resolve_norm(name: str, norm: str, provides: Collection[str], net: str, bn_net: str) -> str:
    """The scheme that runs for ``--init name --norm norm`` in a residual net.

    ``wn``: every scheme (the unnormalized ones, e.g. SkipInit, stay unnormalized);
    ``none``: unnormalized schemes, and ``he`` becomes ``unnormalized-he``;
    ``bn``: plain He-initialised W (N(0, 2/w), no WN) followed by batch norm, as in the BN net of
    De & Smith 2020, appendix C: ``he`` (or ``unnormalized-he``), reported as ``he``.
    """
    scheme = get(name, provides, net)
    if norm == "wn":
        return name
    target = name if not scheme.normalized else scheme.unnormalized
    if norm == "bn":
        if target != "unnormalized-he":
            raise SigpropError(
                f"the batch-normalized {bn_net} uses He init (--init he); got {name!r}", field="init"
            )
        return "he"
    if target is None:
        valid = [n for n in names(provides) if not INITS[n].normalized or INITS[n].unnormalized]
        raise SigpropError(
            f"init {name!r} needs weight normalization; with --norm none choose from {', '.join(valid)}",
            field="init",
        )
    return target


# --------------------------------------------------------------------------------------------
# gains
# --------------------------------------------------------------------------------------------
def proposed_gain_sq(role: LayerRole) -> float:
    """g^2 = gamma * fan_in / fan_out with gamma = 2 before a ReLU, 1/B_k for the last layer of a
    residual block in stage k, 1 otherwise (Arpit et al. 2019, section 3 and section 4,
    implementation details).  A grouped-query attention's key and value projections count the
    outputs as the heads read them, fan_out x reads (each kv head read by H/kv query heads): the
    norm kept is the expanded keys' and values', so the logits are of unit variance at any head
    grouping (docs/theory.md §18)."""
    gamma = {"relu": 2.0, "block_last": 1.0 / role.blocks_in_stage, "projection": 1.0, "linear": 1.0}[
        role.kind
    ]
    return gamma * role.fan_in / (role.fan_out * role.taps * role.reads)


def pytorch_linear_bound(fan_in: int) -> float:
    """nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt 5) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    for the weight, and the bias is drawn from the same interval."""
    return 1.0 / math.sqrt(fan_in)


def pytorch_orthogonal_row_sq(role: LayerRole) -> float:
    """E||w_i||^2 of an orthogonal_ matrix [fan_out, fan_in]: 1 with orthonormal rows, fan_in/fan_out with
    orthonormal columns."""
    return min(1.0, role.fan_in / role.fan_out)


def stage_hanin_gain_sq(role: LayerRole) -> float:
    """Stage-wise Hanin (Arpit et al. 2019, section 5.1, adapted as the issue specifies): the last layer of
    block
    b = 1..B_k of a stage gets g = 0.9^b sqrt(fan_in/fan_out); every other layer as proposed."""
    if role.kind == "block_last":
        return 0.81 ** (role.block_index + 1) * role.fan_in / (role.fan_out * role.taps)
    return proposed_gain_sq(role)


# --------------------------------------------------------------------------------------------
# the registry
# --------------------------------------------------------------------------------------------
#: how users read the papers (author-year; the papers' file names are for developers only)
P001 = "Arpit et al. 2019,"
P003 = "Salimans & Kingma 2016,"
#: the structures a scheme may need (a net kind provides them); MODEL: the user's own module
BLOCKS, TAPS, MODEL = "blocks", "taps", "model"

register(
    InitScheme(
        name="proposed",
        cites=("arpit2019initialize",),
        description="WN, orthogonal directions, g = sqrt(2 n_in/n_out), b = 0",
        paper=f"{P001} section 3, implementation details",
        direction="orthogonal",
        moments=lambda r: theory.LayerMoments(row_sq=proposed_gain_sq(r)),
        haar_gain_sq=proposed_gain_sq,
    )
)
register(
    InitScheme(
        name="proposed-gaussian",
        cites=("arpit2019initialize",),
        description="WN, Gaussian (He) directions, g = sqrt(2 n_in/n_out), b = 0",
        paper=f"{P001} appendix A.1, case (3)",
        direction="gaussian",
        moments=lambda r: theory.LayerMoments(row_sq=proposed_gain_sq(r)),
    )
)
register(
    InitScheme(
        name="he",
        cites=("arpit2019initialize", "he2015delving"),
        description="WN, He directions, g = 1, b = 0 (the paper's baseline)",
        paper=f"{P001} appendix A.1, case (1)",
        direction="gaussian",
        moments=lambda r: theory.LayerMoments(row_sq=1.0),
        unnormalized="unnormalized-he",
    )
)
register(
    InitScheme(
        name="pytorch",
        cites=("arpit2019initialize", "paszke2019pytorch"),
        description="weight_norm over nn.Linear/nn.Conv2d defaults: v, b ~ U(+-1/sqrt(fan_in)), g = ||v|| "
        "(the paper's code: pytorch-he)",
        paper="PyTorch's nn.Linear/nn.Conv2d defaults (the PyTorch default of Arpit et al. 2019 draws W "
        "otherwise: pytorch-he, pytorch-orthogonal)",
        direction="uniform",
        moments=lambda r: theory.LayerMoments(row_sq=1.0 / 3.0, bias_var=1.0 / (3.0 * r.fan_in)),
    )
)
register(
    InitScheme(
        name="pytorch-he",
        cites=("arpit2019initialize", "he2015delving"),
        description="weight_norm default g = ||v|| over He v ~ N(0, 2/n_in), b = 0 (the paper's code's "
        "PyTorch default)",
        paper=f"{P001} section 5.1 (PyTorch default g_i = ||W_i||, W drawn He as in the authors' code)",
        direction="gaussian",
        moments=lambda r: theory.LayerMoments(row_sq=2.0),
    )
)
register(
    InitScheme(
        name="pytorch-orthogonal",
        cites=("arpit2019initialize", "paszke2019pytorch"),
        description="weight_norm default g = ||v|| over orthogonal v, b = 0 (the paper's code's other "
        "PyTorch default)",
        paper=f"{P001} section 5.1 (PyTorch default g_i = ||W_i||, W drawn orthogonal as in the authors' "
        "code)",
        direction="orthogonal",
        moments=lambda r: theory.LayerMoments(row_sq=pytorch_orthogonal_row_sq(r)),
    )
)
register(
    InitScheme(
        name="datadep",
        cites=("salimans2016weight",),
        description="WN, v ~ N(0, 0.05^2), g and b standardise each pre-activation on the probe batch",
        paper=f"{P003} section 3, eq. 5-6",
        direction="gaussian",
        standardizes=True,
    )
)
register(
    InitScheme(
        name="delta-orthogonal",
        cites=("xiao2018dynamical",),
        description="WN conv: orthogonal c_out x c_in matrix at the centre tap, zero elsewhere; g = sqrt(2 "
        "c_in/c_out)",
        paper="Xiao et al. 2018 (delta-orthogonal); gain of Arpit et al. 2019, section 3",
        direction="orthogonal",
        moments=lambda r: theory.LayerMoments(row_sq=proposed_gain_sq(r)),
        needs=frozenset({TAPS}),
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
        moments=lambda r: theory.LayerMoments(row_sq=2.0),
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
        haar_gain_sq=stage_hanin_gain_sq,
        moments=lambda r: theory.LayerMoments(row_sq=stage_hanin_gain_sq(r)),
        needs=frozenset({BLOCKS}),
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
        moments=lambda r: theory.LayerMoments(row_sq=2.0),
        needs=frozenset({BLOCKS}),
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
        moments=lambda r: theory.LayerMoments(row_sq=2.0),
        needs=frozenset({BLOCKS}),
        normalized=False,
        alpha=lambda blocks: 1.0 / math.sqrt(blocks),
    )
)
#: GPT-2's weights' standard deviation (Radford et al. 2019; Hugging Face's initializer_range)
GPT2_STD = 0.02


def gpt2_std(role: LayerRole) -> float:
    """GPT-2's init: every weight N(0, 0.02^2), a residual branch's last layer scaled by 1/sqrt(N)
    for its N residual layers (Radford et al. 2019, section 2.3) -- B of the branch's stage, as the
    model's graph gives it (``sigprop.init_``: the attention and MLP branches, B = 2L)."""
    return GPT2_STD / math.sqrt(role.blocks_in_stage) if role.kind == "block_last" else GPT2_STD


register(
    InitScheme(
        name="gpt2",
        cites=("radford2019language",),
        description="GPT-2's: W ~ N(0, 0.02^2), each residual branch's last layer N(0, 0.02^2/B), b = 0, "
        "embeddings N(0, 0.02^2)",
        paper="Radford et al. 2019, section 2.3 (and Hugging Face's GPT-2: initializer_range 0.02)",
        direction="gaussian",
        moments=lambda r: theory.LayerMoments(row_sq=r.fan_in * gpt2_std(r) ** 2),
        needs=frozenset({MODEL}),
        normalized=False,
        embedding_std=GPT2_STD,
    )
)


def neox_std(role: LayerRole) -> float:
    """GPT-NeoX's init (Black et al. 2022, section 2.3.1): "small init" (Nguyen & Salazar 2019),
    std sqrt(2/(5 d)), for every weight but a residual branch's last, which takes Wang's 2/(L sqrt
    d) -- d the model's width (a branch's last layer writes it: its fan-out; every other layer of
    a decoder reads it: its fan-in), L its transformer layers, B/2 of the B residual branches the
    model's graph gives (``sigprop.init_``: an attention and an MLP branch per layer)."""
    if role.kind == "block_last":
        layers = max(role.blocks_in_stage / 2.0, 1.0)
        return 2.0 / (layers * math.sqrt(role.fan_out))
    return neox_small_std(role.fan_in)


def neox_small_std(width: int) -> float:
    """Nguyen & Salazar 2019's small init over a width d, sqrt(2/(5 d)): GPT-NeoX's every weight
    but a branch's last, and its embedding table."""
    return math.sqrt(2.0 / (5.0 * width))


register(
    InitScheme(
        name="neox",
        cites=("black2022gptneox", "nguyen2019transformers"),
        description="GPT-NeoX's: W ~ N(0, 2/(5d)) (small init), each residual branch's last layer "
        "N(0, 4/(L^2 d)) (Wang's), L = B/2 layers, b = 0, embeddings N(0, 2/(5d))",
        paper="Black et al. 2022, section 2.3.1 (small init of Nguyen & Salazar 2019; Wang's init of GPT-J)",
        direction="gaussian",
        moments=lambda r: theory.LayerMoments(row_sq=r.fan_in * neox_std(r) ** 2),
        needs=frozenset({MODEL}),
        normalized=False,
        embedding_std=neox_small_std,
    )
)
register(
    InitScheme(
        name="as-is",
        cites=(),
        description="the model's own init (its factory's weights, unchanged)",
        paper="the model's own code; its theory reads the drawn weights (docs/theory.md §13)",
        direction="gaussian",
        needs=frozenset({MODEL}),
        normalized=False,
    )
)
