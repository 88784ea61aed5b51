"""The maps of the layers a state goes through, by family (sigprop/model/ops/ builds their nodes
from the traced graph), docs/theory.md §13, §15: a weight layer (``dense``: Linear, ConvNd,
ConvTransposeNd and their ATen and functional forms; ``standardized``: a layer a data-dependent
init calibrated) -- q' = (||W||^2_F/c_out) (M q) + ||b||^2/c_out per element, its gradient r =
(||W||^2_F/c_in) M^T r' (M a conv's window over the positions) --; the normalisations (``norm``:
batch, layer, group, instance; ``rmsnorm``); an elementwise activation (``act``: Gaussian
quadrature of the numpy function pair on its node); a fixed linear map per channel (``mix``:
average pooling, interpolation, a mean) and a max pooling (``maxpool``); an attention
(``attention``: nn.MultiheadAttention; ``sdpa``: scaled dot-product attention; their
``params``).  No torch here."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sigprop import theory
from sigprop.maps import gram
from sigprop.maps.cross import mix
from sigprop.maps.free import directions
from sigprop.maps.state import (
    GraphNode,
    Part,
    blend,
    centre_of,
    inverse_mean,
    map_op,
    merged,
    normalised,
    profile_of,
    token_groups,
)


# --------------------------------------------------------------------------------------------
# a weight layer (``dense``) and a calibrated one (``standardized``)
# --------------------------------------------------------------------------------------------
def _dense_forward(nd: GraphNode, i: int, fold) -> None:
    """q' = f M q + b, k' = f box k + b (box: the mean of M's window), m' = 0, the parts merged."""
    x = merged(fold.states[nd.inputs[0]])
    if nd.mats:  # a conv: each output sums its taps inside the map (q' = f M q + b)
        fld = theory.weight_map(profile_of(x.profile, nd.mats), nd.forward * x.q, nd.mats, nd.bias)
        box = (float(fld.mean()) - nd.bias) / (nd.forward * x.q) if x.q > 0 else 1.0
        fold.states[i] = [
            Part(1.0, float(fld.mean()), 0.0, nd.forward * box * x.shared + nd.bias, normalised(fld))
        ]
    else:
        src = fold.states[nd.inputs[0]]
        # groups of tokens (a class token beside the patches) each through the same weights
        parts = src if token_groups(src) else [x]
        fold.states[i] = [
            Part(
                s.share,
                nd.forward * s.q + nd.bias,
                0.0,
                nd.forward * s.shared + nd.bias,
                None,
                None if s.tokens is None else nd.forward * s.tokens + nd.bias,
                s.axis,
            )
            for s in parts
        ]


def _standardized(nd: GraphNode, i: int, fold) -> None:
    """A layer calibrated on this batch: each unit mean 0, sd 1 (times a scaled prediction's
    factor)."""
    fold.states[i] = [Part(1.0, fold.weight_factor, 0.0, 0.0, None)]


def _dense_backward(nd: GraphNode, i: int, g: list, fold) -> None:
    """Every input unit reads all outputs: one gradient, r = b M^T r' (b = ``backward``)."""
    mine = fold.states[i]
    r = sum(s.share * x[0] for s, x in zip(mine, g))
    rk = sum(s.share * x[1] for s, x in zip(mine, g))
    rp = blend([(s.share * x[0], x[2]) for s, x in zip(mine, g)])
    box, pj = 1.0, None
    if nd.mats:  # each input element's gradient sums the outputs whose taps it is
        bp = theory.window_map(profile_of(rp, nd.mats, transpose=True), nd.mats, transpose=True)
        box, pj = float(bp.mean()), normalised(bp)
    if token_groups(mine) and not nd.mats:  # each group its own
        for j in nd.inputs:
            fold.give(
                j, [(nd.backward * x[0], nd.backward * x[1] if nd.positions else 0.0, None) for x in g], i
            )
        return
    for j in nd.inputs:
        fold.give(j, [(nd.backward * box * r, nd.backward * box * rk if nd.positions else 0.0, pj)], i)


def _dense_jacobian(nd: GraphNode, i: int, fold) -> tuple[float, float] | str:
    """h -> W h of n_out/n_in = ratio: the mean times the rows' mean squared norm (``forward``),
    the normalised variance ratio v + ``theory.gram_variance(ratio, s1)`` (the first half of
    ``theory.chain_variance``; docs/theory.md §14).  A conv's is not derived."""
    if nd.mats or nd.positions:
        return "convolutions" if nd.mats else f"the layer {nd.name} over positions"
    s1 = directions(nd)
    if isinstance(s1, str):
        return s1
    mean, v = fold.states[nd.inputs[0]]
    ratio = nd.width / fold.units[nd.inputs[0]]
    return mean * nd.forward, ratio * v + theory.gram_variance(ratio, s1)


map_op(
    "dense",
    _dense_forward,
    _dense_backward,
    weighted=True,
    # a dense layer moves with its input by its weights alone (its bias does not): f e
    tangent=lambda nd, i, e, fold: None if nd.mats else nd.forward * e[0],
    degree=lambda nd: 1,
    scale_fields=("bias",),
    jacobian=_dense_jacobian,
    cross="gaussian",
    gram=gram.passes,
    gram_back=gram.passes_back,
    # two reads of one W: f times their inputs' cross moment (plus the bias's); back ||W||^2/c_in
    draw=lambda nd, other, S, K, back: (
        (nd.backward * S, nd.backward * K) if back else (nd.forward * S + nd.bias, nd.forward * K + nd.bias)
    ),
)


map_op(
    "standardized",
    _standardized,
    _dense_backward,
    weighted=True,
    degree=lambda nd: 0,
    gram=gram.passes,
    gram_back=gram.passes_back,
)


# --------------------------------------------------------------------------------------------
# the normalisations (``norm``, ``rmsnorm``)
# --------------------------------------------------------------------------------------------
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


def _norm_forward(nd: GraphNode, i: int, fold) -> None:
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


def _norm_backward(nd: GraphNode, i: int, g: list, fold) -> None:
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


#: a causal attention's profile through a layer norm with one statistic per token (over a token's
#: units; its map has no eps), none through a batch norm's
_LAYER_NORM_GRAM = gram.per_token(lambda nd: 0.0 if nd.group == nd.units > 1 else None)


#: a normalisation's output does not move with its input's own direction (scale invariance), and
#: what it does move by is orthogonal to it: 0
map_op(
    "norm",
    _norm_forward,
    _norm_backward,
    tangent=lambda nd, i, e, fold: 0.0 if nd.group else None,
    # a batch norm's output does not see its input's scale; a per-sample norm's gradient reads its
    # readers' alignments, which ``graph.fold_ln`` does not rescale: none
    degree=lambda nd: 0 if nd.group == 0 else None,
    jacobian=lambda nd, i, fold: "batch norm" if nd.group == 0 else f"norm ({nd.name})",
    # per token its gain over the centred token's RMS; a batch norm's statistics: none
    cross="linear",
    factor=lambda nd, x: None if nd.group == 0 else math.sqrt(nd.forward / max(x.q - x.mean * x.mean, 1e-30)),
    gram=_LAYER_NORM_GRAM[0],
    gram_back=_LAYER_NORM_GRAM[1],
)


#: a causal attention's profile through an RMSNorm, its eps (``bias``) per token
_RMS_GRAM = gram.per_token(lambda nd: nd.bias)


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


map_op(
    "rmsnorm",
    _rms_forward,
    _rms_backward,
    tangent=lambda nd, i, e, fold: 0.0,
    cross="linear",
    factor=lambda nd, x: math.sqrt(nd.forward / (x.q + nd.bias)),  # its gain over the token's RMS, eps in
    gram=_RMS_GRAM[0],
    gram_back=_RMS_GRAM[1],
)


# --------------------------------------------------------------------------------------------
# an elementwise activation (``act``)
# --------------------------------------------------------------------------------------------
#: the common activations as numpy (phi, phi') of z, float64 -- what the quadratures evaluate
#: (sigprop/model/ops/activation.py names a traced model's; a plan's ReLU is ``pair(relu)``)
def _special():
    """scipy.special, loaded when a traced model's smooth activation is first evaluated (it takes
    ~0.1 s; a probe of sigprop's own nets never needs it)."""
    from scipy import special  # lazy: see the docstring

    return special


def relu(z):
    return np.maximum(z, 0.0), (z > 0.0).astype(np.float64)


def leaky(slope: float):
    return lambda z: (np.where(z > 0.0, z, slope * z), np.where(z > 0.0, 1.0, slope))


def tanh(z):
    t = np.tanh(z)
    return t, 1.0 - t * t


def sigmoid(z):
    s = _special().expit(z)
    return s, s * (1.0 - s)


def silu(z):
    s = _special().expit(z)
    return z * s, s * (1.0 + z * (1.0 - s))


def gelu(z):
    c = _special().ndtr(z)
    return z * c, c + z * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def pair(both):
    """(phi, phi') as two functions of z (an ``act`` node's ``fn``) from ``both(z) = (phi(z),
    phi'(z))``, each evaluated in float64."""
    return (lambda z: both(np.asarray(z, dtype=np.float64))[0]), (
        lambda z: both(np.asarray(z, dtype=np.float64))[1]
    )


def _act_forward(nd: GraphNode, i: int, fold) -> None:
    """Per part: the one-variable moments, and the cross moments of phi and phi' on one grid."""
    out, dm = [], []
    for s in fold.states[nd.inputs[0]]:
        if _homogeneous(nd) and s.mean == 0.0:  # a plan's ReLU: the closed form
            moments = lambda shared: theory.relu_shared_moments(s.q, shared)
            both = moments(s.shared)
            m1, q1, d2 = both[0], both[1], both[3]  # its one-variable moments, exact
        else:
            moments = lambda shared: theory.shared_moments(nd.fn[0], nd.fn[1], s.mean, s.q, shared)
            m1, q1, d2 = theory.activation_moments(nd.fn[0], nd.fn[1], s.mean, s.q)
            both = moments(s.shared)
        k1 = min(both[2], q1)
        tokens = None
        if s.tokens is not None:  # the tokens of one sample: their own cross moments
            toks = moments(s.tokens)
            tokens = min(toks[2], q1)
            # a gradient's shared moment is between the tokens of one sample (``graph``)
            dm.append((d2, toks.derivative_cross))
        else:
            dm.append((d2, both.derivative_cross))
        out.append(Part(s.share, q1, m1, k1, s.profile, tokens, s.axis))
    fold.states[i], fold.derivative[i] = out, dm


def _act_backward(nd: GraphNode, i: int, g: list, fold) -> None:
    """What passed through it (``_act_receive``): E[phi'^2] r' and the derivative's cross moment rk'."""
    for j in nd.inputs:
        fold.give(j, [(t[0], t[1], x[2]) for t, x in zip(fold.through[i], g)], i)


def _act_receive(j: int, parts: list, reader: int, fold) -> None:
    """Every gradient an activation receives passes through phi': E[phi'^2] times r, and the
    derivative's cross moment times rk -- at a max pooling's maximum where the reader is one
    (it keeps those moments, ``pool.py``)."""
    dm = fold.derivative[reader] if fold.nodes[reader].op == "maxpool" else fold.derivative[j]
    th = fold.through.setdefault(j, [[0.0, 0.0] for _ in fold.states[j]])
    for t, (f, fk), (c, ck, _) in zip(th, dm, parts):
        t[0] += c * f
        t[1] += ck * fk


def _act_tangent(nd: GraphNode, i: int, e: list, fold) -> float | None:
    """E[phi(z) phi'(z) zeta] for the input's response zeta of moment e with z: its regression
    on z, e/var(z) (z - m), by the same quadrature (a ReLU's is e/2 at mean 0, homogeneous)."""
    s = merged(fold.states[nd.inputs[0]])
    var = s.q - s.mean * s.mean
    if var <= 0.0:
        return None
    phi, dphi = nd.fn
    m = s.mean
    moment = theory.activation_moments(lambda z: phi(z) * dphi(z) * (z - m), dphi, m, s.q)[0]
    return moment * e[0] / var


def _homogeneous(nd: GraphNode) -> bool:
    """An activation that says it is a ReLU, positively homogeneous (``params={"homogeneous":
    True}``: sigprop's own plans): it scales with its input, and its moments at mean 0 are the
    closed forms (``theory.relu_shared_moments``)."""
    return isinstance(nd.params, dict) and bool(nd.params.get("homogeneous"))


def _act_jacobian(nd: GraphNode, i: int, fold) -> tuple[float, float] | str:
    """h -> D h, D = phi'(z) diagonal: for a ReLU (mu1, mu2) = (E D^2, E D^4) = (1/2, 1/2)
    (``theory.RELU_MU``), the mean times mu1, the normalised variance plus mu2/mu1^2 - 1 (the
    second half of ``theory.chain_variance``).  Another activation's is not composed here."""
    if not _homogeneous(nd):
        return f"the activation {nd.name}"
    mean, v = fold.states[nd.inputs[0]]
    mu1, mu2 = theory.RELU_MU
    return mean * mu1, v + mu2 / (mu1 * mu1) - 1.0


map_op(
    "act",
    _act_forward,
    _act_backward,
    receive=_act_receive,
    tangent=_act_tangent,
    degree=lambda nd: 1 if _homogeneous(nd) else None,
    jacobian=_act_jacobian,
    cross="act",
    gram=gram.activated,
    gram_back=gram.activated_back,
)


# --------------------------------------------------------------------------------------------
# an attention (``attention``, ``sdpa``)
# --------------------------------------------------------------------------------------------
#: the largest logit variance across keys the attention map is applied at: ``collision``'s range.
#: Measured (benchmarks/attention_range.py: 3 pre-LN layers, d = 128, T = 32, separate q/k/v
#: projections scaled up, 4 draws; docs/theory.md §15) every site within 0.1% forward and 2.2%
#: backward from s^2 = 0.1 to 150, bidirectional and causal, nn.MultiheadAttention within 2% to
#: s^2 = 330; attention with no skip
#: within 4%.  (0.18.x stopped at 2 on a measurement of 0.15.0's maps, 11% backward at
#: 3.3, taken before the key weight K replaced P-bar in the backward; and the Gauss quadrature
#: of ``collision`` failed past 4.)
MAP_LOGIT_VARIANCE = theory.MAX_LOGIT_VARIANCE


@dataclass(frozen=True)
class Projection:
    """A dense map per element: q' = forward q + bias (forward = ||W||^2/rows), r = backward r'."""

    forward: float = 1.0
    bias: float = 0.0
    backward: float = 1.0

    def scaled(self, factor: float) -> "Projection":
        return Projection(self.forward * factor, self.bias, self.backward * factor)


@dataclass(frozen=True)
class Attention:
    """What an attention node's maps read: the query, key, value and output projections (identity
    for ``scaled_dot_product_attention``), the head dimension, the logit scale, the tokens of a
    sample (queries and keys) and whether the mask is causal."""

    q: Projection
    k: Projection
    v: Projection
    o: Projection
    head_dim: int
    scale: float
    tokens: int
    keys: int
    causal: bool
    #: the projections are weight layers (a module's): a prediction with every weight layer's
    #: variance scaled scales them
    weighted: bool = True
    #: logits soft-capped to c tanh(z/c) (Gemma 2), None: not capped
    cap: float | None = None

    def projection(self, name: str, factor: float) -> Projection:
        pr = getattr(self, name)
        return pr.scaled(factor) if self.weighted else pr


def _attention_moments(nd: GraphNode, fold):
    """The projected queries, keys and values ((q, tokens, shared) per element), the weights'
    (P, C), the logits' variance s^2 (soft-capped where they are) and, before the cap, their
    variance and the cap's slope E[sech^4] (``theory.capped``; (s^2, 1) without one)."""
    p: Attention = nd.params
    proj = [p.projection(k, fold.weight_factor) for k in "qkv"]
    xs = [merged(fold.states[j]) for j in nd.inputs]
    mom = [
        (pr.forward * x.q + pr.bias, pr.forward * x.tok + pr.bias, pr.forward * x.shared + pr.bias)
        for pr, x in zip(proj, xs)
    ]
    raw = theory.logit_variance(p.scale, p.head_dim, mom[0][0], mom[1][0], mom[1][1])
    s2, slope = theory.capped(raw, p.cap)
    if s2 > MAP_LOGIT_VARIANCE:  # beyond the weights' quadrature: the forward says so
        return mom, math.nan, math.nan, s2, (raw, slope)
    P, C = theory.attention_weights(s2, p.tokens, p.causal, p.keys)
    return mom, P, C, s2, (raw, slope)


def _attention_forward(nd: GraphNode, i: int, fold) -> None:
    p: Attention = nd.params
    mom, P, C, s2, _ = _attention_moments(nd, fold)
    if s2 > MAP_LOGIT_VARIANCE:  # beyond the map's range: no state, said why
        fold.why[i] = (
            f"{nd.name} at logits of variance {s2:.3g} across keys (the attention map covers up to "
            f"{MAP_LOGIT_VARIANCE:g}, docs/theory.md §15)"
        )
        return
    fold.regimes.append(s2)
    fold.logit_variance[i] = s2
    fold.entropy[i] = theory.attention_entropy(s2, p.tokens, p.causal, p.keys)
    qv, tv, kv = mom[2]
    o = p.projection("o", fold.weight_factor)
    q_out, t_out = tv + (qv - tv) * P, tv + (qv - tv) * C
    fold.states[i] = [
        Part(1.0, o.forward * q_out + o.bias, 0.0, o.forward * kv + o.bias, None, o.forward * t_out + o.bias)
    ]


def _attention_backward(nd: GraphNode, i: int, g: list, fold) -> None:
    p: Attention = nd.params
    mom, P, C, s2, (raw, slope) = _attention_moments(nd, fold)
    mine = fold.states[i]
    o = p.projection("o", fold.weight_factor)
    r = o.backward * sum(s.share * x[0] for s, x in zip(mine, g))
    rk = o.backward * sum(s.share * x[1] for s, x in zip(mine, g))
    (qq, tq, _), _, (qv, tv, _) = mom
    T = p.tokens
    spread_v = max(qv - tv, 0.0)
    r_v = P * r + (T - 1) * C * rk
    rk_v = (1 - P) * r / max(T - 1, 1) + (1 - C) * rk
    # a query's and a key's gradients sum their keys' and queries' parts weighted by K, the
    # weights' squares less what the softmax's centring takes (``theory.key_weight``; P-bar in
    # 0.15.0: 2x high under a causal mask, whose first query sends nothing back), and the
    # gradient's part shared by the tokens adds up the queries' shared part coherently, (1 - P) t_q
    K = theory.key_weight(s2, T, p.causal, p.keys)
    # a cap passes E[sech^4] of a logit's gradient (``slope``); the uncapped variance is the keys'
    # spread
    r_q = slope * K * r * spread_v * raw / qq if qq > 0 else 0.0
    r_k = slope * (K * r * qq + (1 - P) * rk * max(tq, 0.0)) * spread_v * p.scale**2 * p.head_dim
    for j, name, (rr, kk) in zip(nd.inputs, "qkv", ((r_q, 0.0), (r_k, 0.0), (r_v, rk_v))):
        b = p.projection(name, fold.weight_factor).backward
        fold.give(j, [(b * rr, b * kk, None)], i)


# a module's projections are weight layers (its output uncorrelated with its input; a scaled
# prediction scales them, ``Attention.projection``); the function's queries, keys and values are
# the layers before it
def _attention_tangent(nd: GraphNode, i: int, e: list, fold) -> float | None:
    """The value path is linear in the values for fixed weights: the output moves with the values'
    response as much as the values do, (e_v/q_v) of the attended values' q_o, through the output
    projection; the softmax's own response (through the queries and keys) is left out."""
    p: Attention = nd.params
    if e[2] is None:
        return 0.0
    mom, P, _, _, _ = _attention_moments(nd, fold)
    qv, tv, _ = mom[2]
    v, o = (p.projection(k, fold.weight_factor) for k in "vo")
    if qv <= 0.0:
        return None
    return o.forward * v.forward * e[2] / qv * (tv + (qv - tv) * P)


def _attention_draw(nd: GraphNode, other: GraphNode, S: float, K: float, back: bool) -> tuple[float, float]:
    """Two calls of one attention module (its W_v and W_o one draw): W_o mix(W_v x) on both sides,
    each mixed by its own mean weights (``cross.mix``); backward W_v^T mix(W_o^T g) alike."""
    p, o = nd.params, other.params
    S, K = mix(mix((S, K), p), o)
    f = p.o.backward * p.v.backward if back else p.o.forward * p.v.forward
    return f * S, f * K


map_op(
    "attention",
    _attention_forward,
    _attention_backward,
    weighted=True,
    tangent=_attention_tangent,
    cross="gaussian",
    draw=_attention_draw,
    values=2,
    reads=2,
    gram=gram.causal,  # its values' profile forward; backward the module's projections: dropped
)


map_op(
    "sdpa",
    _attention_forward,
    _attention_backward,
    tangent=_attention_tangent,
    cross="mix",
    values=2,
    gram=gram.causal,
    gram_back=gram.causal_back,
)


# --------------------------------------------------------------------------------------------
# a fixed linear map per channel (``mix``) and a max pooling (``maxpool``)
# --------------------------------------------------------------------------------------------
#: the map of no activation (a max pooling of a Gaussian state)
_IDENTITY = (lambda z: z, lambda z: np.ones_like(z))


def _mix_forward(nd: GraphNode, i: int, fold) -> None:
    """y = A x: fluctuations through A^2, the shared part through A."""
    out = []
    for s in fold.states[nd.inputs[0]]:
        p = profile_of(s.profile, nd.mats)
        fluct, shared = theory.window_map(p, nd.mats, power=2), theory.window_map(np.sqrt(p), nd.mats) ** 2
        fld = (s.q - s.shared) * fluct + s.shared * shared
        b = float(shared.mean())
        out.append(Part(s.share, float(fld.mean()), s.mean * math.sqrt(b), s.shared * b, normalised(fld)))
    fold.states[i] = out


def _mix_backward(nd: GraphNode, i: int, g: list, fold) -> None:
    """dx = A^T dy."""
    out = []
    for r, rk, p in g:
        p = profile_of(p, nd.mats, transpose=True)
        fluct = theory.window_map(p, nd.mats, transpose=True, power=2)
        shared = theory.window_map(np.sqrt(p), nd.mats, transpose=True) ** 2
        fld = (r - rk) * fluct + rk * shared
        ck = rk * float(shared.mean()) + nd.backward_cross * (r - rk)
        out.append((float(fld.mean()), ck, normalised(fld)))
    for j in nd.inputs:
        fold.give(j, out, i)


def _maxpool_forward(nd: GraphNode, i: int, fold) -> None:
    """The moments of phi(max of P) after a nondecreasing activation (read off its input) or of
    the max of a Gaussian state; the derivative's moments at the maximum are kept (the
    activation before it reads them backward)."""
    ins = nd.inputs
    src = fold.states[ins[0]]
    fn = _IDENTITY if nd.fn is None else nd.fn
    pre = src if nd.fn is None else fold.states[fold.nodes[ins[0]].inputs[0]]
    out, dm = [], []
    for s, z in zip(src, pre):
        both = theory.shared_moments(fn[0], fn[1], z.mean, z.q, z.shared, nd.pool)
        m1, q1, k1, d2 = both
        dm.append((d2, both.derivative_cross))
        p = normalised(theory.window_map(profile_of(s.profile, nd.mats), nd.mats)) if nd.mats else None
        out.append(Part(s.share, q1, m1, min(k1, q1), p))
    fold.states[i], fold.derivative[i] = out, dm


def _maxpool_backward(nd: GraphNode, i: int, g: list, fold) -> None:
    """Each window's gradient on its maximum."""
    out = []
    for r, rk, p in g:
        if nd.mats:
            p = normalised(theory.window_map(profile_of(p, nd.mats, transpose=True), nd.mats, transpose=True))
        out.append((nd.backward * r, nd.backward**2 * rk, p))
    for j in nd.inputs:
        fold.give(j, out, i)


map_op("mix", _mix_forward, _mix_backward)


map_op("maxpool", _maxpool_forward, _maxpool_backward)
