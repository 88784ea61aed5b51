"""Normalisations as traced ops (docs/theory.md §13): batch norm in training mode (statistics over
the batch: var = q - k, the units' offsets removed), layer, group and instance norm (per-sample
statistics over ``units`` elements holding ``group`` offsets); q' = mean gamma^2 + mean beta^2,
and backward r = (mean gamma^2/var) r' (the group's mean and the projection's directions out)."""

from __future__ import annotations

import math

import torch.nn as nn

from sigprop.model.graph import GraphNode, Part, centre_of, inverse_mean, map_op, merged, token_groups
from sigprop.model.ops.registry import TracedOp, register

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


def _norm_node(m: nn.Module, name, inputs, shape_in) -> GraphNode:
    """A normalisation's node: its gain and bias, and what one of its statistics is taken over
    (``GraphNode``): batch norm over the batch (group 0); layer norm over its normalized
    shape, one offset per leading entry; group norm over a group's channels and positions;
    instance norm over one channel's positions."""
    units = group = 0
    positions = math.prod(shape_in[1:]) if shape_in else 1
    if isinstance(m, nn.LayerNorm):
        units, group = math.prod(m.normalized_shape), m.normalized_shape[0]
    elif isinstance(m, nn.GroupNorm):
        group = m.num_channels // m.num_groups
        units = group * positions
    elif isinstance(m, (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)):
        units, group = positions, 1
    return norm_node(name, inputs, getattr(m, "weight", None), getattr(m, "bias", None), units, group)


def norm_node(name, inputs, gamma, beta, units: int, group: int) -> GraphNode:
    """A normalisation's node from its gain and offset (None: 1 and 0) and what one statistic is
    taken over (``_norm_node``; ATen's ``layer_norm``): their mean squares, ``gain_offset``."""
    g2 = 1.0 if gamma is None else float(gamma.detach().double().pow(2).mean())
    b2 = 0.0 if beta is None else float(beta.detach().double().pow(2).mean())
    return GraphNode(
        name, "norm", inputs, forward=g2, bias=b2, units=units, group=group, params=gain_offset(gamma, beta)
    )


def gain_offset(gamma, beta) -> tuple[float, float]:
    """A layer norm's gain's variance over its units and its offset's mean (what its output's
    token mean holds, ``_centre``)."""
    var = 0.0 if gamma is None else float(gamma.detach().double().var(unbiased=False))
    return var, 0.0 if beta is None else float(beta.detach().double().mean())


def per_token(nd: GraphNode) -> bool:
    """A layer norm over a token's last axis only (one statistic per token, over ``units``)."""
    return nd.group > 1 and nd.group == nd.units


def norm_variance(nd: GraphNode, q: float, m: float, k: float, s: Part | None = None) -> float:
    """The variance a normalisation divides by; of a token's units (``per_token``): q minus the
    token mean's second moment (``centre_of``: exactly 0 for a layer norm's output)."""
    if nd.group == 0:
        return q - k
    if s is not None and per_token(nd):
        return q - centre_of(s, nd.units)[0]
    return (q - k) * (1.0 - 1.0 / max(nd.units, 1)) + (k - m * m) * (1.0 - 1.0 / nd.group)


def _centre(nd: GraphNode, kept_k: float, kept_t: float) -> tuple | None:
    """The token means' moments of a per-token layer norm's output g x-hat + b: mean(b)^2 plus,
    x-hat summing to zero over its u units, var(g)/(u - 1) (times the normalised shared moment
    between two samples, two tokens)."""
    if not per_token(nd) or not isinstance(nd.params, tuple):
        return None
    var_g, b = nd.params
    w = var_g / (nd.units - 1)
    return (nd.units, b * b + w, b * b + w * kept_k, b * b + w * kept_t, 0.0)


register(
    TracedOp(
        "norm",
        lambda gm, n: n.op == "call_module" and isinstance(gm.get_submodule(n.target), NORM_MODULES),
        lambda t, n: _norm_node(t.module(n), n.target, t.inputs(n), t.shape(n.args[0])),
    )
)


def _forward(nd: GraphNode, i: int, fold) -> None:
    """Per channel (batch and instance norm) or over every part (layer and group norm)."""
    src = fold.states[nd.inputs[0]]
    # per channel, per group of tokens (each token its own statistics), or over them all
    parts = src if nd.group in (0, 1) or token_groups(src) else [merged(src)]
    out = []
    for s in parts:
        var = norm_variance(nd, s.q, s.mean, s.shared, s)
        if per_token(nd):  # what two samples', two tokens' units share beyond their token means
            _, ck, ct, _ = centre_of(s, nd.units)
            kept_k, kept_t = ((s.shared - ck) / var, (s.tok - ct) / var) if var > 0.0 else (0.0, 0.0)
        else:
            kept = lambda k: (k - s.mean**2) * (1.0 - 1.0 / nd.group) / var if nd.group and var > 0.0 else 0.0
            kept_k, kept_t = kept(s.shared), kept(s.tok)
        tokens = None if s.tokens is None else nd.forward * kept_t + nd.bias
        out.append(
            Part(
                s.share,
                nd.forward + nd.bias,
                0.0,
                nd.forward * kept_k + nd.bias,
                s.profile,
                tokens,
                s.axis,
                _centre(nd, kept_k, kept_t),
            )
        )
    fold.states[i] = out


def _backward(nd: GraphNode, i: int, g: list, fold) -> None:
    for j in nd.inputs:
        src = fold.states[j]
        parts = src if nd.group in (0, 1) or token_groups(src) else [merged(src)]
        out = []
        for k, (s, (r, rk, p)) in enumerate(zip(parts, g if len(g) == len(parts) else g[:1] * len(parts))):
            var = norm_variance(nd, s.q, s.mean, s.shared, s)
            if var <= 0.0:
                fold.poisoned[j] = True
                break
            ck = nd.forward / var * rk * (1.0 - 1.0 / nd.group) if nd.group else 0.0
            if nd.group == 0:  # batch statistics: a sample's own shared part is kept
                out.append((nd.forward / var * r, nd.forward / var * rk, p))
            elif per_token(nd) and len(parts) == len(g):  # less the gradient's token mean, its part along x
                rc, ra = fold.alignment(i, k, nd.units)
                wc, wa = fold.weights(i, k)
                _, _, ct, v = centre_of(s, nd.units)
                rho = (s.tok - ct) / var  # two tokens' cosine after it
                f = nd.forward * inverse_mean(var, v)  # E[1/var-hat] of a token's own variance
                ck = f * rk * (1.0 - (wc + wa * (2.0 - rho * rho)) / nd.units)
                out.append((f * (r - rc - ra), ck, p))
            else:  # the group's mean goes: 1/group of the shared part, 2 of `units` directions
                out.append((nd.forward / var * (r - rk) * (1.0 - 2.0 / max(nd.units, 2)) + ck, ck, p))
        if not fold.poisoned[j]:
            # a per-token norm's input gradient has no token mean and none along the input
            exact = per_token(nd) and len(parts) == len(g) and len(out) == len(src)
            fold.give(j, out, i, [(0.0, 0.0)] * len(out) if exact else None)


#: a normalisation's output does not move with its input's own direction (scale invariance), and
#: what it does move by is orthogonal to it: 0
map_op("norm", _forward, _backward, tangent=lambda nd, i, e, fold: 0.0 if nd.group else None)


# --------------------------------------------------------------------------------------------
# RMSNorm: x / rms(x) over the last dims, times a gain (no centring, no offset)
# --------------------------------------------------------------------------------------------
#: torch's eps of an RMSNorm given none (``F.rms_norm``, ``nn.RMSNorm``): float32's machine eps
RMS_DEFAULT_EPS = 1.1920928955078125e-07


def rms_node(name: str, inputs: tuple, weight, shape, eps=None) -> GraphNode:
    """An RMSNorm over ``shape`` (its last dims) with gain ``weight`` (None: 1) and ``eps``
    (None: torch's default): ``forward`` the gain's mean square, ``units`` the elements one
    statistic is taken over, ``bias`` the eps."""
    g2 = 1.0 if weight is None else float(weight.detach().double().pow(2).mean())
    e = RMS_DEFAULT_EPS if eps is None else float(eps)
    return GraphNode(name, "rmsnorm", inputs, forward=g2, units=int(math.prod(shape)), bias=e)


def _rms_forward(nd: GraphNode, i: int, fold) -> None:
    """y = g x / sqrt(ms(x) + eps) per token (ms over ``units`` features, mean and offsets kept):
    every moment times f = g^2/(q + eps) -- q' = g^2 q/(q + eps), m' = m g-bar/sqrt(q + eps) taken
    as m sqrt(f), k' = f k, t' = f t (Zhang & Sennrich 2019's RMSNorm at infinite width: ms(x) ->
    q; the eps matters where q is not far above it: OLMo-2's branch outputs at init, q ~ 6e-8
    beside eps 1e-5, leave the norm all but linear)."""
    out = []
    for s in fold.states[nd.inputs[0]]:
        if s.q <= 0.0:
            return
        f = nd.forward / (s.q + nd.bias)
        tokens = None if s.tokens is None else f * s.tokens
        # one scale a token where eps is negligible; else its mean square moves by f (1 - c) of its own
        c = s.q / (s.q + nd.bias)
        centre = (
            nd.units,
            *(f * x for x in centre_of(s, nd.units)[:3]),
            (f * (1 - c)) ** 2 * centre_of(s, nd.units)[3],
        )
        out.append(
            Part(s.share, f * s.q, s.mean * math.sqrt(f), f * s.shared, s.profile, tokens, s.axis, centre)
        )
    fold.states[i] = out


def _rms_backward(nd: GraphNode, i: int, g: list, fold) -> None:
    """r = (g^2/q)(r' - r_a): the gradient divided by the scale, its component along x removed
    (``Fold.alignment``: one of ``units`` directions of a gradient independent of x); the shared
    moment alike.  The input's gradient has none along x; its token mean is generic."""
    for j in nd.inputs:
        src = fold.states[j]
        own = len(g) == len(src)
        parts = g if own else g[:1] * len(src)
        out, align = [], []
        for k, (s, (r, rk, p)) in enumerate(zip(src, parts)):
            # E[1/(ms-hat + eps)]: a token's mean square varies by ~ the variance of its variance
            f = nd.forward * inverse_mean(s.q + nd.bias, centre_of(s, nd.units)[3]) if s.q > 0 else 0.0
            ra = fold.alignment(i, k, nd.units)[1] if own else r / max(nd.units, 1)
            # J^T g = g (g_out - x (x.g_out)/(d s))/sqrt(s), s = ms + eps: the component along x
            # keeps (1 - c)^2 of itself, c = ms/s (1 without eps: none left)
            c = s.q / (s.q + nd.bias) if s.q > 0 else 1.0
            out.append((f * (r - c * (2 - c) * ra), f * rk, p))
            align.append((1.0, (1 - c) ** 2))
        fold.give(j, out, i, align)


def _rms_module(t, n) -> GraphNode:
    m = t.module(n)
    return rms_node(n.target, t.inputs(n), m.weight, m.normalized_shape, m.eps)


register(
    TracedOp(
        "norm",
        lambda gm, n: n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.RMSNorm),
        _rms_module,
    )
)
map_op("rmsnorm", _rms_forward, _rms_backward, tangent=lambda nd, i, e, fold: 0.0)
