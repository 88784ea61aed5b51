"""The maps of the Llama family's ops (docs/theory.md §16, issue 50): a gated MLP's product of two
states, rotary position embeddings, grouped-query attention's keys and values broadcast over the
heads -- each against a measurement written here with plain autograd on the same weights,
averaged over draws -- and real decoders from small configs (Llama, Qwen2, Mistral, Gemma)
against sigprop's own measurement, layer by layer.

Tolerances: the quantities compared are means over draws of mean squares; each bound is the
map's residual measured at these sizes plus several standard errors of the draws' mean (stated
per test); 0.15.x had no map for any of these ops (the theory stopped at the first)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import sigprop
from sigprop.maps import graph
from sigprop.model.trace import trace_graph


def _fold(model, x):
    t = trace_graph(model, x[:2])
    pred = graph.predict_graph(t.nodes, float(x.pow(2).mean()), float(x.mean()))
    return pred, t.nodes


def _index(nodes, op):
    found = [i for i, nd in enumerate(nodes) if nd.op == op]
    assert found, [nd.op for nd in nodes]
    return found[0]


class Gated(nn.Module):
    """A gated MLP, act(x W1) * (x W3), then W2 (SwiGLU with silu, GeGLU with gelu), behind an
    RMSNorm as in every Llama-family block (``normed``), or reading its input as it is."""

    def __init__(self, d: int, f: int, act, normed: bool = True) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d) if normed else nn.Identity()
        self.w1, self.w3 = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.w2, self.act = nn.Linear(f, d, bias=False), act

    def gate(self, x):
        h = self.norm(x)
        return self.act(self.w1(h)) * self.w3(h)

    def forward(self, x):
        return self.w2(self.gate(x))


def _gated_ratios(act, normed: bool, draws: int = 200):
    """Per draw: measured over predicted -- the product's second moment, the output's, the
    input's gradient (d 64, f 128, 64 samples of mean 0.3)."""
    d, f, n = 64, 128, 64
    rows = []
    for seed in range(draws):
        torch.manual_seed(seed)
        m = Gated(d, f, act, normed).double()
        x = (torch.randn(n, d, dtype=torch.double) + 0.3).requires_grad_(True)
        gate = m.gate(x)
        y = m.w2(gate)
        g = torch.randn_like(y)
        (y * g).sum().backward()
        pred, nodes = _fold(m, x.detach())
        k = _index(nodes, "product")
        rows.append(
            (
                float(gate.detach().pow(2).mean()) / pred.q[k],
                float(y.detach().pow(2).mean()) / pred.q[-1],
                float(x.grad.pow(2).mean() / g.pow(2).mean()) / pred.r[0],
            )
        )
    return np.array(rows)


@pytest.mark.parametrize("act", [F.silu, F.gelu, F.relu], ids=["swiglu", "geglu", "reglu"])
def test_a_gated_mlps_product_follows_the_product_of_its_moments(act):
    """Behind an RMSNorm, 200 draws: the product's second moment (E[act(a)^2] E[b^2], a and b
    from independent weights reading one normed token), the output's and the input gradient's
    against autograd.  Measured residuals within 1% (silu, gelu, relu); standard error of the
    200-draw mean about 0.5%; bound 3%."""
    ratios = _gated_ratios(act, normed=True)
    for name, col in zip(("product", "output", "input gradient"), ratios.T):
        assert col.mean() == pytest.approx(1.0, abs=0.03), (name, col.mean(), col.std() / math.sqrt(len(col)))


def test_a_gated_product_of_an_unnormed_input_is_high_by_its_norms_spread():
    """Reading its input as it is, the product is high by the spread of a sample's mean square
    V = |x|^2/d: act(a)^2 and b^2 both grow with V, so E[act(a)^2 b^2] = q_a q_b (1 + e kappa),
    kappa = Var(V)/E[V]^2 = (4 m^2 + 2)/(d (1 + m^2)^2) = 3.1% here and e >= 1 the elasticity of
    E[act(a)^2] in the variance (1 for relu) -- an O(1/d) term the infinite-width map leaves out
    (docs/theory.md §16).  Measured: relu +3.2%, silu +4.0% (standard error 0.4%)."""
    m, d = 0.3, 64
    kappa = (4 * m * m + 2) / (d * (1 + m * m) ** 2)
    for act, most in ((F.relu, 1.0), (F.silu, 1.6)):
        product = _gated_ratios(act, normed=False, draws=100)[:, 0].mean() - 1.0
        assert 0.6 * kappa < product < most * kappa + 0.012, (act.__name__, product, kappa)


def rotate_half(x):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """q = x Wq in H heads of hd, rotated by position as Llama's (base 10000), then Wo."""

    def __init__(self, d: int, heads: int, T: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.wq, self.wo = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2, dtype=torch.double) / self.hd))
        angles = torch.outer(torch.arange(T, dtype=torch.double), inv)
        emb = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def rotated(self, x):
        n, T, d = x.shape
        q = self.wq(x).view(n, T, self.heads, self.hd).transpose(1, 2)
        return q * self.cos + rotate_half(q) * self.sin

    def forward(self, x):
        n, T, d = x.shape
        return self.wo(self.rotated(x).transpose(1, 2).reshape(n, T, d))


def _tokens_moment(h):
    """mean over t != s of h_t . h_s per unit: h is [n, H, T, hd]."""
    T = h.shape[-2]
    total = h.sum(-2)
    return float((total.pow(2).sum(-1) - h.pow(2).sum((-2, -1))).mean() / (T * (T - 1) * h.shape[-1]))


def test_a_rotary_embedding_keeps_the_norm_and_turns_the_tokens_apart():
    """d 64 in 4 heads, T 16, tokens sharing rho = 0.6 of their energy: the rotation keeps the
    second moment exactly and scales the tokens' shared moment by the mean of cos((t - s)
    theta_i) (0.69 here); the gradient's second moment is kept.  200 draws: measured within
    0.5% (second moment), 2% (shared moment), 1% (input gradient); standard errors 0.3%, 1%,
    0.3%; bounds 2%, 4%, 3%."""
    d, heads, T, n, rho = 64, 4, 16, 32, 0.6
    rows = []
    for seed in range(200):
        torch.manual_seed(seed)
        m = Rotary(d, heads, T).double()
        z = torch.randn(n, 1, d, dtype=torch.double)
        x = (
            math.sqrt(rho) * z + math.sqrt(1 - rho) * torch.randn(n, T, d, dtype=torch.double)
        ).requires_grad_(True)
        h = m.rotated(x)
        y = m.wo(h.transpose(1, 2).reshape(n, T, d))
        g = torch.randn_like(y)
        (y * g).sum().backward()
        t = trace_graph(m, x.detach()[:2])
        k = _index(t.nodes, "rotary")
        pred = graph.predict_graph(t.nodes, float(x.detach().pow(2).mean()), 0.0, rho)
        rows.append(
            (
                float(h.pow(2).mean()) / pred.q[k],
                _tokens_moment(h.detach()) / pred.tokens[k],
                float(x.grad.pow(2).mean() / g.pow(2).mean()) / pred.r[0],
            )
        )
    ratios = np.array(rows)
    for name, col, bound in zip(("q", "tokens", "input gradient"), ratios.T, (0.02, 0.04, 0.03)):
        assert col.mean() == pytest.approx(1.0, abs=bound), (
            name,
            col.mean(),
            col.std() / math.sqrt(len(col)),
        )
    # the rotation's attenuation of the shared moment is real: without it the map would be off by
    attenuation = pred.tokens[k] / (rho * pred.q[k])
    assert attenuation < 0.75, attenuation


class Grouped(nn.Module):
    """Grouped-query attention: H query heads, G key/value heads each serving H/G of them
    (Llama's repeat_kv: expand, then reshape), causal SDPA, then Wo."""

    def __init__(self, d: int, heads: int, groups: int, causal: bool = True) -> None:
        super().__init__()
        self.h, self.g, self.hd, self.causal = heads, groups, d // heads, causal
        self.wq = nn.Linear(d, d, bias=False)
        self.wk, self.wv = (nn.Linear(d, groups * self.hd, bias=False) for _ in range(2))
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x):
        n, T, d = x.shape
        q = self.wq(x).view(n, T, self.h, self.hd).transpose(1, 2)
        k, v = (w(x).view(n, T, self.g, self.hd).transpose(1, 2) for w in (self.wk, self.wv))
        rep = self.h // self.g
        k = k[:, :, None].expand(n, self.g, rep, T, self.hd).reshape(n, self.h, T, self.hd)
        v = v[:, :, None].expand(n, self.g, rep, T, self.hd).reshape(n, self.h, T, self.hd)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.wo(o.transpose(1, 2).reshape(n, T, d))


def test_grouped_query_attention_sums_each_key_and_values_copies_gradients():
    """d 64, 8 query heads on 2 key/value heads (4 copies each), T 16, 100 draws: the gradient at
    the key and value projections' outputs -- each element read by 4 heads, their gradients
    summed -- and at the input, against autograd.  0.15.x read ``expand`` as an identity (the
    value projection's gradient 4x low) and weighed a key's queries by P-bar, not K
    (``theory.key_weight``: the keys' gradient 1.93x high under the causal mask).  Measured
    within 1% (values), 4% (keys), 1% (input); standard errors about 1%; bounds 5%, 8%, 4%."""
    d, heads, groups, T, n = 64, 8, 2, 16, 16
    rows = []
    for seed in range(100):
        torch.manual_seed(seed)
        m = Grouped(d, heads, groups).double()
        x = torch.randn(n, T, d, dtype=torch.double, requires_grad=True)
        kv = {}
        hooks = [
            getattr(m, name).register_forward_hook(
                lambda mod, a, out, name=name: kv.update({name: out}) or out.retain_grad()
            )
            for name in ("wk", "wv")
        ]
        y = m(x)
        for hk in hooks:
            hk.remove()
        g = torch.randn_like(y)
        (y * g).sum().backward()
        t = trace_graph(m, x.detach()[:2])
        pred = graph.predict_graph(t.nodes, float(x.detach().pow(2).mean()), 0.0)
        dense = [i for i, nd in enumerate(t.nodes) if nd.op == "dense"]  # wq, wk, wv, wo in order
        r0 = float(g.pow(2).mean())
        rows.append(
            (
                float(kv["wv"].grad.pow(2).mean()) / r0 / pred.r[dense[2]],
                float(kv["wk"].grad.pow(2).mean()) / r0 / pred.r[dense[1]],
                float(x.grad.pow(2).mean()) / r0 / pred.r[0],
            )
        )
    assert [nd.op for nd in t.nodes].count("broadcast") == 2
    ratios = np.array(rows)
    for name, col, bound in zip(("values", "keys", "input"), ratios.T, (0.05, 0.08, 0.04)):
        assert col.mean() == pytest.approx(1.0, abs=bound), (
            name,
            col.mean(),
            col.std() / math.sqrt(len(col)),
        )


class Sine(nn.Module):
    def forward(self, x):
        return torch.sin(x)


class Unmapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), Sine())

    def forward(self, x):
        return self.block(self.inner(x))


def test_where_the_maps_stop_the_note_names_the_module_and_the_op():
    """The first op without a map is named with the module it runs in and its op (0.15.x: its op
    only -- "a product of two states" -- with no place)."""
    r = sigprop.probe_module(model=Unmapped, input_shape=(8,), samples=4, device="cpu")
    notes = [n for n in r.config["theory_notes"] if n.startswith("no moment map")]
    assert notes == ["no moment map for sin (block.1: torch.sin): measured only from there on"], notes


transformers = pytest.importorskip("transformers")

FAMILY = {
    "llama": ("LlamaConfig", "LlamaModel", {}),
    "qwen2": ("Qwen2Config", "Qwen2Model", {}),
    "mistral": ("MistralConfig", "MistralModel", {}),
    "qwen3": ("Qwen3Config", "Qwen3Model", {"head_dim": 16}),  # QK-norm
    # GeGLU, sqrt(d) scale, (1 + w) norms, and its config's padding token 0 (a zero row the
    # random ids leave out; 0.16.0.dev0 fed it: the embeddings' backward 83% low, "≠")
    "gemma": ("GemmaConfig", "GemmaModel", {"head_dim": 16}),
}


def _decoder(name: str, layers: int = 4):
    cfg_name, model_name, extra = FAMILY[name]
    cfg = getattr(transformers, cfg_name)(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **extra,
    )
    return lambda: getattr(transformers, model_name)(cfg)


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_llama_family_decoders_follow_the_maps_layer_by_layer(name):
    """4 layers, d 64, 4 query heads on 2 key/value heads, rotary positions, SwiGLU, RMSNorm, token
    ids, T 16, 32 samples x 4 draws: every layer site within the issue's bounds -- 6% forward,
    10% backward, 0.05 token cosine -- and the theory verdict "="; 0.15.x stopped at the first
    rotary product.  Measured over 4 draws, with the causal mask's position profile in the maps
    (docs/theory.md §16): forward within 2.1%, backward within 5.1%, cosine within 0.031 (before
    it, over 8 draws: 5.2%, 7.9%, 0.044); Qwen3 (QK-norm: logits of variance about 1) backward
    within 2.3% (6% before)."""
    r = sigprop.probe_module(
        model=_decoder(name), input_shape=(16,), vocab=200, samples=32, seeds=4, device="cpu"
    )
    notes = r.config["theory_notes"]
    assert not [n for n in notes if n.startswith("no moment map")], notes
    run = r.runs[0]
    layers = [l for l in run.layers if l.name.startswith("layers.")]
    assert len(layers) == 4
    for l in layers:
        assert l.forward.predicted == pytest.approx(l.forward.rms, rel=0.06), l.name
        assert l.backward.predicted == pytest.approx(l.backward.rms, rel=0.10), l.name
        assert l.tokens.predicted == pytest.approx(l.tokens.mean, abs=0.05), l.name
    assert run.agrees_with_theory is True
    for l in layers:  # uniform attention at N(0, 0.02^2): H = 1, predicted so
        assert l.tokens.entropy_predicted == pytest.approx(l.tokens.entropy, abs=0.05), l.name


def test_the_papers_init_on_llama_follows_the_maps():
    """``--init proposed`` on the 4-layer Llama (roles from its graph, below): its q and k at the
    paper's scale give logits of variance about 1 (0.19.0: the grouped keys counted as read; 2
    before), far from uniform -- the softmax's moments by quadrature, a key's gradient by K
    (``theory.key_weight``).  Every site within 1.5% both ways
    and the entropy within 0.02 (measured over 4 draws: 1%, 0.018); bounds 6%, 10%, 0.05."""
    r = sigprop.probe_module(
        model=_decoder("llama"),
        input_shape=(16,),
        vocab=200,
        samples=32,
        seeds=4,
        device="cpu",
        inits="proposed",
    )
    run = r.runs[0]
    for l in run.layers:
        assert l.forward.predicted == pytest.approx(l.forward.rms, rel=0.06), l.name
        assert l.backward.predicted == pytest.approx(l.backward.rms, rel=0.10), l.name
        if l.tokens is not None and l.tokens.entropy is not None:
            assert l.tokens.entropy < 0.9 and l.tokens.entropy_predicted == pytest.approx(
                l.tokens.entropy, abs=0.05
            )
    assert run.agrees_with_theory is True


def test_qk_norm_attention_entropy_is_predicted():
    """Qwen3 normalises its queries and keys per head (QK-norm, an RMSNorm over d_h): the logits
    have variance about 1 at any weight scale and the weights are far from uniform (H 0.83-0.89):
    the predicted entropy -- E[H]/ln n of softmax weights of Gaussian logits of the traced
    variance, over the causal mask's queries -- within 0.05 of the measured one at every layer
    (measured over 8 draws: within 0.023), and the forward within 6% (its backward: the family
    test above)."""
    r = sigprop.probe_module(
        model=_decoder("qwen3"),
        input_shape=(16,),
        vocab=200,
        samples=32,
        seeds=4,
        device="cpu",
    )
    layers = [l for l in r.runs[0].layers if l.name.startswith("layers.")]
    assert all(l.tokens.entropy < 0.95 for l in layers)  # not uniform: the prediction is a test
    for l in layers:
        assert l.tokens.entropy_predicted == pytest.approx(l.tokens.entropy, abs=0.05), l.name
        assert l.forward.predicted == pytest.approx(l.forward.rms, rel=0.06), l.name
    # the figure's entropy panel draws the prediction dashed beside the measured line (0.16.0.dev0
    # drew the measured one only)
    from sigprop.plot import build_probe_figure

    fig = build_probe_figure(r)
    (ax,) = [a for a in fig.axes if a.get_title().startswith("attention: entropy")]
    (dashed,) = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    want = [l.tokens.entropy_predicted for l in r.runs[0].layers if l.tokens and l.tokens.entropy is not None]
    assert list(dashed.get_ydata()) == pytest.approx(want, abs=1e-12)


class SmallIntoNorm(nn.Module):
    """An RMSNorm reading a state whose mean square is near its eps (OLMo-2's norms after each
    branch read the branch's output, q ~ 6e-8 beside eps 1e-5 at its init), then a weight layer."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.norm, self.out = nn.RMSNorm(d, eps=eps), nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.out(self.norm(x))


@pytest.mark.parametrize("ratio", [0.1, 1.0, 10.0])
def test_an_rmsnorms_eps_is_in_its_map(ratio):
    """Mean square q = ratio x eps at the norm's input: q' = q/(q + eps) forward and the gradient
    divided by q + eps, the component along x removed in part (c (2 - c), c = q/(q + eps)).  0.15
    left eps out: q' = 1 whatever q (OLMo-2's first layer: 70.9 predicted for 4.14 measured).
    d 64, 100 draws: measured -0.2/-0.7/-0.3% forward and -0.3/-0.3/-0.4% backward at ratio
    0.1/1/10 (standard errors 0.01% and 0.2%; the forward's residual largest where the norm is
    least linear); bounds 3% and 5%."""
    d, n, eps = 64, 64, 1e-3
    rows = []
    for seed in range(100):
        torch.manual_seed(seed)
        m = SmallIntoNorm(d, eps).double()
        x = (torch.randn(n, d, dtype=torch.double) * math.sqrt(ratio * eps)).requires_grad_(True)
        h = m.norm(x)
        y = m.out(h)
        g = torch.randn_like(y)
        (y * g).sum().backward()
        pred, nodes = _fold(m, x.detach())
        k = _index(nodes, "rmsnorm")
        rows.append(
            (
                float(h.detach().pow(2).mean()) / pred.q[k],
                float(x.grad.pow(2).mean() / g.pow(2).mean()) / pred.r[0],
            )
        )
    ratios = np.array(rows)
    for name, col, bound in zip(("forward", "backward"), ratios.T, (0.03, 0.05)):
        assert col.mean() == pytest.approx(1.0, abs=bound), (
            name,
            col.mean(),
            col.std() / math.sqrt(len(col)),
        )


def test_the_papers_init_reads_a_llama_blocks_roles_from_its_graph():
    """``init_(..., "proposed")`` on a 4-layer Llama: q, k, v and the MLP's up projection are
    linear layers (a row's squared norm fan_in/fan_out; k and v, read by 2 query heads each,
    fan_in/(2 fan_out): 0.19.0), the gate is read by its activation (2
    fan_in/fan_out), and each of the 2L = 8 residual branches' last layers -- o_proj, down_proj
    -- takes 1/8 (Arpit et al. 2019, section 4).  0.15 counted each rotary sum (x cos +
    rotate_half(x) sin) as a residual join that opens a stage: B = 3, a row's squared norm 1/3."""
    model = _decoder("llama")()
    records = {r.name: r for r in sigprop.init_(model, "proposed", input_shape=(16,), vocab=200, quiet=True)}
    want = {
        "self_attn.q_proj": ("linear", 1, 64 / 64),
        "self_attn.k_proj": ("linear", 1, 64 / 32 / 2),
        "self_attn.v_proj": ("linear", 1, 64 / 32 / 2),
        "self_attn.o_proj": ("block_last", 8, 64 / 64 / 8),
        "mlp.gate_proj": ("relu", 1, 2 * 64 / 128),
        "mlp.up_proj": ("linear", 1, 64 / 128),
        "mlp.down_proj": ("block_last", 8, 128 / 64 / 8),
    }
    for layer in range(4):
        for name, (role, blocks, row_sq) in want.items():
            path = f"layers.{layer}.{name}"
            r = records[path]
            assert (r.role, r.blocks_in_stage) == (role, blocks), path
            w = model.get_submodule(path).weight.detach().double()
            assert float(w.pow(2).sum(1).mean()) == pytest.approx(row_sq, rel=1e-6), path


def test_gpt_neox_init_on_llama_draws_its_published_scales_and_follows_the_maps():
    """``--init neox`` (Black et al. 2022, section 2.3.1): every weight N(0, 2/(5 d)) (Nguyen &
    Salazar 2019's small init; d = 64 the model's width), each branch's last layer N(0, 4/(L^2
    d)) (Wang's, L = 4 layers = B/2), the embedding rows N(0, 2/(5 d) I): a row's squared norm
    fan_in x std^2 (each within 5 sd of its draw's spread).  The probe of the drawn model then
    follows the maps at every layer site within the issue's 6% forward, 10% backward and 0.05
    token cosine (measured over 4 draws: 0.7%, 6.6%, 0.010; before the causal mask's position
    profile was in the maps, docs/theory.md §16, the cosine read 0.03-0.05 low at every layer)."""
    model = _decoder("llama")()
    records = {r.name: r for r in sigprop.init_(model, "neox", input_shape=(16,), vocab=200, quiet=True)}
    small, wang = 2.0 / (5 * 64), (2.0 / (4 * 8.0)) ** 2
    want = {
        "self_attn.q_proj": 64 * small,
        "self_attn.k_proj": 64 * small,
        "self_attn.v_proj": 64 * small,
        "self_attn.o_proj": 64 * wang,
        "mlp.gate_proj": 64 * small,
        "mlp.up_proj": 64 * small,
        "mlp.down_proj": 128 * wang,
    }
    for layer in range(4):
        for name, row_sq in want.items():
            # Gaussian entries: the mean square of W's n entries has relative sd (2/n)^0.5; 5 sd
            w = model.get_submodule(f"layers.{layer}.{name}").weight.detach().double()
            sd = (2.0 / w.numel()) ** 0.5
            assert float(w.pow(2).sum(1).mean()) == pytest.approx(row_sq, rel=5 * sd), name
    emb = model.embed_tokens.weight.detach().double()
    assert float(emb.pow(2).mean()) == pytest.approx(small, rel=5 * (2 / emb.numel()) ** 0.5)
    assert records["embed_tokens"].note == f"rows N(0, {small**0.5:.4g}^2 I)"
    r = sigprop.probe_module(
        model=_decoder("llama"), input_shape=(16,), vocab=200, samples=32, seeds=4, device="cpu", inits="neox"
    )
    for l in [l for l in r.runs[0].layers if l.name.startswith("layers.")]:
        assert l.forward.predicted == pytest.approx(l.forward.rms, rel=0.06), l.name
        assert l.backward.predicted == pytest.approx(l.backward.rms, rel=0.10), l.name
        assert l.tokens.predicted == pytest.approx(l.tokens.mean, abs=0.05), l.name


class Eager(nn.Module):
    """Attention written out, as Hugging Face's eager attention: softmax(q k^T / sqrt(d_h), soft-
    capped to c tanh(z / c) where ``cap`` is given, plus a causal mask) v, then Wo; weights drawn
    at ``gain`` x the default scale, so that the logits are far from uniform."""

    def __init__(self, d: int, heads: int, T: int, cap: float | None, gain: float) -> None:
        super().__init__()
        self.h, self.hd, self.cap = heads, d // heads, cap
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        with torch.no_grad():
            for w in (self.wq, self.wk):
                w.weight.normal_(0.0, gain / math.sqrt(d))
        mask = torch.full((T, T), float("-inf")).triu(1)
        self.register_buffer("mask", mask)

    def forward(self, x):
        n, T, d = x.shape
        q, k, v = (w(x).view(n, T, self.h, self.hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        z = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(self.hd))
        if self.cap is not None:
            z = torch.tanh(z / self.cap) * self.cap
        w = torch.softmax(z + self.mask, dim=-1)
        return self.wo(torch.matmul(w, v).transpose(1, 2).reshape(n, T, d))


@pytest.mark.parametrize("cap", [None, 1.0], ids=["uncapped", "capped"])
def test_attention_written_out_follows_the_attention_maps(cap):
    """The pattern read as one attention (0.15: the theory stopped at its first matmul): d 64 in 4
    heads, T 16, causal, q and k drawn at 1.1x (logits of variance 1.46), 60 draws; with a cap of
    1 the logits' variance falls to 0.46 (E[tanh^2], ``theory.capped``) and a logit's gradient
    passes E[sech^4] = 0.40 of itself.  Measured: the output +2.1% and -0.6%, the input gradient
    +0.5% and -5.7% (uncapped, capped; standard errors 0.6%); bounds 5% and 8%.  Before K took
    the cube of the weights (``theory.key_weight`` by its Monte Carlo, not c (1 - c) at c = P):
    the uncapped input gradient -19%."""
    d, heads, T, n = 64, 4, 16, 16
    rows = []
    for seed in range(60):
        torch.manual_seed(seed)
        m = Eager(d, heads, T, cap, 1.1).double()
        x = torch.randn(n, T, d, dtype=torch.double, requires_grad=True)
        y = m(x)
        g = torch.randn_like(y)
        (y * g).sum().backward()
        pred, nodes = _fold(m, x.detach())
        assert any(nd.op == "sdpa" for nd in nodes), [nd.op for nd in nodes]
        rows.append(
            (
                float(y.detach().pow(2).mean()) / pred.q[-1],
                float(x.grad.pow(2).mean() / g.pow(2).mean()) / pred.r[0],
            )
        )
    ratios = np.array(rows)
    for name, col, bound in zip(("output", "input gradient"), ratios.T, (0.05, 0.08)):
        assert col.mean() == pytest.approx(1.0, abs=bound), (
            name,
            col.mean(),
            col.std() / math.sqrt(len(col)),
        )


def test_a_soft_caps_moments_equal_a_monte_carlo():
    from sigprop import theory

    z = np.random.default_rng(0).standard_normal(400_000)
    for s2, c in ((0.5, 1.0), (2.0, 1.0), (4.0, 3.0)):
        th = np.tanh(math.sqrt(s2) * z / c)
        var, slope = theory.capped(s2, c)
        assert var == pytest.approx(float(((c * th) ** 2).mean()), rel=0.01)
        assert slope == pytest.approx(float(((1 - th * th) ** 2).mean()), rel=0.01)
    assert theory.capped(0.7, None) == (0.7, 1.0)


class CausalIntoNorm(nn.Module):
    """Causal attention at uniform weights (queries 0), its output into an RMSNorm: query t
    averages t + 1 values, so a token's mean square falls as 1/(t + 1) along the sequence."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.v, self.o = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.norm = nn.RMSNorm(d, eps=eps)

    def forward(self, x):
        B, T, d = x.shape
        v = self.v(x).reshape(B, T, 4, d // 4).transpose(1, 2)
        a = F.scaled_dot_product_attention(0.0 * v, v, v, is_causal=True)
        return self.norm(self.o(a.transpose(1, 2).reshape(B, T, d)))


def test_an_rmsnorms_eps_reads_each_positions_mean_square():
    """Where eps is of the order of the tokens' mean squares and those differ by position (a
    causal attention's early tokens hold more of their own values: m_t ~ q_v/(t + 1)), the norm's
    output moment is the mean over positions of m_t/(m_t + eps), not q/(q + eps) of their mean
    (OLMo-2's post-branch norms at init: the embeddings' gradient 37% high for want of it, docs/
    theory.md §16).  d 64, T 16, eps = the mean square at the norm, 20 draws: the fold's q at the
    norm equals a check written with the measured m_t per position and no maps (within 0.5%);
    both are 2% above the measured output moment -- a token's mean square also varies from sample
    to sample at one position (its units correlated through W_v and W_o: a chi-square of fewer
    than d degrees), and m/(m + eps) is concave -- within 3%; the uniform reading of 0.18 was 23%
    high."""
    d, T, n = 64, 16, 64
    rows = []
    for seed in range(20):
        torch.manual_seed(seed)
        m = CausalIntoNorm(d, 1.0).double()
        x = torch.randn(n, T, d, dtype=torch.double)
        seen = []
        m.norm.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
        with torch.no_grad():
            m(x)
            pre = seen.pop()
            eps = m.norm.eps = float(pre.pow(2).mean())
            h = m(x)
        mt = pre.pow(2).mean(-1).mean(0)  # m_t: each position's mean square
        pred, nodes = _fold(m, x)
        k = _index(nodes, "rmsnorm")
        measured = float(h.pow(2).mean())
        rows.append((pred.q[k] / measured, float((mt / (mt + eps)).mean()) / measured))
    fold, by_hand = np.array(rows).mean(axis=0)
    assert fold == pytest.approx(by_hand, rel=0.005)
    assert fold == pytest.approx(1.0, abs=0.03)


def test_olmo2_at_its_own_init_follows_the_maps():
    """OLMo-2 (norms after each branch, QK-norm) at its own init, d 128, 4 layers, its config's
    eps 1e-5: the branches' outputs at init hold mean squares of 1e-7 to 1e-4 that differ by
    position along the causal sequence, beside eps -- each position's m_t/(m_t + eps) above.
    0.19.0.dev0 read the embeddings' gradient 37% high (issue 67's 38%, every mark "=" in a band
    of [-38%, +62%]); measured now over 2 draws of 64 samples: the embeddings -7.4%, every site
    from layer 1 on within 2.3%.  Layer 0's backward reads -14% and is not asserted here: the
    term left open (a token's mean square varies across samples 2-25x more than the chi-square
    the maps assume -- measured 0.03-0.4 relative variance against 0.016 --, and E[1/(m + eps)]
    is convex; docs/theory.md §16, "Left open")."""
    cfg = transformers.Olmo2Config(
        vocab_size=1000,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
        pad_token_id=None,
    )
    r = sigprop.probe_module(
        model=lambda: transformers.Olmo2Model(cfg),
        input_shape=(32,),
        vocab=1000,
        samples=64,
        seeds=2,
        device="cpu",
    )
    layers = {l.name: l for l in r.runs[0].layers}
    emb = layers.pop("embed_tokens")
    assert emb.backward.predicted == pytest.approx(emb.backward.rms, rel=0.10)
    layers.pop("layers.0")
    for l in layers.values():
        assert l.forward.predicted == pytest.approx(l.forward.rms, rel=0.06), l.name
        assert l.backward.predicted == pytest.approx(l.backward.rms, rel=0.10), l.name


def test_a_causal_attentions_query_and_key_gradients_follow_their_positions():
    """Query t's gradient is the output gradient at t times K_t (``theory.key_weights``: 0 for
    the first query, which reads one key), key s's the sum over the queries t >= s of R_tt
    K_t/(t + 1) (``gram._query_key_share``); 0.18 gave both the output gradient's shape.  Against
    autograd on one causal attention (T 32, 4 heads of 32, logits of variance 1, an output gradient
    falling 3x along the sequence, 1024 samples): the shape per position within 15%, measured
    2.5% (queries) and 4.9% (keys); the output gradient's shape is off by 0.55-1.65x; the last
    keys, read by one or two queries, are the noisiest (256 samples put the last at 0.82)."""
    from sigprop.maps.gram import _query_key_share

    torch.manual_seed(0)
    N, T, H, dh = 1024, 32, 4, 32
    q, k = (torch.randn(N, H, T, dh).requires_grad_(True) for _ in range(2))
    v = torch.randn(N, H, T, dh, requires_grad=True)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.randn_like(o) * torch.linspace(3, 1, T).view(1, 1, T, 1)
    (o * g).sum().backward()
    gt = g.transpose(1, 2).reshape(N, T, H * dh)
    R = (gt.unsqueeze(2) * gt.unsqueeze(1)).mean((0, 3)).numpy()  # the output gradient's Gram
    for pos, x in ((0, q), (1, k)):
        C, _ = _query_key_share(R, 1.0, pos)
        measured = x.grad.pow(2).mean((0, 1, 3)).numpy()
        shape = (measured / measured.mean())[1:] / (np.diag(C) / np.diag(C).mean())[1:]
        assert np.all(np.abs(shape - 1) < 0.15), (pos, shape.round(2))
        old = (measured / measured.mean())[1:] / (np.diag(R) / np.diag(R).mean())[1:]
        assert np.abs(old - 1).max() > 0.3
