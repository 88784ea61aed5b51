"""The user's own ``nn.Module`` (torch): build a draw, apply an init scheme to it (``init_``),
measure its sites with autograd, and trace it (``torch.fx``) into the graph of moment maps that
``plans.predict_graph`` composes.

Per sample and site the forward ratio is rms(h_site)/rms(x) and the backward ratio
rms(dl/dh_site)/rms(dl/dy) for l = <e, y> with a random error e at the output: norms per element
(rms = ||.||/sqrt(numel)), so that a site of another size than the input reads as the per-unit
scale (docs/theory.md §13).  The probe runs the model in training mode (batch norm normalises
over the probe batch, as at the first step of training) with dropout off (identity: the signal
at init, not the noise of a mask), in-place activations out of place (a hook would lose the
site they overwrite), and the weights needing no gradient (only the states' gradients are
read: the autograd floor of benchmarks/floor.py).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import fnmatch
import functools
import inspect
import io
import math
import operator
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from scipy import special
from torch.fx.passes.shape_prop import ShapeProp
from torch.nn.utils.parametrizations import _WeightNorm
from torch.nn.utils.parametrize import ParametrizationList
from torch.nn.utils.weight_norm import WeightNorm
from torch.overrides import TorchFunctionMode

from sigprop import inits, plans, specs
from sigprop.errors import SigpropError
from sigprop.kernels import sampling

#: elementwise activations the trace maps by Gauss-Hermite quadrature (module classes, functions,
#: tensor methods)
ACTIVATION_MODULES = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.ELU,
    nn.Softplus,
    nn.Mish,
    nn.Hardtanh,
    nn.ReLU6,
)
ACTIVATION_FUNCTIONS = {
    torch.relu: torch.relu,
    F.relu: F.relu,
    F.gelu: F.gelu,
    F.silu: F.silu,
    torch.tanh: torch.tanh,
    torch.sigmoid: torch.sigmoid,
    F.leaky_relu: F.leaky_relu,
    F.elu: F.elu,
}
ACTIVATION_METHODS = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}
#: modules and calls that leave every element as it is at init (the per-element moments pass)
IDENTITY_MODULES = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.Flatten)
IDENTITY_FUNCTIONS = (torch.flatten, torch.reshape, F.dropout)
IDENTITY_METHODS = (
    "view",
    "reshape",
    "flatten",
    "contiguous",
    "permute",
    "transpose",
    "squeeze",
    "unsqueeze",
)
NORM_MODULES = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)
DENSE_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
TRANSPOSED_MODULES = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
#: fixed per-channel maps (``mix``) and max pooling, as modules; a call of the matching function
#: is turned into its module (``_as_module``) so that one reading serves both
MIX_MODULES = (
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.Upsample,
)
MAXPOOL_MODULES = (
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
)
POOL_FUNCTIONS = {
    F.avg_pool1d: nn.AvgPool1d,
    F.avg_pool2d: nn.AvgPool2d,
    F.avg_pool3d: nn.AvgPool3d,
    F.adaptive_avg_pool1d: nn.AdaptiveAvgPool1d,
    F.adaptive_avg_pool2d: nn.AdaptiveAvgPool2d,
    F.adaptive_avg_pool3d: nn.AdaptiveAvgPool3d,
    F.interpolate: nn.Upsample,
    F.max_pool1d: nn.MaxPool1d,
    F.max_pool2d: nn.MaxPool2d,
    F.max_pool3d: nn.MaxPool3d,
    F.adaptive_max_pool1d: nn.AdaptiveMaxPool1d,
    F.adaptive_max_pool2d: nn.AdaptiveMaxPool2d,
    F.adaptive_max_pool3d: nn.AdaptiveMaxPool3d,
}


# --------------------------------------------------------------------------------------------
# a draw of the model, and what a probe changes in it
# --------------------------------------------------------------------------------------------
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
                f"the model factory raised {type(exc).__name__}: {_first_line(exc)}", field="target"
            ) from None
    if not isinstance(model, nn.Module):
        raise SigpropError(
            f"the model factory returned a {type(model).__name__}, not a torch.nn.Module", field="target"
        )
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


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
    return t


#: the chunk over which ``mean_squares`` sums squares in the state's own precision
SQUARES_CHUNK = 1024


def mean_squares(t: torch.Tensor) -> torch.Tensor:
    """Per sample (row) the mean of the squares of ``t``'s elements, float64 [N].  A float32 state
    is summed in chunks of ``SQUARES_CHUNK`` by ``vector_norm`` (one fused pass, no copy) and the
    chunks' squares added in float64: 3e-8 relative against a float64 sum on 4.7M elements, where
    one float32 ``vector_norm`` over the row was 2e-3 off at 19M and ``.double().pow(2)`` a copy
    and 7x the time (the sites of a UNet were a third of a probe).  A row whose mean square leaves
    [1e-30, 1e30] -- squares that could under- or overflow float32 -- is summed in float64."""
    rows = t.reshape(t.shape[0], -1)
    n = rows.shape[1]
    if rows.dtype != torch.float32 or n < SQUARES_CHUNK:
        return rows.double().pow(2).mean(1)
    m = n // SQUARES_CHUNK
    head = torch.linalg.vector_norm(rows[:, : m * SQUARES_CHUNK].reshape(-1, m, SQUARES_CHUNK), dim=2)
    ms = (head.double().pow(2).sum(1) + rows[:, m * SQUARES_CHUNK :].double().pow(2).sum(1)) / n
    bad = ~torch.isfinite(ms) | (ms < 1e-30) | (ms > 1e30)
    if bool(bad.any()):
        ms[bad] = rows[bad].double().pow(2).mean(1)
    return ms


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
    return f"the output read is {tensors[0]} of the model's {type(y).__name__} (its first tensor; not {rest})"


# --------------------------------------------------------------------------------------------
# sites
# --------------------------------------------------------------------------------------------
def auto_sites(model: nn.Module, called=None) -> list[str]:
    """The default sites: the outputs of the model's top-level blocks, where a plain
    ``nn.Sequential``, ``nn.ModuleList`` or ``nn.ModuleDict`` (a container, not a block: exactly
    those classes) is opened into its own children (torchvision's ResNet reads ``layer3.4``,
    MONAI's DenseNet ``features.denseblock2``), and a block without parameters (an activation, a
    pooling, a dropout) stands for the block before it: it replaces that block's site (so an
    MLP's sites are its post-activation states; one before any block, such as a shared
    activation module, is skipped).  ``called``: the module paths the forward calls (``survey``);
    a block outside it (a leftover head) is no site."""
    blocks: list[tuple[str, nn.Module]] = []

    def open_(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if type(child) in (nn.Sequential, nn.ModuleList, nn.ModuleDict) or (
                len(list(module.named_children())) == 1 and list(child.children()) and module is model
            ):
                open_(path + ".", child)
            elif called is None or path in called:
                blocks.append((path, child))

    open_("", model)
    sites: list[str] = []
    for path, child in blocks:
        has_params = any(True for _ in child.parameters())
        if not has_params:
            if sites:
                sites[-1] = path
        else:
            sites.append(path)
    return sites


def resolve_sites(model: nn.Module, sites: str, called=None) -> tuple[list[str], list[str]]:
    """``auto`` (``auto_sites``), ``leaves`` (every leaf module), or a comma list of module
    paths and fnmatch patterns (``layer3.*``); a name that matches nothing is refused with the
    closest path.  ``called`` (``survey``): modules the forward never calls are left out of auto,
    leaves and patterns, and named in the notes returned beside the sites; a site named
    exactly that the forward never calls is refused."""
    names = [n for n, _ in model.named_modules(remove_duplicate=False) if n]
    runs = (lambda n: True) if called is None else (lambda n: n in called)
    uncalled: list[str] = []
    if sites == "auto":
        out = auto_sites(model, called)
        uncalled = [n for n in auto_sites(model) if not runs(n)]
    elif sites == "leaves":
        leaves = [n for n, m in model.named_modules(remove_duplicate=False) if n and not list(m.children())]
        out, uncalled = [n for n in leaves if runs(n)], [n for n in leaves if not runs(n)]
    else:
        out = []
        for pat in (s.strip() for s in sites.split(",")):
            hit = [n for n in names if fnmatch.fnmatchcase(n, pat)]
            if not hit:
                close = difflib.get_close_matches(pat, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise SigpropError(f"site {pat!r} matches no module of the model{hint}", field="sites")
            if not any(runs(n) for n in hit):
                raise SigpropError(
                    f"site {pat!r} is never called by the model's forward (a module it does not use)",
                    field="sites",
                )
            out += [n for n in hit if runs(n) and n not in out]
            uncalled += [n for n in hit if not runs(n) and n not in uncalled]
    if not out and not names:
        raise SigpropError(
            f"the model ({type(model).__name__}) has no submodules: sites are submodules' outputs",
            field="sites",
        )
    if not out:
        raise SigpropError("no submodule with parameters to measure: name sites with --sites", field="sites")
    notes = []
    if uncalled:
        shown = ", ".join(uncalled[:4]) + (f" and {len(uncalled) - 4} more" if len(uncalled) > 4 else "")
        notes.append(f"not measured: {shown} (never called by the model's forward)")
    return out, notes


# --------------------------------------------------------------------------------------------
# measuring one draw
# --------------------------------------------------------------------------------------------
def measure(
    model: nn.Module,
    x: torch.Tensor,
    e_seed: int,
    sites: list[str],
    batch: int | None = None,
    what: str = "the model",
):
    """ln of the forward and backward per-element RMS ratios at every site, per sample: two
    float64 arrays [E, N]; each site's units per sample; and whether the output's gradient
    reached each site (a site off the output's path -- a side head, BERT's pooler beside
    ``last_hidden_state`` -- has no backward ratio: its ln is -inf here, and the kind marks it).
    Token ids (an integer ``x``) have no scale: the forward ratios are then relative to the first
    site.  The error e at the output is drawn once for all N samples from ``e_seed`` (the same for
    every init and draw).  ``batch``: the samples run in chunks of that many, each chunk's graph
    freed before the next (the memory of one chunk; a batch norm then normalises each chunk by its
    own statistics)."""
    modules = dict(model.named_modules(remove_duplicate=False))
    xs = x if isinstance(x, tuple) else (x,)
    floating = all(t.is_floating_point() for t in xs)
    N = xs[0].shape[0]
    step = N if batch is None else max(1, min(batch, N))
    parts_f: dict[str, list] = {n: [] for n in sites}
    parts_b: dict[str, list] = {n: [] for n in sites}
    numel: dict[str, int] = {}
    reached: set[str] = set()
    e_all: torch.Tensor | None = None

    def per_sample_ms(t: torch.Tensor, where: str = "") -> torch.Tensor:
        ms = mean_squares(t.detach())
        if where and not bool(torch.isfinite(ms).all()):
            raise SigpropError(
                f"{what}: {where} is too large to square in float64 (its mean square overflows): "
                "rescale the inputs",
                field="target",
            )
        return ms

    for lo in range(0, N, step):
        xc = tuple(t[lo : lo + step].detach().requires_grad_(t.is_floating_point()) for t in xs)
        rows = xc[0].shape[0]
        fwd: dict[str, torch.Tensor] = {}
        bwd: dict[str, torch.Tensor] = {}

        def hook(name, rows=rows, fwd=fwd, bwd=bwd):
            def fn(mod, args, out):
                t = output_tensor(out, f"site {name!r}'s output")
                if t.shape[0] != rows:
                    raise SigpropError(
                        f"site {name!r}'s output has {t.shape[0]} rows for {rows} samples: not a per-sample "
                        "state",
                        field="sites",
                    )
                fwd[name] = per_sample_ms(t, f"site {name!r}'s output")
                numel[name] = t[0].numel()
                if not t.requires_grad and t.grad_fn is None and t.is_floating_point():
                    t.requires_grad_(True)  # token inputs: the graph starts at the first site
                if t.requires_grad:
                    t.register_hook(lambda g: bwd.__setitem__(name, per_sample_ms(g)))

            return fn

        handles = [modules[n].register_forward_hook(hook(n)) for n in sites]
        try:
            with torch.enable_grad():
                y = output_tensor(_call(model, xc if len(xc) > 1 else xc[0]))
                check_finite(y.detach(), f"{what}'s output on the probe's inputs")
                if e_all is None:  # all N errors at once: the same e whatever the chunks
                    gen = torch.Generator(device=y.device).manual_seed(e_seed)
                    e_all = torch.randn((N, *y.shape[1:]), generator=gen, device=y.device, dtype=y.dtype)
                e = e_all[lo : lo + rows]
                if y.requires_grad:
                    torch.autograd.backward(y, grad_tensors=e)
        finally:
            for h in handles:
                h.remove()
        missing = [n for n in sites if n not in fwd]
        if missing:
            raise SigpropError(f"site {missing[0]!r} was not called by the model's forward", field="sites")
        # token ids have no scale: the forward ratios are then relative to the first site; several
        # inputs: their elements together
        if floating:
            ms_x = sum(per_sample_ms(t, "the input") * t[0].numel() for t in xc) / sum(
                t[0].numel() for t in xc
            )
        else:
            ms_x = fwd[sites[0]]
        ms_e = per_sample_ms(e)
        # a site the output's gradient never reaches (its hook never ran): -inf here, marked off the
        # path by the kind; one it reaches with dl/dh = 0 (a dead ReLU) reads ratio 0 too
        zero = torch.full((rows,), -math.inf, dtype=torch.float64, device=xs[0].device)
        reached |= set(bwd)
        for n in sites:
            parts_f[n].append(0.5 * (fwd[n] / ms_x).log())
            parts_b[n].append(0.5 * (bwd[n] / ms_e).log() if n in bwd else zero)
        del y, e, fwd, bwd
    ln_f = torch.stack([torch.cat(parts_f[n]) for n in sites])
    ln_b = torch.stack([torch.cat(parts_b[n]) for n in sites])
    return ln_f.cpu().numpy(), ln_b.cpu().numpy(), [numel[n] for n in sites], [n in reached for n in sites]


@dataclass(frozen=True)
class Survey:
    """What one forward of a few samples (no graph) tells before a run: the bytes of every leaf
    module's output per sample (what autograd keeps for the backward, about one tensor per op:
    the driver multiplies by the samples, adds the weights, and refuses a run that would not fit
    before it starts), the modules the forward called (auto sites skip the others), the output's
    units per sample, and which tensor of a tuple or dict output is read (``output_choice``)."""

    per_sample: int
    called: frozenset
    units: int
    output: str


def survey(model: nn.Module, x1, what: str = "the model") -> Survey:
    """One forward of ``x1`` (a few rows) with a hook on every module: ``Survey``.  The model's
    errors are one line naming --input-shape (``_call``); a non-finite output is refused
    (``check_finite``)."""
    total = 0
    called: set[str] = set()
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}

    def seen(mod, args, out):
        nonlocal total
        called.add(names.get(id(mod), ""))
        if not list(mod.children()):
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()

    handles = [m.register_forward_hook(seen) for m in model.modules()]
    try:
        with torch.no_grad():
            out = _call(model, x1)
    finally:
        for h in handles:
            h.remove()
    y = output_tensor(out)
    check_finite(y, f"{what}'s output on the probe's inputs")
    rows_ = (x1 if isinstance(x1, tuple) else (x1,))[0].shape[0]
    return Survey(total // max(rows_, 1), frozenset(called), y[0].numel(), output_choice(out))


def check_finite(t: torch.Tensor, what: str) -> None:
    """One line, the same on every path (probe, spectrum, curvature), where ``t`` holds NaN or inf."""
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise SigpropError(
            f"{what} holds NaN or inf ({bad} of {t.numel()} entries): sigprop measures finite signals",
            field="target",
        )


def check_finite_weights(model: nn.Module, what: str) -> None:
    """``check_finite`` on every floating parameter and buffer of the model (NaN weights stop here,
    before a probe, a spectrum or a curvature runs, in one line naming the first such tensor)."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        check_finite(t.detach(), f"{what}: {name}")


def rows(x, lo: int, hi: int):
    """Rows lo:hi of the inputs (one tensor, or a tuple of them for a forward of several)."""
    return tuple(t[lo:hi] for t in x) if isinstance(x, tuple) else x[lo:hi]


def _call(model, x):
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
            f"{_first_line(exc)}{hint}",
            field="input_shape",
        ) from None


# --------------------------------------------------------------------------------------------
# the paper's init for any model
# --------------------------------------------------------------------------------------------
@dataclass
class InitRecord:
    """What ``init_`` did to one layer: its path, class, fan-in/out, its role in the net (relu,
    block_last with its stage's block count, projection, linear), whether it is weight-normalized,
    and whether it was set (``note``: why not)."""

    name: str
    kind: str
    fan_in: int
    fan_out: int
    weight_norm: bool
    set: bool
    role: str = ""
    blocks_in_stage: int = 1
    note: str = ""
    #: a module left as it was: its own parameters' names (``weight``, ``in_proj_weight``, ...)
    parameters: tuple[str, ...] = ()


def _why_left(m: nn.Module) -> str:
    """Why ``init_`` leaves a module's own parameters as they were, in a few words."""
    if isinstance(m, NORM_MODULES) or "norm" in type(m).__name__.lower():
        return "a normalisation's gain and offset, kept"
    if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
        return "an embedding table, kept"
    return "not understood"


#: the role ``init_`` gives a layer whose role the graph does not say
ASSUMED = "a ReLU layer assumed (gain g^2 = 2 fan_in/fan_out under proposed), no residual branch read"


def init_notes(init: str, records: list[InitRecord]) -> list[str]:
    """What ``init_`` did not do, in words for the table's foot and the JSON: the modules whose
    parameters it left as they were, grouped by class (every parameter is set or named here),
    and the role it assumed where the graph could not be read."""
    left = [r for r in records if not r.set]
    guessed = [r for r in records if r.set and r.note.startswith("role not read")]
    roles_note = ""
    if guessed:
        why = guessed[0].note[len("role not read (") : guessed[0].note.index("): ")]
        roles_note = (
            f"{len(guessed)} of {sum(r.set for r in records)} layers' roles not read ({why}): {ASSUMED}"
        )
    notes = []
    if left:
        groups: dict[tuple[str, str, tuple], list[str]] = {}
        for r in left:
            groups.setdefault((r.kind, r.note, r.parameters), []).append(r.name)
        parts = []
        for (cls, why, params), names in groups.items():
            which = names[0] if len(names) == 1 else f"{len(names)} x, e.g. {names[0]}"
            parts.append(f"{cls} {which} ({', '.join(params) or 'weight'}: {why})")
        count = sum(len(r.parameters) or 1 for r in left)
        notes.append(f"init {init!r} left {count} parameter(s) as they were: {'; '.join(parts)}")
    if roles_note:
        notes.append(f"init {init!r}: {roles_note}")
    return notes


def _wn_parts(m: nn.Module):
    """(g, v) parameters of a weight-normalized layer (torch.nn.utils.parametrizations.weight_norm
    or the older torch.nn.utils.weight_norm), or None."""
    par = getattr(m, "parametrizations", None)
    if par is not None and "weight" in par:
        orig = par["weight"]
        if hasattr(orig, "original0") and hasattr(orig, "original1"):
            return orig.original0, orig.original1
    if hasattr(m, "weight_g") and hasattr(m, "weight_v"):
        return m.weight_g, m.weight_v
    return None


ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)
MUL_FUNCTIONS = (operator.mul, operator.imul, torch.mul)
DIV_FUNCTIONS = (operator.truediv, operator.itruediv, torch.div)


def op_kind(gm: fx.GraphModule, n: fx.Node) -> str:
    """What an fx node is, for the trace's moment maps and for ``init_``'s roles alike: input,
    const, output, dense, transposed, norm, act, identity, mix (average pooling, interpolation,
    a mean over the positions), maxpool, cat, add, mul, or other."""
    if n.op in ("placeholder", "get_attr", "output"):
        return {"placeholder": "input", "get_attr": "const", "output": "output"}[n.op]
    if n.op == "call_module":
        m = gm.get_submodule(n.target)
        for classes, name in (
            (DENSE_MODULES, "dense"),
            (NORM_MODULES, "norm"),
            (ACTIVATION_MODULES, "act"),
            (IDENTITY_MODULES, "identity"),
        ):
            if isinstance(m, classes):
                return name
        if isinstance(m, nn.PReLU) and m.weight.numel() == 1:  # one slope: elementwise
            return "act"
        for classes, name in (
            (TRANSPOSED_MODULES, "transposed"),
            (MIX_MODULES, "mix"),
            (MAXPOOL_MODULES, "maxpool"),
        ):
            if isinstance(m, classes):
                return name
        return "other"
    fn, method = n.op == "call_function", n.op == "call_method"
    if (fn and n.target in ACTIVATION_FUNCTIONS) or (method and n.target in ACTIVATION_METHODS):
        return "act"
    if (fn and n.target in IDENTITY_FUNCTIONS) or (method and n.target in IDENTITY_METHODS):
        return "identity"
    if fn and n.target is torch.cat:
        return "cat"
    if fn and n.target in POOL_FUNCTIONS:
        return "maxpool" if issubclass(POOL_FUNCTIONS[n.target], MAXPOOL_MODULES) else "mix"
    if (fn and n.target is torch.mean) or (method and n.target == "mean"):
        return "mix"
    if (fn and n.target in ADD_FUNCTIONS) or (method and n.target in ("add", "add_")):
        return "add"
    if (fn and n.target in MUL_FUNCTIONS) or (method and n.target in ("mul", "mul_")):
        return "mul"
    if (fn and n.target in DIV_FUNCTIONS) or (method and n.target in ("div", "div_")):
        return "div"
    return "other"


PASS_THROUGH = ("identity", "scale")


def roles(model: nn.Module) -> tuple[dict[str, tuple[str, int, int]], str]:
    """Each Linear/ConvNd's role as the paper's init reads it, from the model's fx graph:
    {module path: (kind, blocks_in_stage, block_index)} with kind ``relu`` (an activation reads
    its output, through norms), ``block_last`` (the last weight layer of a residual branch: the
    side of an add that is not the skip), ``projection`` (a weight layer on the skip side) or
    ``linear``; and why the graph could not be read ("" when it could).  A residual join is an
    add of two states: the skip is the side the other descends from, or, for a projection
    shortcut, the side with fewer weight layers since they parted.  Stages: consecutive joins,
    a new one at every join whose skip has a weight layer (a projection) -- the ResNets of
    Arpit et al. 2019, section 4, whose stages open with a projection; B is the stage's joins."""
    try:
        gm = fx.symbolic_trace(model)
    except Exception as exc:
        return {}, f"torch.fx could not trace the model ({type(exc).__name__}: {_first_line(exc)})"
    nodes = list(gm.graph.nodes)
    kind_of: dict[fx.Node, str] = {}
    for n in nodes:
        k = op_kind(gm, n)
        if k == "add" and len(n.all_input_nodes) != 2:
            k = "identity"  # x + a constant: no join
        elif k in ("mul", "div"):
            k = "scale" if len(n.all_input_nodes) == 1 else "other"
        kind_of[n] = k
    ancestors: dict[fx.Node, set] = {}
    for n in nodes:
        a = {n}
        for i in n.all_input_nodes:
            a |= ancestors[i]
        ancestors[n] = a
    out: dict[str, tuple[str, int, int]] = {}
    for n in nodes:  # relu or linear: what reads the layer's output (through norms and reshapes)
        if kind_of[n] != "dense":
            continue
        frontier, role = list(n.users), "linear"
        while frontier:
            u = frontier.pop()
            if kind_of[u] == "act":
                role = "relu"
                break
            if kind_of[u] in ("norm", "identity", "scale"):
                frontier += list(u.users)
        out[n.target] = (role, 1, 0)

    def last_dense(n):
        while kind_of.get(n) in PASS_THROUGH:
            n = n.all_input_nodes[0]
        return n if kind_of.get(n) == "dense" else None

    joins = []
    for n in nodes:
        if kind_of[n] != "add":
            continue
        a, b = n.all_input_nodes
        if a in ancestors[b]:
            skip, branch = a, b
        elif b in ancestors[a]:
            skip, branch = b, a
        else:
            common = ancestors[a] & ancestors[b]
            count = lambda x: sum(1 for k in ancestors[x] - common if kind_of[k] == "dense")
            skip, branch = (a, b) if count(a) <= count(b) else (b, a)
            common = ancestors[a] & ancestors[b]
            for k in ancestors[skip] - common:
                if kind_of[k] == "dense":
                    out[k.target] = ("projection", 1, 0)
        projected = skip not in ancestors[branch]
        joins.append((last_dense(branch), projected))
    stages: list[list] = []
    for last, projected in joins:
        if projected or not stages:
            stages.append([])
        stages[-1].append(last)
    for stage in stages:
        for i, last in enumerate(stage):
            if last is not None:
                out[last.target] = ("block_last", len(stage), i)
    return out, ""


def init_(
    model: nn.Module,
    scheme,
    seed: int = 0,
    draw: int = 0,
    wn: bool = False,
    blocks: dict | None = None,
    roles_: dict | None = None,
    batch=None,
) -> list[InitRecord]:
    """Apply the init scheme ``scheme`` (a name or an ``inits.InitScheme``) to every Linear and
    ConvNd of ``model`` (Arpit et al. 2019's schemes and their baselines), each layer's weights
    drawn by sigprop's own sampler for that scheme (sigprop/kernels/sampling.py) with the layer
    generator (seed, draw, index in module order): the same numbers sigprop's own nets draw for a
    layer of that shape and role.  Fans are c_in k^2 and c_out (the paper's footnote 3); the role
    comes from the model's graph (``roles``): a layer read by an activation is a ReLU layer
    (g^2 = 2 fan_in/fan_out for ``proposed``), the last weight layer of a residual branch gets
    1/B of its stage's B blocks (section 4), a projection shortcut and a layer read by nothing
    nonlinear gain 1. ``blocks``: {module path of a branch's last layer: B} overrides the B the graph
    gives; ``roles_``: {module path: "relu" | "linear" | "projection"} the role. A weight-normalized
    layer gets g and v; a plain one w = g v/||v|| (``wn=True`` adds weight normalization first).
    A grouped conv draws each group's rows as one layer's (fans per group: c_in k^2/groups and
    c_out/groups).  A data-dependent scheme (``datadep``: Salimans & Kingma 2016, section 3)
    then calibrates the layers in the order the forward calls them on ``batch`` (the inputs: a
    tensor or a tuple of them), ``calibrate``.  Returns what it did per layer; a layer it does
    not understand (a transposed conv, transformers' Conv1D, an embedding's table) is left as it
    is, named."""
    if isinstance(scheme, str):
        scheme = inits.get(scheme, frozenset({"taps"}), "a model")
    if scheme.name == "as-is":
        return []
    if scheme.standardizes and batch is None:
        raise SigpropError(
            f"init {scheme.name!r} calibrates on a batch: pass batch= (the inputs)", field="init"
        )
    records = _draw(model, scheme, seed, draw, wn, blocks, roles_)
    if scheme.standardizes:
        calibrate(model, [r.name for r in records if r.set], batch)
        layers = dict(model.named_modules())
        for r in records:
            if r.set and layers[r.name].bias is None:
                r.note = "no bias to centre it: scaled to sd 1 only"
    return records


def calibrate(model: nn.Module, names: list[str], batch) -> None:
    """The data-dependent init of a model (Salimans & Kingma 2016, eq. 5-6, as sigprop's own
    nets: ``sampling.CALIBRATIONS``): layer after layer in the order the forward calls them, a
    forward on ``batch`` (no graph) up to the layer reads its pre-activation t = v.x/||v|| per
    unit -- a Linear's last axis, a conv's channels, over the samples and positions -- and sets
    g = 1/sigma[t], b = -mu[t]/sigma[t]: each unit standardised on the batch by everything before
    it already calibrated.  One forward per layer, stopped at the layer.  The model is drawn on
    the host in float32 and run where the probe runs: it is calibrated there, on the batch's device
    and in its dtype, and handed back where it was (the scale and bias rounded to its dtype)."""
    first = (batch if isinstance(batch, tuple) else (batch,))[0]
    home = next((p for p in model.parameters() if p.is_floating_point()), None)
    if home is not None and (home.device, home.dtype) != (first.device, first.dtype):
        where = (home.device, home.dtype)
        model.to(device=first.device, dtype=first.dtype)
        try:
            calibrate(model, names, batch)
        finally:
            model.to(device=where[0], dtype=where[1])
        return
    layers = dict(model.named_modules())
    order: list[str] = []
    seen = {id(layers[n]): n for n in names}

    def note(mod, args, out):
        n = seen.get(id(mod))
        if n is not None and n not in order:
            order.append(n)

    handles = [layers[n].register_forward_hook(note) for n in names]
    try:
        with torch.no_grad():
            _call(model, batch)
    finally:
        for h in handles:
            h.remove()

    for n in order:
        m, got = layers[n], {}

        def grab(mod, args, out, got=got):
            got["t"] = out.detach()
            raise _Stop

        h = m.register_forward_hook(grab)
        try:
            with torch.no_grad():
                _call(model, batch)
        except _Stop:
            pass
        finally:
            h.remove()
        t = got["t"].double()
        axis = t.dim() - 1 if isinstance(m, nn.Linear) else 1
        if m.bias is not None:  # t is v.x/||v||: the drawn bias is 0, but a kept one is taken off
            t = t - m.bias.detach().double().reshape([-1 if d == axis else 1 for d in range(t.dim())])
        dims = [d for d in range(t.dim()) if d != axis]
        mu, sigma = t.mean(dim=dims), t.std(dim=dims, unbiased=False)
        if not bool((sigma > 0).all()):
            raise SigpropError(
                f"datadep: a unit of {n!r} has zero variance over the batch; use more samples",
                field="samples",
            )
        w_scale = (1.0 / sigma).to(m.weight.dtype)
        parts = _wn_parts(m)
        with torch.no_grad():
            if parts is not None:
                g_param, _ = parts
                g_param.mul_(w_scale.reshape(g_param.shape))
            else:
                m.weight.mul_(w_scale.reshape(-1, *([1] * (m.weight.dim() - 1))))
            if m.bias is not None:
                m.bias.copy_((-mu / sigma).to(m.bias.dtype))
        # the trace maps it as standardised (its bias is not independent of its input: it cancels
        # the units' offsets on this batch), not as a random layer with a bias
        m._sigprop_standardized = m.bias is not None


class _Stop(BaseException):
    """Ends a calibration's forward at the layer it reads (not an Exception: ``_call`` lets it by)."""


def _draw(model, scheme, seed, draw, wn, blocks, roles_) -> list[InitRecord]:
    """``init_``'s draw of every layer (before any calibration)."""
    found, why = roles(model)
    records: list[InitRecord] = []
    index = 0
    for name, m in list(model.named_modules()):
        if not isinstance(m, DENSE_MODULES):
            own = [n for n, _ in m.named_parameters(recurse=False)]
            if own and not isinstance(m, ParametrizationList):  # a WN layer's g and v are its layer's
                records.append(
                    InitRecord(
                        name, type(m).__name__, 0, 0, False, False, note=_why_left(m), parameters=tuple(own)
                    )
                )
            continue
        if wn and _wn_parts(m) is None:
            torch.nn.utils.parametrizations.weight_norm(m)
        parts = _wn_parts(m)
        w = m.weight.detach()
        shape = w.shape
        groups = getattr(m, "groups", 1)  # a grouped conv: each group's rows drawn as one layer's
        fan_out, fan_in = shape[0] // groups, int(np.prod(shape[1:]))
        taps = int(np.prod(shape[2:])) if w.dim() > 2 else 1
        kind, B, b_index = found.get(name, ("relu", 1, 0))
        if blocks and name in blocks:
            kind, B = "block_last", int(blocks[name])
        if roles_ and name in roles_:
            kind = roles_[name]
        index += 1
        role = inits.LayerRole(
            fan_in=fan_in, fan_out=fan_out, kind=kind, blocks_in_stage=B, block_index=b_index, taps=taps
        )
        gen = sampling.layer_generator(seed, draw, index, w.device)
        # as the walker draws in this dtype; the groups one after another from the layer's generator
        drawn = [sampling.sample(scheme, role, gen, w.device, w.dtype) for _ in range(groups)]
        p = drawn[0]
        if groups > 1:
            cat = lambda xs: None if xs[0] is None else torch.cat([x.reshape(-1) for x in xs])  # noqa: E731
            p = dataclasses.replace(
                p,
                v=torch.cat([d.v.reshape(fan_out, -1) for d in drawn]),
                g=cat([d.g for d in drawn]),
                scale=cat([d.scale for d in drawn]),
                bias=cat([d.bias for d in drawn]),
            )
        with torch.no_grad():
            v = p.v.reshape(shape).to(w.dtype)
            row_scale = p.scale.reshape(-1, *([1] * (w.dim() - 1))).to(w.dtype)
            if parts is not None and p.g is not None:
                g_param, v_param = parts
                v_param.copy_(v)
                g_param.copy_(p.g.reshape(g_param.shape).to(w.dtype))
            elif parts is not None:  # an unnormalised scheme on a WN layer: g = ||w|| keeps w
                g_param, v_param = parts
                v_param.copy_(v * row_scale)
                g_param.copy_(v_param.reshape(fan_out, -1).norm(dim=1).reshape(g_param.shape))
            else:
                m.weight.copy_(v * row_scale)
            if m.bias is not None:
                m.bias.copy_(
                    torch.zeros_like(m.bias) if p.bias is None else p.bias.reshape(m.bias.shape).to(w.dtype)
                )
        note = ""
        if name not in found and not (roles_ and name in roles_) and not (blocks and name in blocks):
            note = f"role not read ({why or 'no call of this module in the traced graph'}): {ASSUMED}"
        records.append(
            InitRecord(name, type(m).__name__, fan_in, fan_out, parts is not None, True, kind, B, note)
        )
    return records


# --------------------------------------------------------------------------------------------
# the trace: the model as a graph of moment maps (plans.GraphNode)
# --------------------------------------------------------------------------------------------
def _numpy_fn(fn):
    """A torch elementwise function as a float64 numpy function (for theory's quadrature)."""

    def f(z: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return fn(torch.from_numpy(np.asarray(z, dtype=np.float64))).numpy()

    def df(z: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.asarray(z, dtype=np.float64)).requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(fn(t).sum(), t)
        return g.numpy()

    return f, df


def _dense_node(m: nn.Module, shape_in, shape_out, name, inputs) -> plans.GraphNode:
    """A Linear or ConvNd: q' = (||W||^2/c_out) q + ||b||^2/c_out per element.  A conv carries
    its taps' box over the positions (``_conv_matrices``), so its gradient reads r = (||W||^2 /
    c_in) M^T r' (each input element in c_out k^d products, fewer at a padded border); where the
    box cannot be built (or for a Linear) r = ||W||^2 numel_out/(c_out numel_in) r'."""
    w = m.weight.detach().double()
    sq = float(w.pow(2).sum())
    c_out = w.shape[0]
    bias = 0.0 if m.bias is None else float(m.bias.detach().double().pow(2).sum()) / c_out
    numel_in, numel_out = math.prod(shape_in), math.prod(shape_out)
    mats = _conv_matrices(m, shape_in, shape_out) if not isinstance(m, nn.Linear) else ()
    c_in = w.shape[1] * getattr(m, "groups", 1)
    return plans.GraphNode(
        name,
        "standardized" if getattr(m, "_sigprop_standardized", False) else "dense",
        inputs,
        forward=sq / c_out,
        backward=sq / c_in if mats else sq * numel_out / (c_out * numel_in),
        bias=bias,
        width=c_out,
        positions=len(shape_in) > 1,
        mats=mats,
    )


def _conv_matrices(m: nn.Module, shape_in, shape_out, transposed: bool = False) -> tuple:
    """A conv's (or transposed conv's) window over the positions, one matrix per spatial axis
    (n_out x n_in, entry: the taps joining the two positions over k), each from torch's own 1-D
    conv of the identity with a kernel of 1/k (so stride, padding, dilation and the padding mode
    are torch's); () where the shapes do not read as (channels, *positions)."""
    d = len(m.kernel_size)
    if len(shape_in) != d + 1 or len(shape_out) != d + 1:
        return ()
    mats = []
    for i in range(d):
        n_in, n_out = shape_in[1 + i], shape_out[1 + i]
        k, st, dil = m.kernel_size[i], m.stride[i], m.dilation[i]
        eye = torch.eye(n_in, dtype=torch.float64).reshape(n_in, 1, n_in)
        ker = torch.full((1, 1, k), 1.0 / k, dtype=torch.float64)
        try:
            if transposed:
                pad, extra = m.padding[i], m.output_padding[i]
                a = F.conv_transpose1d(eye, ker, stride=st, padding=pad, output_padding=extra, dilation=dil)
            elif isinstance(m.padding, str):
                if m.padding_mode != "zeros":
                    return ()
                a = F.conv1d(eye, ker, stride=st, padding=m.padding, dilation=dil)
            elif m.padding_mode != "zeros":
                padded = F.pad(eye, (m.padding[i],) * 2, mode=m.padding_mode)
                a = F.conv1d(padded, ker, stride=st, dilation=dil)
            else:
                a = F.conv1d(eye, ker, stride=st, padding=m.padding[i], dilation=dil)
        except (RuntimeError, NotImplementedError, ValueError):
            return ()
        if a.shape[-1] != n_out:
            return ()
        mats.append(a.reshape(n_in, n_out).T.numpy())
    return tuple(mats)


def _norm_node(m: nn.Module, name, inputs, shape_in) -> plans.GraphNode:
    """A normalisation's node: its gain and bias, and what one of its statistics is taken over
    (``plans.GraphNode``): batch norm over the batch (group 0); layer norm over its normalized
    shape, one offset per leading entry; group norm over a group's channels and positions;
    instance norm over one channel's positions."""
    gamma = getattr(m, "weight", None)
    beta = getattr(m, "bias", None)
    g2 = 1.0 if gamma is None else float(gamma.detach().double().pow(2).mean())
    b2 = 0.0 if beta is None else float(beta.detach().double().pow(2).mean())
    units = group = 0
    positions = math.prod(shape_in[1:]) if shape_in else 1
    if isinstance(m, nn.LayerNorm):
        units, group = math.prod(m.normalized_shape), m.normalized_shape[0]
    elif isinstance(m, nn.GroupNorm):
        group = m.num_channels // m.num_groups
        units = group * positions
    elif isinstance(m, (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)):
        units, group = positions, 1
    return plans.GraphNode(name, "norm", inputs, forward=g2, bias=b2, units=units, group=group)


def _transposed_node(m: nn.Module, shape_in, shape_out, name, inputs) -> plans.GraphNode:
    """A transposed conv (weight [c_in, c_out/groups, k...]): the adjoint of a conv, so each
    output element sums c_in (k/s)^d products on average -- q' = (||W||^2/c_out) T q with T its
    window over the positions (``_conv_matrices``: 1/s per axis inside the map) -- and each
    input element's gradient a row of c_out k^d weights: r = (||W||^2/c_in) T^T r'."""
    w = m.weight.detach().double()
    sq, c_in = float(w.pow(2).sum()), w.shape[0]
    c_out = shape_out[0]
    bias = 0.0 if m.bias is None else float(m.bias.detach().double().pow(2).sum()) / c_out
    mats = _conv_matrices(m, shape_in, shape_out, transposed=True)
    numel_in, numel_out = math.prod(shape_in), math.prod(shape_out)
    return plans.GraphNode(
        name,
        "dense",
        inputs,
        forward=sq / c_out if mats else sq * numel_in / (c_in * numel_out),
        backward=sq / c_in,
        bias=bias,
        width=c_out,
        mats=mats,
    )


def _as_module(gm: fx.GraphModule, n: fx.Node) -> nn.Module | None:
    """The module a pooling/interpolation node applies (a call of ``F.avg_pool2d`` and its kin
    made into the module with its arguments), or None where its arguments are not constants."""
    if n.op == "call_module":
        return gm.get_submodule(n.target)
    cls = POOL_FUNCTIONS.get(n.target) if n.op == "call_function" else None
    if cls is None:
        return None
    try:
        kw = dict(n.normalized_arguments(gm, normalize_to_only_use_kwargs=True).kwargs)
    except Exception:
        return None
    kw.pop("input", None)
    if cls is nn.Upsample and kw.pop("antialias", False):
        return None
    if any(isinstance(v, fx.Node) for v in kw.values()):
        return None
    try:
        return cls(**kw)
    except (TypeError, ValueError):
        return None


def _per_axis(v, d: int) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * d


def _axis_matrices(m, shape_in, shape_out) -> list[np.ndarray] | None:
    """The per-channel map of a separable pooling or interpolation module as one matrix per
    spatial axis (n_out x n_in), each the module's own 1-D operation applied to the identity (so
    borders, padding, ceil mode and align_corners are torch's); None where not separable here."""
    d = len(shape_in) - 1 if isinstance(m, nn.Upsample) else int(type(m).__name__[-2])
    if len(shape_in) != len(shape_out) or len(shape_in) < d + 1 or shape_in[:-d] != shape_out[:-d]:
        return None
    out = []
    for i in range(d):
        n_in, n_out = shape_in[len(shape_in) - d + i], shape_out[len(shape_out) - d + i]
        eye = torch.eye(n_in, dtype=torch.float64).reshape(n_in, 1, n_in)
        if isinstance(m, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)):
            if m.divisor_override:
                return None
            k, st, pad = (_per_axis(v, d)[i] for v in (m.kernel_size, m.stride or m.kernel_size, m.padding))
            a = F.avg_pool1d(eye, k, st, pad, m.ceil_mode, m.count_include_pad)
        elif isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)):
            a = F.adaptive_avg_pool1d(eye, n_out)
        else:  # nn.Upsample: separable per axis for these modes
            mode = {"nearest": "nearest", "nearest-exact": "nearest-exact"}.get(m.mode)
            if m.mode in ("linear", "bilinear", "trilinear"):
                mode = "linear"
            if mode is None:
                return None
            sf = None if m.scale_factor is None else _per_axis(m.scale_factor, d)[i]
            ac = m.align_corners if mode == "linear" else None
            kw = {"size": n_out}
            if sf is not None:
                kw = {"scale_factor": sf, "recompute_scale_factor": m.recompute_scale_factor}
            a = F.interpolate(eye, mode=mode, align_corners=ac, **kw)
        if a.shape[-1] != n_out:
            return None
        out.append(a.reshape(n_in, n_out).T.numpy())
    return out


def _mix_node(label, inputs, mats: list[np.ndarray]) -> plans.GraphNode:
    """A fixed per-channel linear map A (the Kronecker product of ``mats``) as a ``mix`` node:
    for inputs whose fluctuations are independent across positions and whose offsets are
    shared, q' = A^2 (q - k) + (A 1)^2 k per output position, and back r = (A^2)^T (r' - rk') +
    (A^T 1)^2 rk' (``plans.predict_graph``); and o, the mean entry of A^T A off its diagonal,
    which every pair of inputs shares of the fluctuations' gradient (1/P^2 for a global mean of
    P positions: every position receives the same gradient)."""
    fro_all = ones_all = 1.0
    n_in_all = 1
    for A in mats:
        fro_all *= float((A * A).sum())
        ones_all *= float((A.sum(1) ** 2).sum())  # 1^T A^T A 1, the sum of all its entries
        n_in_all *= A.shape[1]
    pairs = n_in_all * (n_in_all - 1)
    cross = (ones_all - fro_all) / pairs if pairs else 0.0
    return plans.GraphNode(label, "mix", inputs, backward_cross=cross, mats=tuple(mats))


def _mean_matrices(n: fx.Node, shape_in) -> list[np.ndarray] | None:
    """A mean over positions (``x.mean((2, 3))``, ``torch.mean``): an averaging row for each
    reduced axis, the identity for the others; None when the dims are not constants or include
    the batch or the channel axis (dim 1 is the channels of a conv map but the positions of a
    token sequence: not guessed)."""
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    if isinstance(dims, int):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)) or not dims or not all(isinstance(v, int) for v in dims):
        return None
    rank = len(shape_in) + 1
    dims = {v % rank for v in dims}
    if min(dims) < 2:
        return None
    return [
        np.full((1, shape_in[v - 1]), 1.0 / shape_in[v - 1]) if v in dims else np.eye(shape_in[v - 1])
        for v in range(2, rank)
    ]


def _maxpool_node(m, label, inputs, shape_in, shape_out, source: plans.GraphNode | None) -> plans.GraphNode:
    """A max pooling of P = the kernel's elements (adaptive: the largest bin) after a
    nondecreasing activation (max phi(z) = phi(max z)) or of a Gaussian state (a dense or norm
    output); else no map."""
    if getattr(m, "return_indices", False) or source is None:
        return plans.GraphNode(label, "unknown", inputs, why="a max pooling with indices")
    d = int(type(m).__name__[-2])
    if type(m).__name__.startswith("Adaptive"):
        pool = math.prod(math.ceil(a / b) for a, b in zip(shape_in[-d:], shape_out[-d:]))
    else:
        pool = math.prod(_per_axis(m.kernel_size, d))
    ratio = math.prod(shape_out) / math.prod(shape_in)
    mats = ()
    if type(m).__name__.startswith("Adaptive"):
        mats = _axis_matrices(_ADAPTIVE_AVG[d](1), shape_in, shape_out)
    elif _per_axis(m.dilation, d) == (1,) * d:
        avg = _AVG[d](m.kernel_size, m.stride, m.padding, m.ceil_mode, count_include_pad=False)
        mats = _axis_matrices(avg, shape_in, shape_out)
    mats = tuple(mats or ())
    if source.op == "act" and _nondecreasing(source.fn[0]):
        return plans.GraphNode(label, "maxpool", inputs, backward=ratio, pool=pool, fn=source.fn, mats=mats)
    if source.op in ("dense", "norm"):
        return plans.GraphNode(label, "maxpool", inputs, backward=ratio, pool=pool, mats=mats)
    return plans.GraphNode(label, "unknown", inputs, why=f"a max pooling after {source.name}")


_AVG = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}
_ADAPTIVE_AVG = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}


def _nondecreasing(phi) -> bool:
    z = np.linspace(-50.0, 50.0, 4001)
    return bool(np.all(np.diff(phi(z)) >= -1e-12))


def _relu(z):
    return np.maximum(z, 0.0), (z > 0.0).astype(np.float64)


def _leaky(slope: float):
    return lambda z: (np.where(z > 0.0, z, slope * z), np.where(z > 0.0, 1.0, slope))


def _tanh(z):
    t = np.tanh(z)
    return t, 1.0 - t * t


def _sigmoid(z):
    s = special.expit(z)
    return s, s * (1.0 - s)


def _silu(z):
    s = special.expit(z)
    return z * s, s * (1.0 + z * (1.0 - s))


def _gelu(z):
    c = special.ndtr(z)
    return z * c, c + z * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _numpy_activation(n: fx.Node, m: nn.Module | None):
    """(phi, phi') of an ``act`` node in numpy where the function is one of the common ones
    (ReLU, leaky ReLU, tanh, sigmoid, SiLU, exact GELU): the quadratures of the moment maps
    evaluate it on 65,536 points a call, and the generic path (torch, with autograd for phi') is
    a third of a small model's probe; else ``_numpy_fn`` of ``_activation``.  The same values to
    float64 rounding (tests/kinds/test_module.py)."""
    both = None
    if m is not None:
        if type(m) is nn.ReLU:
            both = _relu
        elif type(m) is nn.LeakyReLU:
            both = _leaky(float(m.negative_slope))
        elif type(m) is nn.GELU and m.approximate == "none":
            both = _gelu
        else:
            both = {nn.Tanh: _tanh, nn.Sigmoid: _sigmoid, nn.SiLU: _silu}.get(type(m))
    elif not [a for a in n.args[1:] if not isinstance(a, fx.Node)] and not set(n.kwargs) - {"inplace"}:
        key = n.target if n.op == "call_function" else getattr(torch, n.target, None)
        both = {
            torch.relu: _relu,
            F.relu: _relu,
            torch.tanh: _tanh,
            torch.sigmoid: _sigmoid,
            F.silu: _silu,
            F.gelu: _gelu,
        }.get(key)
    if both is None:
        return _numpy_fn(_activation(n, m))
    return (lambda z: both(np.asarray(z, dtype=np.float64))[0]), (
        lambda z: both(np.asarray(z, dtype=np.float64))[1]
    )


def _activation(n: fx.Node, m: nn.Module | None):
    """The elementwise function an ``act`` node applies: the module, or the function or tensor
    method with the node's constant arguments (in-place flags dropped)."""
    if m is not None:  # in float64, as the quadrature evaluates it (PReLU's slope is a parameter)
        return copy.deepcopy(m).double()
    if n.op == "call_method":
        return ACTIVATION_METHODS[n.target]
    fn = ACTIVATION_FUNCTIONS[n.target]
    kw = {k: v for k, v in n.kwargs.items() if k != "inplace"}
    extra = [a for a in n.args[1:] if not isinstance(a, fx.Node)]
    return lambda t: fn(t, *extra, **kw)


def _constant_factor(n: fx.Node) -> float | None:
    """c of ``c * h``, ``h * c`` or ``h / c`` (c a Python number), else None."""
    a = n.args
    if len(a) != 2 or n.kwargs:
        return None
    if n.target in DIV_FUNCTIONS or n.target in ("div", "div_", "truediv"):
        return 1.0 / float(a[1]) if isinstance(a[1], (int, float)) and a[1] != 0 else None
    consts = [v for v in a if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return float(consts[0]) if len(consts) == 1 and any(isinstance(v, fx.Node) for v in a) else None


def _root(j: int, nodes: list, fx_of: list) -> tuple[int, float]:
    """A node as c times an earlier node whose elements it keeps in place: through constant
    scalings and element-preserving identities (nn.Identity, dropout -- off in a probe --,
    ``contiguous``, ``clone``), not through reshapes that move elements (a transpose)."""
    c = 1.0
    while True:
        n = fx_of[j]
        ins = nodes[j].inputs
        if nodes[j].op == "scale" and len(ins) == 1:
            c *= _constant_factor(n)
        elif nodes[j].op == "identity" and len(ins) == 1 and _keeps_elements(n, nodes[j], nodes[ins[0]]):
            pass
        else:
            return j, c
        j = ins[0]


def _keeps_elements(n: fx.Node, node, source) -> bool:
    same_shape = node.shape == source.shape
    if n.op == "call_module":
        return same_shape and n.target is not None and "flatten" not in type(n).__name__.lower()
    return same_shape and (n.target in ("contiguous", "clone") or n.target is F.dropout)


def _near(j: int, nodes: list) -> set[int]:
    """The nodes a state depends on without a random weight layer between: back from node j
    through every op, stopping at (and keeping) dense layers, whose zero-mean weights make
    their output uncorrelated with anything upstream (docs/theory.md §13)."""
    seen, stack = set(), [j]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        if nodes[i].op not in ("dense", "standardized"):
            stack += list(nodes[i].inputs)
    return seen


def _add_node(gm, n: fx.Node, label: str, index: dict, nodes: list, fx_of: list) -> plans.GraphNode:
    """A sum's node.  Of two states: ``add`` (independent summands, the cross term zero), unless
    both are one node times constants -- ``h + h``, ``h + 2 h``: exactly (c1 + c2) h, a
    ``scale`` --, or they share a node with no random weight layer between it and either
    summand (``h + relu(h)``): a cross term no map follows, named.  Of a state and a constant
    (a number, or a tensor of the model's such as a learned positional embedding): ``offset``.
    """
    if n.kwargs:  # torch.add(..., alpha=...)
        return plans.GraphNode(label, "unknown", (), why=f"{label} with alpha")
    states = [a for a in n.args if isinstance(a, fx.Node) and nodes[index[a]].op != "const"]
    consts = [a for a in n.args if not (isinstance(a, fx.Node) and nodes[index[a]].op != "const")]
    ins = tuple(index[a] for a in states)
    if len(states) == 2:
        (ra, ca), (rb, cb) = (_root(j, nodes, fx_of) for j in ins)
        if ra == rb:
            return plans.GraphNode(label, "scale", (ra,), forward=(ca + cb) ** 2)
        shared = _near(ins[0], nodes) & _near(ins[1], nodes)
        if shared:
            via = nodes[max(shared)].name
            why = f"{label} of two summands that share {via} with no weight layer between (their cross term)"
            return plans.GraphNode(label, "unknown", ins, why=why)
        return plans.GraphNode(label, "add", ins)
    if len(states) == 1 and len(consts) == 1:
        c = consts[0]
        if isinstance(c, fx.Node):  # a tensor the model holds (get_attr)
            try:
                t = operator.attrgetter(c.target)(gm).detach().double()
            except AttributeError:
                return plans.GraphNode(label, "unknown", ins, why=f"{label} with a constant")
            mean, square = float(t.mean()), float(t.pow(2).mean())
        elif isinstance(c, (int, float)) and not isinstance(c, bool):
            mean, square = float(c), float(c) ** 2
        else:
            return plans.GraphNode(label, "unknown", ins, why=f"{label} with a constant")
        if square == 0.0:
            return plans.GraphNode(label, "identity", ins)
        return plans.GraphNode(label, "offset", ins, forward=square, bias=mean)
    return plans.GraphNode(label, "unknown", ins, why=f"{label} of {len(states)} states")


@dataclass
class Traced:
    """A model traced by ``trace_graph``: its graph of moment maps (``nodes``), the last node
    inside every module path (``last_in``: a site's node), and the ``Survey`` the shape
    propagation's forward of two samples gives for free; ``why`` (and no nodes) where torch.fx
    could not trace it."""

    nodes: list | None
    last_in: dict
    why: str = ""
    survey: Survey | None = None

    def where(self, sites: list[str]) -> list[int | None]:
        return [self.last_in.get(s) for s in sites]


def trace(model: nn.Module, x: torch.Tensor, sites: list[str]):
    """The model's graph of moment maps and each site's node (None where the site is not in the
    graph), or (None, None, why) when torch.fx cannot trace it (``trace_graph``)."""
    t = trace_graph(model, x)
    return (None, None, t.why) if t.nodes is None else (t.nodes, t.where(sites), "")


def _survey_of(gm: fx.GraphModule, out, rows_: int, what: str) -> Survey:
    """``survey``'s record from a shape propagation: its modules' outputs (bytes per sample),
    the module paths it ran (calls and their enclosing modules), and its output."""
    total, called = 0, set()
    for n in gm.graph.nodes:
        called |= set((n.meta.get("nn_module_stack") or {}).keys())
        if n.op == "call_module":
            called.add(n.target)
            meta = n.meta.get("tensor_meta")
            if meta is not None and hasattr(meta, "shape"):
                total += math.prod(meta.shape) * meta.dtype.itemsize
    y = output_tensor(out)
    check_finite(y, f"{what}'s output on the probe's inputs")
    return Survey(total // max(rows_, 1), frozenset(called), y[0].numel(), output_choice(out))


def trace_graph(model: nn.Module, x, what: str = "the model") -> Traced:
    """``Traced``: torch.fx's graph of the model with its shapes (a forward of two samples, no
    graph -- a batch norm needs two) made into moment maps."""
    two = rows(x, 0, 2) if isinstance(x, tuple) else (x[:2],)
    try:
        gm = fx.symbolic_trace(model)
        # ShapeProp prints the traceback of a failing node itself: the failure is said in one line
        with torch.no_grad(), Deterministic(), contextlib.redirect_stderr(io.StringIO()):
            out = ShapeProp(gm).propagate(*two)
    except Exception as exc:
        return Traced(
            None, {}, f"torch.fx could not trace the model ({type(exc).__name__}: {_first_line(exc)})"
        )
    try:
        seen = _survey_of(gm, out, two[0].shape[0], what)
    except SigpropError as exc:
        if "NaN" in exc.message:
            raise
        seen = None  # an output sigprop cannot read: ``survey`` says why on the model itself
    index: dict[fx.Node, int] = {}
    nodes: list[plans.GraphNode] = []
    fx_of: list[fx.Node] = []  # each graph node's fx node
    last_in: dict[str, int] = {}  # a module path -> the last node inside it

    def shape(n):
        meta = n.meta.get("tensor_meta")
        return tuple(meta.shape[1:]) if meta is not None and hasattr(meta, "shape") else None

    for n in gm.graph.nodes:
        tensor_inputs = tuple(
            index[a] for a in n.all_input_nodes if a in index and nodes[index[a]].op != "const"
        )
        label = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
        k = op_kind(gm, n)
        m = gm.get_submodule(n.target) if n.op == "call_module" else None
        node: plans.GraphNode
        if k in ("input", "const"):
            node = plans.GraphNode(n.name, k, ())
        elif k == "output":
            node = plans.GraphNode(n.name, "output", tensor_inputs[:1])
        elif k == "dense" and shape(n.args[0]) and shape(n):
            node = _dense_node(m, shape(n.args[0]), shape(n), n.target, tensor_inputs)
        elif k == "transposed" and shape(n.args[0]) and shape(n) and m.groups == 1:
            node = _transposed_node(m, shape(n.args[0]), shape(n), n.target, tensor_inputs)
        elif k == "norm":
            node = _norm_node(m, n.target, tensor_inputs, shape(n.args[0]))
        elif k == "act":
            node = plans.GraphNode(label, "act", tensor_inputs, fn=_numpy_activation(n, m))
        elif k == "identity":
            node = plans.GraphNode(label, "identity", tensor_inputs)
        elif k == "mix" and shape(n.args[0]) and shape(n) and len(tensor_inputs) == 1:
            is_mean = n.op == "call_method" or n.target is torch.mean
            pm = None if is_mean else _as_module(gm, n)
            mats = None
            if is_mean:
                mats = _mean_matrices(n, shape(n.args[0]))
            elif pm is not None:
                mats = _axis_matrices(pm, shape(n.args[0]), shape(n))
            what = "a mean over these dims" if is_mean else type(pm).__name__ if pm else "its arguments"
            why = f"{label} ({what})"
            node = (
                plans.GraphNode(label, "unknown", tensor_inputs, why=why)
                if mats is None
                else _mix_node(label, tensor_inputs, list(mats))
            )
        elif k == "maxpool" and shape(n.args[0]) and shape(n) and len(tensor_inputs) == 1:
            pm = _as_module(gm, n)
            source = nodes[tensor_inputs[0]]
            node = (
                plans.GraphNode(label, "unknown", tensor_inputs, why=label)
                if pm is None
                else _maxpool_node(pm, label, tensor_inputs, shape(n.args[0]), shape(n), source)
            )
        elif (
            k == "cat"
            and shape(n)
            and all(shape(a) for a in n.all_input_nodes)
            and len(tensor_inputs) == len(n.all_input_nodes)
        ):  # each input's elements, unchanged: q the units-weighted mean, each gradient its part
            sizes = [math.prod(shape(a)) for a in n.all_input_nodes]
            node = plans.GraphNode(label, "cat", tensor_inputs, shares=tuple(z / sum(sizes) for z in sizes))
        elif k == "add":
            node = _add_node(gm, n, label, index, nodes, fx_of)
        elif k in ("mul", "div"):
            c = _constant_factor(n)
            if len(tensor_inputs) == 1 and c is not None:
                node = plans.GraphNode(label, "scale", tensor_inputs, forward=c**2)
            else:
                what = "a product of two states" if k == "mul" else "a division by a state"
                node = plans.GraphNode(label, "unknown", tensor_inputs, why=what)
        else:
            node = plans.GraphNode(
                label, "unknown", tensor_inputs, why=type(m).__name__ if m is not None else label
            )
        index[n] = len(nodes)
        fx_of.append(n)
        nodes.append(dataclasses.replace(node, shape=shape(n) or ()))
        for path in (n.meta.get("nn_module_stack") or {}).keys():
            last_in[path] = index[n]
        if n.op == "call_module":
            last_in[n.target] = index[n]
    return Traced(nodes, last_in, "", seen)
