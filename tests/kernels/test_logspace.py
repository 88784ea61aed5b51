"""The log-space kernels (sigprop/kernels/logspace.py): bit-packed ReLU masks."""

import pytest
import torch

from sigprop.kernels import logspace as ls


@pytest.mark.parametrize("n", [1, 7, 8, 9, 250])
def test_mask_bit_packing_round_trip(n, monkeypatch):
    mask = torch.rand(3, 13, n, generator=torch.Generator().manual_seed(n)) > 0.5
    packed = ls.pack_mask(mask)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 13, (n + 7) // 8)
    assert torch.equal(ls.unpack_mask(packed, n), mask)
    # unit k of a group of 8 sits at bit k: the int64 gather equals the weighted-sum fallback
    assert int(ls.pack_mask(torch.tensor([[True] + [False] * 7]))[0, 0]) == 1
    assert int(ls.pack_mask(torch.tensor([[False] * 7 + [True]]))[0, 0]) == 128
    monkeypatch.setattr(ls.sys, "byteorder", "big")
    assert torch.equal(ls.pack_mask(mask), packed)
