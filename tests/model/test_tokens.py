"""Transformers' sites and tokens (issue 39): one site per layer of a repeated stack, the mean
cosine between the tokens of one sample and the attention's entropy, each checked against an
implementation written here on the same weights and inputs (a T x T cosine matrix from a plain
forward hook, the attention weights a model returns itself)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import sigprop
from sigprop.cli import main
from sigprop.errors import SigpropError
from sigprop.model.attention import AttentionReader, normalised_entropy
from sigprop.model.measure import token_cosine
from sigprop.model.sites import auto_sites, resolve_sites


def cosine_matrix_mean(h: torch.Tensor) -> torch.Tensor:
    """Per sample of [N, T, d] the mean of the off-diagonal T x T cosines, a zero token 0."""
    n = h.double().norm(dim=-1, keepdim=True)
    u = torch.where(n > 0, h.double() / n.clamp(min=1e-300), torch.zeros_like(h.double()))
    c = u @ u.transpose(1, 2)
    T = h.shape[1]
    off = ~torch.eye(T, dtype=torch.bool)
    return c[:, off].mean(1)


def entropy_of(w: torch.Tensor) -> torch.Tensor:
    """Per sample of weights [N, H, Tq, Tk] the mean over heads and queries with two or more keys
    of H(w)/ln(keys), the keys a query reads counted as its non-zero weights."""
    n = (w > 0).sum(-1)
    h = -(torch.where(w > 0, w * w.log(), torch.zeros_like(w))).sum(-1)
    keep = n >= 2
    r = torch.where(keep, h / n.clamp(min=2).double().log(), torch.zeros_like(h))
    return r.flatten(1).sum(1) / keep.flatten(1).sum(1)


def test_token_cosine_equals_the_mean_off_diagonal_cosine_matrix():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 7, 16, generator=g) + 0.7 * torch.randn(5, 1, 16, generator=g)
    h[2, 3] = 0.0  # a zero token: cosine 0 with every other
    got, want = token_cosine(h), cosine_matrix_mean(h)
    # float32 unit vectors: each ||u|| within ~1e-7 of 1, the sums of 7 of them in float64
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    assert float(got.min()) > 0.2  # the shared component shows


def test_normalised_entropy_of_uniform_one_hot_and_causal_weights():
    T = 6
    zero = torch.zeros(2, 3, T, T)
    assert torch.allclose(normalised_entropy(zero, None), torch.ones(2, dtype=torch.float64))
    spike = torch.zeros(1, 1, T, T)
    spike[..., 0] = 1e4
    assert float(normalised_entropy(spike, None)) < 1e-6
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(1, 1, T, T)
    # uniform over the keys each query may read: 1, the first query (one key) left out
    assert torch.allclose(normalised_entropy(zero[:1, :1], causal), torch.ones(1, dtype=torch.float64))


class SDPABlock(nn.Module):
    """A hand-written causal attention block calling F.scaled_dot_product_attention."""

    def __init__(self, d: int = 16, heads: int = 2, gain: float = 3.0) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.heads = heads
        with torch.no_grad():
            self.qkv.weight.mul_(gain)  # logits of order 1 and more: far from uniform

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)


def test_the_attention_reader_matches_the_weights_computed_by_hand_sdpa():
    torch.manual_seed(0)
    m = SDPABlock()
    x = torch.randn(4, 9, 16)
    with AttentionReader(m) as r:
        m(x)
    ((path, got),) = r.calls
    B, T, d = x.shape
    q, k, _ = m.qkv(x).reshape(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
    z = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    w = torch.softmax(z.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf), -1).double()
    want = entropy_of(w.detach())
    assert path == ()  # the model itself made the call: no module call of its own around it
    assert torch.allclose(got, want, atol=1e-5)
    assert float(want.mean()) < 0.9  # not the uniform regime: the test can tell a wrong mask


def test_a_float_mask_of_the_dtypes_lowest_value_hides_its_keys():
    """Hugging Face's additive masks write ``torch.finfo(dtype).min`` where a key is hidden: those
    keys get weight 0 and are not counted among the keys a query may read (the oracle counts the
    non-zero weights); a finite bias elsewhere (ALiBi-like) is added to the logits."""
    torch.manual_seed(2)
    B, H, T, E = 3, 2, 7, 8
    q, k, v = (3.0 * torch.randn(B, H, T, E) for _ in range(3))
    lowest = torch.finfo(torch.float32).min
    mask = torch.triu(torch.full((T, T), lowest), 1) - 0.3 * torch.arange(T).float()  # causal + bias
    mask = mask.expand(B, 1, T, T).clone()
    mask[1, ..., 1] = lowest  # sample 1 may not read key 1 either (its second query: one key)
    with AttentionReader(nn.Identity()) as r:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ((_, got),) = r.calls
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(E) + mask, -1).double()
    assert torch.allclose(got, entropy_of(w), atol=1e-5)


def test_the_attention_reader_matches_multihead_attentions_own_weights():
    """nn.MultiheadAttention returns its weights (need_weights, per head): their entropy equals
    the reader's, with a causal float mask and a key padding mask."""
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.mul_(4.0)
    x = torch.randn(3, 8, 16)
    causal = torch.triu(torch.full((8, 8), -math.inf), 1)
    pad = torch.zeros(3, 8, dtype=torch.bool)
    pad[1, -2:] = True
    with AttentionReader(mha) as r:
        _, w = mha(
            x, x, x, attn_mask=causal, key_padding_mask=pad, need_weights=True, average_attn_weights=False
        )
    ((_, got),) = r.calls
    assert torch.allclose(got, entropy_of(w.detach().double()), atol=1e-5)


def test_gpt2_sdpa_entropy_equals_the_eager_attention_weights():
    """Hugging Face GPT-2 with sdpa attention (read by the reader) against the same weights run
    with eager attention returning its weights (output_attentions)."""
    transformers = pytest.importorskip("transformers")
    cfg = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    a = transformers.GPT2Model(transformers.GPT2Config(**cfg, attn_implementation="sdpa")).eval()
    b = transformers.GPT2Model(transformers.GPT2Config(**cfg, attn_implementation="eager")).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        for blk in (a.h[0], b.h[0]):
            blk.attn.c_attn.weight.mul_(20.0)  # away from uniform
    ids = torch.randint(0, 50, (3, 10))
    with AttentionReader(a) as r:
        a(ids)
    weights = b(ids, output_attentions=True).attentions
    assert [p[-1] for p, _ in r.calls] == ["h.0.attn", "h.1.attn"]  # the innermost call running it
    for (_, got), w in zip(r.calls, weights):
        assert torch.allclose(got, entropy_of(w.detach().double()), atol=1e-5)
    assert float(r.calls[0][1].mean()) < 0.95


# --------------------------------------------------------------------------------------------
# sites: one per layer of a repeated stack
# --------------------------------------------------------------------------------------------
class Encoder(nn.Module):
    """A user's model around nn.TransformerEncoder (pre-LN, GELU)."""

    def __init__(self, d: int = 32, layers: int = 3, norm_first: bool = True) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d, 4, 2 * d, dropout=0.1, activation="gelu", batch_first=True, norm_first=norm_first
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, d)

    def forward(self, x):
        return self.head(self.encoder(x))


def test_auto_sites_open_a_stack_of_layers_wherever_it_sits():
    assert auto_sites(Encoder()) == ["encoder.layers.0", "encoder.layers.1", "encoder.layers.2", "head"]
    got, _ = resolve_sites(Encoder(), "encoder.layers.*")
    assert got == ["encoder.layers.0", "encoder.layers.1", "encoder.layers.2"]
    # a ModuleList of leaves (no blocks) or of one block is no stack: opened only as a container
    plain = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    assert auto_sites(plain) == ["1", "2"]


def test_gpt2_reads_one_site_per_layer():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=50, n_positions=16)
    r = sigprop.probe_module(
        model=lambda: transformers.GPT2Model(cfg), input_shape=(8,), vocab=50, samples=4, device="cpu"
    )
    layers = r.runs[0].layers
    assert [l.name for l in layers] == ["wte", "drop", "h.0", "h.1", "h.2", "ln_f"]
    assert all(l.tokens is not None for l in layers)
    assert [l.tokens.entropy is not None for l in layers] == [False, False, True, True, True, False]


def test_the_probes_token_cosine_equals_plain_hooks_on_the_same_model():
    """The probe's token cosine at every layer against a T x T cosine matrix of the outputs a
    plain forward hook reads on the same model instance and inputs (dropout off: p = 0 here, the
    attention's too, so the instance runs in training mode as the probe runs it)."""
    torch.manual_seed(0)
    model = Encoder(layers=3)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(m, nn.MultiheadAttention):  # its own dropout, a float, not a module
            m.dropout = 0.0
    x = torch.randn(6, 10, 32)
    r = sigprop.probe_module(model=model, inputs=x, samples=6, device="cpu")
    seen = {}
    hooks = [
        model.get_submodule(n).register_forward_hook(lambda mod, a, out, n=n: seen.__setitem__(n, out))
        for n in ("encoder.layers.0", "encoder.layers.1", "encoder.layers.2", "head")
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    for layer in r.runs[0].layers:
        want = cosine_matrix_mean(seen[layer.name])
        assert layer.tokens.mean == pytest.approx(float(want.mean()), abs=1e-5)
        assert layer.tokens.std == pytest.approx(float(want.std(unbiased=False)), abs=1e-5)
    entropies = [l.tokens.entropy for l in r.runs[0].layers]
    assert all(0.5 < e <= 1.0 for e in entropies[:3]) and entropies[3] is None


def test_max_token_cosine_gates_and_is_refused_without_sequences(tmp_path, capsys):
    nets = tmp_path / "nets.py"
    nets.write_text(
        "import torch.nn as nn\n"
        "def net():\n"
        "    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))\n"
    )
    base = ["module", f"{nets}:net", "--input-shape", "5,8", "--samples", "8", "--format", "json"]
    assert main([*base, "--max-token-cosine", "0.99", "--check"]) == 0
    doc = json.loads(capsys.readouterr().out)
    run = doc["runs"][0]
    gate = [c for c in run["checks"] if c["verdict"] == "tokens"]
    last = run["layers"][-1]
    assert gate[0]["measured"] == pytest.approx(last["token_cosine"]["mean"])
    assert last["attention_entropy"] is None
    # a bound below the measured cosine fails the check (exit 1), whatever the other verdicts
    low = last["token_cosine"]["mean"] - 0.01
    assert main([*base, "--max-token-cosine", str(low), "--check"]) == 1
    capsys.readouterr()
    assert main(["module", f"{nets}:net", "--input-shape", "8", "--max-token-cosine", "0.5"]) == 2
    assert "--max-token-cosine: token cosines are measured on sequences" in capsys.readouterr().err
    with pytest.raises(SigpropError, match="a cosine bound must be a number"):
        sigprop.probe_module(model=Encoder, input_shape=(4, 32), max_token_cosine=1.5)


class _PaddedLM(nn.Module):
    """Token ids -> an embedding with a padding row (zero at init, as nn.Embedding and Hugging
    Face's decoders make it) -> a linear layer; returns the embeddings' output too."""

    def __init__(self, vocab: int = 12, d: int = 16, pad: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=pad)
        self.out = nn.Linear(d, d)

    def forward(self, ids):
        return self.out(self.embed(ids))


def test_random_ids_leave_out_the_padding_ids_and_are_uniform_over_the_rest():
    """``build.uniform_ids``: 60,000 ids over [0, 10) less 0, 3 and 9 -- none of those, each of
    the other 7 at 1/7 within 5 standard errors (sd of a share sqrt(p(1-p)/n) = 0.0014); no padding
    id: torch.randint's own draws, unchanged; every id a padding one: refused, naming --vocab."""
    from sigprop.model import build

    gen = torch.Generator().manual_seed(0)
    ids = build.uniform_ids(10, (60_000,), [0, 3, 9], gen, "cpu")
    counts = torch.bincount(ids, minlength=10).double() / ids.numel()
    assert counts[[0, 3, 9]].sum() == 0
    rest = counts[[1, 2, 4, 5, 6, 7, 8]]
    assert (rest - 1 / 7).abs().max() < 5 * math.sqrt((1 / 7) * (6 / 7) / 60_000)
    a = build.uniform_ids(10, (50,), [], torch.Generator().manual_seed(1), "cpu")
    assert torch.equal(a, torch.randint(10, (50,), generator=torch.Generator().manual_seed(1)))
    assert build.padding_ids(_PaddedLM(pad=3), 12) == [3] and build.padding_ids(_PaddedLM(pad=3), 3) == []
    with pytest.raises(SigpropError, match="--vocab 1") as e:
        build.uniform_ids(1, (4,), [0], gen, "cpu")
    assert e.value.field == "vocab"


def test_the_probe_never_feeds_the_padding_token_and_maps_the_rows_it_reads():
    """A probe of ``--vocab 12`` on an embedding with padding row 3: the ids the model receives
    (a forward pre-hook) never hold 3 and hold every other id, the note says so, and the
    embedding's map takes the moments of the rows read: its q is the mean square of the table
    less row 3, computed here (exact arithmetic on the same weights: relative 1e-12)."""
    from sigprop.model import build
    from sigprop.model.ops.aten import embedding_node

    seen = []

    def make():
        m = _PaddedLM()
        m.register_forward_pre_hook(lambda mod, args: seen.append(args[0].clone()))
        return m

    r = sigprop.probe_module(model=make, input_shape=(8,), vocab=12, samples=64, device="cpu")
    ids = torch.cat([s.reshape(-1) for s in seen])
    assert (ids != 3).all() and set(ids.tolist()) == set(range(12)) - {3}
    assert any("padding id(s) 3" in n for n in r.config["init_notes"])
    table = build.build(make, 0, 0).embed.weight.detach().double()
    rows = torch.cat((table[:3], table[4:]))
    assert embedding_node(table, "embed", (), 3).forward == pytest.approx(
        float(rows.pow(2).mean()), rel=1e-12
    )
    assert embedding_node(table, "embed", (), 3).params == pytest.approx(
        float(rows.mean(0).pow(2).mean()), rel=1e-12
    )
    assert embedding_node(table, "embed", (), -1).forward == pytest.approx(
        float(table.pow(2).mean()), rel=1e-12
    )
