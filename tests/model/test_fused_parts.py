"""Pieces of one weight layer's output (docs/theory.md §16, "Pieces of a fused projection"; issue
68 item 2): Phi-3's ``gate_up_proj`` chunked into a gate and an up projection, Falcon's
``query_key_value`` written as ``x @ W.T`` and split per head, GPT-NeoX's fused QKV beside a
parallel residual.  Two pieces on disjoint rows of W are as independent as two layers; a piece
whose rows are scaled apart from the rest has its own moment (0.19.0.dev0 read the whole
output's).  Each law against autograd on the same weights, and the real configs against sigprop's
own measurement at their own init and under ``proposed``.

Tolerances: as tests/model/test_decoder_maps.py -- the quantities compared are means over 200
draws of mean squares (standard error about 0.5%; the separate-matrix gated MLP's residual within
1%): bound 3%.  The configs: the issue's bounds (6% forward, 10% backward, 0.05 token cosine)."""

from __future__ import annotations

import dataclasses
import math
import operator

import numpy as np
import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

import sigprop
from sigprop.maps import graph
from sigprop.model.hf import Hidden
from sigprop.model.ops import parts, structure
from sigprop.model.trace import trace_graph

D, F_, T, VOCAB = 64, 128, 16, 256


class FusedGated(nn.Module):
    """Phi-3's MLP: one projection to 2f chunked into gate and up, act(gate) * up, then W2; the
    gate's rows scaled by ``gate_scale`` after the draw (an init that scales a piece apart)."""

    def __init__(self, gate_scale: float = 1.0, overlap: bool = False) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(D)
        self.w13, self.w2 = nn.Linear(D, 2 * F_, bias=False), nn.Linear(F_, D, bias=False)
        self.overlap = overlap
        with torch.no_grad():
            self.w13.weight[:F_] *= gate_scale

    def gate(self, x):
        y = self.w13(self.norm(x))
        if self.overlap:  # the up piece reads half the gate's rows
            return F.silu(y[..., :F_]) * y[..., F_ // 2 : F_ // 2 + F_]
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward(self, x):
        return self.w2(self.gate(x))


def _fold(model, x):
    t = trace_graph(model, x[:2])
    return graph.predict_graph(t.nodes, float(x.pow(2).mean()), float(x.mean())), t.nodes


def _ratios(gate_scale: float, draws: int = 200) -> np.ndarray:
    """Per draw, measured over predicted: the product's second moment, the output's, the input's
    gradient (64 samples of mean 0.3, float64)."""
    rows = []
    for seed in range(draws):
        torch.manual_seed(seed)
        m = FusedGated(gate_scale).double()
        x = (torch.randn(64, D, dtype=torch.double) + 0.3).requires_grad_(True)
        gate = m.gate(x)
        y = m.w2(gate)
        g = torch.randn_like(y)
        (y * g).sum().backward()
        pred, nodes = _fold(m, x.detach())
        k = next(i for i, nd in enumerate(nodes) if nd.op == "product")
        rows.append(
            (
                float(gate.detach().pow(2).mean()) / pred.q[k],
                float(y.detach().pow(2).mean()) / pred.q[-1],
                float(x.grad.pow(2).mean() / g.pow(2).mean()) / pred.r[0],
            )
        )
    return np.array(rows)


@pytest.mark.parametrize("gate_scale", [1.0, 2.0], ids=["drawn-alike", "gate-scaled-apart"])
def test_two_chunks_of_one_projection_multiply_as_two_layers(gate_scale):
    """act(gate) * up with gate and up chunks of one x W: the product, the output and the input's
    gradient against autograd over 200 draws, within 3% (0.19.0.dev0: no map, "a product of two
    states that share chunk")."""
    for name, col in zip(("product", "output", "input gradient"), _ratios(gate_scale).T):
        assert col.mean() == pytest.approx(1.0, abs=0.03), (name, col.mean(), col.std() / math.sqrt(len(col)))


def test_a_piece_scaled_apart_is_not_read_as_the_whole(monkeypatch):
    """The same with each piece read at the whole output's moment (sigma = 1, what a fused
    projection's parts were read as before): the product is off by far more than the 3% above --
    the gate's rows at 2x hold 4/5 of the output's moment, the up's 1/5."""
    real = parts.piece_of

    def averaged(t, n):
        piece = real(t, n)
        return None if piece is None else dataclasses.replace(piece, sigma=1.0)

    monkeypatch.setattr(parts, "piece_of", averaged)
    product = _ratios(2.0, draws=20)[:, 0].mean()
    assert abs(product - 1.0) > 0.2, product


def test_pieces_that_share_rows_are_named_not_multiplied():
    """Two slices of one output that overlap in rows are not independent: no map, naming why."""
    torch.manual_seed(0)
    t = trace_graph(FusedGated(overlap=True), torch.randn(2, D))
    why = [nd.why for nd in t.nodes if nd.op == "unknown"]
    assert any("rows of one weight layer" in w for w in why), why


class Written(nn.Module):
    """Falcon's ``FalconLinear``, ``x @ self.weight.T`` (``transposed``: ``x @ self.weight`` of a
    [d_in, d_out] matrix), beside the same weights in an nn.Linear."""

    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.ref = nn.Linear(D, F_, bias=False)
        self.transposed = transposed
        w = self.ref.weight.detach().clone()
        self.weight = nn.Parameter(w.T.contiguous() if transposed else w)
        self.out = nn.Linear(F_, D, bias=False)

    def forward(self, x):
        h = x @ self.weight if self.transposed else x @ self.weight.T
        return self.out(F.gelu(h))


@pytest.mark.parametrize("transposed", [False, True], ids=["x@W.T", "x@W"])
def test_a_product_by_a_weight_is_its_linear(transposed):
    """The fold of ``x @ W.T`` equals that of nn.Linear on the same W (same floats: exactly)."""
    torch.manual_seed(0)
    m = Written(transposed)
    x = torch.randn(64, D)
    pred, nodes = _fold(m, x)
    assert not [nd.why for nd in nodes if nd.op == "unknown"]
    ref = nn.Sequential(m.ref, nn.GELU(), m.out)
    want, _ = _fold(ref, x)
    assert pred.q[-1] == pytest.approx(want.q[-1], rel=1e-12)
    assert pred.r[0] == pytest.approx(want.r[0], rel=1e-12)


def test_an_in_place_sum_whose_input_is_read_again_is_named():
    """aten.add_(a, b) with a read after it: the later reader would see the old a in the graph."""
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    s = g.call_function(torch.ops.aten.add_.Tensor, (a, b))
    again = g.call_function(operator.mul, (a, 2.0))
    g.output((s, again))
    assert structure._read_again(s)
    g2 = fx.Graph()
    a2, b2 = g2.placeholder("a"), g2.placeholder("b")
    s2 = g2.call_function(torch.ops.aten.add_.Tensor, (a2, b2))
    g2.output(g2.call_function(operator.mul, (s2, 2.0)))
    assert not structure._read_again(s2)


def _phi3():
    t = pytest.importorskip("transformers")
    cfg = t.Phi3Config(
        num_hidden_layers=3, hidden_size=D, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=2 * D, vocab_size=VOCAB, max_position_embeddings=T, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return Hidden(t.Phi3Model(cfg))


def _falcon(new: bool):
    t = pytest.importorskip("transformers")
    cfg = t.FalconConfig(
        num_hidden_layers=3, hidden_size=D, num_attention_heads=4, vocab_size=VOCAB, bias=False,
        new_decoder_architecture=new, num_kv_heads=2 if new else None, multi_query=not new,
        parallel_attn=True, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return Hidden(t.FalconModel(cfg))


def _neox(parallel: bool):
    t = pytest.importorskip("transformers")
    cfg = t.GPTNeoXConfig(
        num_hidden_layers=3, hidden_size=D, num_attention_heads=4, intermediate_size=4 * D,
        vocab_size=VOCAB, max_position_embeddings=T, rotary_pct=0.25, use_parallel_residual=parallel,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return Hidden(t.GPTNeoXModel(cfg))


FAMILIES = {
    "phi3": _phi3,
    "falcon-7b-form": lambda: _falcon(False),
    "falcon-40b-form": lambda: _falcon(True),
    "neox-parallel": lambda: _neox(True),
    "neox-sequential": lambda: _neox(False),
}


@pytest.mark.parametrize("init", ["as-is", "proposed"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_projection_families_have_theory_at_every_layer(family, init):
    """Phi-3 (chunked gate_up, fused qkv sliced), Falcon (``x @ W.T``, multi-query and grouped
    splits per head, parallel attention, an in-place sum), GPT-NeoX (fused qkv per head, partial
    rotary, parallel or sequential residual): every site predicted within 6% forward, 10%
    backward, 0.05 token cosine (measured at most 4%, 4%, 0.046 with 4 layers)."""
    make = FAMILIES[family]
    result = sigprop.probe_module(model=make, inits=init, input_shape=(T,), vocab=VOCAB, samples=64)
    notes = result.config["theory_notes"]
    assert not [n for n in notes if n.startswith("no moment map")], notes
    for layer in result.runs[0].layers:
        assert layer.forward.predicted == pytest.approx(layer.forward.rms, rel=0.06), layer.name
        assert layer.backward.predicted == pytest.approx(layer.backward.rms, rel=0.10), layer.name
        if layer.tokens is not None and layer.tokens.predicted is not None:
            assert layer.tokens.predicted == pytest.approx(layer.tokens.mean, abs=0.05), layer.name
