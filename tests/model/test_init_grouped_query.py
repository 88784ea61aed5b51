"""``--init proposed`` on grouped-query attention (issue 67, item 3): the key and value projections
count their outputs as the heads read them (fan_out x H/kv), so that the logits q.k/sqrt(d_h) are
of unit variance at any width and head grouping -- 0.18 drew them at fan_in/fan_out, the logits'
variance H/kv (2, 4: Llama-3's 4), beyond the attention maps' range from d 256 on.  The logits
are measured here by a hook of their own on the same model, not by sigprop's maps."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import sigprop
from sigprop import inits
from sigprop.model import init as model_init


class GQA(nn.Module):
    """A pre-norm block of grouped-query attention: H query heads on G key/value heads."""

    def __init__(self, d: int = 64, heads: int = 8, groups: int = 2):
        super().__init__()
        self.h, self.g, self.dh = heads, groups, d // heads
        self.norm = nn.LayerNorm(d)
        self.q_proj = nn.Linear(d, heads * self.dh, bias=False)
        self.k_proj = nn.Linear(d, groups * self.dh, bias=False)
        self.v_proj = nn.Linear(d, groups * self.dh, bias=False)
        self.o_proj = nn.Linear(heads * self.dh, d, bias=False)
        self.logits = []

    def forward(self, x):
        B, T, _ = x.shape
        a = self.norm(x)
        q = self.q_proj(a).view(B, T, self.h, self.dh).transpose(1, 2)
        k = self.k_proj(a).view(B, T, self.g, self.dh).transpose(1, 2)
        v = self.v_proj(a).view(B, T, self.g, self.dh).transpose(1, 2)
        k, v = (t.repeat_interleave(self.h // self.g, dim=1) for t in (k, v))
        self.logits.append((q @ k.transpose(-2, -1) / math.sqrt(self.dh)).detach())
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("heads, groups", [(8, 2), (8, 1), (8, 8)])
def test_the_logits_are_of_unit_variance_at_any_grouping(heads, groups):
    torch.manual_seed(0)
    model = GQA(128, heads, groups)
    x = torch.randn(4, 32, 128)
    records = sigprop.init_(model, "proposed", batch=x)
    reads = {r.name: r for r in records}
    assert reads["k_proj"].set and reads["v_proj"].set
    found, _ = model_init.roles(model, x)
    expected = {"k_proj": heads // groups, "v_proj": heads // groups} if groups < heads else {}
    assert found.reads == expected
    model.logits.clear()
    with torch.no_grad():
        model(x)
    s2 = float(model.logits[0].var(dim=-1).mean())  # across keys, per query: the maps' s^2
    assert s2 == pytest.approx(1.0, rel=0.15), s2  # 4 x 8 heads x 32 queries of 32 keys
    rows = model.k_proj.weight.detach().pow(2).sum(1).mean()
    assert float(rows) == pytest.approx(128 / (groups * 16 * (heads // groups)), rel=1e-4)


def test_the_gain_counts_the_reads():
    role = inits.LayerRole(fan_in=2048, fan_out=512, kind="linear", reads=4)
    assert inits.proposed_gain_sq(role) == pytest.approx(1.0)
    assert inits.proposed_gain_sq(inits.LayerRole(fan_in=2048, fan_out=512, kind="linear")) == pytest.approx(
        4.0
    )
