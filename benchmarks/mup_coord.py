"""sigprop's coordinate check beside microsoft/mup's own (issue 52, item 5): the same
architectures, trained the same few steps at the same widths, SP and μP, measured once by
``mup.coord_check.get_coord_data`` (mup's MuReadout, ``set_base_shapes`` and MuAdam/MuSGD) and
once by ``sigprop.width_check`` (the plain model, μP applied by sigprop in Table 3's form).
Each prints, per module and step, the slope of log mean|h| on log width from both (mean ±
standard error over seeds; the draws differ, the distributions are the same), and the width-stable
verdict sigprop reads.

Needs mup, which installs beside CPU torch only without its dependencies (its setup asks for
torchvision, which fails to import beside torch 2.13's CPU build):
    pip install --no-deps mup && pip install pandas tqdm pyyaml
Usage: python benchmarks/mup_coord.py [mlp|transformer|all] [threads]     (default all 2)

The models: mup's MLP example (examples/MLP/main.py: 3072 -> n -> n -> 10, no biases, tanh;
its readout drawn N(0, 1/fan_in) here, not zero, so that SP's first step has a gradient below
the readout), and a pre-norm causal transformer in the form mup's README prescribes
(MuReadout, attention q·k/d), 2 blocks, 4 heads, written here with F.scaled_dot_product_attention.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import sigprop
from sigprop.width import fit

try:
    import mup
    from mup.coord_check import get_coord_data
except ImportError:  # pragma: no cover - the benchmark says how to install it
    sys.exit("benchmarks/mup_coord.py needs mup: pip install --no-deps mup && pip install pandas tqdm pyyaml")

BASE = 64
SEEDS, STEPS, BATCH = 3, 3, 64


class MLP(nn.Module):
    """mup's examples/MLP/main.py MLP (input_mult = output_mult = 1, init_std 1)."""

    def __init__(self, width: int = 64, readout=None):
        super().__init__()
        self.fc_1 = nn.Linear(3072, width, bias=False)
        self.fc_2 = nn.Linear(width, width, bias=False)
        self.fc_3 = (readout or nn.Linear)(width, 10, bias=False)
        for m in (self.fc_1, self.fc_2):
            nn.init.kaiming_normal_(m.weight, a=1, mode="fan_in")
        nn.init.normal_(self.fc_3.weight, std=1 / math.sqrt(width))

    def forward(self, x):
        return self.fc_3(torch.tanh(self.fc_2(torch.tanh(self.fc_1(x)))))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mup_attention: bool):
        super().__init__()
        self.heads, self.mup_attention = heads, mup_attention
        self.n1, self.n2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.o = nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, h):
        B, T, E = h.shape
        q, k, v = self.qkv(self.n1(h)).reshape(B, T, 3, self.heads, E // self.heads).permute(2, 0, 3, 1, 4)
        d = E // self.heads
        # mup's README: attention 1/d; its base-width constant sqrt(d0) keeps the base width's net
        scale = math.sqrt(BASE // self.heads) / d if self.mup_attention else 1 / math.sqrt(d)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        h = h + self.o(a.transpose(1, 2).reshape(B, T, E))
        return h + self.down(F.gelu(self.up(self.n2(h))))


class LM(nn.Module):
    def __init__(self, width: int = 64, vocab: int = 64, blocks: int = 2, heads: int = 4, mup_form=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(16, width))
        self.blocks = nn.ModuleList(Block(width, heads, mup_form) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        self.out = (mup.MuReadout if mup_form else nn.Linear)(width, vocab)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=1 / math.sqrt(m.in_features))
                nn.init.zeros_(m.bias)

    def forward(self, ids):
        h = self.emb(ids) + self.pos[: ids.shape[1]]
        for b in self.blocks:
            h = b(h)
        out = self.out(self.norm(h))
        return out.reshape(-1, out.shape[-1])  # [B T, V]: mup's lossfn='xent' reads [N, C]


def _mup_model(make, width: int, mu: bool):
    model = make(width, True) if mu else make(width, False)
    if mu:
        mup.set_base_shapes(model, make(BASE, True), delta=make(2 * BASE, True))
    else:
        mup.set_base_shapes(model, None)
    return model


def mup_slopes(make, widths, x, y, optimizer, lr, mu: bool) -> dict:
    """mup's coordinate check: per (module, step) the slope of log l1 on log width (mup counts
    t = 1 at init: step t - 1 here)."""
    models = {w: (lambda w=w: _mup_model(make, w, mu)) for w in widths}
    df = get_coord_data(models, [(x, y)], optimizer=optimizer, lr=lr, mup=mu, nseeds=SEEDS, nsteps=STEPS + 1,
                        lossfn="xent", cuda=False, show_progress=False)  # fmt: skip
    out = {}
    for (module, t), g in df.groupby(["module", "t"]):
        if not module:
            continue
        table = g.pivot_table(index="width", values="l1", aggfunc=list)
        values = np.array([table.loc[w, "l1"] for w in widths]).T  # seeds x widths
        out[(module, t - 1)] = fit.slope(widths, values)
    return out


def compare(name, make_plain, make_mup, widths, shape, vocab, optimizer, lr) -> None:
    gen = torch.Generator().manual_seed(0)
    if vocab:
        x = torch.randint(vocab, (BATCH, *shape), generator=gen)
        y = torch.randint(vocab, (BATCH * shape[0],), generator=gen)
    else:
        x, y = torch.randn(BATCH, *shape, generator=gen), torch.randint(10, (BATCH,), generator=gen)
    t0 = time.perf_counter()
    ours = sigprop.width_check(
        make_plain, widths=widths, input_shape=shape, vocab=vocab, params=["sp", "mup"], optimizer=optimizer,
        lr=lr, steps=STEPS, seeds=SEEDS, batch_size=BATCH, base_width=BASE, device="cpu",
    )  # fmt: skip
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = {}
    for mu in (False, True):
        theirs[mu] = mup_slopes(make_mup, widths, x, y, optimizer, lr, mu)
    t_mup = time.perf_counter() - t0
    print(f"\n## {name}, {optimizer} lr {lr:g}, widths {widths}, {SEEDS} seeds, {STEPS} steps")
    print(f"sigprop {t_ours:.1f} s, mup {t_mup:.1f} s (both: every width x seed trained)")
    print(f"{'param':5} {'module':16} {'step':>4} {'mup slope':>14} {'sigprop slope':>14} {'|diff|/se':>9}")
    for run in ours.runs:
        mu = run.param == "mup"
        for s in run.slopes:
            m, m_se = theirs[mu].get((s.site, s.step), (None, None))
            if m is None or s.l1 is None:
                continue
            se = math.hypot(m_se or 0, s.l1_se or 0) or float("nan")
            cells = f"{m:+8.2f} ± {m_se:.2f} {s.l1:+8.2f} ± {s.l1_se:.2f} {abs(m - s.l1) / se:9.1f}"
            print(f"{run.param:5} {s.site:16} {s.step:4d} {cells}")
        print(f"  sigprop: {run.stable_words}; theory {run.theory}")


def main(which: str = "all", threads: int = 2) -> None:
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, mup {getattr(mup, '__version__', '?')}, {threads} threads")
    if which in ("mlp", "all"):
        plain = lambda width: MLP(width)
        with_mup = lambda width, mu: MLP(width, mup.MuReadout if mu else None)
        for opt, lr in (("adam", 0.01), ("sgd", 0.1)):
            compare("mup's MLP example", plain, with_mup, [64, 128, 256, 512, 1024], (3072,), None, opt, lr)
    if which in ("transformer", "all"):
        plain = lambda width: LM(width)
        with_mup = lambda width, mu: LM(width, mup_form=mu)
        compare("a mup-form transformer", plain, with_mup, [64, 128, 256, 512], (16,), 64, "adam", 0.01)


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["all"]), *[int(a) for a in sys.argv[2:3]])
