"""The autograd oracle (../shared/STYLE.md habit 10): each net written as plain torch on the explicit
formulas -- w = g v / ||v||, h^b = S h^{b-1} + alpha F(h^{b-1}), BN in training mode -- from the
parameters the walker kept, so the hand-written forward and backward can be compared with
torch.autograd on small nets."""

import torch
import torch.nn.functional as F

from sigprop import theory


def oracle_ratios(params, x, e):
    """Plain autograd on the explicit WN formula w = g v / ||v||: forward ||h^l||/||x|| and
    backward ||dl/da^l||/||e|| with dl/da^L = e."""
    x = x.detach().clone().requires_grad_(True)
    h = x
    pre = []
    hs = []
    for p in params:
        v = p.v.detach().clone()
        if p.g is not None:
            w = p.g.detach().unsqueeze(1) * v / torch.linalg.vector_norm(v, dim=1, keepdim=True)
        else:
            w = v
        a = h @ w.T
        if p.bias is not None:
            a = a + p.bias.detach()
        a.retain_grad()
        pre.append(a)
        h = torch.relu(a)
        hs.append(h)
    pre[-1].backward(e)
    xn = torch.linalg.vector_norm(x, dim=1)
    en = torch.linalg.vector_norm(e, dim=1)
    fwd = torch.stack([torch.linalg.vector_norm(hh, dim=1) / xn for hh in hs])
    bwd = torch.stack([torch.linalg.vector_norm(a.grad, dim=1) / en for a in pre])
    return fwd, bwd, pre


def _weight(p):
    v = p.v.detach().clone()
    if p.g is None:
        return v
    return p.g.detach().unsqueeze(1) * v / torch.linalg.vector_norm(v, dim=1, keepdim=True)


def _apply(p, h):
    a = h @ _weight(p).T
    return a if p.bias is None else a + p.bias.detach()


def oracle_resnet(params, x, e):
    """Plain autograd on the explicit formula h^b = S h^{b-1} + alpha F(h^{b-1}), w = g v/||v||:
    forward ||h^b||/||x||, backward ||dl/dh^b||/||e|| with l = sum_i <e_i, h^E_i>, branch ratios,
    and every pre-activation (to check the data-dependent calibration)."""
    h = x.detach().clone().requires_grad_(True)
    hs, branch, pre = [h], [], []
    for bp in params:
        z = hs[-1]
        for j, p in enumerate(bp.branch):
            z = _apply(p, z)
            pre.append(z)
            if j < len(bp.branch) - 1:
                z = torch.relu(z)
        s = hs[-1] if bp.projection is None else _apply(bp.projection, hs[-1])
        if bp.projection is not None:
            pre.append(s)
        branch.append(torch.linalg.vector_norm(bp.alpha * z, dim=1) / torch.linalg.vector_norm(hs[-1], dim=1))
        h = s + bp.alpha * z
        h.retain_grad()
        hs.append(h)
    for t in hs:
        t.retain_grad()
    (hs[-1] * e).sum().backward()
    xn = torch.linalg.vector_norm(x, dim=1)
    en = torch.linalg.vector_norm(e, dim=1)
    fwd = torch.stack([torch.linalg.vector_norm(t, dim=1) / xn for t in hs])
    bwd = torch.stack([torch.linalg.vector_norm(t.grad, dim=1) / en for t in hs])
    return fwd.detach(), bwd.detach(), torch.stack(branch).detach(), [p.detach() for p in pre]


def oracle_bn(params, x, e, eps=theory.BN_EPS):
    h = x.detach().clone().requires_grad_(True)
    hs = [h]
    for l, p in enumerate(params):
        y = F.batch_norm(hs[-1], None, None, training=True, eps=eps)
        z = torch.relu(y) @ p.v.detach().T
        h = z if l == 0 else hs[-1] + z
        h.retain_grad()
        hs.append(h)
    (hs[-1] * e).sum().backward()
    xn = torch.linalg.vector_norm(x, dim=1)
    en = torch.linalg.vector_norm(e, dim=1)
    fwd = torch.stack([torch.linalg.vector_norm(t, dim=1) / xn for t in hs])
    bwd = torch.stack([torch.linalg.vector_norm(t.grad, dim=1) / en for t in hs])
    return fwd.detach(), bwd.detach(), [t.detach() for t in hs]
