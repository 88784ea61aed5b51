"""μP's attention 1/d (sigprop/width/attention.py) against the attention written out by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from sigprop.width.attention import AttentionScale


def _by_hand(mha, x, factor):
    B, T, E = x.shape
    H = mha.num_heads
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, -1)

    def heads(t):
        return t.reshape(B, T, H, E // H).transpose(1, 2)

    w = torch.softmax(heads(q) @ heads(k).transpose(-1, -2) * factor / math.sqrt(E // H), -1)
    return F.linear((w @ heads(v)).transpose(1, 2).reshape(B, T, E), mha.out_proj.weight, mha.out_proj.bias)


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_logits_read_sqrt_d0_over_d(need_weights):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 2, batch_first=True).double()
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    rec = AttentionScale()
    with rec:
        mha(x, x, x, need_weights=need_weights)
    assert rec.dims == [16]
    with AttentionScale([4]):  # base head dimension 4: logits q.k sqrt(4)/16
        y = mha(x, x, x, need_weights=need_weights)[0]
    assert torch.allclose(y, _by_hand(mha, x, math.sqrt(4 / 16)), rtol=1e-12, atol=1e-12)
    y.sum().backward()  # the rescaled projection is differentiable: the gradient reaches the weight
    assert mha.in_proj_weight.grad is not None


def test_sdpa_scale_and_a_given_scale():
    q, k, v = (torch.randn(2, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    with AttentionScale([2]):  # one mode per forward: its calls in order
        a = F.scaled_dot_product_attention(q, k, v)
    with AttentionScale([2]):
        b = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert torch.allclose(a, F.scaled_dot_product_attention(q, k, v, scale=math.sqrt(2 / 8) / math.sqrt(8)))
    assert torch.allclose(b, F.scaled_dot_product_attention(q, k, v, scale=0.3 * math.sqrt(2 / 8)))


def test_the_recorded_logits_are_the_calls_own():
    """The logits a check records (``record``): MHA's as written out by hand, rescaled under μP;
    grouped-query SDPA's with each key head repeated over its group."""
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(32, 2, batch_first=True).double()
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    mode = AttentionScale([4], record=True)
    with mode:
        mha(x, x, x, need_weights=False)
    q, k, _ = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, -1)
    q, k = (t.reshape(3, 5, 2, 16).transpose(1, 2) for t in (q, k))
    want = q @ k.transpose(-1, -2) * math.sqrt(4 / 16) / math.sqrt(16)
    assert torch.allclose(mode.logits[0], want, rtol=1e-12, atol=1e-12)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mode = AttentionScale([8], rescale=False, record=True)
    with mode:
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    want = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(8)
    assert torch.allclose(mode.logits[0], want, rtol=1e-5, atol=1e-6)
