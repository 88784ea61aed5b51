"""The optimizers a width check trains with, one registry (issue 68, item 6): each name with
torch's constructor, the column of Yang et al. (2021), Table 3 its learning rates and exponents
read (``theory.OPTIMIZERS``: "sgd" or "adam"), the words a verdict names it by, and the state it
keeps per weight for the memory estimate (``width/cost.py``).  Adding one is one ``register``
call: validation, training, the exponents, the estimate and the words all read it from here --
0.18 named SGD and Adam in five places, and a third name added to the theory's tuple trained with
Adam (docs/theory.md §17)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sigprop.registry import Registry
from sigprop.theory import width as theory


@dataclass(frozen=True)
class Optimizer:
    """One optimizer: ``make(groups)`` builds it on torch.optim's parameter groups; ``family`` is
    the theory's column (its learning rates scale as SGD's or Adam's); ``states``: tensors of a
    weight's size it holds beside the weight and its gradient at its step's peak (Adam: two
    moments and its foreach step's temporary)."""

    words: str
    family: str
    make: Callable[[list], Any]
    states: int


OPTIMIZERS: Registry[Optimizer] = Registry("optimizer", field="optimizer")


def register(name: str, optimizer: Optimizer) -> Optimizer:
    """Add an optimizer under ``name``; its family must be one the theory has a column for."""
    if optimizer.family not in theory.OPTIMIZERS:
        raise ValueError(
            f"optimizer {name!r}: family {optimizer.family!r} has no column in the theory "
            f"(one of {', '.join(theory.OPTIMIZERS)})"
        )
    return OPTIMIZERS.add(name, optimizer)


def torch_optimizer(name: str) -> Callable[[list], Any]:
    """torch.optim's class ``name`` as a ``make``, torch loaded when a point trains."""

    def make(groups: list):
        import torch  # the CLI's options read this module: torch only where a point trains

        return getattr(torch.optim, name)(groups)

    return make


register("sgd", Optimizer("SGD", "sgd", torch_optimizer("SGD"), 0))
register("adam", Optimizer("Adam", "adam", torch_optimizer("Adam"), 3))


def family(name: str) -> str:
    """The theory's column of a registered optimizer; any other name as it is (the theory refuses
    it)."""
    found = OPTIMIZERS.get(name)
    return found.family if found is not None else name


def states(name: str) -> int:
    """The per-weight state of a registered optimizer; a model's own is counted as Adam's."""
    found = OPTIMIZERS.get(name)
    return found.states if found is not None else OPTIMIZERS["adam"].states
