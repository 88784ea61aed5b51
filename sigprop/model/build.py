"""A draw of a user's model and what a probe changes in it (docs/theory.md §13, "What a probe
runs"): built under a seeded generator, on the probe's device in its dtype, in training mode
(batch norm over the probe's batch) with no stochastic op on (``Deterministic``, sigprop/model/
forward.py), in-place
activations out of place, the weights needing no gradient; its output read at one tensor; its
forward called with errors said in one line."""

from __future__ import annotations

import re

import torch
import torch.nn as nn
from torch.nn.utils.parametrizations import _WeightNorm
from torch.nn.utils.weight_norm import WeightNorm

from sigprop import specs
from sigprop.errors import SigpropError
from sigprop.model.forward import _DeterministicForward, first_line


def build(factory, seed: int, draw: int) -> nn.Module:
    """Draw ``draw`` of the model: ``factory()`` under torch's global generator seeded from (seed,
    draw), the caller's generator state restored after (a run reproduces, and ``rerun`` too)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(specs.derive_seed(seed, specs.STREAM_MODEL, draw))
        try:
            model = factory()
        except SigpropError:
            raise
        except Exception as exc:  # the user's code: its error in one line, named
            raise SigpropError(
                f"the model factory raised {type(exc).__name__}: {first_line(exc)}", field="target"
            ) from None
    if not isinstance(model, nn.Module):
        raise SigpropError(
            f"the model factory returned a {type(model).__name__}, not a torch.nn.Module", field="target"
        )
    return model


def padding_ids(model: nn.Module, vocab: int) -> list[int]:
    """The ids below ``vocab`` that an embedding of the model keeps as its padding token
    (``nn.Embedding.padding_idx``, Hugging Face's ``pad_token_id``): the rows a real input only
    puts where its attention mask hides them, and which ``--vocab``'s random ids leave out."""
    found = {
        int(m.padding_idx) % m.num_embeddings
        for m in model.modules()
        if isinstance(m, nn.Embedding) and m.padding_idx is not None
    }
    return sorted(i for i in found if i < vocab)


def uniform_ids(vocab: int, shape: tuple, skip: list[int], gen: torch.Generator, device) -> torch.Tensor:
    """Token ids uniform over [0, vocab) less the sorted ids ``skip``: uniform over the vocab -
    len(skip) others, each drawn id shifted past the skipped ids at or below it."""
    if len(skip) >= vocab:
        raise SigpropError(
            f"--vocab {vocab} holds only the model's padding ids {skip}: give a larger vocabulary",
            field="vocab",
        )
    ids = torch.randint(vocab - len(skip), shape, generator=gen, device=device)
    for s in skip:  # ascending: an id pushed to s is pushed again past s
        ids = ids + (ids >= s).to(ids.dtype)
    return ids


def prepare(model: nn.Module, device, dtype) -> nn.Module:
    """The model as a probe runs it: on ``device`` in ``dtype``, training mode with every
    stochastic op off (dropout and drop-path modules in eval mode, the rest by ``Deterministic``
    around every forward), in-place activations out of place, and the weights needing no
    gradient."""
    model = model.to(device=device, dtype=dtype)
    model.train()
    for m in model.modules():
        if isinstance(m, DROPOUT_MODULES) or (
            _STOCHASTIC_NAME.search(type(m).__name__) and not list(m.children()) and not list(m.parameters())
        ):
            m.eval()  # dropout, DropPath, StochasticDepth: identity in eval mode (batch norm is not touched)
        if getattr(m, "inplace", False) is True:
            m.inplace = False
    for p in model.parameters():
        p.requires_grad_(False)
    if not isinstance(getattr(model, "forward", None), _DeterministicForward):
        model.forward = _DeterministicForward(model, model.forward)
    return model


def prepare_notes(model: nn.Module, dtype: torch.dtype) -> list[str]:
    """What ``prepare`` changes in the model that a user should read in the run, not only in the
    docs: weights of another floating dtype cast to the probe's (a float64 or float16 model is
    probed in ``--dtype``), and normalisations the model came with in eval mode, which a probe
    runs in training mode (statistics of the probe's batch, not the running ones)."""
    notes = []
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.is_floating_point()})
    want = str(dtype).replace("torch.", "")
    if any(d != want for d in dtypes):
        notes.append(
            f"the model's {' and '.join(dtypes)} weights are cast to {want} for the probe (--dtype {want})"
        )
    frozen = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats and not m.training
    ]
    if frozen:
        shown = ", ".join(map(repr, frozen[:3])) + (f" and {len(frozen) - 3} more" if len(frozen) > 3 else "")
        notes.append(
            f"the model came in eval mode: its {len(frozen)} batch/instance norm(s) ({shown}) run in "
            "training mode here, normalising by the probe's batch as at the first training step, not by "
            "their running statistics"
        )
    return notes


#: dropout modules: identity in eval mode
DROPOUT_MODULES = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)
#: parameter-free leaf modules by these names (timm's DropPath, torchvision's StochasticDepth,
#: MONAI's DropPath, DropBlock) act only in training mode: put in eval mode for a probe
_STOCHASTIC_NAME = re.compile(r"drop|stochastic", re.IGNORECASE)


def _weight_norm(v: torch.Tensor, g: torch.Tensor, dim: int | None) -> torch.Tensor:
    """g v/||v||, the norm over every axis but ``dim`` (all of them for -1 or None), written out."""
    if dim is None or dim == -1:
        return g * v / torch.linalg.vector_norm(v)
    axes = [a for a in range(v.dim()) if a != dim % v.dim()]
    return g * v / torch.linalg.vector_norm(v, dim=axes, keepdim=True)


def exact_weight_norm(model: nn.Module) -> int:
    """Give every weight normalization of the model -- the parametrization
    (``torch.nn.utils.parametrizations.weight_norm``) and the older hook
    (``torch.nn.utils.weight_norm``) -- a hand-written g v/||v|| in place of the fused
    ``torch._weight_norm``, whose second derivative torch 2.13 gets wrong (an asymmetric Hessian:
    tests/test_hessian.py); the values are the same.  Returns how many it changed."""
    changed = 0
    for m in model.modules():
        if isinstance(m, _WeightNorm):
            m.forward = lambda weight_g, weight_v, dim=m.dim: _weight_norm(weight_v, weight_g, dim)
            changed += 1
        for hook in m._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm):
                hook.compute_weight = lambda module, h=hook: _weight_norm(
                    getattr(module, h.name + "_v"), getattr(module, h.name + "_g"), h.dim
                )
                changed += 1
    return changed


def trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters by their full names, a layer's together (each module's own, then
    its weight normalization's g and v, which live in ``NAME.parametrizations.weight``)."""
    out: dict[str, torch.Tensor] = {}
    for prefix, m in model.named_modules():
        for name, p in m.named_parameters(recurse=False):
            out[f"{prefix}.{name}" if prefix else name] = p
    return out


def output_tensor(y, where: str = "the model's output"):
    """The tensor a probe reads from a forward's result: the tensor itself, the first tensor of
    a tuple or list, or of a dict's values (Hugging Face's ModelOutput is one)."""
    if isinstance(y, torch.Tensor):
        t = y
    elif isinstance(y, (tuple, list)):
        t = next((v for v in y if isinstance(v, torch.Tensor)), None)
    elif isinstance(y, dict) or hasattr(y, "values"):
        t = next((v for v in y.values() if isinstance(v, torch.Tensor)), None)
    else:
        t = None
    if t is None:
        raise SigpropError(f"{where} holds no tensor (got a {type(y).__name__})", field="target")
    if not t.is_floating_point():
        raise SigpropError(f"{where} is a {t.dtype} tensor: the probe needs floating outputs", field="target")
    if t.dim() == 0:
        raise SigpropError(
            f"{where} is a scalar (a 0-dim tensor): a probe reads one output row per sample; return the "
            "per-sample output (the logits, not a loss)",
            field="target",
        )
    return t


def output_choice(y) -> str:
    """Which tensor of a forward's result the probe reads, in words, where there was a choice
    (a tuple, list or dict of several tensors): "" for a single tensor."""
    if isinstance(y, torch.Tensor):
        return ""
    if isinstance(y, (tuple, list)):
        named = [(f"[{i}]", v) for i, v in enumerate(y)]
    elif isinstance(y, dict) or hasattr(y, "items"):
        named = [(repr(k), v) for k, v in y.items()]
    else:
        return ""
    tensors = [n for n, v in named if isinstance(v, torch.Tensor)]
    if len(tensors) < 2:
        return ""
    rest = ", ".join(tensors[1:4]) + (f" and {len(tensors) - 4} more" if len(tensors) > 4 else "")
    # torch.fx's shape propagation hands a dict or list output back as its immutable_dict/_list
    kind = type(y).__name__.removeprefix("immutable_")
    return f"the output read is {tensors[0]} of the model's {kind} (its first tensor; not {rest})"


def check_finite(t: torch.Tensor, what: str) -> None:
    """One line, the same on every path (probe, spectrum, curvature), where ``t`` holds NaN or inf."""
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise SigpropError(
            f"{what} holds NaN or inf ({bad} of {t.numel()} entries): sigprop measures finite signals",
            field="target",
        )


def probe_output(out, rows_: int, what: str) -> torch.Tensor:
    """The output tensor a probe reads (``output_tensor``) from a forward of ``rows_`` samples,
    refused in one line where it is not one row per sample (a mean over the batch) or not finite."""
    y = output_tensor(out)
    if y.shape[0] != rows_:
        raise SigpropError(
            f"{what}'s output has {y.shape[0]} row(s) for {rows_} samples (shape {tuple(y.shape)}): a probe "
            "reads one output row per sample; return the per-sample output, not a reduction over the batch",
            field="target",
        )
    check_finite(y, f"{what}'s output on the probe's inputs")
    return y


def check_finite_weights(model: nn.Module, what: str) -> None:
    """``check_finite`` on every floating parameter and buffer of the model (NaN weights stop here,
    before a probe, a spectrum or a curvature runs, in one line naming the first such tensor)."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        check_finite(t.detach(), f"{what}: {name}")


def rows(x, lo: int, hi: int):
    """Rows lo:hi of the inputs (one tensor, or a tuple of them for a forward of several)."""
    return tuple(t[lo:hi] for t in x) if isinstance(x, tuple) else x[lo:hi]
