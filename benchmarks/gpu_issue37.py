"""Issue 37's checks on a GPU (one process, prints; never asserts): a model with dropout 0.5 in
nn.MultiheadAttention and scaled_dot_product_attention (CUDA's flash/efficient kernels take the
dropout as an argument) probes bit-identically to the same weights with 0, and the module probe's
mean squares (float32, chunked) against float64 ones on the device.
Usage: python benchmarks/gpu_issue37.py [--device cuda]"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import sigprop
from sigprop.model import measure


class Attn(nn.Module):
    def __init__(self, p: float, d: int = 64) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.mha = nn.MultiheadAttention(d, 4, dropout=p, batch_first=True)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.p = p

    def forward(self, x):
        h = self.inp(x)
        a, _ = self.mha(h, h, h)
        return F.scaled_dot_product_attention(self.q(a), self.k(a), self.v(a), dropout_p=self.p)


def main() -> None:
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    out = []
    for p in (0.5, 0.0):

        def factory(p=p):
            torch.manual_seed(1)
            return Attn(p)

        r = sigprop.probe_module(
            model=factory, input_shape=(32, 64), sites="leaves", samples=64, device=device
        )
        out.append([(l.name, l.forward.rms, l.backward.rms) for l in r.runs[0].layers])
    print("dropout 0.5 == dropout 0, bit for bit, on", device, ":", out[0] == out[1])
    t = torch.randn(64, 32, 96, 96, device=device)
    a, b = measure.mean_squares(t), t.double().pow(2).mean(dim=(1, 2, 3))
    print("mean squares float32 chunked vs float64:", float(((a - b) / b).abs().max()))


if __name__ == "__main__":
    main()
