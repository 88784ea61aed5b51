"""The peer: the naive autograd probe a user would write first.

nn.Linear layers wrapped in torch.nn.utils.parametrizations.weight_norm (g = sqrt 2, orthogonal
v), the whole forward pass kept in the autograd graph with retain_grad on every activation,
then one backward of sum(e * h^L): every activation, every gradient and a materialised copy of
every weight stay alive.  Usage: python peer.py L n N
"""

import sys
import time

import torch
from torch.nn.utils.parametrizations import weight_norm


def peer(L: int, n: int, N: int, device: str = "cpu") -> float:
    """Run the peer on ``device``; returns its seconds (one host sync at the end)."""
    dev = torch.device(device)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    layers = []
    for _ in range(L):
        lin = torch.nn.Linear(n, n, bias=False, device=dev)
        torch.nn.init.orthogonal_(lin.weight)
        lin = weight_norm(lin)
        with torch.no_grad():
            lin.parametrizations.weight.original0.fill_(2**0.5)
        layers.append(lin)
    x = torch.randn(N, n, device=dev)
    e = torch.randn(N, n, device=dev)
    h = x
    hs = []
    for lin in layers:
        h = torch.relu(lin(h))
        h.retain_grad()
        hs.append(h)
    (h * e).sum().backward()
    fwd = torch.stack([t.norm(dim=1) for t in hs]) / x.norm(dim=1)
    bwd = torch.stack([t.grad.norm(dim=1) for t in hs]) / e.norm(dim=1)
    float((fwd.sum() + bwd.sum()).detach())
    return time.perf_counter() - t0


def main() -> None:
    L, n, N = (int(a) for a in sys.argv[1:4])
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    print(f"peer L={L} n={n} N={N} compute {peer(L, n, N, device):.2f}s")


if __name__ == "__main__":
    main()
