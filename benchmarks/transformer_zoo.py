"""Known-good and known-bad transformers at their own inits, for the preservation verdict
(issue 67, item 1; docs/reliability.md §7): factories ``name(layers=..., d=...)`` taking token ids
below ``VOCAB`` (a ViT: images 3 x 16 x 16).  Small widths, so that sixteen draws of each run in
minutes on a CPU; the layer counts are those that make the bad ones bad.

Good: GPT-2 (Hugging Face, its own init), a nanoGPT-style decoder (N(0, 0.02^2), the branches'
last layers 0.02/sqrt(2L)), Llama, Qwen2 and Mistral configs (Hugging Face, grouped-query), BERT
(post-LN at its own 0.02 init), a ViT (its images, a final norm), a pre-LN encoder
(``nn.TransformerEncoder``, norm_first, PyTorch's default init).

Bad: residual blocks with no normalisation and He branches (the stream doubles its variance a
block), no normalisation with branches at a constant scale 1/2 (not scaled with depth), attention
without skips (each layer only mixes the tokens: rank collapse), a post-LN stack of PyTorch's
default init deep enough that each norm halves the first layer's gradient's variance a layer.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

VOCAB = 256
T = 16


class Hidden(nn.Module):
    """A Hugging Face base model returning its last hidden state (its cache as it comes)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        out = self.m(x) if not isinstance(x, torch.Tensor) or x.is_floating_point() else self.m(input_ids=x)
        return out.last_hidden_state


def _hf():
    import transformers  # the models extra; only the Hugging Face factories need it

    return transformers


def gpt2(layers: int = 12, d: int = 64):
    t = _hf()
    cfg = t.GPT2Config(n_layer=layers, n_embd=d, n_head=4, vocab_size=VOCAB, n_positions=T, bos_token_id=0,
                       eos_token_id=0)  # fmt: skip
    return Hidden(t.GPT2Model(cfg))


def llama(layers: int = 8, d: int = 64, family: str = "Llama"):
    t = _hf()
    cfg = getattr(t, f"{family}Config")(
        num_hidden_layers=layers, hidden_size=d, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=2 * d, vocab_size=VOCAB, max_position_embeddings=T, pad_token_id=0,
    )  # fmt: skip
    return Hidden(getattr(t, f"{family}Model")(cfg))


def qwen2(layers: int = 8, d: int = 64):
    return llama(layers, d, "Qwen2")


def mistral(layers: int = 8, d: int = 64):
    return llama(layers, d, "Mistral")


def bert(layers: int = 12, d: int = 64):
    t = _hf()
    cfg = t.BertConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=4,
                       intermediate_size=4 * d, vocab_size=VOCAB, max_position_embeddings=T,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    return Hidden(t.BertModel(cfg, add_pooling_layer=False))


def vit(layers: int = 8, d: int = 64):
    t = _hf()
    cfg = t.ViTConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=4, intermediate_size=4 * d,
                      image_size=16, patch_size=4, num_channels=3)  # fmt: skip
    return Hidden(t.ViTModel(cfg, add_pooling_layer=False))


class Tokens(nn.Module):
    """Token ids through an embedding (and learned positions) into ``layers`` blocks, then a final
    norm where ``final_norm``."""

    def __init__(self, blocks: list[nn.Module], d: int, final_norm: bool = True, std: float = 1.0):
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(T, d)  # nanoGPT's wte and wpe
        nn.init.normal_(self.emb.weight, std=std)
        nn.init.normal_(self.pos.weight, std=std)
        self.layers = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(d) if final_norm else nn.Identity()

    def forward(self, ids):
        h = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.layers:
            h = block(h)
        return self.norm(h)


class NanoBlock(nn.Module):
    """nanoGPT's block: pre-LN causal attention (fused QKV, SDPA) and a GELU MLP."""

    def __init__(self, d: int, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, L, C = x.shape
        q, k, v = self.c_attn(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, L, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, L, C))
        return x + self.proj(nn.functional.gelu(self.fc(self.ln2(x))))


def nanogpt(layers: int = 12, d: int = 64):
    """nanoGPT's init: every weight N(0, 0.02^2), the branches' last layers 0.02/sqrt(2L), biases 0."""
    model = Tokens([NanoBlock(d) for _ in range(layers)], d, std=0.02)
    for name, p in model.named_parameters():
        if name.endswith("weight") and p.dim() == 2:
            std = 0.02 / math.sqrt(2 * layers) if name.endswith(("c_proj.weight", "proj.weight")) else 0.02
            nn.init.normal_(p, std=std)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
    return model


def pre_ln_encoder(layers: int = 12, d: int = 64):
    layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
    return Tokens(list(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).layers), d)


class MLPBranch(nn.Module):
    """x + scale * W2 relu(W1 x), He-drawn (no normalisation anywhere)."""

    def __init__(self, d: int, scale: float = 1.0):
        super().__init__()
        self.fc, self.proj, self.scale = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), scale
        for lin in (self.fc, self.proj):
            nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        return x + self.scale * self.proj(torch.relu(self.fc(x)))


def no_norm_he(layers: int = 24, d: int = 64):
    """Residual blocks with no normalisation and He branches: the stream's variance doubles (and
    more) a block."""
    return Tokens([MLPBranch(d) for _ in range(layers)], d, final_norm=False)


def unscaled_branches(layers: int = 48, d: int = 64):
    """No normalisation, the branches at a constant 1/2, not 1/sqrt(L): (1 + c)^L."""
    return Tokens([MLPBranch(d, 0.5) for _ in range(layers)], d, final_norm=False)


class AttentionOnly(nn.Module):
    """LN(attention(x)) with no skip: each layer only mixes the tokens."""

    def __init__(self, d: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True, dropout=0.0)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(self.attn(x, x, x, need_weights=False)[0])


def no_skip_attention(layers: int = 24, d: int = 64):
    return Tokens([AttentionOnly(d) for _ in range(layers)], d)


def deep_post_ln(layers: int = 48, d: int = 64):
    layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=False)
    return Tokens(
        list(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).layers), d, final_norm=False
    )


GOOD = {
    "gpt2": gpt2,
    "nanogpt": nanogpt,
    "llama": llama,
    "qwen2": qwen2,
    "mistral": mistral,
    "bert": bert,
    "vit": vit,
    "pre-ln encoder": pre_ln_encoder,
}
BAD = {
    "no norm, He branches (24 blocks)": no_norm_he,
    "no norm, branches at 1/2 (48 blocks)": unscaled_branches,
    "attention without skips (24 layers)": no_skip_attention,
    "post-LN, PyTorch's init (48 layers)": deep_post_ln,
}


def inputs(name: str) -> dict:
    """The probe's input options for a zoo model: token ids of T, or images for the ViT."""
    return {"input_shape": (3, 16, 16)} if name == "vit" else {"input_shape": (T,), "vocab": VOCAB}
