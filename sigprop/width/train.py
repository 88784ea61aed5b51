"""One point of a coordinate check: a model at one width and seed, trained ``steps`` optimizer
steps on a fixed random batch, each site's output recorded before every step (step 0: at init)
as ``mup``'s coordinate check does (Yang et al. 2021, section 6 and appendix D.1): the mean |x|
(``l1``, mup's statistic), the root mean square (``rms``) and the change from init per element
(``delta``: rms of h_t - h_0)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from sigprop.errors import SigpropError
from sigprop.model.build import output_tensor
from sigprop.model.forward import call
from sigprop.width import optimizers
from sigprop.width import params as P
from sigprop.width.attention import AttentionScale

STATS = ("l1", "rms", "delta")
#: the model's output, a site of its own where no module's site returns it (a readout written as
#: ``h @ W``, a multiplier after the last layer)
OUTPUT = "(output)"


def _same(y: torch.Tensor, h: torch.Tensor) -> bool:
    """Whether a site's recorded output is the model's output: the same storage (a view of it) or
    the same values (``h * 1.0``)."""
    if y.numel() != h.numel():
        return False
    return y.data_ptr() == h.data_ptr() or torch.equal(y.detach().reshape(-1), h.reshape(-1))


@dataclass
class Site:
    """A site: the output of a module that owns a weight of a growing role."""

    name: str
    role: str


@dataclass
class Point:
    """The records of one (parametrization, width, seed): per site, per step, each statistic."""

    param: str
    width: int
    seed: int
    sites: list[Site]
    #: stats[statistic][site][step]
    stats: dict[str, list[list[float]]] = field(default_factory=dict)
    loss: list[float] = field(default_factory=list)
    #: the rows the loss averages over (examples x tokens): the first step's kernel sums them
    rows: int = 0


def sites(model: nn.Module, roles_: list[P.Role]) -> list[tuple[str, nn.Module, str]]:
    """(path, module, role) of every module owning a matrix of a growing role (its own, not its
    children's), in ``named_modules`` order; the role is its first such matrix's."""
    role_of = {r.name: r.role for r in roles_}
    out = []
    for path, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            role = role_of.get(f"{path}.{pname}" if path else pname)
            if p.dim() >= 2 and role in ("input", "hidden", "output"):
                out.append((path, m, role))
                break
    return out


class _Recorder:
    """Forward hooks keeping each site's output of the current forward (a reused module: its
    first call)."""

    def __init__(self, found) -> None:
        self.out: dict[str, torch.Tensor] = {}
        self.handles = [m.register_forward_hook(self._hook(path)) for path, m, _ in found]

    def _hook(self, path):
        def hook(_m, _inp, y):
            if path in self.out:
                return
            try:  # the probe's reader of a module's result; a result with no float tensor is no site
                self.out[path] = output_tensor(y).detach()
            except SigpropError:
                pass

        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def loss_of(y: torch.Tensor, target: torch.Tensor, loss: str) -> torch.Tensor:
    """Cross-entropy over the output's last dimension against random labels (mup's default), or
    half the mean squared error against random targets."""
    if y.dtype not in (torch.float32, torch.float64):  # half precision: the loss in float32
        y = y.float()
    if loss == "xent":
        return F.cross_entropy(y.reshape(-1, y.shape[-1]), target.reshape(-1))
    return 0.5 * (y - target.to(y.dtype)).pow(2).mean()


def run_point(
    model: nn.Module,
    roles_: list[P.Role],
    *,
    param: str,
    optimizer: str,
    lr: float,
    ratio: float,
    steps: int,
    x: torch.Tensor,
    target_of,
    loss: str,
    gen: torch.Generator,
    width: int,
    seed: int,
    attention: list[int] | None = None,
    zero_readout: bool = False,
    on_step=None,
    written: list[tuple[int, int]] | None = None,
    make_optimizer=None,
    output_site: bool = False,
) -> Point:
    """Apply ``param`` to ``model`` and train it ``steps`` steps on ``x``, recording each site.
    ``attention``: the head dimensions of the model's attention calls at the base width (None or
    empty: none); each call's logits are then sites too (``attn-logits.i``, role ``logits``), and
    under μP each call is rescaled to 1/d (sigprop/width/attention.py), and so is each call
    written out by hand (``written``: its product's order and d at the base width; no logits
    site).  ``on_step()`` is called after each of the ``steps + 1`` forwards (a step's time:
    sigprop/width/cost.py).  ``make_optimizer``: the model's own optimizer (``--param as-is``),
    called as ``make_optimizer(model.parameters(), lr=lr)``, in place of torch.optim's.
    ``output_site``: the model's output is a site of its own (``output_is_a_site``)."""
    P.apply(model, roles_, param, optimizer, ratio, gen, zero_readout)
    model.train()
    opt = _optimizer(model, roles_, param, optimizer, lr, ratio, make_optimizer)
    found = sites(model, roles_)
    rec = _Recorder(found)
    point = Point(param, width, seed, [])  # its sites: those the first forward reaches
    first: dict[str, torch.Tensor] = {}
    target = None
    try:
        for t in range(steps + 1):
            rec.out.clear()
            mode = _attention_mode(attention, written, param)
            with mode:
                y = output_tensor(call(model, x))
            if target is None:
                target = target_of(y)
                point.rows = y[..., 0].numel() if loss == "xent" else y.shape[0]
            value = loss_of(y, target, loss)
            if not math.isfinite(float(value.detach())):
                raise SigpropError(
                    f"the loss is not finite at width {width}, step {t} ({param}, lr {lr:g}): the steps "
                    "diverged; lower --lr",
                    field="lr",
                )
            point.loss.append(float(value.detach()))
            out = dict(rec.out)
            for i, logits in enumerate(getattr(mode, "logits", ())):
                out[f"attn-logits.{i}"] = logits
            out[OUTPUT] = y.detach()
            if t == 0:  # a module that owns a weight but is not called (MHA's out_proj) is no site
                found = _first_sites(point, found, rec.out, out, output_site)
            _record(point, found, out, first, t)
            if t < steps:
                opt.zero_grad(set_to_none=True)
                value.backward()
                opt.step()
            if on_step is not None:
                on_step()
    finally:
        rec.close()
    return point


def output_is_a_site(model: nn.Module, roles_: list[P.Role], x: torch.Tensor) -> bool:
    """Whether the model's output needs a site of its own: no module's site returns it (read once,
    by the client, at a width other than the base -- where a width multiplier of the model's own
    is 1 and its output equals its readout's -- so that every point has the same sites)."""
    rec = _Recorder(sites(model, roles_))
    try:
        with torch.no_grad():
            y = output_tensor(call(model, x))
    finally:
        rec.close()
    return not any(_same(y, h) for h in rec.out.values())


def _first_sites(point: Point, found, modules: dict, out: dict, output_site: bool) -> list:
    """The sites the first forward reached (``point.sites``, its statistics begun): the modules
    called, each attention call's logits, and the model's output where no module's site returns
    it (``output_site``: the output is always a site)."""
    found = [(p, r) for p, _, r in found if p in modules]
    found += [(name, "logits") for name in out if name.startswith("attn-logits.")]
    if output_site:
        found.append((OUTPUT, "output"))
    point.sites = [Site(p, r) for p, r in found]
    point.stats = {s: [[] for _ in found] for s in STATS}
    return found


def _optimizer(model: nn.Module, roles_, param: str, optimizer: str, lr: float, ratio: float, make=None):
    """The point's optimizer: the model's own (``make``), else torch.optim's SGD or Adam with one
    parameter group per role's learning rate."""
    if make is not None:
        return _own_optimizer(make, model, lr)
    groups = P.groups(model, roles_, param, optimizer, lr, ratio)
    return optimizers.OPTIMIZERS[optimizer].make(groups)


def _attention_mode(attention, written, param: str):
    """The forward's attention mode: each call's logits recorded and, under μP, rescaled
    (sigprop/width/attention.py); none without attention."""
    if not (attention or written):
        return nullcontext()
    return AttentionScale(attention or [], rescale=param == "mup", record=True, written=written)


def _own_optimizer(make, model: nn.Module, lr: float):
    """The model's own optimizer over its parameters, checked to be one (``step``, ``zero_grad``)."""
    try:
        opt = make(model.parameters(), lr=lr)
    except Exception as exc:
        raise SigpropError(
            f"the model's optimizer failed as CALLABLE(model.parameters(), lr={lr:g}): "
            f"{type(exc).__name__}: {exc}",
            field="optimizer",
        ) from None
    if not (callable(getattr(opt, "step", None)) and callable(getattr(opt, "zero_grad", None))):
        raise SigpropError(
            f"the model's optimizer returned a {type(opt).__name__}, not an optimizer (no step, zero_grad)",
            field="optimizer",
        )
    return opt


def _record(point: Point, found, out: dict, first: dict, t: int) -> None:
    """Each site's statistics of this forward, in float64 whatever the model's dtype (a site the
    forward skipped this time: nan)."""
    for i, (path, _) in enumerate(found):
        h = out.get(path)
        if h is None:
            for s in STATS:
                point.stats[s][i].append(float("nan"))
            continue
        h = h.double()
        if t == 0:
            first[path] = h
        point.stats["l1"][i].append(float(h.abs().mean()))
        point.stats["rms"][i].append(float(h.pow(2).mean().sqrt()))
        point.stats["delta"][i].append(float((h - first[path]).pow(2).mean().sqrt()))
