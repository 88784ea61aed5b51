"""Small factories of widths for the coordinate check's tests."""

from __future__ import annotations

import math

import torch
import torch.nn as nn


class TinyLM(nn.Module):
    """An embedding, one pre-norm attention + MLP block, a readout: every role a transformer has."""

    def __init__(self, width: int = 32, vocab: int = 11, heads: int = 2, scale_logits: bool = False):
        super().__init__()
        self.scale = math.sqrt(width / 16) if scale_logits else 1.0
        self.emb = nn.Embedding(vocab, width)
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True, dropout=0.1)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        a = self.norm1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.down(torch.relu(self.up(self.norm2(h))))
        return self.out(h) * self.scale


class Times(nn.Module):
    def __init__(self, c: float):
        super().__init__()
        self.c = c

    def forward(self, x):
        return x * self.c


def mlp(width: int, scale_logits: bool = False) -> nn.Module:
    """A 3-layer ReLU MLP (8 -> width -> width -> 5); ``scale_logits`` multiplies the readout's
    input by sqrt(width/16): a model that is not what μP's theory assumes."""
    extra = [Times(math.sqrt(width / 16))] if scale_logits else []
    return nn.Sequential(
        nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), *extra, nn.Linear(width, 5)
    )
