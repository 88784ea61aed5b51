"""The attention maps past logit variance 2 (issue 67, item 3; docs/theory.md §15): blocks whose
queries and keys are scaled by c (logit variance ~ c^4/9 after a LayerNorm at PyTorch's default
init), against sigprop's measurement of the same models, 4 draws of 16 samples, d 128, T 32: the
worst site's forward, backward and token-cosine error per c, for pre-LN blocks with their own
query/key/value projections (bidirectional, causal), nn.MultiheadAttention with its
in-projection's query and key rows scaled, and attention with no skip.

Usage: python benchmarks/attention_range.py   (a few minutes on 2 cores)
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import sigprop

D, T, H = 128, 32, 4


class Block(nn.Module):
    def __init__(self, c: float, form: str) -> None:
        super().__init__()
        self.form = form
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.mha = nn.MultiheadAttention(D, H, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        with torch.no_grad():
            self.q.weight.mul_(c)
            self.k.weight.mul_(c)
            self.mha.in_proj_weight[: 2 * D].mul_(c)

    def attend(self, h):
        if self.form == "mha":
            return self.mha(h, h, h, need_weights=False)[0]
        B, L, d = h.shape
        heads = lambda t: t.reshape(B, L, H, d // H).transpose(1, 2)
        causal = self.form == "causal"
        a = F.scaled_dot_product_attention(
            heads(self.q(h)), heads(self.k(h)), heads(self.v(h)), is_causal=causal
        )
        return self.o(a.transpose(1, 2).reshape(B, L, d))

    def forward(self, x):
        if self.form == "no skip":
            return self.attend(self.ln1(x))
        x = x + self.attend(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def model(c: float, form: str) -> nn.Module:
    if form == "no skip":
        return nn.Sequential(nn.Linear(D, D), Block(c, form), nn.Linear(D, D))
    return nn.Sequential(*[Block(c, form) for _ in range(3)])


def main() -> None:
    torch.set_num_threads(2)
    print("| form | c | logit variance | forward worst | backward worst | token cosine worst |")
    print("|---|---|---|---|---|---|")
    for form in ("bidirectional", "causal", "mha", "no skip"):
        for c in (1.0, 2.0, 3.0, 4.0, 6.0):
            r = sigprop.probe_module(model=lambda: model(c, form), input_shape=(T, D), samples=16, seeds=4)
            note = next(n for n in r.config["theory_notes"] if n.startswith("attention: logits of variance"))
            s2 = " ".join(note.split()[4:7])
            layers = r.runs[0].layers
            f = max((l.forward.predicted / l.forward.rms - 1 for l in layers), key=abs)
            b = max((l.backward.predicted / l.backward.rms - 1 for l in layers), key=abs)
            t = max((l.tokens.predicted - l.tokens.mean for l in layers), key=abs)
            print(f"| {form} | {c:g} | {s2} | {f:+.1%} | {b:+.1%} | {t:+.3f} |", flush=True)


if __name__ == "__main__":
    main()
