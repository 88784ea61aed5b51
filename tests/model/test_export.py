"""Models torch.fx cannot trace, read by torch.export at the ATen level (issue 39): Hugging Face
BERT and GPT-2 from small configs, token ids in, the traced theory beside the measurement.

Tolerances: per layer the maps are infinite-width (d = 64: ~2% a layer, docs/theory.md §4); the
forward within 5% and the token cosine within 0.05 (the issue's bound) at every layer site over
2 draws, the backward within 10% (the issue's bound; measured within 3% for GPT-2 once a split's
readers were weighed by their share of its elements: before, 25% at its embeddings)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import sigprop
from sigprop.model.ops.attention import mask_kind
from sigprop.model.trace import trace_graph

transformers = pytest.importorskip("transformers")


def bert():
    cfg = transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=256,
        vocab_size=200,
        max_position_embeddings=32,
    )
    return transformers.BertModel(cfg)


def gpt2():
    cfg = transformers.GPT2Config(
        n_embd=64, n_layer=3, n_head=4, vocab_size=200, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2Model(cfg)


def _probe(make):
    return sigprop.probe_module(model=make, input_shape=(16,), vocab=200, samples=8, seeds=2, device="cpu")


def test_bert_is_traced_by_torch_export_and_follows_the_maps():
    r = _probe(bert)
    notes = r.config["theory_notes"]
    assert any("traced by torch.export" in n for n in notes)
    assert not [n for n in notes if n.startswith("no moment map")]
    layers = [l for l in r.runs[0].layers if l.name.startswith("encoder.layer.")]
    assert len(layers) == 3
    for l in layers:
        assert l.forward.predicted == pytest.approx(l.forward.rms, rel=0.05)
        assert l.backward.predicted == pytest.approx(l.backward.rms, rel=0.10)
        assert l.tokens.predicted == pytest.approx(l.tokens.mean, abs=0.05)
    # the token-type and position embeddings make the tokens of a sample share ~1/3
    assert layers[0].tokens.mean > 0.2


def test_gpt2_is_traced_with_its_causal_mask_and_tanh_gelu():
    r = _probe(gpt2)
    notes = r.config["theory_notes"]
    assert not [n for n in notes if n.startswith("no moment map")]
    layers = {l.name: l for l in r.runs[0].layers}
    for name in ("h.0", "h.1", "h.2", "ln_f"):
        l = layers[name]
        assert l.forward.predicted == pytest.approx(l.forward.rms, rel=0.05), name
        assert l.tokens.predicted == pytest.approx(l.tokens.mean, abs=0.05), name
        assert l.backward.predicted == pytest.approx(l.backward.rms, rel=0.10), name
    wte = layers["wte"]
    assert wte.backward.predicted == pytest.approx(wte.backward.rms, rel=0.10)
    assert layers["h.0"].tokens.entropy > 0.99  # N(0, 0.02^2) weights: uniform attention


def _llama():
    cfg = transformers.LlamaConfig(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaModel(cfg)


@pytest.mark.parametrize("make", [gpt2, _llama], ids=["gpt2", "llama"])
def test_a_reused_export_reads_each_draws_own_weights(make):
    """The second draw reuses the exported graph (the same graph object) with its own weights
    loaded, its input-free values read anew and its shapes kept (``_Recording.statics``): its
    prediction equals a fresh export's on the same weights.  A buffer the state dict leaves out
    (a Llama's rotary ``inv_freq``), other in a third model: the kept graph's output differs from
    that model's and the graph is exported again."""
    from sigprop.maps.graph import predict_graph
    from sigprop.model import trace as tr

    def q(traced):
        return [None if v is None else round(v, 12) for v in predict_graph(traced.nodes, 1.0).q]

    torch.manual_seed(0)
    a, b = make().eval(), make().eval()
    ids = torch.randint(0, 200, (2, 16))
    tr._EXPORTED.clear()
    first = trace_graph(a, ids)
    kept = next(iter(tr._EXPORTED.values()))
    second = trace_graph(b, ids)  # reused, b's weights
    assert next(iter(tr._EXPORTED.values())) is kept
    tr._EXPORTED.clear()
    fresh = trace_graph(b, ids)
    assert first.tracer == second.tracer == "torch.export"
    assert q(second) == q(fresh)
    assert q(first) != q(second)
    c = make().eval()
    buffers = [buf for name, buf in c.named_buffers() if name.endswith("inv_freq")]
    if buffers:
        for buf in buffers:
            buf.mul_(0.5)
        kept = next(iter(tr._EXPORTED.values()))
        again = trace_graph(c, ids)
        assert next(iter(tr._EXPORTED.values())) is not kept
        tr._EXPORTED.clear()
        assert q(again) == q(trace_graph(c, ids))


def test_mask_kinds():
    T = 5
    tril = torch.ones(T, T, dtype=torch.bool).tril()
    assert mask_kind(torch.ones(2, 1, T, T, dtype=torch.bool)) == "none"
    assert mask_kind(tril.expand(2, 1, T, T)) == "causal"
    assert mask_kind(torch.zeros(T, T).masked_fill(~tril, -torch.inf)) == "causal"
    assert mask_kind(torch.zeros(T, T).masked_fill(~tril, torch.finfo(torch.float32).min)) == "causal"
    assert mask_kind(torch.randn(T, T)) is None  # an additive bias
    assert mask_kind(tril.T) is None


def test_the_tanh_gelu_written_out_is_the_one_op():
    """Hugging Face's NewGELUActivation is the tanh GELU exactly (the export writes it as one)."""
    from transformers.activations import NewGELUActivation

    x = torch.randn(1000, dtype=torch.float64) * 3
    assert torch.allclose(NewGELUActivation()(x), F.gelu(x, approximate="tanh"), atol=1e-12)


class Unreadable(nn.Module):
    """Data-dependent control flow: neither tracer reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        if bool(h.sum() > 0):
            return h
        return -h


def test_a_model_no_tracer_reads_is_measured_with_both_reasons():
    r = sigprop.probe_module(model=Unreadable, input_shape=(8,), samples=8, device="cpu", sites="a")
    note = r.config["theory_notes"][0]
    assert "torch.fx could not trace" in note and "torch.export neither" in note
    assert r.runs[0].layers[0].forward.rms > 0


def test_init_reads_gpt2s_roles_from_its_exported_graph():
    """sigprop.init_ on GPT-2 (issue 39): every Conv1D drawn with its role read from the ATen graph
    -- c_attn linear (attention reads it), c_fc a GELU layer, each branch's c_proj 1/B with B = 2L
    (its attention and MLP branches) -- the embeddings drawn, the LayerNorms at their identity:
    nothing left."""
    model = gpt2()
    records = sigprop.init_(model, "proposed")
    by = {r.name: r for r in records}
    assert (by["h.0.attn.c_attn"].role, by["h.0.mlp.c_fc"].role) == ("linear", "relu")
    assert {
        (by[f"h.{i}.{b}.c_proj"].role, by[f"h.{i}.{b}.c_proj"].blocks_in_stage)
        for i in range(3)
        for b in ("attn", "mlp")
    } == {("block_last", 6)}
    assert by["wte"].set and by["wpe"].set and not any(r.note.startswith("role not read") for r in records)
    assert all(r.set for r in records)  # nothing left: the LayerNorms at gain 1, offset 0


def test_gpt2_with_the_papers_init_follows_the_maps_everywhere():
    """With ``proposed`` (its residual rule read from the graph) GPT-2's backward ratios follow
    the maps at every site too (within 5%), and the signal is preserved."""
    r = sigprop.probe_module(
        model=gpt2, input_shape=(16,), vocab=200, inits=["proposed"], samples=8, seeds=2, device="cpu"
    )
    run = r.runs[0]
    assert run.preserved
    for l in run.layers:
        if l.forward.predicted is not None and not l.off_path:
            assert l.forward.predicted == pytest.approx(l.forward.rms, rel=0.05), l.name
            assert l.backward.predicted == pytest.approx(l.backward.rms, rel=0.05), l.name


def vit():
    cfg = transformers.ViTConfig(
        num_hidden_layers=3,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=256,
        image_size=16,
        patch_size=4,
    )
    return transformers.ViTModel(cfg, add_pooling_layer=False)


def test_vit_with_its_class_token_follows_the_maps():
    """ViT from a small config (17 tokens: a class token beside 16 patches): the patch embedding's
    conv, the class token concatenated as a group of tokens of its own (``Part.axis``): forward
    within 5% everywhere; backward within 10% at the layers and 15% at the embeddings (measured
    11% at d = 128, docs/theory.md §15: the groups' own statistics are kept, the class token's
    cosine with the patches is not)."""
    r = sigprop.probe_module(model=vit, input_shape=(3, 16, 16), samples=8, seeds=2, device="cpu")
    assert not [n for n in r.config["theory_notes"] if n.startswith("no moment map")]
    for l in r.runs[0].layers:
        assert l.forward.predicted == pytest.approx(l.forward.rms, rel=0.05), l.name
        tol = 0.15 if l.name == "embeddings" else 0.10
        assert l.backward.predicted == pytest.approx(l.backward.rms, rel=tol), l.name


def test_a_vits_tokens_are_read_from_its_attention_and_their_cosine_predicted():
    """Image inputs: the token count comes from the graph's first attention (16 patches and the
    class token), so every layer site reads its token cosine beside the maps' (the class token's
    one-token group has no pair of its own; 0.14.x read its self-moment as a pair's: 0.036 high
    at the final LayerNorm), and --max-token-cosine is a check there, not a refusal."""
    r = sigprop.probe_module(
        model=vit, input_shape=(3, 16, 16), samples=16, seeds=2, device="cpu", max_token_cosine=0.9
    )
    run = r.runs[0]
    for layer in run.layers:
        assert layer.tokens is not None, layer.name
        assert layer.tokens.predicted == pytest.approx(layer.tokens.mean, abs=0.02), layer.name
    (gate,) = [c for c in run.checks if c.verdict == "tokens"]
    assert gate.passed and gate.cosine == pytest.approx(run.layers[-1].tokens.mean)


def test_the_gpt2_scheme_draws_as_hugging_faces_own_init():
    """``--init gpt2`` (Radford et al. 2019): each weight's standard deviation equals the one
    Hugging Face's own init gives the same model (0.02, c_proj 0.02/sqrt(2L), embeddings 0.02),
    within the sampling error of a layer's few thousand weights (5%).  Seeded: the global stream a
    worker's earlier tests leave made it fail once in a dozen runs under xdist."""
    torch.manual_seed(0)
    own = gpt2()
    drawn = gpt2()
    records = sigprop.init_(drawn, "gpt2")
    assert all(r.set for r in records)  # nothing left: the LayerNorms at gain 1, offset 0
    mine = dict(drawn.named_parameters())
    for name, p in own.named_parameters():
        if name.endswith("weight") and "ln" not in name:
            assert float(mine[name].std()) == pytest.approx(float(p.std()), rel=0.05), name


def test_llamas_auto_sites_skip_its_rotary_embedding():
    """Llama: the rotary embedding's output (cos, sin) is not one row per sample: no auto site;
    its rotary products and gated MLP have maps since 0.16.0 (tests/model/test_decoder_maps.py)."""
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=200,
        max_position_embeddings=32,
    )
    r = sigprop.probe_module(
        model=lambda: LlamaModel(cfg), input_shape=(16,), vocab=200, samples=4, device="cpu"
    )
    assert [l.name for l in r.runs[0].layers] == ["embed_tokens", "layers.0", "layers.1", "norm"]
    assert not [n for n in r.config["theory_notes"] if n.startswith("no moment map")]


class _Functional(nn.Module):
    """The same layers called as functions (``F.linear``, ``x @ W^T + b`` as GPT-2's Conv1D
    writes it: ``addmm``), so that each tracer reads them as ATen ops."""

    def __init__(self, first: nn.Linear, second: nn.Linear) -> None:
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x):
        h = F.relu(F.linear(x, self.first.weight, self.first.bias))
        flat = h.reshape(-1, h.shape[-1])
        out = torch.addmm(self.second.bias, flat, self.second.weight.T)
        return out.reshape(*h.shape[:-1], -1)


@pytest.mark.parametrize("shape", [(8,), (5, 8)], ids=["vectors", "tokens"])
def test_one_dense_map_whatever_reads_the_layer(shape):
    """A Linear module (torch.fx), ``aten.linear`` and ``aten.addmm`` (torch.export) on the same
    weights are one dense map (ops/linear.py ``weight_node``): the same forward, backward and
    bias factors to the bit, the same width, and the gradient's shared moment passing on tokens
    only (before 0.17 the ATen reading wrote its own copy: it passed it on a vector too, and
    rounded its backward differently)."""
    from sigprop.model.trace import _export_graph

    torch.manual_seed(0)
    first, second = nn.Linear(8, 16), nn.Linear(16, 4)
    x = torch.randn(4, *shape)
    fx_nodes = [n for n in trace_graph(nn.Sequential(first, nn.ReLU(), second), x).nodes if n.op == "dense"]
    traced = _export_graph(_Functional(first, second), (x[:2],), "read as ATen ops")
    aten_nodes = [n for n in traced.nodes if n.op == "dense"]
    assert traced.tracer == "torch.export" and len(fx_nodes) == len(aten_nodes) == 2
    for a, b in zip(fx_nodes, aten_nodes):
        assert (a.forward, a.backward, a.bias, a.width) == (b.forward, b.backward, b.bias, b.width)
        assert a.positions == b.positions == (len(shape) > 1)
    w = second.weight.detach().double()
    assert aten_nodes[1].backward == float(w.pow(2).sum()) / 16  # ||W||^2 / c_in
