"""``init_`` reads attention's output projection as the last layer of a residual branch (issue 48,
item 3): 0.14.0 gave each ``self_attn.out_proj`` of a re-drawn encoder the ReLU gain (a row's
squared norm 2.0 where the paper's rule gives 1/B), and ``--init proposed`` raised the last
layer's token cosine from 0.18 to 0.75."""

import pytest
import torch
import torch.nn as nn

import sigprop
from sigprop.model import init

D, FF, LAYERS, T = 32, 64, 4, 8


def encoder(norm_first: bool = True) -> nn.Module:
    layer = nn.TransformerEncoderLayer(D, 4, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    return nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)


class Block(nn.Module):
    """A hand-written pre-LN block: x + attn(ln(x)), then x + W2 relu(W1 ln(x))."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 4, batch_first=True)
        self.w1, self.w2 = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.w2(torch.relu(self.w1(self.ln2(x))))


def row_norm2(w: torch.Tensor) -> float:
    return float(w.detach().pow(2).sum(1).mean())


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-LN", "post-LN"])
def test_an_encoders_attention_and_mlp_branches_end_at_one_over_b(norm_first):
    """Each layer holds two residual branches (attention, MLP): B = 2 L; the proposed init gives
    the last layer of each g^2 = fan_in / (B fan_out) (Arpit et al. 2019, section 4), the MLP's
    first layer the ReLU gain 2 fan_in / fan_out, the attention's in-projection gain 1."""
    model = encoder(norm_first)
    init.init_(model, "proposed", 0, 0, batch=torch.randn(4, T, D))
    B = 2 * LAYERS
    for layer in model.layers:
        assert row_norm2(layer.self_attn.out_proj.weight) == pytest.approx(1 / B, rel=1e-5)
        assert row_norm2(layer.linear2.weight) == pytest.approx(FF / D / B, rel=1e-5)
        assert row_norm2(layer.linear1.weight) == pytest.approx(2 * D / FF, rel=1e-5)
        assert row_norm2(layer.self_attn.in_proj_weight) == pytest.approx(1.0, rel=1e-5)


def test_a_hand_written_blocks_attention_output_is_a_branchs_last_layer():
    model = nn.Sequential(Block(), Block())
    init.init_(model, "proposed", 0, 0, batch=torch.randn(4, T, D))
    B = 4  # two blocks, each an attention and an MLP branch
    for block in model:
        assert row_norm2(block.attn.out_proj.weight) == pytest.approx(1 / B, rel=1e-5)
        assert row_norm2(block.w2.weight) == pytest.approx(FF / D / B, rel=1e-5)


def test_the_proposed_init_keeps_a_pre_ln_encoders_tokens_apart():
    """The done-when of issue 48: ``--init proposed`` lowers the token cosine of a pre-LN encoder
    against its own init (every layer re-drawn, so that both read the same architecture)."""

    def redrawn():
        model = encoder(True)
        for layer in model.layers:
            for m in layer.modules():
                reset = getattr(m, "reset_parameters", None) or getattr(m, "_reset_parameters", None)
                if m is not layer and reset is not None:
                    reset()
        return model

    r = sigprop.probe_module(
        model=redrawn, input_shape=(T, D), inits=["as-is", "proposed"], samples=16, device="cpu"
    )
    cos = {run.init: run.layers[-1].tokens.mean for run in r.runs}
    assert cos["proposed"] < cos["as-is"], cos


def test_gpt2_and_bert_branches_end_at_one_over_b():
    """Hugging Face's GPT-2 (Conv1D: x W, a unit's weights a column) and BERT (post-LN): each
    layer's attention and MLP branch ends at 1/B, B = 2L, read from torch.export's graph."""
    transformers = pytest.importorskip("transformers")
    ids = torch.randint(50, (4, T), generator=torch.Generator().manual_seed(0))
    gpt2 = transformers.GPT2Model(
        transformers.GPT2Config(n_embd=D, n_layer=2, n_head=4, vocab_size=50, n_positions=16)
    )
    init.init_(gpt2, "proposed", 0, 0, batch=ids)
    B = 4
    for h in gpt2.h:  # Conv1D weights are [in, out]: a unit's squared norm is a column's
        assert float(h.attn.c_proj.weight.detach().pow(2).sum(0).mean()) == pytest.approx(1 / B, rel=1e-5)
        assert float(h.mlp.c_proj.weight.detach().pow(2).sum(0).mean()) == pytest.approx(
            4 * D / D / B, rel=1e-5
        )
        assert float(h.mlp.c_fc.weight.detach().pow(2).sum(0).mean()) == pytest.approx(2 / 4, rel=1e-5)
    bert = transformers.BertModel(
        transformers.BertConfig(
            hidden_size=D,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=FF,
            vocab_size=50,
            max_position_embeddings=16,
        )
    )
    init.init_(bert, "proposed", 0, 0, batch=ids)
    for layer in bert.encoder.layer:
        assert row_norm2(layer.attention.output.dense.weight) == pytest.approx(1 / B, rel=1e-5)
        assert row_norm2(layer.output.dense.weight) == pytest.approx(FF / D / B, rel=1e-5)
        assert row_norm2(layer.intermediate.dense.weight) == pytest.approx(2 * D / FF, rel=1e-5)
