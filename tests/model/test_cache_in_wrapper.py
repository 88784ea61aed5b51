"""A user's wrapper around a Hugging Face model keeps its theory (issue 48, item 5): with the
cache on (transformers' default) ``self.gpt(inputs_embeds=x)`` concatenated its keys to an empty
cache and 0.14.0 lost every theory value at ``cat.default``; only ``use_cache=False`` passed at the
top worked.  The export now switches off the cache of every Hugging Face model inside the model
(its config, restored after) and says so; the measurement runs the model as it is."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import sigprop
from sigprop.model.trace import cache_off, trace_graph

transformers = pytest.importorskip("transformers")


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        cfg = transformers.GPT2Config(
            n_embd=32, n_layer=2, n_head=4, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0
        )
        self.gpt = transformers.GPT2Model(cfg)

    def forward(self, x):
        return self.gpt(inputs_embeds=x).last_hidden_state


def test_a_wrapped_gpt2_with_its_cache_on_keeps_its_theory():
    assert Wrapper().gpt.config.use_cache is True  # the premise: transformers' default
    r = sigprop.probe_module(target=f"{__file__}:Wrapper", input_shape=(8, 32), samples=8)
    layers = r.run("as-is").layers
    blocks = [layer for layer in layers if layer.name.startswith(("gpt.h.", "gpt.ln_f"))]
    assert len(blocks) == 3 and all(b.forward.predicted is not None for b in blocks), r.config["theory_notes"]
    assert not any("cat.default" in n for n in r.config["theory_notes"])
    assert any("key/value cache of 'gpt' off" in n for n in r.config["theory_notes"])
    # the traced theory follows the measurement (forward within 5%: tests/model/test_export.py)
    last = layers[-2]  # gpt.h.1, the last block before ln_f
    assert abs(math.log(last.forward.rms / last.forward.predicted)) < 0.05


def test_the_cache_is_restored_after_the_trace():
    model = Wrapper()
    with cache_off(model):
        assert model.gpt.config.use_cache is False
    assert model.gpt.config.use_cache is True
    trace_graph(model, torch.randn(4, 8, 32), "the model")
    assert model.gpt.config.use_cache is True
