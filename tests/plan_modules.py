"""sigprop's own nets as ordinary ``nn.Module``s with the weights a walk kept (issue 29, item 5a):
the module path (``sigprop.probe_module``: hooks, autograd, per-element ratios) must measure
what the walker measures on the same weights, inputs and errors.  Built from a plan's steps
(Linear/Conv with a ReLU or not, Record, Open ... Close with a projection) and the walk's
``kept`` units, in the walker's unit order: w = scale * v (WN: scale = g/||v||), its bias."""

from __future__ import annotations

import torch
import torch.nn as nn

from sigprop import plans


def _layer(step, p) -> nn.Module:
    """A Linear or Conv2d holding draw 0 of the kept parameters ``p``."""
    v = p.v[0] if p.v.dim() == 3 else p.v
    scale = p.scale[0] if p.scale.dim() == 2 else p.scale
    w = (scale.unsqueeze(1) * v).detach()
    bias = None if p.bias is None else (p.bias[0] if p.bias.dim() == 2 else p.bias).detach()
    if isinstance(step, plans.Conv):
        c_in, k = step.shape_in[0], step.kernel
        m = nn.Conv2d(c_in, step.role.fan_out, k, step.stride, step.padding, bias=bias is not None)
        m.weight.data.copy_(w.reshape(step.role.fan_out, c_in, k, k))
    else:
        m = nn.Linear(step.role.fan_in, step.role.fan_out, bias=bias is not None)
        m.weight.data.copy_(w)
    if bias is not None:
        m.bias.data.copy_(bias)
    return m


class Unit(nn.Module):
    """A layer and its ReLU: sites ``layer`` (the pre-activation, where the walker reads the
    gradient) and ``act`` (where it reads the state)."""

    def __init__(self, layer: nn.Module, relu: bool) -> None:
        super().__init__()
        self.layer, self.act = layer, (nn.ReLU() if relu else nn.Identity())

    def forward(self, x):
        return self.act(self.layer(x))


class Block(nn.Module):
    """h' = S h + alpha F(h): the branch's layers (a ReLU after those flagged), the skip the
    identity or a projection."""

    def __init__(self, layers, relus, projection, alpha: float) -> None:
        super().__init__()
        self.branch = nn.ModuleList(layers)
        self.relus = list(relus)
        self.projection = projection
        self.alpha = float(alpha)

    def forward(self, h):
        z = h
        for layer, relu in zip(self.branch, self.relus):
            z = layer(z)
            if relu:
                z = torch.relu(z)
        skip = h if self.projection is None else self.projection(h)
        return skip + self.alpha * z


def plan_module(steps, kept) -> tuple[nn.Sequential, list, list]:
    """The plan as a module, and the sites whose forward and backward ratios are the walker's
    recorded entries (in order; None where the module has no such site).  A net recorded at its
    pre-activations (the MLP's, the CNN's: the error e is dl/da^L) ends at its last
    pre-activation, without the last ReLU, whose state is then not a site."""
    units: list[nn.Module] = []
    fwd_sites, bwd_sites = [], []
    i = 1 if isinstance(steps[0], plans.Record) else 0
    k = 0
    while i < len(steps):
        s = steps[i]
        if isinstance(s, (plans.Linear, plans.Conv)):
            units.append(Unit(_layer(s, kept[k].params), s.relu))
            fwd_sites.append(f"{len(units) - 1}.act")
            pre = steps[i + 1].pre_activation or s.relu
            bwd_sites.append(f"{len(units) - 1}.layer" if pre else f"{len(units) - 1}.act")
            i += 2
        elif isinstance(s, plans.Open):
            j = next(t for t in range(i, len(steps)) if isinstance(steps[t], plans.Close))
            close, inner = steps[j], steps[i + 1 : j]
            bp = kept[k].params
            layers = [_layer(st, p) for st, p in zip(inner, bp.branch)]
            proj = None if close.projection is None else _layer(close.projection, bp.projection)
            units.append(Block(layers, [st.relu for st in inner], proj, bp.alpha))
            fwd_sites.append(str(len(units) - 1))
            bwd_sites.append(str(len(units) - 1))
            i = j + 2
        else:
            raise ValueError(f"no module for step {s!r}")
        k += 1
    last = steps[-1]
    if isinstance(last, plans.Record) and last.pre_activation and isinstance(units[-1], Unit):
        units[-1].act = nn.Identity()
        fwd_sites[-1] = None
    return nn.Sequential(*units), fwd_sites, bwd_sites
