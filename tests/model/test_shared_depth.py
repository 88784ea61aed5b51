"""Depth that reuses its weights (issue 50, item 2): a module called several times (a looped
block, ALBERT's shared layer) is a site per call, each measured as plain hooks on that call
measure it; a weight read again, or a copy of an earlier one's values, stops the independent-draw
maps there with a note naming both readers; tied input and output embeddings do not."""

import copy

import pytest
import torch
import torch.nn as nn

import sigprop

D, T = 32, 8


class Looped(nn.Module):
    """One pre-LN encoder layer applied ``n`` times (a looped, recurrent-depth transformer)."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.n = n
        self.block = nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True, norm_first=True)

    def forward(self, x):
        for _ in range(self.n):
            x = self.block(x)
        return x


def test_a_looped_blocks_calls_are_sites_each_measured_as_hooks_measure_it():
    """Sites ``block``, ``block@1``, ``block@2``, ``block@3``: one per call, in the forward's
    order.  Each call's forward and backward RMS ratio per sample equals plain hooks' on the same
    weights, inputs and output errors (0.16.0.dev0 had one site per module, its forward read at
    the last call and its backward at the first)."""
    from sigprop.model import measure, sites

    torch.manual_seed(0)
    model = Looped()
    x = torch.randn(6, T, D)
    seen = sites.survey(model, x[:2])
    names, _ = sites.resolve_sites(model, "auto", seen.called, seen.not_per_sample, seen.order)
    assert names == ["block", "block@1", "block@2", "block@3"]
    got = measure.measure(model, x, 123, names, tokens=T)

    outs = []
    h = model.block.register_forward_hook(lambda m, a, out: outs.append(out))
    xg = x.clone().requires_grad_(True)
    y = model(xg)
    h.remove()
    for o in outs:
        o.retain_grad()
    e = torch.randn(y.shape, generator=torch.Generator().manual_seed(123))
    y.backward(e)
    rms = lambda t: t.detach().double().pow(2).flatten(1).mean(1).sqrt()
    for k, o in enumerate(outs):
        fwd, bwd = (rms(o) / rms(x)).log(), (rms(o.grad) / rms(e)).log()
        assert torch.allclose(torch.as_tensor(got.ln_f[k]), fwd, rtol=0, atol=1e-6), names[k]
        assert torch.allclose(torch.as_tensor(got.ln_b[k]), bwd, rtol=0, atol=1e-6), names[k]
    assert len({round(float(b.mean()), 6) for b in got.ln_b}) == 4  # four calls, four gradients


def test_a_weight_read_again_stops_the_maps_and_names_both_calls():
    """The second call reads the first's weights: the maps (independent draws) stop there --
    ``block@1, which reads the weights of block again`` --, the first call keeps its prediction,
    every later one has none (0.16.0.dev0 predicted each call as if drawn anew: the looped block's
    last call 0.16 predicted for 0.29 measured, silently)."""
    r = sigprop.probe_module(model=Looped, input_shape=(T, D), samples=8, device="cpu")
    layers = r.runs[0].layers
    assert layers[0].forward.predicted == pytest.approx(layers[0].forward.rms, rel=0.06)
    assert all(l.forward.predicted is None and l.backward.predicted is None for l in layers[1:])
    assert any(
        n.startswith("no moment map for block@1, which reads the weights of block again")
        for n in r.config["theory_notes"]
    )
    # the cosine grows call after call: the measurement itself is per call
    cos = [l.tokens.mean for l in layers]
    assert cos == sorted(cos) and cos[-1] > 2 * cos[0]


class Copies(nn.Module):
    """A user's own stack of deep copies of one block (not nn.TransformerEncoder): every block
    starts with the first one's weights."""

    def __init__(self, n: int = 3) -> None:
        super().__init__()
        block = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.blocks = nn.ModuleList(copy.deepcopy(block) for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


def test_copies_of_a_block_are_named_wherever_they_sit():
    """Deep copies not re-drawn: the second block starts with the first's weights, said at its
    first weight layer; re-drawn, the maps hold at every block."""
    r = sigprop.probe_module(model=Copies, input_shape=(T, D), samples=8, device="cpu")
    notes = r.config["theory_notes"]
    assert any(
        n.startswith("no moment map for blocks.1.1, which starts with the same weights as blocks.0.1")
        for n in notes
    ), notes
    by = {l.name: l.forward.predicted for l in r.runs[0].layers}
    assert by["blocks.0.3"] is not None and by["blocks.1.2"] is None and by["blocks.2.3"] is None

    def redrawn():
        m = Copies()
        for b in m.blocks:
            for lay in b:
                if hasattr(lay, "reset_parameters"):
                    lay.reset_parameters()
        return m

    r = sigprop.probe_module(model=redrawn, input_shape=(T, D), samples=8, device="cpu")
    assert not [n for n in r.config["theory_notes"] if n.startswith("no moment map")]
    assert all(l.forward.predicted is not None for l in r.runs[0].layers)


transformers = pytest.importorskip("transformers")


def test_albert_shares_its_layer_across_depth():
    """ALBERT (Lan et al. 2020) runs one layer group at every depth: a site per call
    (``encoder.albert_layer_groups.0``, ``...@1``, ...), the maps stopping at the second call's
    first weight (0.16.0.dev0: one site, ``encoder``, predicted as if every layer were drawn
    anew)."""
    cfg = transformers.AlbertConfig(
        vocab_size=100,
        embedding_size=16,
        hidden_size=D,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=2 * D,
        max_position_embeddings=16,
    )
    r = sigprop.probe_module(
        model=lambda: transformers.AlbertModel(cfg, add_pooling_layer=False),
        input_shape=(T,),
        vocab=100,
        samples=8,
        device="cpu",
    )
    group = "encoder.albert_layer_groups.0"
    assert [l.name for l in r.runs[0].layers][-3:] == [group, f"{group}@1", f"{group}@2"]
    assert any(
        f"{group}.albert_layers.0.attention.query@1, which reads the weights of" in n
        for n in r.config["theory_notes"]
    )


def test_tied_embeddings_are_not_read_as_shared_depth():
    """A tied Llama (its output layer reads the embedding table): read as an independent weight,
    as docs/theory.md §16 documents (2.6% at the logits), not stopped."""
    cfg = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=D,
        intermediate_size=2 * D,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        tie_word_embeddings=True,
    )
    r = sigprop.probe_module(
        model=lambda: transformers.LlamaForCausalLM(cfg), input_shape=(T,), vocab=100, samples=8, device="cpu"
    )
    assert not [n for n in r.config["theory_notes"] if n.startswith("no moment map")], r.config[
        "theory_notes"
    ]
