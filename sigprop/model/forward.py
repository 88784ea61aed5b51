"""A user's model's forward as a probe runs it: under ``Deterministic`` (no stochastic op: dropout
the identity, attention's dropout_p 0, a randomised leaky ReLU at its mean slope, any other
random draw refused in one line), on one input tensor or several (``call``), its errors said in
one line (``first_line``).  Below sigprop/model/build.py (whose ``prepare`` installs it on the
model) and the measurements whose hooks run inside it: a hook reading the model's output does
not call back into the module whose forward is running."""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from sigprop.errors import SigpropError


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


#: dropout as functions: the identity during a probe (the in-place ones leave their input as it is)
_DROPOUT_FUNCTIONS = frozenset(
    getattr(torch, n)
    for n in (
        "dropout",
        "dropout_",
        "feature_dropout",
        "feature_dropout_",
        "alpha_dropout",
        "alpha_dropout_",
        "feature_alpha_dropout",
        "feature_alpha_dropout_",
    )
) | {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout}
#: calls that take a dropout probability (attention): run with dropout_p = 0, by argument position
_DROPOUT_P = {F.scaled_dot_product_attention: 4, F.multi_head_attention_forward: 10}
#: randomised leaky ReLU: its training mode draws the slopes; eval mode uses their mean
_RRELU = frozenset({F.rrelu, F.rrelu_, torch.rrelu, torch.rrelu_})
#: calls that draw random numbers: refused inside a model's forward (what they do cannot be undone)
_RANDOM_TORCH = ("bernoulli", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like")
_RANDOM_TORCH += ("randperm", "multinomial", "normal", "poisson", "binomial")
_RANDOM_TENSOR = ("bernoulli", "bernoulli_", "normal_", "uniform_", "exponential_", "geometric_")
_RANDOM_TENSOR += ("cauchy_", "log_normal_", "random_", "multinomial")
_RANDOM = {
    **{getattr(torch, n): f"torch.{n}" for n in _RANDOM_TORCH},
    **{getattr(torch.Tensor, n): f"Tensor.{n}" for n in _RANDOM_TENSOR},
    F.gumbel_softmax: "F.gumbel_softmax",
}


class Deterministic(TorchFunctionMode):
    """No stochastic op runs while this mode is on (Arpit et al. 2019 measure the signal at init,
    not the noise of a mask): dropout in every functional form is the identity, attention runs
    with ``dropout_p = 0`` (``scaled_dot_product_attention``, ``nn.MultiheadAttention``'s
    functional forward: both read their dropout from an argument, not from a module's training
    flag), a randomised leaky ReLU uses its mean slope, and any other call that draws random
    numbers is refused in one line naming the module that made it.  A TorchFunctionMode sees the
    calls at the Python level, above autograd, so the backward is that of the deterministic
    forward; it costs one Python call per torch call of the forward (a few hundred for GPT-2)."""

    def __init__(self, names: dict[int, str] | None = None) -> None:
        super().__init__()
        self.names = names or {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUT_FUNCTIONS:
            return args[0] if args else kwargs["input"]
        if func in _DROPOUT_P:
            at = _DROPOUT_P[func]
            if len(args) > at:
                args = (*args[:at], 0.0, *args[at + 1 :])
            else:
                kwargs = {**kwargs, "dropout_p": 0.0}
        elif func in _RRELU:  # (input, lower, upper, training, ...)
            if len(args) > 3:
                args = (*args[:3], False, *args[4:])
            else:
                kwargs = {**kwargs, "training": False}
        elif func in _RANDOM:
            raise SigpropError(
                f"the model draws random numbers in its forward ({_RANDOM[func]}{self._caller()}): a probe "
                "measures the signal at init, not a random draw; turn it off in the factory (a dropout, "
                "drop-path or noise rate of 0)",
                field="target",
            )
        return func(*args, **kwargs)

    def _caller(self) -> str:
        """`` in 'path'``: the innermost module whose forward made the call (read off the stack)."""
        frame = inspect.currentframe()
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module) and id(owner) in self.names:
                return f" in {self.names[id(owner)] or 'the model'!r} ({type(owner).__name__})"
            frame = frame.f_back
        return ""


class _DeterministicForward:
    """A prepared model's forward: its own, under ``Deterministic`` (whoever calls it: the probe's
    hooks, ``torch.func`` for the spectrum, ``functional_call`` for the curvature).  Set on the
    instance, so ``torch.fx`` (which traces the class's forward) does not see it."""

    def __init__(self, model: nn.Module, forward) -> None:
        self.names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
        self.forward = forward
        functools.update_wrapper(self, forward)

    def __call__(self, *args, **kwargs):
        with Deterministic(self.names):
            return self.forward(*args, **kwargs)


def call(model, x):
    """The model's forward on one input tensor or, for a tuple, on its tensors as arguments, with no
    stochastic op (``Deterministic``; a data-dependent init calibrates before ``prepare``)."""
    xs = x if isinstance(x, tuple) else (x,)
    try:
        if isinstance(model.forward, _DeterministicForward):  # a prepared model (``prepare``)
            return model(*xs)
        with Deterministic({id(m): n for n, m in model.named_modules(remove_duplicate=False)}):
            return model(*xs)
    except SigpropError:
        raise
    except Exception as exc:
        shapes = ";".join(",".join(map(str, t.shape[1:])) for t in xs)
        hint = ""
        if isinstance(exc, TypeError) and "positional argument" in str(exc):
            hint = " (a forward of several tensors: give their shapes as --input-shape a;b, or inputs=)"
        raise SigpropError(
            f"the model's forward on inputs of shape {shapes} raised {type(exc).__name__}: "
            f"{first_line(exc)}{hint}",
            field="input_shape",
        ) from None
