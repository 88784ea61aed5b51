"""How often each of ``sigprop width``'s two verdicts reads what it should (docs/reliability.md §6):
each case run at ten base seeds (``--seed 0..9``, each with 2 seeds of weights, batch and
targets), counting the runs that read width-stable and the theory verdicts.  The cases: sigprop's
MLP under SP, μP and NTK (its defaults: depth 4, widths 64-1024, 3 steps, gate 0.25), models that
fooled 0.18.0 (a readout multiplier applied twice, a readout written ``h @ W``, a μP model built
for its own optimizer, attention written by hand), and a run where nothing trains.

Usage: python benchmarks/width_verdicts.py [--seeds 10] [--quick]   (about 6 min on 2 cores)
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter

import torch
import torch.nn as nn

import sigprop


class Multiplied(nn.Module):
    """A ReLU MLP whose output is times (32 / width)^power: a readout multiplier of the model's own,
    on top of the one sigprop's μP applies (the logits' change ∝ width^-power)."""

    def __init__(self, width: int, power: float = 1.0, readout_param: bool = False):
        super().__init__()
        self.a, self.b = nn.Linear(16, width), nn.Linear(width, width)
        self.power, self.width = power, width
        if readout_param:  # the readout written as h @ W
            self.W = nn.Parameter(torch.randn(width, 10) / math.sqrt(width))
            self.c = None
        else:
            self.c = nn.Linear(width, 10)

    def forward(self, x):
        h = torch.relu(self.b(torch.relu(self.a(x))))
        y = h @ self.W if self.c is None else self.c(h)
        return y * (32 / self.width) ** self.power


class MuMLP(nn.Module):
    """μP by hand for Adam (Yang et al. 2021, Table 3): the readout drawn N(0, 1/width^2); its
    learning rates are ``mu_adam``'s."""

    def __init__(self, width: int):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, width), nn.Linear(width, width), nn.Linear(width, 10)
        with torch.no_grad():
            self.c.weight.normal_(0, 1 / width)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def mu_adam(params, lr):
    """mup's MuAdam for MuMLP: a matrix whose fan-in is the width at lr x 32 / fan-in."""
    groups = [
        {"params": [p], "lr": lr * (32 / p.shape[1] if p.dim() == 2 and p.shape[1] >= 32 else 1.0)}
        for p in params
    ]
    return torch.optim.Adam(groups)


class Decoder(nn.Module):
    """One causal block, attention written as nanoGPT writes it (a product, a masked_fill, a
    softmax), a readout to the vocabulary."""

    def __init__(self, width: int, vocab: int = 64, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.emb, self.norm = nn.Embedding(vocab, width), nn.LayerNorm(width)
        self.qkv, self.proj, self.out = (
            nn.Linear(width, 3 * width),
            nn.Linear(width, width),
            nn.Linear(width, vocab),
        )

    def forward(self, ids):
        h = self.emb(ids)
        B, T, C = h.shape
        q, k, v = (
            t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
            for t in self.qkv(self.norm(h)).split(C, 2)
        )
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        h = h + self.proj((torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C))
        return self.out(h)


MLP = dict(net="mlp")
BARE = lambda width: Multiplied(width, 0.0, True)  # the readout written h @ W, no multiplier
SMALL = dict(widths=[32, 64, 128, 256, 512], input_shape=(16,))
CASES = {
    "SP, Adam 0.01": (MLP, dict(params=["sp"])),
    "μP, Adam 0.01": (MLP, dict(params=["mup"])),
    "SP, SGD 0.1": (MLP, dict(params=["sp"], optimizer="sgd", lr=0.1)),
    "SP, SGD 0.01": (MLP, dict(params=["sp"], optimizer="sgd", lr=0.01)),
    "μP, SGD 0.1": (MLP, dict(params=["mup"], optimizer="sgd", lr=0.1)),
    "NTK, SGD 0.1 (the kernel regime)": (MLP, dict(params=["ntk"], optimizer="sgd", lr=0.1)),
    "one class under xent (nothing trains)": (MLP, dict(params=["sp", "mup"], classes=1)),
    "μP on a model with a readout multiplier of its own, (32/n)": (
        dict(net=Multiplied, **SMALL), dict(params=["mup"])),
    "μP on a readout written h @ W": (dict(net=BARE, **SMALL), dict(params=["mup"])),
    "SP on a readout written h @ W": (dict(net=BARE, **SMALL), dict(params=["sp"])),
    "as-is, μP by hand, torch's Adam": (dict(net=MuMLP, **SMALL), dict(params=["as-is"])),
    "as-is, μP by hand, its own optimizer": (
        dict(net=MuMLP, **SMALL), dict(params=["as-is"], optimizer=f"{__name__}:mu_adam")),
    "μP on attention written by hand (nanoGPT)": (
        dict(net=Decoder, widths=[32, 64, 128, 256], input_shape=(8,), vocab=64),
        dict(params=["mup"], batch_size=4)),
}  # fmt: skip


def run_case(net: dict, options: dict, seed: int):
    kw = dict(net)
    target = kw.pop("net")
    return sigprop.width_check(target, seed=seed, **kw, **options)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="3 seeds")
    a = ap.parse_args()
    seeds = 3 if a.quick else a.seeds
    torch.set_num_threads(2)
    print("| case | width-stable | theory | first words (seed 0) |\n|---|---|---|---|")
    t0 = time.perf_counter()
    for name, (net, options) in CASES.items():
        stable, theory, words = Counter(), Counter(), ""
        for seed in range(seeds):
            r = run_case(net, options, seed)
            for run in r.runs:
                stable[run.param] += run.width_stable
                theory[(run.param, run.theory)] += 1
                if seed == 0 and not words:
                    words = run.stable_words
        st = ", ".join(f"{p} {k} / {seeds}" for p, k in stable.items())
        th = ", ".join(f"{p} {t} {k} / {seeds}" for (p, t), k in theory.items())
        print(f"| {name} | {st} | {th} | {words} |", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s, torch {torch.__version__}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
