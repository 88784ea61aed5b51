"""The input-output Jacobian's spectrum at init (``sigprop spectrum``; issue 30; torch).

For each weight draw and each of N inputs x, J = d h^L / d x (the plan's last state in its
input, the net the probe walks: ``walker.as_function``) exactly, by reverse mode over every
output (``torch.func.jacrev``, vectorised over the samples), then its singular values in
float64.  The eigenvalues of J J^T (n_out of them: the squared singular values and, where n_out >
n_in, zeros) are what the summaries read: their mean is tr(J J^T)/n_out = E||J^T e||^2/||e||^2
for e ~ N(0, I), the squared backward ratio sigprop's probe measures (docs/theory.md §14).
A user's model (the module kind) is read the same way through its own forward
(``model_jacobians``, ``model_function``).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from sigprop import walker

#: the fraction's band: eigenvalues within a factor 2 of one
NEAR = 2.0


def jacobian(
    fn: walker.Function,
    x: torch.Tensor,
    upto: int | None = None,
    batch: int | None = None,
    together: bool = False,
) -> torch.Tensor:
    """J [N, n_out, n_in] of ``fn``'s output (flattened; the state after the first ``upto``
    units when given) in its input, one per sample; ``batch`` samples at a time (all: None).
    ``together``: the net normalises over the batch (``plans.batch_dependent``), so sample i's J
    is d y_i/d x_i of the batch map ``x``, the others held (``batch_function``)."""
    if together:
        n_in = math.prod(x.shape[1:])
        return torch.stack(
            [
                torch.func.jacrev(batch_function(fn, x, i, upto))(x[i]).reshape(-1, n_in)
                for i in range(x.shape[0])
            ]
        )

    def one(xi: torch.Tensor) -> torch.Tensor:
        return fn.forward(fn.params, xi.unsqueeze(0), upto).reshape(-1)

    step = x.shape[0] if batch is None else batch
    parts = [torch.func.vmap(torch.func.jacrev(one))(x[i : i + step]) for i in range(0, x.shape[0], step)]
    return torch.cat(parts).reshape(x.shape[0], -1, math.prod(x.shape[1:]))


def sample_function(fn: walker.Function) -> Callable[[torch.Tensor], torch.Tensor]:
    """One input (no batch dimension) -> the plan's last state, flattened."""
    return lambda z: fn.forward(fn.params, z.unsqueeze(0)).reshape(-1)


def in_batch(call: Callable, x: torch.Tensor, i: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Sample i's input -> row i of ``call`` (a batch -> its outputs), flattened, run inside the
    batch ``x`` with the other samples held: J of it is d y_i/d x_i of the batch map."""

    def f(z: torch.Tensor) -> torch.Tensor:
        return call(torch.cat([x[:i], z.unsqueeze(0), x[i + 1 :]]))[i].reshape(-1)

    return f


def batch_function(
    fn: walker.Function, x: torch.Tensor, i: int, upto: int | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Sample i's input -> its state inside the batch ``x`` (``in_batch``): for a plan whose batch
    norm normalises over the batch."""
    return in_batch(lambda xb: fn.forward(fn.params, xb, upto), x, i)


def eigenvalues(J: torch.Tensor) -> np.ndarray:
    """The eigenvalues of J J^T per sample [N, n_out]: the squared singular values (float64; those
    below the rank tolerance of J's own dtype set to 0) and n_out - n_in zeros where the output
    is the wider."""
    s = torch.linalg.svdvals(J.double()).cpu().numpy()
    n_out = J.shape[1]
    # J is as precise as its dtype: singular values below the rank tolerance (sigma_max times the
    # larger size times that dtype's epsilon, numpy's matrix_rank rule) are zeros, not data
    tol = s[:, :1] * max(J.shape[1:]) * torch.finfo(J.dtype).eps
    s = np.where(s > tol, s, 0.0)
    lam = s * s
    if lam.shape[1] < n_out:
        lam = np.concatenate([lam, np.zeros((lam.shape[0], n_out - lam.shape[1]))], axis=1)
    return lam


def summary(lam: np.ndarray, k: int) -> dict:
    """One draw's summaries over its samples' eigenvalues [N, n_out] (the first ``k`` the squared
    singular values, in decreasing order): mean and variance of the eigenvalues (pooled), the
    largest and smallest singular value, the median over samples of the condition number
    sigma_max/sigma_min (inf where J is singular), and the fraction of the eigenvalues within a
    factor ``NEAR`` of one."""
    flat = lam.reshape(-1)
    s_max = np.sqrt(lam[:, 0])
    s_min = np.sqrt(lam[:, k - 1])
    with np.errstate(divide="ignore"):
        cond = np.where(s_min > 0, s_max / np.where(s_min > 0, s_min, 1.0), np.inf)
    cond_median = float(np.median(cond))
    return {
        "mean": float(flat.mean()),
        "variance": float(flat.var()),
        "sigma_max": float(s_max.max()),
        "sigma_min": float(s_min.min()),
        "condition": cond_median if math.isfinite(cond_median) else None,
        "near_one": float(np.mean((flat >= 1.0 / NEAR) & (flat <= NEAR))),
    }


def histogram(lam: np.ndarray, bins: int = 40, weights: np.ndarray | None = None) -> dict:
    """The eigenvalues' histogram on a log10 axis: bin edges (log10 sigma^2) over the positive
    ones, their counts (with ``weights``: the quadrature's weighted counts), and how many are
    zero."""
    w = np.ones_like(lam) if weights is None else weights
    pos = lam > 0
    if not pos.any():
        return {"log10_edges": [], "counts": [], "zeros": float(w.sum())}
    lo, hi = np.log10(lam[pos].min()), np.log10(lam[pos].max())
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(np.log10(lam[pos]), bins=bins, range=(lo, hi), weights=w[pos])
    as_int = weights is None
    return {
        "log10_edges": [float(e) for e in edges],
        "counts": [int(c) if as_int else float(c) for c in counts],
        "zeros": int(w[~pos].sum()) if as_int else float(w[~pos].sum()),
    }


class Gram:
    """J^T J at one input as an operator (``size``, ``device``, ``dtype``, a call): v -> J^T (J v),
    one forward-mode product (``torch.func.jvp``) and one reverse (``vjp``) -- what Lanczos and
    stochastic Lanczos quadrature read when J is too large to form; ``outer``: J J^T instead
    (v -> J (J^T v), of size n_out)."""

    def __init__(
        self, f: Callable[[torch.Tensor], torch.Tensor], xi: torch.Tensor, outer: bool = False
    ) -> None:
        """``f``: one input (the shape of ``xi``) -> the output, flattened (``sample_function``,
        ``model_function``)."""
        self.f = f
        self.xi = xi
        self.outer = outer
        self.n_out = int(self.f(xi).numel())
        _, self.pullback = torch.func.vjp(self.f, xi)
        self.size = self.n_out if outer else xi.numel()
        self.device, self.dtype = xi.device, xi.dtype

    def quadratic(self, v: torch.Tensor) -> float:
        """v^T G v = ||J v||^2 (outer: ||J^T v||^2) for a unit v, in float64 from one product."""
        if self.outer:
            (u,) = self.pullback(v.reshape(-1))
            return float(u.double().pow(2).sum())
        _, jv = torch.func.jvp(self.f, (self.xi,), (v.reshape(self.xi.shape),))
        return float(jv.double().pow(2).sum())

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        if self.outer:
            (u,) = self.pullback(v)
            _, out = torch.func.jvp(self.f, (self.xi,), (u,))
            return out.reshape(-1).detach()
        _, jv = torch.func.jvp(self.f, (self.xi,), (v.reshape(self.xi.shape),))
        (g,) = self.pullback(jv)
        return g.reshape(-1).detach()


def extremes_exact(lam: np.ndarray, k: int, count: int) -> dict:
    """The ``count`` largest (decreasing) and smallest (increasing) singular values, each the mean
    over samples of the i-th, from the eigenvalues [N, n_out] (decreasing; the first ``k`` =
    min(n_in, n_out) the squared singular values)."""
    s = np.sqrt(lam[:, :k])
    return {
        "top": [float(v) for v in s[:, :count].mean(0)],
        "bottom": [float(v) for v in s[:, k - count :].mean(0)[::-1]],
    }


class Deflated:
    """c I - G with the unit vectors ``found`` projected out (P (c I - G) P): its largest
    eigenvalue is G's next smallest, even where G's smallest is repeated -- a Krylov space from one
    start vector holds one direction of a repeated eigenvalue, so that Lanczos finds its copies
    only by rounding."""

    def __init__(self, op, c: float, found: list) -> None:
        self.op, self.c, self.found = op, c, found
        self.size, self.device, self.dtype = op.size, op.device, op.dtype

    def _project(self, v: torch.Tensor) -> torch.Tensor:
        for u in self.found:
            v = v - torch.dot(u, v) * u
        return v

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        v = self._project(v)
        return self._project(self.c * v - self.op(v))


#: ARPACK's relative tolerance for each smallest eigenvalue (``_smallest``): an error of tol x c
#: in lambda is sqrt(tol) of sigma_max in sigma (1e-6: 1e-3 of sigma_max, float32 products allow it)
BOTTOM_TOL = 1e-6


def _smallest(op, c: float, count: int, lanczos_top) -> list[float]:
    """G's ``count`` smallest eigenvalues one at a time, each the largest of ``Deflated`` c I - G
    (the ones found projected out), as the Rayleigh quotient of its Ritz vector
    (``Gram.quadratic``: ||J v||^2, a null vector of J at float rounding)."""
    found: list[torch.Tensor] = []
    out = []
    for i in range(count):
        _, (v,) = lanczos_top(Deflated(op, c, found), 1, tol=BOTTOM_TOL, seed=i + 1, vectors=True)
        for u in found:  # the vector as ARPACK returned it may keep a little of the found ones
            v = v - torch.dot(u, v) * u
        v = v / torch.linalg.vector_norm(v)
        found.append(v)
        out.append(max(op.quadratic(v), 0.0))
    return out


def extremes_one(g: "Gram", count: int, lanczos_top) -> tuple[np.ndarray, np.ndarray]:
    """One sample's ``count`` largest and smallest singular values, as ``extremes_exact`` reads
    them, by Lanczos (``lanczos_top``: the k largest-magnitude eigenvalues of an operator) on
    J^T J or J J^T, the smaller: the largest directly, the smallest from the top Ritz vectors
    v of c I - G (c a bound on the largest: 1.01 x its estimate) as the Rayleigh quotients
    ||J v||^2 (``Gram.quadratic``).  Read as c minus the Ritz values they were off by ARPACK's
    tolerance times c -- sqrt(1e-4) = 1% of sigma_max where J is rank-deficient (measured 0.0002-
    0.042 against the exact path's 0); the quotient's error is the vector's squared, and a null
    vector of J gives ||J v|| at float rounding (docs/theory.md §14)."""
    small = g if g.size <= g.n_out else Gram(g.f, g.xi, outer=True)
    top = sorted(lanczos_top(small, count), reverse=True)
    c = 1.01 * top[0]
    low = sorted(_smallest(small, c, count, lanczos_top))
    return np.sqrt(np.maximum(top, 0.0)), np.sqrt(np.maximum(low, 0.0))


def extremes_mean(per_sample: list) -> dict:
    """The samples' extremes (``extremes_one``) averaged, as the record holds them."""
    tops, bottoms = [t for t, _ in per_sample], [b for _, b in per_sample]
    return {"top": [float(v) for v in np.mean(tops, 0)], "bottom": [float(v) for v in np.mean(bottoms, 0)]}


def lanczos_summary(
    n_in: int, n_out: int, largest: list, nodes: list, weights: list
) -> tuple[dict, np.ndarray, np.ndarray]:
    """One draw's summaries from its samples' J^T J operators (n_in x n_in, J with n_out rows), their largest
    eigenvalues (restarted Lanczos) and their stochastic Lanczos quadratures (nodes and
    weights per probe, over the n_in eigenvalues of J^T J): the mean of the n_out eigenvalues of
    J J^T is n_in E[sum w theta]/n_out (the trace), their second moment n_in E[sum w theta^2]/n_out,
    sigma_max from Lanczos, sigma_min from the smallest Ritz value (an upper bound that Lanczos
    approaches from above: exact when the quadrature resolves the lower edge; 0 when n_in > n_out
    makes J^T J singular), and the fraction within a factor ``NEAR`` of one from the quadrature.
    Also the pooled nodes and their weights in units of eigenvalues (for the histogram)."""
    m1 = np.mean([sum(w * t for w, t in zip(ws, ts)) for ws, ts in zip(weights, nodes)])
    m2 = np.mean([sum(w * t * t for w, t in zip(ws, ts)) for ws, ts in zip(weights, nodes)])
    near = np.mean(
        [sum(w for w, t in zip(ws, ts) if 1.0 / NEAR <= t <= NEAR) for ws, ts in zip(weights, nodes)]
    )
    mean, second = n_in * m1 / n_out, n_in * m2 / n_out
    s_max = math.sqrt(max(largest))
    low = 0.0 if n_in > n_out else max(0.0, min(min(ts) for ts in nodes))
    s_min = math.sqrt(low)
    pooled = np.concatenate([np.asarray(ts) for ts in nodes])
    mass = np.concatenate([np.asarray(ws) for ws in weights]) * n_in / len(nodes) * len(largest)
    return (
        {
            "mean": float(mean),
            "variance": float(second - mean * mean),
            "sigma_max": s_max,
            "sigma_min": s_min,
            "condition": s_max / s_min if s_min > 0 else None,
            "near_one": float(near * n_in / n_out),
        },
        pooled,
        mass,
    )
