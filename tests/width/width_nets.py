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


class Decoder(nn.Module):
    """A one-block causal decoder, its attention in one of three forms: ``sdpa``
    (F.scaled_dot_product_attention), ``nanogpt`` (``(q @ k.transpose(-2, -1)) * s``, a
    masked_fill, a softmax: nanoGPT's), ``einsum`` (``torch.einsum`` logits, an added mask, a
    softmax in float32); each form computes the same function of the same weights."""

    def __init__(self, width: int = 32, vocab: int = 11, heads: int = 2, form: str = "sdpa"):
        super().__init__()
        self.heads, self.form = heads, form
        self.emb = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        B, T, C = h.shape
        q, k, v = self.qkv(self.norm(h)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        d = q.shape[-1]
        mask = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        if self.form == "sdpa":
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.form == "nanogpt":
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            att = att.masked_fill(~mask, float("-inf"))
            y = torch.softmax(att, dim=-1) @ v
        else:
            att = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(d)
            att = att + torch.zeros(T, T, device=ids.device).masked_fill(~mask, float("-inf"))
            y = torch.nn.functional.softmax(att, dim=-1, dtype=torch.float32) @ v
        h = h + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return self.out(h)


class BareReadout(nn.Module):
    """A readout written as ``h @ W``, W an nn.Parameter of shape (width, classes); ``power``: the
    output times (16 / width)^power, a width multiplier of the model's own."""

    def __init__(self, width: int = 32, power: float = 0.0, inputs: int = 6, classes: int = 16):
        super().__init__()
        self.a, self.b = nn.Linear(inputs, width), nn.Linear(width, width)
        self.W = nn.Parameter(torch.randn(width, classes) / math.sqrt(width))
        self.factor = (16 / width) ** power

    def forward(self, x):
        return (torch.relu(self.b(torch.relu(self.a(x)))) @ self.W) * self.factor


class MuMLP(nn.Module):
    """μP by hand (Yang et al. 2021, Table 3, Adam): the readout drawn N(0, 1/width^2); its
    learning rates are those of its own optimizer, ``mu_adam``."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, width), nn.Linear(width, width), nn.Linear(width, 4)
        with torch.no_grad():
            self.c.weight.normal_(0, 1 / width)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def mu_adam(params, lr):
    """μP's Adam for MuMLP (mup's MuAdam for it): a matrix whose fan-in is the width at lr x 32 / fan-in."""
    return torch.optim.Adam(
        [
            {"params": [p], "lr": lr * (32 / p.shape[1] if p.dim() == 2 and p.shape[1] >= 32 else 1.0)}
            for p in params
        ]
    )


def not_an_optimizer(params, lr):
    """A factory that returns its parameters, not an optimizer (refused, naming --optimizer)."""
    return list(params)
