"""Softmax attention at initialization: the moments of its weights (docs/theory.md §15).

A query t reads n keys with logits z_s = scale q_t . k_s; at initialization, for a fixed query,
the logits are Gaussian across the keys with variance s^2 = scale^2 d_h q_q (q_k - t_k) (q_q the
per-element second moment of the queries, q_k and t_k the keys' second moment and their shared
moment between the tokens of one sample: the part common to every key moves no logit).  The
weights w = softmax(z) then have mean 1/n and a collision probability P(s^2, n) = E[sum_s w_s^2]
-- 1/n for uniform attention (s^2 -> 0), e^{s^2}/n for many keys (the lognormal law of large
numbers), 1 when one key takes all -- that sets how much of the values' independent part the
output keeps: E[o^2] = t_v + (q_v - t_v) P (Noci et al. 2022 write the uniform case: rank
collapse, every token the same vector, Dong et al. 2021).  P is computed here by a deterministic
quadrature of its Laplace-transform form (``collision``), exact up to the nodes; tests/theory
check it against a Monte Carlo of the softmax itself."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

#: quadrature nodes per axis of ``collision`` (Gauss-Hermite over a logit, generalised
#: Gauss-Laguerre over the Laplace variable)
ATTENTION_NODES = 64
#: the largest logit variance ``collision`` is computed at: within the standard error of a Monte
#: Carlo of the softmax (20,000 draws) for n from 2 to 256 up to s^2 = 1024
#: (tests/theory/test_attention.py); the grid's tables grow as s^2 (45 MB at 1024), and past it one
#: key takes nearly all of a query's weight (P = 0.91-0.98 at n = 2-256)
MAX_LOGIT_VARIANCE = 1024.0
#: the logit variance above which ``collision`` reads the log-domain grid (``_collision_grid``):
#: below it the Gauss quadrature agrees with the grid within 2e-5 and is 20x faster; above, the
#: Gauss nodes undersample the lognormal's tail (0.6% low at s^2 = 4, n = 2; 42% at s^2 = 16)
GRID_LOGIT_VARIANCE = 1.0


@lru_cache(maxsize=4096)
def collision(s2: float, n: int) -> float:
    """P(s^2, n) = E[sum_s w_s^2] for w = softmax of n i.i.d. N(0, s^2) logits; 1 for one key, 1/n
    at s^2 = 0.  Exact up to quadrature: with 1/(1 + y)^2 = int_0^inf t e^{-t(1 + y)} dt and y
    = R e^{-z} (z one logit, R the sum of the other n - 1 exponentials, independent of z),

        P = n E_z int_0^inf t e^{-t} phi(t e^{-z})^(n-1) dt,   phi(l) = E[exp(-l e^{z'})],

    up to s^2 = ``GRID_LOGIT_VARIANCE`` the t-integral scaled per z by a = e^z / m, m = (n - 1)
    e^{s^2/2} (the mean of R), so that the generalised Gauss-Laguerre weight tau e^{-tau} carries
    its decay for any n: int = a^2 sum_k w_k exp(tau_k (1 - a) + (n - 1) ln phi(tau_k / m)),
    Gauss-Hermite over z and z'; beyond, the same integral on a log-domain grid
    (``_collision_grid``).  Trusted up to ``MAX_LOGIT_VARIANCE``."""
    if n <= 1:
        return 1.0
    if s2 <= 0.0:
        return 1.0 / n
    if s2 > MAX_LOGIT_VARIANCE:
        raise ValueError(
            f"collision: logit variance {s2:g} beyond {MAX_LOGIT_VARIANCE:g} (MAX_LOGIT_VARIANCE)"
        )
    if s2 > GRID_LOGIT_VARIANCE:
        return _collision_grid(s2, n)
    from scipy.special import roots_genlaguerre  # scipy's import is slow: only when attention is mapped

    x, w = np.polynomial.hermite_e.hermegauss(ATTENTION_NODES)
    w = w / w.sum()
    tau, wt = roots_genlaguerre(ATTENTION_NODES, 1.0)
    sig = math.sqrt(s2)
    m = (n - 1) * math.exp(s2 / 2)
    ez = np.exp(sig * x)
    log_phi = np.log((w[None, :] * np.exp(-(tau / m)[:, None] * ez[None, :])).sum(1))
    a = ez / m
    inner = a**2 * (wt[None, :] * np.exp(tau[None, :] * (1 - a[:, None]) + (n - 1) * log_phi[None, :])).sum(1)
    return float(min(1.0, max(1.0 / n, n * (w * inner).sum())))


def _collision_grid(s2: float, n: int) -> float:
    """``collision``'s integral with t = e^u, P = n E_z int e^{2u - e^u + (n - 1) Phi(u - z)} du,
    Phi(v) = ln E[exp(-e^{v + z'})], every variable on one uniform grid of step h = min(1/4, s/2)
    (so that u - z falls on Phi's grid), sums in the log domain.  The trapezoid rule converges
    geometrically on these analytic integrands: the Gaussian's error is ~ e^{-2 pi^2 s^2/h^2} (<
    1e-17 at h = s/2), e^{-e^u}'s ~ e^{-pi^2/h} (1e-17 at h = 1/4); the grid runs over 9 s of a
    logit (weights renormalised on it) and u from -32 (e^{2u} < 1e-27) to 4 (e^{-e^4} < 1e-23).
    Agrees with the Gauss quadrature within 2e-5 at s^2 <= 1 and with a Monte Carlo of the softmax
    within its standard error to s^2 = 1024 (tests/theory/test_attention.py)."""
    from scipy.special import logsumexp  # scipy's import is slow: only when attention is mapped

    lw, u, phi, at = _grid_tables(s2)
    f = (2.0 * u - np.exp(u))[None, :] + (n - 1) * phi[at]
    inner = logsumexp(f, axis=1) + math.log(u[1] - u[0])
    return float(min(1.0, max(1.0 / n, n * math.exp(logsumexp(lw + inner)))))


@lru_cache(maxsize=16)  # up to 3 MB an entry (the index at s^2 = 1024)
def _grid_tables(s2: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What ``_collision_grid`` reads for every n at one s^2: the logit's log weights on the
    grid, u, Phi on the grid of u - z, and the index of Phi(u - z) per (z, u)."""
    from scipy.special import logsumexp  # scipy's import is slow: only when attention is mapped

    sig = math.sqrt(s2)
    h = min(0.25, sig / 2.0)
    k = int(math.ceil(9.0 * sig / h))
    iz = np.arange(-k, k + 1)
    lw = -0.5 * (h * iz / sig) ** 2
    lw -= logsumexp(lw)
    iu = np.arange(math.floor(-32.0 / h), math.ceil(4.0 / h) + 1)
    j0 = iu[0] - k
    v = h * np.arange(j0, iu[-1] + k + 1)
    with np.errstate(over="ignore"):  # e^{v + z'} = inf is exp(-inf) = 0 of the sum: as meant
        phi = logsumexp(lw[None, :] - np.exp(v[:, None] + h * iz[None, :]), axis=1)
    return lw, h * iu, phi, iu[None, :] - iz[:, None] - j0


def key_counts(T: int, causal: bool, keys: int | None = None) -> np.ndarray:
    """The keys each of T queries reads: all ``keys`` (default T), or t + 1 under a causal mask."""
    if causal:
        return np.arange(1, T + 1)
    return np.full(T, T if keys is None else keys)


def attention_weights(s2: float, T: int, causal: bool, keys: int | None = None) -> tuple[float, float]:
    """(P-bar, C-bar) over the T queries of one sample: the mean collision probability P(s^2, n_t)
    and the mean over ordered pairs of queries t != u of E[sum_s w_ts w_us] = 1/max(n_t, n_u) --
    two queries' weights independent (their logits are, for queries with no shared part), each
    of mean 1/n over the keys it reads (docs/theory.md §15)."""
    n = key_counts(T, causal, keys)
    p = float(np.mean([collision(s2, int(k)) for k in n]))
    if T < 2:
        return p, 0.0
    if causal:  # pairs u < t read the first u + 1 keys together: 1/max = 1/(t + 1)
        c = float(sum((t) / (t + 1.0) for t in range(T)) * 2 / (T * (T - 1)))
    else:
        c = 1.0 / float(n[0])
    return p, c


def key_weight(s2: float, T: int, causal: bool, keys: int | None = None) -> float:
    """K = the mean over keys j of sum_t w_tj^2 (1 - 2 w_tj + sum_s w_ts^2): how much of the
    gradient a key's logits receive survives the softmax's centring -- d logit_tj = w_tj g_t .
    (v_j - sum_s w_ts v_s), and v_j - v-bar_t keeps 1 - 2 w_tj + sum_s w_ts^2 of the values'
    spread.  For rows of equal weights (s^2 -> 0) it is the mean over queries of c_t (1 - c_t),
    c_t = 1/n_t; beyond, each query's expectation by ``entropy``'s Monte Carlo (``_key_weight``).
    A query that reads one key (a causal mask's first)
    sends its key nothing: under a causal mask K is about half of P-bar (0.53 at T = 16), and it
    is P-bar (1 - 1/T) without one (docs/theory.md §15)."""
    return float(np.mean(key_weights(s2, T, causal, keys)))


def key_weights(s2: float, T: int, causal: bool, keys: int | None = None) -> np.ndarray:
    """Per query t the expectation ``key_weight`` averages, E[sum_s w_ts^2 (1 - 2 w_ts + sum_s'
    w_ts'^2)] over the n_t keys it reads: 0 for a causal mask's first query (one key)."""
    return np.array([_key_weight(s2, int(k)) for k in key_counts(T, causal, keys)])


def _key_weight(s2: float, n: int) -> float:
    """E[sum w^2 - 2 sum w^3 + (sum w^2)^2] for the softmax w of n i.i.d. N(0, s^2) logits: c (1 -
    c), c = 1/n, at s^2 = 0; beyond, ``entropy``'s Monte Carlo on its fixed stream."""
    if n <= 1:
        return 0.0
    if s2 <= 0.0:
        return (1.0 / n) * (1.0 - 1.0 / n)
    return _softmax_draws(s2, n)[1]


@lru_cache(maxsize=4096)
def _softmax_draws(s2: float, n: int) -> tuple[float, float]:
    """``ENTROPY_DRAWS`` rows of n i.i.d. N(0, s^2) logits on one fixed stream (numpy's PCG64,
    seed 0: the same every call), shifted by their row's maximum, and their softmax weights w:
    the two averages ``entropy`` and ``_key_weight`` read, E[H(w)]/ln n and E[sum w^2 - 2 sum w^3
    + (sum w^2)^2], from one draw (each drew its own before: half a fold's time at T = 64)."""
    z = np.random.Generator(np.random.PCG64(0)).standard_normal((ENTROPY_DRAWS, n)) * math.sqrt(s2)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    total = e.sum(axis=1, keepdims=True)
    w = e / total
    h = np.log(total[:, 0]) - (e * z).sum(axis=1) / total[:, 0]
    c = (w * w).sum(axis=1)
    return float(h.mean() / math.log(n)), float((c - 2.0 * (w**3).sum(axis=1) + c * c).mean())


#: draws of ``entropy``'s Monte Carlo (one fixed stream: the same value every call): its
#: standard error of H/ln n at s^2 <= 0.5 is 0.0024 for two keys and 0.0005 for 16, at s^2 = 4
#: 0.005 and 0.0025 -- a tenth of the 0.05 the measured column is held to, or less
ENTROPY_DRAWS = 4096


def entropy(s2: float, n: int) -> float:
    """E[H(w)]/ln n for w = softmax of n i.i.d. N(0, s^2) logits: the normalised entropy of one
    query's weights, 1 at s^2 = 0 (uniform), 0 when one key takes all; H = ln Z - sum_s w_s z_s,
    Z = sum_s e^{z_s}.  A Monte Carlo of ``ENTROPY_DRAWS`` draws on one fixed stream (numpy's
    PCG64, seed 0; deterministic), checked in tests/theory against the exact two-key integral
    and the small-s^2 expansion 1 - s^2 (n - 1)/(2 n ln n)."""
    if n <= 1:
        return float("nan")  # one key: no entropy to compare (as the measured column)
    if s2 <= 0.0:
        return 1.0
    return _softmax_draws(s2, n)[0]


def attention_entropy(s2: float, T: int, causal: bool, keys: int | None = None) -> float:
    """The mean over the queries that read two keys or more of ``entropy``(s^2, n_t): what the
    measured column averages (docs/theory.md §16)."""
    n = [int(k) for k in key_counts(T, causal, keys) if k >= 2]
    return float(np.mean([entropy(s2, k) for k in n])) if n else float("nan")


def capped(s2: float, cap: float | None) -> tuple[float, float]:
    """Soft-capped logits c tanh(z/c) (Gemma 2's ``attn_logit_softcapping``) of z ~ N(0, s^2):
    their variance E[c^2 tanh^2(z/c)] and E[sech^4(z/c)], the square of the cap's slope (what it
    passes of a logit's gradient), by Gauss-Hermite quadrature; (s^2, 1) without a cap."""
    if cap is None or s2 <= 0.0:
        return s2, 1.0
    x, w = np.polynomial.hermite_e.hermegauss(ATTENTION_NODES)
    w = w / w.sum()
    th = np.tanh(math.sqrt(s2) * x / cap)
    return float((w * (cap * th) ** 2).sum()), float((w * (1.0 - th * th) ** 2).sum())


def logit_variance(scale: float, head_dim: int, q_query: float, q_key: float, tokens_key: float) -> float:
    """s^2 = scale^2 d_h q_q (q_k - t_k): the variance across keys of one query's logits."""
    return scale * scale * head_dim * q_query * max(q_key - tokens_key, 0.0)
