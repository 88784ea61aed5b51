"""Haar-distributed (semi-)orthogonal matrices without a QR factorization (torch).

``torch.linalg.qr`` of a Gaussian matrix (with the sign fix Q diag(sign R_jj), Mezzadri 2007)
is Haar, and it costs a Householder factorization (geqrf, 4/3 n^3 flops, poorly parallel) plus
forming Q from the reflectors (orgqr).  The factorization is not needed: geqrf's j-th reflector
is the one that maps the j-th *transformed* column x_j in R^(m-j) to beta_j e_1, and x_j is
again N(0, I) and independent of the earlier reflectors (an orthogonal map of an independent
Gaussian vector), so drawing the x_j directly gives the same joint law of reflectors -- hence of
Q -- at the cost of orgqr alone (Stewart 1980, "The efficient generation of random orthogonal
matrices with an application to condition estimators", SIAM J. Numer. Anal. 17(3)).  The
reflectors follow LAPACK's dlarfg convention exactly, so feeding the x_j that geqrf would have
produced gives LAPACK's Q to rounding (tests/kernels/test_haar.py::test_haar_reflectors_match_lapack).
See docs/theory.md section 9 and docs/benchmarks.md for what it saves.

``orthogonalize_batched`` forms the same Q for a batch of matrices with the UT transform
(Joffrain, Low, Quintana-Orti, van de Geijn & van Zee 2006, "Accumulating Householder
transformations, revisited", ACM TOMS 32(2)): H_0 ... H_{k-1} = I - V S^{-1} V^T with
S = triu(V^T V, 1) + diag(1/tau) -- two batched GEMMs and one batched triangular solve instead
of k rank-1 updates (orgqr), so a batch of layers (or of draws) runs at GEMM speed on a GPU.
"""

from __future__ import annotations

import torch


def _reflectors(h):
    """The reflectors of ``orthogonalize`` for rows h [..., k, m] (k <= m): (tau, beta, denom) in
    float64, shape [..., k].  Graph-safe: masks, never a host scalar written into a tensor."""

    k, m = h.shape[-2], h.shape[-1]
    i = torch.arange(k, device=h.device)
    tail = torch.cumsum(h.square().flip(-1), -1, dtype=torch.float64)[..., i, m - 1 - i]
    alpha = h[..., i, i].to(torch.float64)
    beta = -torch.copysign(tail.sqrt(), alpha)
    tau = (beta - alpha) / beta
    denom = alpha - beta
    if k == m:  # the last reflector acts on R^1: H = I (tau = 0), beta = alpha, as in dlarfg
        last = i == k - 1
        tau = torch.where(last, 0.0, tau)  # a Python scalar is a launch parameter: no fill kernel
        beta = torch.where(last, alpha, beta)
        denom = torch.where(last, 1.0, denom)
    return tau, beta, denom


def orthogonalize_batched(g):
    """``orthogonalize`` of every matrix of g [B, rows, cols] at once, by the UT transform.

    With h = g or g^T (k x m, k <= m) and the reflectors of ``_reflectors``, V (m x k) is unit
    lower triangular with V[i, j] = h[j, i] / denom_j below the diagonal; a reflector with
    tau = 0 (the identity) gets a zero column.  Then Q[:, :k] = E - V S^{-1} V_top^T with
    S = triu(V^T V, 1) + diag(1/tau) (1 where tau = 0), E the first k columns of I and V_top
    the top k x k block of V: one GEMM for V^T V, one triangular solve, one GEMM.  The same Q as
    ``orthogonalize`` to rounding (tests/kernels/test_haar.py); the products run in g's dtype, the
    reflector scalars in float64 as there.  Never TF32: the caller's matmul precision is
    switched off for the two GEMMs (orthogonality would fall to ~1e-3)."""

    rows, cols = g.shape[-2:]
    h = g if rows <= cols else g.transpose(-1, -2)
    k, m = h.shape[-2], h.shape[-1]
    tau, beta, denom = _reflectors(h)
    dt = h.dtype
    i = torch.arange(m, device=g.device)
    j = torch.arange(k, device=g.device)
    below = i.unsqueeze(1) > j.unsqueeze(0)  # [m, k]
    eye = (i.unsqueeze(1) == j.unsqueeze(0)).to(dt)  # the first k columns of I
    live = (tau != 0).unsqueeze(-2)  # [B, 1, k]
    v = torch.where(below, (h / denom.to(dt).unsqueeze(-1)).transpose(-1, -2), eye)
    v = torch.where(live, v, 0.0)
    inv_tau = (1.0 / torch.where(tau != 0, tau, 1.0)).to(dt)  # 1 where tau = 0
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        s = torch.triu(v.transpose(-1, -2) @ v, 1) + torch.diag_embed(inv_tau)
        w = torch.linalg.solve_triangular(s, v[..., :k, :].transpose(-1, -2), upper=True)  # S^{-1} V_top^T
        q = eye - v @ w  # = -(v @ w) + eye exactly, one kernel fewer
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    q = q * torch.sign(beta).to(dt).unsqueeze(-2)
    return q.transpose(-1, -2) if rows <= cols else q


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

    rows, cols = g.shape
    h = g if rows <= cols else g.T
    # masks, not ``tau[-1] = 0.0``: a Python scalar written into a device tensor is a
    # host-to-device copy, which stops every CUDA-graph capture (tests/kernels/test_graph_safe.py)
    tau, beta, denom = _reflectors(h)
    v = h / denom.to(h.dtype).unsqueeze(1)
    q = torch.linalg.householder_product(v.T, tau.to(h.dtype))  # m x k, orthonormal columns
    q = q * torch.sign(beta).to(h.dtype)
    return q.T if rows <= cols else q
