"""The maps of the graph's wiring (sigprop/model/ops/ builds their nodes), docs/theory.md §13,
§15-§17: identity, slice, output, add (independent summands, or summands a shared weight
correlates: sigprop/maps/cross.py), offset, scale, cat, constant, product, embedding; and a
decoder's position ops, ``rotary`` (rotary position embedding) and ``broadcast`` (a tensor
expanded over a new axis).  No torch here."""

from __future__ import annotations

import math
from dataclasses import replace

from sigprop import theory
from sigprop.maps import gram
from sigprop.maps.cross import Unsupported, tangent
from sigprop.maps.free import directions
from sigprop.maps.state import (
    GraphNode,
    Part,
    blend,
    centre_of,
    map_op,
    merged,
    scaled_parts,
    token_groups,
    tokens_of,
)


def _constant(nd: GraphNode, i: int, fold) -> None:
    """A constant part of a state (its input only orders it): second moment, mean, and -- the
    same values in every sample -- shared moments equal to its second moment."""
    fold.states[i] = [Part(1.0, nd.forward, nd.bias, nd.forward)]


def _passes(nd: GraphNode, i: int, fold) -> None:
    """identity, output: unchanged (a reshape drops the profile)."""
    ins = nd.inputs
    same = nd.shape == fold.nodes[ins[0]].shape
    fold.states[i] = [
        s if same else Part(s.share, s.q, s.mean, s.shared, None, s.tokens, s.axis)
        for s in fold.states[ins[0]]
    ]


def _gives_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """offset, identity, output: each input element's gradient is the output's (where the shape
    is kept, so is the gradient's alignment with a token's mean and state, ``Fold.alignment``)."""
    for j in nd.inputs:
        same = nd.shape == fold.nodes[j].shape
        keeps = same and nd.op != "offset" and len(g) == len(fold.states[j])
        align = [fold.weights(i, k) for k in range(len(g))] if keeps else None
        fold.give(j, [(r, rk, p if same else None) for r, rk, p in g], i, align)


def _add_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """a + b: each summand's gradient is the sum's, its token mean too; its component along the
    summand a is q_a/Q of the one along the sum plus q_b/Q of a generic one (the sum's gradient
    seen from a holds b's share of directions it is independent of; docs/theory.md §15, "The
    centred residual stream"), and a fork loses the cross term of its two gradients
    (``_fork_cross``)."""
    ins = nd.inputs
    states = [fold.states[j] for j in ins]
    if len(ins) != 2 or not all(len(st) == len(g) for st in states) or nd.shape != fold.nodes[ins[0]].shape:
        return _gives_back(nd, i, g, fold)
    along = [fold.weights(i, k)[1] for k in range(len(g))]
    fork, cross = _fork_cross(nd, i, fold) if min(along) < 1.0 else (None, 0.0)
    for j, mine, other in ((ins[0], states[0], states[1]), (ins[1], states[1], states[0])):
        same = nd.shape == fold.nodes[j].shape
        align = []
        for k, (a, b) in enumerate(zip(mine, other)):
            wc, wa = fold.weights(i, k)
            total = a.q + b.q
            share = a.q / total if total > 0 else 0.5
            align.append((wc, share * wa + (1.0 - share)))
        # the fork's two gradients, the sum's and the branch's, are correlated (``_fork_cross``)
        less = [cross * (1.0 - wa) if j == fork else 0.0 for wa in along]
        fold.give(
            j,
            [(r * (1.0 - c), rk, p if same else None) for (r, rk, p), c in zip(g, less)],
            i,
            align if same else None,
        )


def _fork_cross(nd: GraphNode, i: int, fold) -> tuple[int | None, float]:
    """x + B(x), x a fork: its gradient g + J_B^T g has the cross term 2 g^T J_B g, which for a g
    with no part along the sum y (a LayerNorm read y: w_a = 0) is -2 r (y^T J_B y)/(|y|^2 u) per
    element = -2 r e_B/(q_y u), e_B the branch's moment with its own response to x
    (``cross.tangent``: q_B for weight layers and homogeneous activations, 0 behind a norm);
    (1 - w_a) of it in general (docs/theory.md §15, "The centred residual stream").  The fork,
    and that share of the sum's r it loses."""
    a, b = sorted(nd.inputs)
    shape = nd.shape
    if a == b or not shape or shape[-1] < 2:
        return None, 0.0
    e = tangent(fold, a, b)
    y = merged(fold.states[i])
    if e is None or y.q <= 0.0:
        return None, 0.0
    return a, 2.0 * e / (y.q * shape[-1])


def _add(nd: GraphNode, i: int, fold) -> None:
    """a + b, independent summands: q' = q_a + q_b + 2 m_a m_b, k' alike; summands that read a
    shared weight (``Fold.cross``): q' = q_a + q_b + 2 S, t' = t_a + t_b + 2 K, their cross
    moments (sigprop/maps/cross.py)."""
    ins = nd.inputs
    if len(ins) != 2:
        return
    c = fold.cross
    if c is not None and c.ancestors[ins[0]] & c.ancestors[ins[1]]:
        return _correlated_add(nd, i, fold)
    a, b = fold.states[ins[0]], fold.states[ins[1]]
    if [s.share for s in a] != [s.share for s in b]:
        if token_groups(a) and len(b) == 1:  # the same moments for every token: one per group
            b = [replace(b[0], share=s.share, axis="tokens") for s in a]
        elif token_groups(b) and len(a) == 1:
            a = [replace(a[0], share=s.share, axis="tokens") for s in b]
        else:
            a, b = [merged(a)], [merged(b)]
    fold.states[i] = [
        Part(
            x.share,
            x.q + y.q + 2 * x.mean * y.mean,
            x.mean + y.mean,
            x.shared + y.shared + 2 * x.mean * y.mean,
            blend([(x.q, x.profile), (y.q, y.profile)]),
            None if x.tokens is None and y.tokens is None else x.tok + y.tok + 2 * x.mean * y.mean,
            x.axis,
            _summed_centre(x, y),
        )
        for x, y in zip(a, b)
    ]


def _correlated_add(nd: GraphNode, i: int, fold) -> None:
    """a + b, both downstream of a weight read at several nodes: their cross moments added (the
    parts merged; the two-sample moment as for independent summands)."""
    a, b = (merged(fold.states[j]) for j in nd.inputs)
    try:
        S, K = fold.cross.pair(*nd.inputs)
    except Unsupported as exc:
        fold.why[i] = (
            f"{nd.name}: a sum of states that share weights, through {exc}, which the shared-depth "
            "maps do not read"
        )
        return
    fold.states[i] = [
        Part(
            1.0,
            a.q + b.q + 2 * S,
            a.mean + b.mean,
            a.shared + b.shared + 2 * a.mean * b.mean,
            None,
            a.tok + b.tok + 2 * K,
            a.axis,
        )
    ]


def _summed_centre(x: Part, y: Part) -> tuple | None:
    """A sum's token-mean moments where a summand has its own (a layer norm's output beside a
    branch): the summands' (``centre_of``) plus their means' cross term."""
    known = x.centre or y.centre
    if known is None:
        return None
    u, cross = known[0], 2 * x.mean * y.mean
    (*cx, vx), (*cy, vy) = centre_of(x, u), centre_of(y, u)
    # a token's variance: the summands' own and their cross term's 4 var_x var_y / u
    v = vx + vy + 4.0 * (x.q - cx[0]) * (y.q - cy[0]) / u
    return (u, *(p + q + cross for p, q in zip(cx, cy)), v)


def _scaled(nd: GraphNode, i: int, fold) -> None:
    """c h, c^2 = ``forward``: every moment of the units times c^2 (``state.scaled_parts``)."""
    fold.states[i] = scaled_parts(fold.states[nd.inputs[0]], nd.forward)


def _scaled_back(nd: GraphNode, i: int, g: list, fold) -> None:
    for j in nd.inputs:
        keeps = nd.shape == fold.nodes[j].shape and len(g) == len(fold.states[j])
        align = [fold.weights(i, k) for k in range(len(g))] if keeps else None
        fold.give(j, [(nd.forward * r, nd.forward * rk, p) for r, rk, p in g], i, align)


def _offset(nd: GraphNode, i: int, fold) -> None:
    """h + c, c a constant (mean c-bar = ``bias``, mean square = ``forward``); a constant that
    differs between the positions of a sample (a positional embedding: ``params``, its moment
    between two positions) adds that moment, not its square, to the shared ones."""
    c, c2 = nd.bias, nd.forward
    cross = c2 if nd.params is None else nd.params
    fold.states[i] = [
        Part(
            s.share,
            s.q + 2 * s.mean * c + c2,
            s.mean + c,
            s.shared + 2 * s.mean * c + cross,
            None,
            s.tok + 2 * s.mean * c + cross
            if nd.params is not None
            else tokens_of([s], lambda t: t.tok + 2 * t.mean * c + c2, sum),
            s.axis,
        )
        for s in fold.states[nd.inputs[0]]
    ]


def _concatenated(nd: GraphNode, i: int, fold) -> None:
    ins = nd.inputs
    axis = "tokens" if nd.params == "tokens" else "units"  # along the tokens: groups of tokens
    if len(nd.shares) == len(ins):
        fold.states[i] = [
            Part(share * s.share, s.q, s.mean, s.shared, s.profile, s.tokens, axis)
            for share, j in zip(nd.shares, ins)
            for s in fold.states[j]
        ]


def _concatenated_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """Each input its own parts' gradients."""
    at = 0
    for j in nd.inputs:
        size = len(fold.states[j])
        fold.give(j, g[at : at + size], i)
        at += size


def _sliced(nd: GraphNode, i: int, fold) -> None:
    """A part of the source's elements, as they were -- a piece of a fused projection times its
    rows' ``backward`` = sigma, their mean squared norm over all rows' (docs/theory.md §16,
    "Pieces of a fused projection")."""
    _passes(nd, i, fold)
    if nd.backward != 1.0:
        fold.states[i] = scaled_parts(fold.states[i], nd.backward)


def _sliced_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """A part of the source's elements: its gradient weighs ``forward`` (its share) of the source's
    (the other parts' readers give theirs), times a piece's sigma (``backward``): the weight
    layer's backward ||W||^2/c_in r' then sums each row's ||w_u||^2 r'_u over c_in."""
    c = nd.forward * nd.backward
    for j in nd.inputs:
        fold.give(j, [(c * r, c * rk, None) for r, rk, _ in g], i)


def _same(nd, i, e, fold):
    return e[0]


def _summed(nd, i, e, fold):
    return sum(x for x in e if x is not None)


def _cat_tangent(nd, i, e, fold):
    return sum(w * x for w, x in zip(nd.shares, e) if x is not None)


def _unchanged(nd, i, fold):
    return fold.states[nd.inputs[0]]


def _block_jacobian(nd: GraphNode, i: int, fold) -> tuple[float, float] | str:
    """A residual block's sum S h + alpha F(h): with a = the branch's mean over the fork's (the
    branch's scaling inside it), the mean times g2 + a (g2 = 1 for an identity skip, else the
    projection's mean squared row norm), the normalised variance r v + ``theory.block_variance``
    (r = d_out/d_in, 1 for the identity; the branch's own variance its node's less r v, the
    chain laws being affine in v; the projection's S^T S of ``theory.gram_variance(1/r, s1)``)
    (docs/theory.md §14).  Another sum's is not composed here."""
    got = fold.fork_of(*nd.inputs) if len(nd.inputs) == 2 else None
    if got is None:
        return f"the sum {nd.name}"
    fork, projection = got
    (m0, v0), (mb, vb) = fold.states[fork], fold.states[nd.inputs[1]]
    a = mb / m0
    if projection is None:
        return m0 * (1.0 + a), v0 + theory.block_variance(a, vb - v0)
    s1 = directions(projection)
    if isinstance(s1, str):
        return s1
    g2, r = projection.forward, projection.width / fold.units[fork]
    v_skip = theory.gram_variance(1.0 / r, s1)
    return m0 * (g2 + a), r * v0 + theory.block_variance(a, vb - r * v0, g2, r, v_skip)


#: an op that passes its input on unchanged (a reshape, the graph's output), in every walk
UNCHANGED = dict(
    tangent=_same,
    degree=lambda nd: 1,
    jacobian=_unchanged,
    cross="linear",
    gram=gram.passes,
    gram_back=gram.passes_back,
)


map_op("identity", _passes, _gives_back, **UNCHANGED)


map_op(
    "slice",
    _sliced,
    _sliced_back,
    tangent=lambda nd, i, e, fold: nd.backward * e[0],
    degree=lambda nd: 1,
    gram=gram.piece,
    gram_back=gram.piece_back,
)


map_op("output", _passes, _gives_back, **UNCHANGED)


map_op(
    "add",
    _add,
    _add_back,
    tangent=_summed,
    degree=lambda nd: 1,
    jacobian=_block_jacobian,
    cross="sum",
    gram=gram.summed,
    gram_back=gram.passes_back,
)


map_op(
    "offset",
    _offset,
    _gives_back,
    tangent=_same,
    cross="offset",
    gram=gram.passes,
    gram_back=gram.passes_back,
)


map_op(
    "scale",
    _scaled,
    _scaled_back,
    tangent=lambda nd, i, e, fold: nd.forward * e[0],
    degree=lambda nd: 1,
    jacobian=lambda nd, i, fold: (fold.states[nd.inputs[0]][0] * nd.forward, fold.states[nd.inputs[0]][1]),
    cross="linear",
    factor=lambda nd, x: math.sqrt(nd.forward),
    gram=gram.passes,
    gram_back=gram.passes_back,
)


map_op("cat", _concatenated, _concatenated_back, tangent=_cat_tangent)


map_op("constant", _constant, lambda nd, i, g, fold: None)


def _product(nd: GraphNode, i: int, fold) -> None:
    """a * b, independent states (each behind weights of its own: a gated MLP's silu(x W1) and
    x W3): every moment the product of the two's -- q' = q_a q_b, m' = m_a m_b, and the shared
    moments between two samples and between two tokens alike (docs/theory.md §16, "Gated MLPs")."""
    a, b = (merged(fold.states[j]) for j in nd.inputs)
    profile = None  # over the positions: the two's product where both have one
    if a.profile is not None and b.profile is not None and a.profile.shape == b.profile.shape:
        profile = a.profile * b.profile / float((a.profile * b.profile).mean())
    tokens = None if a.tokens is None and b.tokens is None else a.tok * b.tok
    fold.states[i] = [Part(1.0, a.q * b.q, a.mean * b.mean, a.shared * b.shared, profile, tokens)]


def _product_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """The gradient g at a * b reaches a as g * b: r q_b, its moment between two positions r_k
    k_b (g independent of b: it comes from the weights above), and b as g * a."""
    r, rk, p = g[0]  # the product is one part (``_product``)
    a, b = (merged(fold.states[j]) for j in nd.inputs)
    for j, other in zip(nd.inputs, (b, a)):
        fold.give(j, [(r * other.q, rk * other.tok, p)], i)


def _product_tangent(nd, i, e, fold):
    """d(a b) = b da + a db: E[a b (b J_a x + a J_b x)] = q_b e_a + q_a e_b (independent a, b)."""
    a, b = (merged(fold.states[j]).q for j in nd.inputs)
    return (b * e[0] if e[0] is not None else 0.0) + (a * e[1] if e[1] is not None else 0.0)


map_op(
    "product",
    _product,
    _product_back,
    tangent=_product_tangent,
    gram=gram.multiplied,
    gram_back=gram.product_back,
)


def _embedding_forward(nd: GraphNode, i: int, fold) -> None:
    fold.states[i] = [Part(1.0, nd.forward, nd.bias, nd.params, None, nd.params)]


map_op("embedding", _embedding_forward, lambda nd, i, g, fold: None, cross="fresh")


# --------------------------------------------------------------------------------------------
# a decoder's position ops
# --------------------------------------------------------------------------------------------
def _rotary(nd: GraphNode, i: int, fold) -> None:
    """x cos + rotate_half(x) sin, per unit i and its partner p(i) = i -+ h (sign -+1): q' = q
    mean(c^2 + s^2) + 2 m^2 mean(sign c s), likewise between two samples (the same positions,
    the same rotation); between two tokens t != s of a sample, tok mean(c_t c_s + s_t s_s) -- the
    mean of cos((t - s) theta_i) for one angle -- plus m^2 mean(sign (c_t s_s + s_t c_s)); the
    units are independent about a common mean m (docs/theory.md §16, "Rotary positions")."""
    p = nd.params
    fold.states[i] = [
        Part(
            x.share,
            p["gain"] * x.q + p["cross"] * x.mean**2,
            p["mean"] * x.mean,
            p["gain"] * x.shared + p["cross"] * x.mean**2,
            None,
            p["tokens"] * x.tok + p["tokens_cross"] * x.mean**2,
            x.axis,
        )
        for x in fold.states[nd.inputs[0]]
    ]


def _rotary_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """The gradient goes back through the transposed rotation: r mean(c^2 + s^2), and between
    two positions r_k mean(c_t c_s + s_t s_s) (the gradient's units uncorrelated)."""
    p = nd.params
    fold.give(nd.inputs[0], [(p["gain"] * r, p["grad_tokens"] * rk, None) for r, rk, _ in g], i)


map_op(
    "rotary",
    _rotary,
    _rotary_back,
    tangent=lambda nd, i, e, fold: nd.params["gain"] * e[0],
    gram=gram.rotated,
    gram_back=gram.rotated_back,
)


def _broadcast_back(nd: GraphNode, i: int, g: list, fold) -> None:
    """Each element's k copies' gradients, independent (each a head's own): k r, k r_k."""
    k = nd.forward
    fold.give(nd.inputs[0], [(k * r, k * rk, p) for r, rk, p in g], i)


map_op(
    "broadcast",
    _passes,
    _broadcast_back,
    tangent=lambda nd, i, e, fold: e[0],
    gram=gram.passes,
    gram_back=gram.passes_back,
)
