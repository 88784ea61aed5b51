"""Haar-distributed (semi-)orthogonal matrices without a QR factorization (imports torch only).

``torch.linalg.qr`` of a Gaussian matrix (with the sign fix Q diag(sign R_jj), Mezzadri 2007)
is Haar, and it costs a Householder factorization (geqrf, 4/3 n^3 flops, poorly parallel) plus
forming Q from the reflectors (orgqr).  The factorization is not needed: geqrf's j-th reflector
is the one that maps the j-th *transformed* column x_j in R^(m-j) to beta_j e_1, and x_j is
again N(0, I) and independent of the earlier reflectors (an orthogonal map of an independent
Gaussian vector), so drawing the x_j directly gives the same joint law of reflectors -- hence of
Q -- at the cost of orgqr alone (Stewart 1980, "The efficient generation of random orthogonal
matrices with an application to condition estimators", SIAM J. Numer. Anal. 17(3)).  The
reflectors follow LAPACK's dlarfg convention exactly, so feeding the x_j that geqrf would have
produced gives LAPACK's Q to rounding (tests/test_haar.py::test_haar_reflectors_match_lapack).
See docs/theory.md section 9 and docs/benchmarks.md for what it saves.
"""

from __future__ import annotations


def orthogonalize(g):
    """A Haar (semi-)orthogonal matrix of g's shape built from g's entries: orthonormal rows when
    rows <= cols, orthonormal columns otherwise (the convention of torch.nn.init.orthogonal_).

    With h = g (rows <= cols) or g^T, of shape k x m (k <= m), reflector j uses x_j = h[j, j:]
    (independent N(0, 1) entries; the entries left of the diagonal are not used):
    alpha = x_j[0], beta = -sign(alpha) ||x_j||, tau = (beta - alpha) / beta,
    v = x_j / (alpha - beta) (so v[0] = 1), H_j = I - tau v v^T maps x_j to beta e_1;
    Q = H_0 ... H_{k-1} (first k columns, torch.linalg.householder_product) times diag(sign beta).
    When k = m the last reflector acts on R^1: H = I (tau = 0) and beta = alpha, as in dlarfg.
    The tail norms ||x_j||^2 are one reversed cumulative sum, accumulated in float64.
    """
    import torch

    rows, cols = g.shape
    h = g if rows <= cols else g.T
    k, m = h.shape
    i = torch.arange(k, device=g.device)
    tail = torch.cumsum(h.square().flip(1), 1, dtype=torch.float64)[i, m - 1 - i]
    alpha = h[i, i].to(torch.float64)
    beta = -torch.copysign(tail.sqrt(), alpha)
    tau = (beta - alpha) / beta
    denom = alpha - beta
    if k == m:  # masks, not ``tau[-1] = 0.0``: a Python scalar written into a device tensor is a
        # host-to-device copy, which stops every CUDA-graph capture (tests/test_graph_safe.py)
        last = i == k - 1
        tau = torch.where(last, torch.zeros_like(tau), tau)
        beta = torch.where(last, alpha, beta)
        denom = torch.where(last, torch.ones_like(denom), denom)
    v = h / denom.to(h.dtype).unsqueeze(1)
    q = torch.linalg.householder_product(v.T, tau.to(h.dtype))  # m x k, orthonormal columns
    q = q * torch.sign(beta).to(h.dtype)
    return q.T if rows <= cols else q
