"""The coordinate check's cost (issue 52, item 6): a 4-layer Llama-family decoder
(examples/my_nets.py:llama, with its readout) at widths 64..1024, 3 steps (4 records), 3 seeds,
μP with Adam -- ``sigprop.width_check`` against its floor, the same points trained by a bare loop
(the same draws, parametrization and optimizer, no hooks, no statistics, no role reading), and,
where mup is installed, the naive peer: mup's ``get_coord_data`` on the same models (it records
every module's output; its μP from MuReadout and set_base_shapes).

Usage: python benchmarks/width.py [threads] [max_width]     (default 2 1024)
Prints the seconds of each and the ratios sigprop/floor and mup/floor, measured in one run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import sigprop
from sigprop.width import params as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from my_nets import llama

STEPS, SEEDS, BATCH, TOKENS, VOCAB = 3, 3, 8, 16, 1000


def make(width: int):
    return llama(layers=4, d=width, lm=True, vocab=VOCAB)


def floor(widths) -> float:
    """The same points trained by a bare loop: build, apply μP, STEPS Adam steps, STEPS + 1
    forwards (the records' forwards: the last one with no step after it)."""
    t0 = time.perf_counter()
    base = widths[0]
    for k in range(SEEDS):
        x = torch.randint(VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(k))
        y = torch.randint(VOCAB, (BATCH * TOKENS,), generator=torch.Generator().manual_seed(k + 100))
        for w in widths:
            torch.manual_seed(k)
            model = make(w)
            r = _roles_at(w)
            P.apply(model, r, "mup", "adam", w / base, torch.Generator().manual_seed(k))
            opt = torch.optim.Adam(P.groups(model, r, "mup", "adam", 0.01, w / base))
            for t in range(STEPS + 1):
                logits = model(x).logits
                if t == STEPS:
                    break
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    return time.perf_counter() - t0


_cache: dict = {}


def _roles_at(w):
    """The roles at width w, read once per width outside the timed loop."""
    if w not in _cache:
        _cache[w] = P.roles(make(w), make(64 if w != 64 else 128))
    return _cache[w]


def peer(widths) -> float | None:
    try:
        import mup
        from mup.coord_check import get_coord_data
    except ImportError:
        return None

    def model_of(w):
        m = make(w)
        m.lm_head = mup.MuReadout(w, VOCAB, bias=False)
        return m

    class Flat(torch.nn.Module):  # mup's xent reads [N, C] from the model's output
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x).logits.reshape(-1, VOCAB)

    def lazy(w):
        def build():
            m = Flat(model_of(w))
            mup.set_base_shapes(m, Flat(model_of(widths[0])), delta=Flat(model_of(widths[1])))
            return m

        return build

    x = torch.randint(VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(0))
    y = torch.randint(VOCAB, (BATCH * TOKENS,), generator=torch.Generator().manual_seed(100))
    # mup reads every module's output as a tensor: a decoder layer's (a tuple, a cache) stops it,
    # so it records the modules sigprop does (those that own a weight matrix)
    kinds = (nn.Linear, nn.Embedding)
    dense = {n for n, m in Flat(model_of(widths[0])).named_modules() if isinstance(m, kinds)}
    t0 = time.perf_counter()
    get_coord_data({w: lazy(w) for w in widths}, [(x, y)], optimizer="adam", lr=0.01, mup=True, nseeds=SEEDS,
                   nsteps=STEPS + 1, lossfn="xent", cuda=False, show_progress=False,
                   filter_module_by_name=lambda name: name in dense)  # fmt: skip
    return time.perf_counter() - t0


def main(threads: int = 2, max_width: int = 1024) -> None:
    torch.set_num_threads(threads)
    widths = [w for w in (64, 128, 256, 512, 1024, 2048) if w <= max_width]
    print(f"torch {torch.__version__}, {threads} threads; 4-layer Llama, widths {widths}, {STEPS} steps, "
          f"{SEEDS} seeds, batch {BATCH} x {TOKENS} tokens, μP with Adam")  # fmt: skip
    make(widths[0])  # transformers' import (3 s) outside every timing: the floor would not pay it
    t0 = time.perf_counter()
    r = sigprop.width_check(
        make, widths=widths, input_shape=(TOKENS,), vocab=VOCAB, params=["mup"], optimizer="adam", lr=0.01,
        steps=STEPS, seeds=SEEDS, batch_size=BATCH, device="cpu",
    )  # fmt: skip
    ours = time.perf_counter() - t0
    for w in widths:
        _roles_at(w)
    bare = floor(widths)
    theirs = peer(widths)
    print(f"sigprop width_check  {ours:7.1f} s   {ours / bare:5.2f} x floor   ({r.runs[0].stable_words})")
    print(f"floor (bare loop)    {bare:7.1f} s")
    if theirs is None:
        print(
            "mup get_coord_data   (not installed: pip install --no-deps mup; pip install pandas tqdm pyyaml)"
        )
    else:
        print(f"mup get_coord_data   {theirs:7.1f} s   {theirs / bare:5.2f} x floor")


if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:3]])
