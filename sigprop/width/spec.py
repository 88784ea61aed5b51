"""What a coordinate check runs (``WidthSpec``) and what net it runs on (``WidthNet``), declared
once for the command line, the API and the JSON (sigprop/options.py); no torch."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from sigprop.errors import SigpropError
from sigprop.options import declared
from sigprop.specs import parse_shard
from sigprop.theory import width as theory
from sigprop.width import optimizers

PARAM_CHOICES = (*theory.PARAMETRIZATIONS, theory.AS_IS)
#: the default gate: a slope above it (a factor 2 over a 16x width range is 0.25) is growth, one
#: below minus it shrinking (a readout's update: below -1/2 minus it; sigprop/width/check.py)
MAX_WIDTH_SLOPE = 0.25


def widths_of(text, field: str = "widths") -> tuple[int, ...]:
    """``64,128,256`` (or a list of ints) as a tuple of widths; one line naming ``field`` where it
    is not a comma list of positive integers."""
    items = [str(t).strip() for t in text] if isinstance(text, (list, tuple)) else str(text).split(",")
    try:
        out = tuple(int(t) for t in items)
    except ValueError:
        raise SigpropError(f"expected widths like 64,128,256, got {text!r}", field=field) from None
    if any(w < 1 for w in out):
        raise SigpropError(f"widths must be positive, got {text!r}", field=field)
    return out


@dataclass(frozen=True)
class WidthNet:
    """The net a check trains: ``target`` (``MODULE:CALLABLE`` or ``FILE.py:CALLABLE``, or the
    callable itself from the API) called with ``kwargs`` and the width as ``width_arg``; the
    ``widths``; its input (``input_shape`` per example, or token ids below ``vocab``); and whether
    its weight layers form a chain (sigprop's MLP: SP's exponents are derived along it)."""

    target: object
    widths: tuple[int, ...]
    input_shape: tuple[int, ...]
    kwargs: dict = field(default_factory=dict)
    width_arg: str = "width"
    vocab: int | None = None
    chain: bool = False
    #: the option that gives the widths (a refusal for their size names it): --widths, or --arg
    field: str = "widths"

    @property
    def own(self) -> bool:
        """One of sigprop's own nets (sigprop/width/nets.py): its failure is not the user's TARGET."""
        return isinstance(self.target, str) and self.target.startswith("sigprop.")


#: where and how a check runs, not what it measures: left out of a point's resume key
RUN_OPTIONS = ("device", "out", "shard", "points", "executor", "workers", "scheduler")


@dataclass(frozen=True)
class WidthSpec:
    """How a coordinate check runs (``sigprop width``; Yang et al. 2021, section 6): the
    parametrizations, the optimizer and its base learning rate, the steps, the seeds (each a
    fresh batch, targets and weights), the batch size, the loss, the base width (None: the
    smallest), the gate's slope, the device."""

    params: tuple[str, ...] = declared(
        str,
        ("sp", "mup"),
        "Parametrization (repeatable): sp, mup, ntk (SGD only) applied by sigprop; as-is: the model's own.",
        repeat=True,
        choices=PARAM_CHOICES,
        flag="--param",
        shown="sp and mup",
    )
    optimizer: str = declared(
        str,
        "adam",
        "The optimizer of the steps: adam or sgd (torch.optim's; each role's learning rate under sp, mup "
        "and ntk), or the model's own with --param as-is: MODULE:CALLABLE or FILE.py:CALLABLE, called as "
        "CALLABLE(model.parameters(), lr=LR) (mup:MuAdam, a factory of yours).",
    )
    lr: float = declared(
        float, 0.01, "The base learning rate (at the base width; each layer's scales by its role)."
    )
    steps: int = declared(int, 3, "Optimizer steps K: the sites are recorded at steps 0 (init) to K.", min=1)
    seeds: int = declared(
        int, 2, "Independent draws of the weights, batch and targets (the slopes' error).", min=1
    )
    seed: int = declared(int, 0, "Base seed.", min=0)
    batch_size: int = declared(int, 64, "Examples in the fixed batch each step trains on.", min=1)
    loss: str = declared(
        str,
        "xent",
        "xent (random labels over the output's last dimension) or mse (random targets).",
        choices=("xent", "mse"),
    )
    zero_readout: bool = declared(
        bool,
        False,
        "Draw the readout (the output role) as zeros under sp, mup and ntk (Yang et al. 2021, Table 3's "
        "'or 0'; mup's examples).",
    )
    data: str | None = declared(
        str,
        None,
        "Real inputs and labels instead of random ones: a .pt (a dict with x and y) or .npz; seed k "
        "trains on rows k B..(k+1) B - 1 (B = --batch-size) with --loss xent.",
    )
    base_width: int | None = declared(
        int, None, "The width at which every parametrization is the same net.", min=1, shown="the smallest"
    )
    max_width_slope: float = declared(
        float,
        MAX_WIDTH_SLOPE,
        "The gate: a slope of log scale on log width above it is growth, below minus it shrinking (a "
        "readout's update: below -1/2 minus it), beyond its standard error (--check fails).",
    )
    device: str = declared(str, "auto", "auto, cpu, cuda or cuda:K (auto = CUDA when available).")
    out: str | None = declared(
        str,
        None,
        "Append each finished point (parametrization x width x seed) to this JSON-lines file; a rerun "
        "with the same options reads the points there and runs only the rest.",
        shown="none: the points are kept in memory",
    )
    shard: str | None = declared(
        str,
        None,
        "Run only the i-th of N parts of the points (i/N: a SLURM array task's $SLURM_ARRAY_TASK_ID) into "
        "--out, and fit nothing; then --points PART ... with the same options fits them all.",
    )
    points: tuple[str, ...] = declared(
        str,
        (),
        "A points file written by another run of this check (a shard's --out; repeatable): its points are "
        "read, not run again.",
        repeat=True,
        shown="none",
    )
    executor: str = declared(
        str, "local", "Where the points run: local (here) or dask (a cluster's workers)."
    )
    workers: int | None = declared(int, None, "--executor dask: a local cluster of this many workers.", min=1)
    scheduler: str | None = declared(
        str, None, "--executor dask: the running scheduler's address (tcp://...)."
    )

    def __post_init__(self) -> None:
        # a CLI choice arrives as an Enum member: its value is the name (never "width_params.as-is")
        object.__setattr__(self, "params", tuple(getattr(p, "value", p) for p in self.params))
        optimizer = str(getattr(self.optimizer, "value", self.optimizer))
        where, _, name = optimizer.rpartition(":")
        if where.endswith(".py"):  # a file's path made absolute: a worker may run elsewhere
            optimizer = os.path.abspath(where) + ":" + name
        object.__setattr__(self, "optimizer", optimizer)

    @property
    def own_optimizer(self) -> bool:
        """The optimizer is the model's own (a target, not a registered one: adam, sgd)."""
        return self.optimizer not in optimizers.OPTIMIZERS
        object.__setattr__(self, "points", tuple(self.points or ()))


def validate(spec: WidthSpec, net: WidthNet) -> None:
    """Refuse a check in one line naming its option."""
    w = net.widths
    if len(w) < 2:
        raise SigpropError("give at least two widths", field="widths")
    if any(not isinstance(x, int) or x < 1 for x in w) or len(set(w)) != len(w):
        raise SigpropError(f"widths must be distinct positive integers, got {list(w)}", field="widths")
    if not spec.params:
        raise SigpropError("give at least one parametrization", field="params")
    for p in spec.params:
        if p not in PARAM_CHOICES:
            raise SigpropError(
                f"unknown parametrization {p!r}; choose from {', '.join(PARAM_CHOICES)}", field="params"
            )
    if len(set(spec.params)) != len(spec.params):
        raise SigpropError("a parametrization is named twice", field="params")
    if spec.own_optimizer:
        if ":" not in spec.optimizer:
            raise SigpropError(
                f"unknown optimizer {spec.optimizer!r}; choose from {', '.join(optimizers.OPTIMIZERS)}, or "
                "the model's own as MODULE:CALLABLE or FILE.py:CALLABLE",
                field="optimizer",
            )
        if set(spec.params) != {theory.AS_IS}:
            raise SigpropError(
                f"the model's own optimizer ({spec.optimizer}) trains the model's own parametrization: give "
                "--param as-is (sp, mup and ntk set each role's learning rate for adam or sgd)",
                field="optimizer",
            )
    if "ntk" in spec.params and optimizers.family(spec.optimizer) != "sgd":
        raise SigpropError(
            "ntk is defined for SGD (Yang & Hu 2021, Table 1); with adam use sp or mup", field="params"
        )
    if not (spec.lr > 0 and math.isfinite(spec.lr)):
        raise SigpropError(f"the learning rate must be positive, got {spec.lr}", field="lr")
    if spec.steps < 1:
        raise SigpropError("give at least one step", field="steps")
    if spec.seeds < 1:
        raise SigpropError("give at least one seed", field="seeds")
    if spec.seeds == 1 and len(w) < 3:
        raise SigpropError("one seed needs three widths for a slope's standard error", field="seeds")
    if spec.batch_size < 1:
        raise SigpropError("the batch must hold at least one example", field="batch_size")
    if spec.base_width is not None and spec.base_width < 1:
        raise SigpropError("the base width must be positive", field="base_width")
    if spec.loss not in ("xent", "mse"):
        raise SigpropError(f"unknown loss {spec.loss!r}; choose from xent, mse", field="loss")
    if spec.shard is not None:
        parse_shard(spec.shard)
        if not spec.out:
            raise SigpropError("a shard writes its points to --out PART.jsonl: give it", field="shard")
    if spec.data is not None and net.vocab is not None:
        raise SigpropError("--data holds the inputs: no --vocab beside it", field="data")
    if spec.data is not None and spec.loss != "xent":
        raise SigpropError("--data's labels are classes: it takes --loss xent", field="data")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", spec.device):
        raise SigpropError(
            f"unknown device {spec.device!r}; choose from auto, cpu, cuda, cuda:K", field="device"
        )
    if not (spec.max_width_slope > 0 and math.isfinite(spec.max_width_slope)):
        raise SigpropError("the gate's slope must be positive", field="max_width_slope")
