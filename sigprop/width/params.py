"""A parametrization applied to a torch model (Yang et al. 2021, Table 3; sigprop/theory/width.py):
each parameter's role read off how its shape changes between two widths of the same factory
(``mup``'s base shapes: the dimensions that grow are its "infinite" ones), its weights redrawn
N(0, 1/fan_in) times the role's init scaling, and one optimizer parameter group per learning
rate."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import torch
import torch.nn as nn

from sigprop.errors import SigpropError
from sigprop.theory import width as theory
from sigprop.width import optimizers


@dataclass(frozen=True)
class Role:
    """One parameter's role: its name, role (theory.ROLES), fan-in, and whether it is a module's
    ``bias`` (zeroed under a parametrization sigprop applies)."""

    name: str
    role: str
    fan_in: int
    bias: bool
    #: a Linear's, conv's, attention's or embedding's weight, which sigprop redraws; a tensor of
    #: the model's own (a position table) keeps the factory's draw, its learning rate scaled
    drawn: bool = True
    #: the dimension whose size is the fan-in where it is not a Linear's (a readout of the model's
    #: own, ``h @ W`` with W (width, classes): 0)
    fan_axis: int | None = None


def _owner(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name.rpartition(".")[0]) if "." in name else model


#: the parameters laid out (out, in, ...): a Linear's or a conv's weight, attention's projections
_IN_OUT = ("weight", "in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")


def _laid_out_in_out(owner: nn.Module, leaf: str) -> bool:
    dense = isinstance(owner, (nn.Linear, nn.modules.conv._ConvNd, nn.MultiheadAttention))
    return dense and leaf in _IN_OUT


def roles(model: nn.Module, other: nn.Module, readouts: frozenset[str] = frozenset()) -> list[Role]:
    """The role of each of ``model``'s parameters, compared with the same factory's ``other`` (a
    different width): a matrix whose output and input dimensions both change is ``hidden``, only
    its output ``input``, only its input ``output``; a vector that changes is ``vector``;
    anything else ``fixed``.  An ``nn.Embedding``'s table is (vocabulary, width): its input is the
    vocabulary.  A matrix that is no Linear's, conv's or attention's (a position table, a
    model's own nn.Parameter) follows ``mup``'s rule: two growing dimensions ``hidden``, one
    ``vector`` -- unless it is in ``readouts`` (``feeding_output``: a matrix of the model's own with
    one growing dimension whose matmul gives the output, ``h @ W``): then it is the ``output``
    role, its fan-in the growing dimension.  Refused where no parameter changes (the width is not
    the model's)."""
    theirs = dict(other.named_parameters())
    out = []
    for name, p in model.named_parameters():
        q = theirs.get(name)
        if q is None or q.dim() != p.dim():
            raise SigpropError(
                f"parameter {name!r} is not in the model at every width: the width argument must change "
                "sizes only, not the layers",
                field="arg",
            )
        grows = [a != b for a, b in zip(p.shape, q.shape)]
        owner = _owner(model, name)
        leaf = name.rpartition(".")[2]
        if p.dim() == 1 or p.dim() == 0:
            role = "vector" if any(grows) else "fixed"
            out.append(Role(name, role, 1, leaf == "bias"))
            continue
        if isinstance(owner, nn.Embedding):
            grow_out, grow_in = grows[1], grows[0]
        elif _laid_out_in_out(owner, leaf):
            grow_out, grow_in = grows[0], any(grows[1:])
        elif name in readouts and p.dim() == 2 and sum(grows) == 1:  # the model's own readout, h @ W
            axis = grows.index(True)
            out.append(Role(name, "output", p.shape[axis], False, fan_axis=axis))
            continue
        else:  # a tensor of the model's own (a position table): mup's rule, one growing dim = a vector
            role = "hidden" if sum(grows) >= 2 else "vector" if any(grows) else "fixed"
            out.append(Role(name, role, 1, False, drawn=False))
            continue
        role = {
            (True, True): "hidden",
            (True, False): "input",
            (False, True): "output",
            (False, False): "fixed",
        }[(grow_out, grow_in)]
        out.append(Role(name, role, _fan_in(model, name, p), False))
    if all(r.role == "fixed" for r in out):
        raise SigpropError(
            "the width changes no layer of the model (no parameter's size differs)", field="arg"
        )
    return out


def _fan_in(model: nn.Module, name: str, p: torch.Tensor, axis: int | None = None) -> int:
    if axis is not None:
        return int(p.shape[axis])
    owner = _owner(model, name)
    if p.dim() < 2 or isinstance(owner, nn.Embedding) or not _laid_out_in_out(owner, name.rpartition(".")[2]):
        return 1
    return math.prod(p.shape[1:])


def at(model: nn.Module, roles_: list[Role], width: int) -> list[Role]:
    """The roles read at two widths, at another width of the same factory: the same parameters
    and roles, each fan-in this model's own (so a check reads roles from two widths only)."""
    params = dict(model.named_parameters())
    if set(params) != {r.name for r in roles_}:
        raise SigpropError(
            f"the model's parameters at width {width} are not those at the others: the width argument must "
            "change sizes only, not the layers",
            field="arg",
        )
    return [replace(r, fan_in=_fan_in(model, r.name, params[r.name], r.fan_axis)) for r in roles_]


#: autograd's nodes of a product with a weight (the readout's matmul) and of a change of layout
_PRODUCTS = ("MmBackward", "AddmmBackward", "BmmBackward", "BaddbmmBackward", "MvBackward", "AddmvBackward",
             "ConvolutionBackward", "LinearBackward", "DotBackward")  # fmt: skip
_LAYOUTS = ("View", "Reshape", "UnsafeView", "TBackward", "Transpose", "Permute", "Expand", "Squeeze",
            "Unsqueeze", "Clone", "ToCopy", "Alias", "Contiguous")  # fmt: skip


def feeding_output(model: nn.Module, y: torch.Tensor) -> frozenset[str]:
    """The names of the parameters in the last product before the output ``y`` (a forward with
    autograd on): walked back from ``y`` through every op that is no product (a multiplier, a
    norm, a bias), the first product on each path gives the parameters that reach it through
    layout changes only (a transpose, a view) -- the readout's weight, whatever form it takes."""
    names = {id(p): n for n, p in model.named_parameters()}
    found: set[str] = set()
    seen: set = set()
    stack = [y.grad_fn]
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        kind = type(f).__name__
        if any(kind.startswith(m) for m in _PRODUCTS):
            found |= _weights(f, names)
            continue
        stack.extend(g for g, _ in f.next_functions)
    return frozenset(found)


def _weights(f, names: dict[int, str]) -> set[str]:
    """The parameters an autograd node reads directly or through layout changes."""
    out: set[str] = set()
    stack = [g for g, _ in f.next_functions]
    while stack:
        g = stack.pop()
        if g is None:
            continue
        variable = getattr(g, "variable", None)
        if variable is not None:
            if id(variable) in names:
                out.add(names[id(variable)])
        elif any(m in type(g).__name__ for m in _LAYOUTS):
            stack.extend(h for h, _ in g.next_functions)
    return out


def ratio_power(ratio: float, exponent: Fraction) -> float:
    """(n/n0)^-exponent."""
    return float(ratio) ** (-float(exponent))


@torch.no_grad()
def apply(
    model: nn.Module,
    roles_: list[Role],
    param: str,
    optimizer: str,
    ratio: float,
    gen: torch.Generator,
    zero_readout: bool = False,
) -> None:
    """Redraw ``model``'s weights for ``param`` at width ratio n/n0 = ``ratio``: every matrix of a
    growing role N(0, 1/fan_in) times (n/n0)^-init (an embedding's table N(0, 1)), every growing
    bias zero; norms' gains, fixed weights and tensors of the model's own kept as the factory drew
    them; ``zero_readout``: the output role's matrices, and their modules' biases, zero.
    ``as-is`` changes nothing."""
    if param == theory.AS_IS:
        return
    params = dict(model.named_parameters())
    readouts = {r.name.rpartition(".")[0] for r in roles_ if r.role == "output"} if zero_readout else set()
    for r in roles_:
        p = params[r.name]
        if r.bias and r.name.rpartition(".")[0] in readouts:  # the readout's bias: zero with it
            p.zero_()
            continue
        if r.role in ("input", "hidden", "output") and r.drawn:
            sc = theory.scaling(param, optimizers.family(optimizer), r.role)
            std = ratio_power(ratio, sc.init) / math.sqrt(r.fan_in)
            if zero_readout and r.role == "output":
                std = 0.0
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype, device="cpu").to(p.device) * std)
        elif r.role == "vector" and r.bias:
            p.zero_()


def groups(
    model: nn.Module, roles_: list[Role], param: str, optimizer: str, lr: float, ratio: float
) -> list[dict]:
    """The optimizer's parameter groups: one per learning rate, each role's ``lr`` times
    (n/n0)^-lr (Yang et al. 2021, Table 3); ``as-is`` and SP one group at ``lr``."""
    params = dict(model.named_parameters())
    by_lr: dict[float, list] = {}
    for r in roles_:
        rate = lr
        if param != theory.AS_IS:
            rate = lr * ratio_power(ratio, theory.scaling(param, optimizers.family(optimizer), r.role).lr)
        by_lr.setdefault(rate, []).append(params[r.name])
    return [{"params": ps, "lr": rate} for rate, ps in by_lr.items()]
