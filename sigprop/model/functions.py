"""A model's curvature and Jacobian as functions (the model engine's, sigprop/engines/model.py): its
loss with the 10-way head over every parameter that reaches it (``build_module``, for
sigprop/hessian.py's estimators), and the Jacobian of its output in its input through its own
forward (``model_jacobians``, for sigprop/spectra.py's summaries)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from sigprop import inits
from sigprop.errors import SigpropError
from sigprop.hessian import CLASSES, Model, _head
from sigprop.inits import LayerRole
from sigprop.model import build as model_build
from sigprop.spectra import in_batch

#: the head's parameters in a model's dict: a name no module path takes (a model may have a
#: ``head`` of its own)
MODEL_HEAD = "(head)"


def build_module(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int, draw: int) -> Model:
    """A user's model (the module kind, already drawn, initialised and prepared) as the loss's
    function: every parameter of the model that reaches the loss (a layer's together,
    ``model_build.trainable``; weight normalization written out, ``model_build.exact_weight_norm``, for a
    symmetric Hessian), its forward by ``torch.func.functional_call``, its output
    (``model_build.output_tensor``) flattened into the 10-way head -- PyTorch's default nn.Linear, as
    for sigprop's own nets.  A parameter the loss does not depend on (one gradient pass on two
    samples finds no path: a module the forward never calls, a side output) is left out of the
    Hessian and named in ``left_out`` -- its rows and columns would be zero."""
    model_build.exact_weight_norm(model)
    own = {n: p.detach() for n, p in model_build.trainable(model).items()}
    with torch.no_grad():
        width = model_build.output_tensor(model(x[:2]))[0].numel()
    head = _head(
        inits.INITS["pytorch"], False, LayerRole(width, CLASSES, "linear"), seed, draw, x.device, x.dtype
    )
    head = {f"{MODEL_HEAD}.{k.split('.', 1)[1]}": v for k, v in head.items()}

    def loss(p: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        out = model_build.output_tensor(
            torch.func.functional_call(model, {n: p.get(n, own[n]) for n in own}, (xb,))
        )
        logits = out.reshape(out.shape[0], -1) @ p[f"{MODEL_HEAD}.v"].T + p[f"{MODEL_HEAD}.b"]
        return F.cross_entropy(logits, yb)

    probe = {n: t.clone().requires_grad_(True) for n, t in own.items() if t.is_floating_point()}
    if not probe:
        raise SigpropError(
            f"the model ({type(model).__name__}) has no parameters: the curvature is the loss Hessian in "
            "the model's own weights (buffers are not weights)",
            field="target",
        )
    with torch.enable_grad():
        grads = torch.autograd.grad(
            loss({**own, **probe, **head}, x[:2], y[:2]), list(probe.values()), allow_unused=True
        )
    left_out = [n for n, g in zip(probe, grads) if g is None]
    if len(left_out) == len(probe):
        raise SigpropError(
            f"none of the model's {len(probe)} parameter(s) reaches its output: the loss Hessian in its "
            "weights is zero",
            field="target",
        )
    params = {**{n: t for n, t in own.items() if n not in left_out}, **head}
    return Model([], params, loss, left_out)


def left_out_note(init: str, names: list[str]) -> str:
    """The parameters the curvature left out (``build_module``), in words."""
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (
        f"init {init!r}: {len(names)} parameter(s) do not reach the loss and are left out of the Hessian "
        f"(their rows would be zero): {shown}"
    )


def batch_dependent(model: torch.nn.Module) -> bool:
    """Whether a sample's output depends on the rest of the batch: a batch norm in training mode
    (a probe runs the model so, ``model_build.prepare``)."""
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules())


def model_function(model: torch.nn.Module, x: torch.Tensor, i: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Sample i's input -> the model's output for it (the probe's output tensor,
    ``model_build.output_tensor``), flattened.  A batch norm in training mode normalises by the batch:
    then sample i runs inside the batch ``x`` (the others held fixed, their dependence on it
    included: J = d y_i / d x_i of the batch map); otherwise alone."""
    if not batch_dependent(model):
        return lambda z: model_build.output_tensor(model(z.unsqueeze(0))).reshape(-1)
    return in_batch(lambda xb: model_build.output_tensor(model(xb)), x, i)


def functional(model: torch.nn.Module) -> torch.nn.Module:
    """The model ready for torch.func's transforms: a batch norm in training mode keeps no running
    statistics (their in-place update of a captured buffer is refused inside a transform; its
    output, from the batch's statistics, is unchanged: ``torch.func.replace_all_batch_norm_modules_``)."""
    torch.func.replace_all_batch_norm_modules_(model)
    return model


def model_jacobians(model: torch.nn.Module, x: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """J [N, n_out, n_in] of the model's output in its input, one per sample (``model_function``):
    one reverse product per output, ``chunk`` of them at a time (vectorised by torch.func.jacrev)."""
    out = []
    for i in range(x.shape[0]):
        J = torch.func.jacrev(model_function(model, x, i), chunk_size=chunk)(x[i])
        out.append(J.reshape(J.shape[0], -1).detach())
    return torch.stack(out)
