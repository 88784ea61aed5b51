"""sigprop/kernels/haar.py: reflectors drawn directly give LAPACK's Q, and the result is Haar."""

import math

import pytest
import torch

from sigprop.kernels.haar import orthogonalize


def _transformed_columns(g: torch.Tensor) -> torch.Tensor:
    """The columns x_j that geqrf reflects (x_j = H_j beta_j e_1), laid out as haar.py reads them:
    row j of the result holds x_j from position j on, noise to its left (which must be ignored)."""
    a, tau = torch.geqrf(g)
    m, k = g.shape
    x = torch.randn(k, m, dtype=g.dtype, generator=torch.Generator().manual_seed(5))
    for j in range(k):
        v = torch.cat([torch.ones(1, dtype=g.dtype), a[j + 1 :, j]])
        e1 = torch.zeros(m - j, dtype=g.dtype)
        e1[0] = 1.0
        x[j, j:] = a[j, j] * (e1 - tau[j] * v)
    return x


@pytest.mark.parametrize("m, k", [(1, 1), (2, 2), (7, 7), (9, 4), (64, 64), (100, 37)])
def test_haar_reflectors_match_lapack(m, k):
    """Given the x_j geqrf would have produced from G, haar.py's Q equals torch.linalg.qr(G)'s Q
    with the sign fix diag(sign R_jj): the same reflectors, LAPACK's dlarfg convention."""
    g = torch.randn(m, k, dtype=torch.float64, generator=torch.Generator().manual_seed(m * 100 + k))
    q, r = torch.linalg.qr(g)
    expected = q * torch.sign(torch.diagonal(r))
    got = orthogonalize(_transformed_columns(g))  # k x m: rows orthonormal -> transpose
    assert torch.allclose(got.T, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("shape", [(30, 50), (50, 30), (40, 40), (1, 1), (1, 9), (9, 1)])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-13), (torch.float32, 2e-6)])
def test_haar_orthonormal(shape, dtype, tol):
    g = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(3))
    q = orthogonalize(g)
    assert q.shape == g.shape and q.dtype == dtype
    gram = q @ q.T if shape[0] <= shape[1] else q.T @ q
    assert (gram - torch.eye(min(shape), dtype=dtype)).abs().max().item() < tol


def test_haar_trace_moments():
    """For Haar O(n), n >= 4: E tr Q = 0, E (tr Q)^2 = 1, E (tr Q)^4 = 3 (Diaconis & Shahshahani
    1994).  Without the sign fix diag(sign beta) the same draws give E tr Q = -1.27 (checked once
    by hand).  8000 draws of 6 x 6: standard errors 0.011, 0.016 and 0.1; bounds at ~4.5 SE."""
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(8000, 6, 6, dtype=torch.float64, generator=gen)
    tr = torch.stack([torch.trace(orthogonalize(x)) for x in g])
    assert abs(tr.mean().item()) < 0.05
    assert abs((tr**2).mean().item() - 1.0) < 0.075
    assert abs((tr**4).mean().item() - 3.0) < 0.5


def test_haar_first_entry_is_beta_distributed():
    """Q[0, 0]^2 of Haar O(n) is Beta(1/2, (n-1)/2): mean 1/n, variance 2(n-1)/(n^2 (n+2))."""
    n, draws = 5, 8000
    gen = torch.Generator().manual_seed(12)
    g = torch.randn(draws, n, n, dtype=torch.float64, generator=gen)
    x = torch.stack([orthogonalize(a)[0, 0] ** 2 for a in g])
    mean, var = 1 / n, 2 * (n - 1) / (n**2 * (n + 2))
    se = math.sqrt(var / draws)
    assert abs(x.mean().item() - mean) < 4.5 * se
    assert x.var().item() == pytest.approx(var, rel=0.08)


# ------------------------------------------------------------------------------------------
# the batched UT transform (haar.orthogonalize_batched): the CUDA path, checked on the CPU
# ------------------------------------------------------------------------------------------
from sigprop.kernels.haar import orthogonalize_batched  # noqa: E402


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (5, 5), (64, 64), (3, 7), (7, 3), (100, 37), (37, 100)])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-14), (torch.float32, 2e-6)])
def test_batched_ut_transform_equals_the_householder_product(shape, dtype, tol):
    """The same reflectors accumulated as I - V S^{-1} V^T (Joffrain et al. 2006) give the Q of
    torch.linalg.householder_product (LAPACK orgqr) to rounding: a few ulps of the dtype times
    the size (tolerances: 1e-14 in float64, 2e-6 in float32 for n <= 100)."""
    g = torch.randn(6, *shape, dtype=dtype, generator=torch.Generator().manual_seed(sum(shape)))
    want = torch.stack([orthogonalize(x) for x in g])
    got = orthogonalize_batched(g)
    assert got.shape == g.shape and got.dtype == dtype
    assert (got - want).abs().max().item() < tol


def test_batched_ut_transform_gives_lapacks_q():
    """From the x_j geqrf would have produced, the batched path too gives torch.linalg.qr's Q."""
    g = torch.randn(40, 17, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    q, r = torch.linalg.qr(g)
    got = orthogonalize_batched(_transformed_columns(g).unsqueeze(0))[0]
    assert torch.allclose(got.T, q * torch.sign(torch.diagonal(r)), atol=1e-12, rtol=0)


def test_batched_haar_trace_moments():
    gen = torch.Generator().manual_seed(11)
    tr = torch.diagonal(
        orthogonalize_batched(torch.randn(8000, 6, 6, dtype=torch.float64, generator=gen)), dim1=-2, dim2=-1
    ).sum(-1)
    assert abs(tr.mean().item()) < 0.05
    assert abs((tr**2).mean().item() - 1.0) < 0.075
    assert abs((tr**4).mean().item() - 3.0) < 0.5
