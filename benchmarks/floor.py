"""The floor: only the unavoidable work of an MLP probe on given shapes, nothing else.

Weight generation (a Gaussian matrix made Haar-orthogonal, as the proposed init, by the cheapest
method known here: Householder reflectors drawn directly, sigprop/kernels/haar.py -- the same as sigprop
uses, so sigprop is not credited for it; a QR would cost ~2.8 ms more per 512^2 layer), forward matmuls +
ReLU with the masks
kept as bool, the backward matmuls through the masks, and one norm per layer and sample in each
direction, accumulated on the device.  No statistics, no theory, no output beyond one line.
Usage: python floor.py L n N [seeds] [device]
"""

import sys
import time

import torch

from sigprop.kernels.haar import orthogonalize  # imports torch only


def _run(L: int, n: int, N: int, dev, weights_of) -> None:
    """One probe's unavoidable work: x and e drawn, L layers forward (matmul, ReLU, mask kept as
    bool, one norm per sample), the backward pass through the transposed weights and the masks,
    one host sync at the end.  ``weights_of()`` yields the L weight matrices, drawn as it goes."""
    x = torch.randn(N, n, device=dev)
    e = torch.randn(N, n, device=dev)
    norms_f = torch.empty(L, N, device=dev)
    norms_b = torch.empty(L, N, device=dev)
    weights, masks = [], []
    h = x
    for l, w in enumerate(weights_of()):
        a = h @ w.T
        masks.append(a > 0)
        h = torch.relu(a)
        nrm = torch.linalg.vector_norm(h, dim=1)
        norms_f[l] = nrm
        h = h / nrm.clamp_min(1e-30).unsqueeze(1)
        weights.append(w)
    d = e
    for l in range(L - 1, -1, -1):
        d = (d @ weights[l]) * masks[l - 1] if l > 0 else d @ weights[l]
        nrm = torch.linalg.vector_norm(d, dim=1)
        norms_b[l] = nrm
        d = d / nrm.clamp_min(1e-30).unsqueeze(1)
    float(norms_f.sum() + norms_b.sum())  # one host sync at the end


def floor(L: int, n: int, N: int, seeds: int = 1, device: str = "cpu") -> float:
    """Run the floor (one orgqr Haar draw per layer); returns its compute seconds."""
    dev = torch.device(device)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(seeds):
            _run(
                L,
                n,
                N,
                dev,
                lambda: (orthogonalize(torch.randn(n, n, device=dev)) * 2**0.5 for _ in range(L)),
            )
    return time.perf_counter() - t0


def limit(L: int, n: int, N: int, device: str = "cpu", chunk: int = 32) -> float:
    """The limit line of issue 16: the same work with Haar weights generated ``chunk`` layers at a
    time by the batched UT transform (sigprop/kernels/haar.py, GEMM speed on a GPU) and bare matmuls:
    no bookkeeping, no log-space, masks as bool, weights kept.  Returns compute seconds."""
    from sigprop.kernels.haar import orthogonalize_batched

    dev = torch.device(device)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.no_grad():
        _run(
            L,
            n,
            N,
            dev,
            lambda: (
                w
                for l0 in range(0, L, chunk)
                for w in orthogonalize_batched(torch.randn(min(chunk, L - l0), n, n, device=dev)) * 2**0.5
            ),
        )
    return time.perf_counter() - t0


def main() -> None:
    L, n, N = (int(a) for a in sys.argv[1:4])
    seeds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    print(f"floor L={L} n={n} N={N} seeds={seeds} compute {floor(L, n, N, seeds, device):.2f}s")


if __name__ == "__main__":
    main()
