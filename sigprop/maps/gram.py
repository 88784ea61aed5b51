"""The tokens' Gram matrix downstream of a causal attention (docs/theory.md §16, "A causal mask's
position profile").  No torch here.

A causal attention at uniform weights gives query t the mean of the first t + 1 values: its output
Gram G_o = W G_v W^T (W_ts = 1/(t + 1) for s <= t) is far from the one number per moment the fold
keeps -- early tokens carry more of their own energy (G_o,tt = 1/(t + 1) of the values' own part),
late ones are near-copies of each other.  Ops that are nonlinear in the pair moments read that
profile: a per-token norm divides each token by its own RMS, so two tokens' cosine after it is
the mean over pairs of G_ts/sqrt(G_tt G_ss), not mean(G_ts)/mean(G_tt); an activation's kernel
is a curve in each pair's correlation.  This module carries, from each causal attention on, the
T x T shape of the state's Gram (``fold.gram``: per element, absolute, rescaled to the fold's
own q and token moment at every node) and corrects the token moment the fold keeps at those ops
by the ratio of the profile's answer to the uniform one's -- so each op's own corrections (a
layer norm's centring, an RMSNorm's eps) stay, and a state without a profile is left exactly as
before.  The token cosine read at a site is the mean over pairs of the cosines of the carried
Gram.  Ops that mix tokens otherwise, or whose token axis the fold does not know (a slice, a
concatenation, a pooling), drop the profile (uniform from there on)."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from sigprop import theory
from sigprop.maps.state import Piece, law_of

#: Gauss-Legendre nodes per side of 0 of the per-pair quadrature (an activation with a jump)
PAIR_NODES = 24


def uniform(q: float, tok: float, T: int) -> np.ndarray:
    """The Gram of T tokens that share one moment ``tok`` and each hold ``q``."""
    return (q - tok) * np.eye(T) + tok * np.ones((T, T))


def off_mean(G: np.ndarray) -> float:
    T = G.shape[0]
    return float((G.sum() - np.trace(G)) / (T * (T - 1))) if T > 1 else 0.0


def _diag_mean(G: np.ndarray) -> float:
    return float(np.trace(G)) / G.shape[0]


def _flat(G: np.ndarray) -> np.ndarray:
    """The uniform Gram of G's own means: what the fold's one number per moment reads."""
    return uniform(_diag_mean(G), off_mean(G), G.shape[0])


def rescaled(G: np.ndarray, q: float, tok: float) -> np.ndarray:
    """G's shape at the level (q, tok): its diagonal times q/mean(diag), the rest times tok/mean."""
    T = G.shape[0]
    tr, total = float(np.trace(G)), float(G.sum())
    dm = tr / T
    om = (total - tr) / (T * (T - 1)) if T > 1 else 0.0
    a = q / dm if dm > 0 else 0.0
    b = tok / om if abs(om) > 1e-12 * max(dm, 1e-300) else 0.0
    out = b * G
    idx = np.arange(T)
    out[idx, idx] = a * G[idx, idx]
    return out


def cosine(G: np.ndarray) -> float:
    """The mean over two tokens t != s of G_ts/sqrt(G_tt G_ss)."""
    d = np.sqrt(np.clip(np.diag(G), 1e-300, None))
    return off_mean(G / np.outer(d, d))


def causal_mean(T: int) -> np.ndarray:
    """W_ts = 1/(t + 1) for s <= t: a causal attention's mean weights."""
    return np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]


def _pair_weights(s2: float, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Per causal query t (n = t + 1 keys) its weights' E[w_s^2] - 1/n^2 (a) and E[w_s w_s'] -
    1/n^2 for two keys s != s' (b): the weights' fluctuation about their mean, from the collision
    probability c = E[sum w^2] of n i.i.d. N(0, s^2) logits (``theory.collision``): E[w_s^2] =
    c/n, E[w_s w_s'] = (1 - c)/(n (n - 1))."""
    n = np.arange(1, T + 1, dtype=np.float64)
    c = np.array([theory.collision(float(s2), int(k)) for k in n.astype(int)])
    a = c / n - 1.0 / n**2
    b = np.where(n > 1, (1.0 - c) / (n * np.maximum(n - 1.0, 1.0)) - 1.0 / n**2, 0.0)
    return a, b


def attended(Gv: np.ndarray, s2: float) -> np.ndarray:
    """A causal attention's output Gram from its values': W G_v W^T between two queries (their
    weights independent, each of mean W), and on the diagonal each query's own weights'
    fluctuation added -- sum_s E[w_s^2] G_ss + sum_{s != s'} E[w_s w_s'] G_ss' over its keys."""
    T = Gv.shape[0]
    W = causal_mean(T)
    G = W @ Gv @ W.T
    if s2 > 0.0:
        a, b = _pair_weights(s2, T)
        d = np.cumsum(np.diag(Gv))  # sum over the first t + 1 keys of G_ss
        tot = np.cumsum(np.cumsum(Gv, 0), 1)[np.arange(T), np.arange(T)]  # sum over the block
        G[np.arange(T), np.arange(T)] += a * d + b * (tot - d)
    return G


def attended_back(R: np.ndarray, s2: float) -> np.ndarray:
    """The values' gradient Gram from the output's: W^T R W, plus each query's weights'
    fluctuation on its own block, R_tt (a on the diagonal, b off it, over its keys)."""
    T = R.shape[0]
    W = causal_mean(T)
    C = W.T @ R @ W
    if s2 > 0.0:  # query t's block is keys 0..t: sum over t >= max(s, s') of R_tt b_t, and a - b on it
        a, b = _pair_weights(s2, T)
        r = np.diag(R)
        tail = lambda v: np.cumsum(v[::-1])[::-1]
        idx = np.arange(T)
        C += tail(r * b)[np.maximum.outer(idx, idx)]
        C[idx, idx] += tail(r * (a - b))
    return C


def _kernel(phi, mean: float, G: np.ndarray) -> np.ndarray:
    """E[phi(u_t) phi(u_s)] for every pair, (u_t, u_s) jointly Gaussian about ``mean`` with
    second moments G: off the diagonal by Mehler's expansion, sum_k rho^k c_k(t) c_k(s) with c_k(t)
    = E[phi(mean + sd_t z) He_k(z)]/sqrt(k!) (``TERMS`` terms, Gauss-Hermite in z), on it E[phi^2]
    by the same quadrature -- T one-variable quadratures instead of T^2 two-variable ones
    (0.2 s -> 4 ms for T = 64; within 0.5% of a 2e6-draw Monte Carlo for ReLU, 1e-14 of the
    two-variable quadrature for SiLU).  A phi with a jump (ReLU's derivative), whose Hermite
    coefficients the nodes do not resolve (13% off), takes the two-variable quadrature per pair
    (``_pairs``: 3% off there)."""
    if not _continuous(phi):
        return _pairs(phi, mean, G)
    T = G.shape[0]
    z, w = _hermite()
    sd = np.sqrt(np.clip(np.diag(G) - mean * mean, 0.0, None))
    f = phi((mean + sd[:, None] * z[None, :]).ravel()).reshape(T, z.size)  # [T, nodes]
    c = (f * w) @ _basis().T  # [T, TERMS]: c_k(t)
    rho = np.clip((G - mean * mean) / np.maximum(np.outer(sd, sd), 1e-300), -1.0, 1.0)
    out = np.zeros_like(G)
    for k in range(TERMS - 1, -1, -1):  # Horner in rho: c_0 c_0^T + rho (c_1 c_1^T + rho (...))
        out *= rho
        out += c[:, k, None] * c[None, :, k]
    out[np.arange(T), np.arange(T)] = (f * f) @ w  # E[phi^2] exactly, not the series at rho = 1
    return out


@functools.lru_cache(maxsize=256)
def _continuous(phi) -> bool:
    """Whether phi has no jump on [-8, 8] (steps of 1e-3: a jump is a step 100 times the largest
    of its neighbours' and above 1e-3 of its range)."""
    x = np.linspace(-8.0, 8.0, 16001)
    d = np.abs(np.diff(phi(x)))
    scale = float(np.abs(phi(x)).max()) + 1e-300
    big = int(np.argmax(d))
    near = np.concatenate([d[max(big - 5, 0) : big], d[big + 1 : big + 6]])
    return not (d[big] > 1e-3 * scale and d[big] > 100.0 * float(near.max(initial=0.0)))


def _pairs(phi, mean: float, G: np.ndarray) -> np.ndarray:
    """E[phi(u_t) phi(u_s)] per pair by two-variable Gauss-Legendre (``PAIR_NODES`` per side of
    0 in each variable), every pair in one array."""
    T = G.shape[0]
    span = theory.activation.QUAD_SPAN
    t, w = np.polynomial.legendre.leggauss(PAIR_NODES)
    x = np.concatenate([0.5 * span * (t - 1.0), 0.5 * span * (t + 1.0)])
    wt = np.concatenate([0.5 * span * w, 0.5 * span * w]) * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    sd = np.sqrt(np.clip(np.diag(G) - mean * mean, 0.0, None))
    a, b = np.triu_indices(T)
    rho = np.clip((G[a, b] - mean * mean) / np.maximum(sd[a] * sd[b], 1e-300), -1.0, 1.0)
    u, v = x[None, :, None], x[None, None, :]
    shape = (a.size, x.size, x.size)
    za = np.broadcast_to(mean + sd[a][:, None, None] * u, shape)
    zb = mean + sd[b][:, None, None] * (rho[:, None, None] * u + np.sqrt(1.0 - rho * rho)[:, None, None] * v)
    vals = np.einsum("i,pij,j->p", wt, phi(za.ravel()).reshape(shape) * phi(zb.ravel()).reshape(shape), wt)
    out = np.empty_like(G)
    out[a, b] = vals
    out[b, a] = vals
    return out


#: Mehler's expansion's terms and the Gauss-Hermite nodes of its coefficients
TERMS, HERMITE_NODES = 48, 96


@functools.lru_cache(maxsize=1)
def _hermite() -> tuple[np.ndarray, np.ndarray]:
    """Probabilists' Gauss-Hermite nodes and weights (weights summing to 1)."""
    z, w = np.polynomial.hermite_e.hermegauss(HERMITE_NODES)
    return z, w / w.sum()


@functools.lru_cache(maxsize=1)
def _basis() -> np.ndarray:
    """He_k(z)/sqrt(k!) at the nodes, k < ``TERMS`` (by the normalised recurrence)."""
    z, _ = _hermite()
    h = np.zeros((TERMS, z.size))
    h[0] = 1.0
    h[1] = z
    for k in range(1, TERMS - 1):
        h[k + 1] = (z * h[k] - math.sqrt(k) * h[k - 1]) / math.sqrt(k + 1)
    return h


def _tok_ratio(profile: np.ndarray, flat: np.ndarray) -> float | None:
    """The token moment's correction: the profile's off-diagonal share over the uniform one's."""
    ref = off_mean(flat) / max(_diag_mean(flat), 1e-300)
    if abs(ref) < 1e-12:
        return None
    return off_mean(profile) / max(_diag_mean(profile), 1e-300) / ref


def step(nd, i: int, fold, merged) -> None:
    """Node i's Gram (``fold.gram[i]``) from its inputs' by its op's law (``OpMap.gram``: none, the
    profile dropped), and where the op reads the pairs nonlinearly, its state's token moment
    corrected (``merged``: a state's parts as one)."""
    st = fold.states[i]
    if st is None or len(st) != 1 or st[0].tokens is None:
        return
    law = law_of(nd, "gram")
    G = None if law is None else law(nd, i, fold, merged)
    if G is not None:
        fold.gram[i] = rescaled(G, st[0].q, st[0].tok)


def _input(nd, fold, at: int = 0) -> np.ndarray | None:
    return fold.gram.get(nd.inputs[at])


def passes(nd, i: int, fold, merged) -> np.ndarray | None:
    """An op on each token alike and linearly (a reshape, a scaling, a dense layer on each token,
    a piece of one): the Gram's shape passes (a conv's taps mix positions: dropped)."""
    return None if nd.mats else _input(nd, fold)


def piece(nd, i: int, fold, merged) -> np.ndarray | None:
    """A slice: a piece of a weight layer's output (``Piece``: its own rows of each token) passes
    the shape; another part (of the tokens) drops it."""
    return _input(nd, fold) if isinstance(nd.params, Piece) else None


def rotated(nd, i: int, fold, merged) -> np.ndarray | None:
    """Rotary positions: each pair of tokens' moment times its mean relative rotation."""
    G_in = _input(nd, fold)
    if G_in is None:
        return None
    pair = nd.params.get("pair")
    return G_in * pair if pair is not None and pair.shape == G_in.shape else G_in


def per_token(eps_of):
    """A norm with one statistic per token, its eps as its map reads it (``eps_of(nd)``; None:
    not per token -- a batch norm): each token divided by its own RMS.  Its eps counts per token,
    so where it is not far below the tokens' mean squares, and those differ by position (a causal
    attention's early tokens), the second moment moves too: mean_t of G_tt/(G_tt + eps) against
    the fold's q/(q + eps) (OLMo-2's post-branch norms at init: the embeddings' gradient 37% high
    without it, docs/theory.md §16)."""

    def law(nd, i: int, fold, merged) -> np.ndarray | None:
        G_in, eps = _input(nd, fold), eps_of(nd)
        if G_in is None or eps is None:
            return None
        d = np.sqrt(np.clip(np.diag(G_in) + eps, 1e-300, None))
        G = G_in / np.outer(d, d)
        flat = _flat(G_in) / (_diag_mean(G_in) + eps)
        _correct(fold.states[i], _tok_ratio(G, flat), _diag_mean(G) / _diag_mean(flat))
        return G

    def back(nd, k: int, pos: int, j: int, R: np.ndarray, fold, merged):
        G, eps = fold.gram.get(j), eps_of(nd)
        if eps is None:
            return None
        if G is None or G.shape[0] != R.shape[0]:
            return R, (1.0, 1.0)
        v = np.diag(G) + eps
        s = 1.0 / np.sqrt(np.clip(v, 1e-300, None))
        C = R * np.outer(s, s)
        return C, _levels(C, R / float(np.mean(v)))

    return law, back


def activated(nd, i: int, fold, merged) -> np.ndarray | None:
    """An activation: its kernel on each pair (``_kernel``)."""
    G_in = _input(nd, fold)
    if G_in is None:
        return None
    m = merged(fold.states[nd.inputs[0]]).mean
    G = _kernel(nd.fn[0], m, G_in)
    _correct(fold.states[i], _tok_ratio(G, _kernel(nd.fn[0], m, _flat(G_in))))
    return G


def _two(nd, fold, merged) -> list | None:
    """A two-input op's inputs' Grams, an input without a profile read as uniform (None: neither
    has one)."""
    grams = [fold.gram.get(j) for j in nd.inputs]
    if len(nd.inputs) != 2 or all(g is None for g in grams):
        return None
    T = next(g.shape[0] for g in grams if g is not None)
    mats = []
    for j, g in zip(nd.inputs, grams):
        s = merged(fold.states[j])
        mats.append(g if g is not None and g.shape[0] == T else uniform(s.q, s.tok, T))
    return mats


def summed(nd, i: int, fold, merged) -> np.ndarray | None:
    """A sum of two states: their Grams add."""
    mats = _two(nd, fold, merged)
    return None if mats is None else mats[0] + mats[1]


def multiplied(nd, i: int, fold, merged) -> np.ndarray | None:
    """A product of two independent states: their Grams multiply entrywise."""
    mats = _two(nd, fold, merged)
    return None if mats is None else mats[0] * mats[1]


def causal(nd, i: int, fold, merged) -> np.ndarray | None:
    """A causal attention: the output's Gram from the values' (``attended``), where the values
    have a profile the fold's q and token moment corrected by the profile's over the uniform
    one's (its own terms kept); where not, from the uniform values'."""
    if nd.params is None or not nd.params.causal:
        return None
    T = int(nd.params.tokens)
    if T < 2 or int(nd.params.keys) != T:
        return None
    v = nd.inputs[2]
    Gv = fold.gram.get(v)
    s2 = fold.logit_variance.get(i, 0.0)
    if Gv is not None and Gv.shape[0] == T:
        flat = attended(_flat(Gv), s2)
        G = attended(Gv, s2)
        dq = (np.trace(G) / np.trace(flat)) if np.trace(flat) > 0 else 1.0
        _correct(fold.states[i], _tok_ratio(G, flat), float(dq))
        return G
    s = merged(fold.states[v])
    return attended(uniform(s.q, s.tok, T), s2)


def _correct(st: list, ratio: float | None, q_ratio: float = 1.0) -> None:
    """A state's token moment times the profile's correction (``ratio``: of its share of q), its
    second moment times ``q_ratio``."""
    if ratio is not None and math.isfinite(ratio) and math.isfinite(q_ratio):
        s = st[0]
        st[0] = dataclasses.replace(s, q=s.q * q_ratio, tokens=s.tok * ratio * q_ratio)


# --------------------------------------------------------------------------------------------
# the gradients' Gram: the same profile backward
# --------------------------------------------------------------------------------------------
def _levels(C: np.ndarray, flat: np.ndarray) -> tuple[float, float | None]:
    """The ratios of a share's second moment and token moment with the profile to without."""
    dq = _diag_mean(C) / _diag_mean(flat) if _diag_mean(flat) > 0 else 1.0
    of = off_mean(flat)
    dk = off_mean(C) / of if abs(of) > 1e-12 * max(_diag_mean(flat), 1e-300) else None
    return dq, dk


def _share(nd, k: int, pos: int, j: int, R: np.ndarray, fold, merged):
    """(the share's Gram shape, its levels' corrections) that reader k (op ``nd``, j its input
    ``pos``) gives node j from k's gradient Gram R, by its op's law (``OpMap.gram_back``); None
    where the op is not read here."""
    law = law_of(nd, "gram_back")
    return None if law is None else law(nd, k, pos, j, R, fold, merged)


def passes_back(nd, k: int, pos: int, j: int, R: np.ndarray, fold, merged):
    """Linear on each token (a sum too): the gradient's Gram passes unchanged."""
    return None if nd.mats else (R, (1.0, 1.0))


def piece_back(nd, k: int, pos: int, j: int, R: np.ndarray, fold, merged):
    return (R, (1.0, 1.0)) if isinstance(nd.params, Piece) and not nd.mats else None


def rotated_back(nd, k: int, pos: int, j: int, R: np.ndarray, fold, merged):
    pair = nd.params.get("pair")
    return (R * pair if pair is not None and pair.shape == R.shape else R), (1.0, 1.0)


def activated_back(nd, k: int, pos: int, j: int, R: np.ndarray, fold, merged):
    """phi'(x) times the gradient: R times phi''s kernel on the input's Gram."""
    G = fold.gram.get(j)
    if G is None or G.shape[0] != R.shape[0]:
        return R, (1.0, 1.0)
    m = merged(fold.states[j]).mean
    D = _kernel(nd.fn[1], m, G)
    C = R * D
    return C, _levels(C, R * _kernel(nd.fn[1], m, _flat(G)))


def causal_back(nd, k: int, pos: int, j: int, R: np.ndarray, fold, merged):
    """A causal attention: the queries' and keys' shares (``_query_key_share``), the values'
    ``attended_back``."""
    T = R.shape[0]
    if nd.params is None or not nd.params.causal or int(nd.params.tokens) != T:
        return None
    s2 = fold.logit_variance.get(k, 0.0)
    if pos != 2:
        return _query_key_share(R, s2, pos)
    C = attended_back(R, s2)
    return C, _levels(C, attended_back(_flat(R), s2))


def product_back(nd, k: int, pos: int, j: int, R: np.ndarray, fold, merged):
    """A product: R times the other factor's Gram."""
    if len(nd.inputs) != 2:
        return None
    Go = fold.gram.get(nd.inputs[1 - pos])
    if Go is None or Go.shape[0] != R.shape[0]:
        return R, (1.0, 1.0)
    C = R * Go
    return C, _levels(C, R * _flat(Go))


def _query_key_share(R: np.ndarray, s2: float, pos: int):
    """A causal attention's queries' (pos 0) or keys' (pos 1) gradient Gram from its output's R:
    query t's gradient is R_tt K_t (K_t = ``theory.key_weights``: what its weights' centring
    leaves, 0 for the first query, which reads one key), key s's the sum over the queries t >= s
    that read it of R_tt K_t/(t + 1); the map's own level reads mean(R) mean(K), so the levels'
    correction is mean(R_tt K_t)/(mean(R) mean(K)) -- early positions carry the larger gradients
    and the smaller K (docs/theory.md §16).  The off-diagonal keeps R's shape, scaled per token."""
    T = R.shape[0]
    K = theory.key_weights(s2, T, True)
    r = np.clip(np.diag(R), 1e-300, None)
    if pos == 0:
        a = r * K
    else:
        a = np.cumsum((r * K / np.arange(1, T + 1))[::-1])[::-1]
    k_mean = float(np.mean(K))
    if k_mean <= 0.0 or not np.all(np.isfinite(a)):
        return R, (1.0, 1.0)
    s = np.sqrt(a / r)
    C = R * np.outer(s, s)
    return C, _levels(C, R * k_mean)  # against the uniform reading: every token's K the mean


def back_step(nd, k: int, given: dict, fold, merged) -> None:
    """After node k's backward gave its inputs ``given`` ({j: (r, rk)}, what each got from k):
    where k's gradient has a Gram (``fold.rgram``) or its op makes one from the forward's, each
    input's share with its profile, its levels corrected in the fold's gradients (the op's own
    terms kept), recorded for the input's Gram (``fold.rshares``)."""
    R = fold.rgram.get(k)
    g = fold.grads[k]
    if R is None:
        T = next((fold.gram[j].shape[0] for j in nd.inputs if j in fold.gram), None)
        if T is None and getattr(nd.params, "causal", False) and law_of(nd, "gram_back") is causal_back:
            T = int(nd.params.tokens)  # a causal attention's gradient Gram made here
        if T is None or g is None or len(g) != 1 or T < 2:
            return
        R = uniform(g[0][0], g[0][1], T)
    for pos, j in enumerate(nd.inputs):
        if j not in given or fold.grads[j] is None or len(fold.grads[j]) != 1:
            continue
        got = _share(nd, k, pos, j, R, fold, merged)
        if got is None:
            continue
        C, (dq, dk) = got
        r, rk = given.pop(j)
        r2, rk2 = r * dq, (rk * dk if dk is not None else rk)
        if math.isfinite(r2) and math.isfinite(rk2):
            fold.grads[j][0][0] += r2 - r
            fold.grads[j][0][1] += rk2 - rk
            r, rk = r2, rk2
        fold.rshares.setdefault(j, []).append((C, r, rk))


def finish(j: int, fold) -> None:
    """Node j's gradient Gram once all its readers gave: the sum of their shares, each at its
    level (a share given without a profile: uniform), rescaled to the fold's totals."""
    shares = fold.rshares.pop(j, None)
    g = fold.grads[j]
    if not shares or g is None or len(g) != 1:
        return
    T = shares[0][0].shape[0]
    total = sum(rescaled(C, r, rk) for C, r, rk in shares if C.shape[0] == T)
    given = sum(r for _, r, _ in shares)
    rest = g[0][0] - given  # readers whose share has no profile here
    if rest > 1e-12 * max(g[0][0], 1e-300):
        rest_k = g[0][1] - sum(rk for _, _, rk in shares)
        total = total + uniform(rest, rest_k, T)
    fold.rgram[j] = rescaled(total, g[0][0], g[0][1])
