"""The models docs/quickstart.md and docs/ci.md probe as ``examples/my_nets.py:NAME`` -- a user's
own file, as sigprop reads one (``sigprop module FILE.py:CALLABLE``); tests/docs/test_my_nets.py
runs each.  Every factory builds a fresh model, so that ``--seeds S`` draws S models."""

import torch.nn as nn
from torch.nn.utils.parametrizations import weight_norm


class Block(nn.Module):
    """h + W2 relu(W1 h): a residual block of two weight-normalized 3 x 3 convs."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = weight_norm(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv2 = weight_norm(nn.Conv2d(channels, channels, 3, padding=1))
        self.relu = nn.ReLU()

    def forward(self, h):
        return h + self.conv2(self.relu(self.conv1(h)))


def wn_resnet(blocks: int = 10, channels: int = 64) -> nn.Module:
    """A WN ResNet's residual stream on 3 x 32 x 32 images: a stride-2 weight-normalized stem
    to channels x 16 x 16, then ``blocks`` residual blocks (each a site of its own)."""
    stem = weight_norm(nn.Conv2d(3, channels, 3, stride=2, padding=1))
    return nn.Sequential(stem, *[Block(channels) for _ in range(blocks)])


def encoder(layers: int = 6, norm_first: bool = True, d: int = 128) -> nn.Module:
    """PyTorch's transformer encoder on float tokens [T, d] (``--input-shape 32,128``): d = 128, 4
    heads, FF 512, GELU, every layer re-drawn -- ``nn.TransformerEncoder`` deep-copies one layer,
    so its layers start equal (docs/quickstart.md: the copies change the numbers)."""
    layer = nn.TransformerEncoderLayer(
        d, 4, 4 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first
    )
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    for copy in model.layers:
        for m in copy.modules():  # MultiheadAttention names its own _reset_parameters
            reset = getattr(m, "reset_parameters", None) or getattr(m, "_reset_parameters", None)
            if m is not copy and reset is not None:
                reset()
    return model


def gpt2(layers: int = 12, d: int = 128, vocab: int = 1000):
    """A small GPT-2 (Hugging Face transformers, the [models] extra) on token ids below ``vocab``:
    ``sigprop module examples/my_nets.py:gpt2 --vocab 1000 --input-shape 32``."""
    from transformers import GPT2Config, GPT2Model  # the [models] extra: only this factory needs it

    return GPT2Model(GPT2Config(n_embd=d, n_layer=layers, n_head=4, vocab_size=vocab, n_positions=64))


#: ``llama``'s families: (config, model, what differs from Llama's layout)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaModel", {}),
    "qwen3": ("Qwen3Config", "Qwen3Model", {}),  # QK-norm: an RMSNorm on each head's q and k
    # OLMo-2: the norms after each branch (x + norm(branch(x))), QK-norm over all heads
    "olmo2": ("Olmo2Config", "Olmo2Model", {}),
    # Gemma 2: logits soft-capped at 50, gains 1 + w, the embedding times sqrt(d); no padding row
    # (its default pad_token_id 0 zeroes token 0's embedding: sigprop's random ids leave such an id
    # out since 0.16.0; None keeps docs/quickstart.md's figures as they were drawn)
    "gemma2": ("Gemma2Config", "Gemma2Model", {"pad_token_id": None, "attn_implementation": "eager"}),
}


def llama(
    layers: int = 4,
    d: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 1000,
    family: str = "llama",
    lm: bool = False,
):
    """A small Llama-family decoder (Hugging Face transformers, the [models] extra): RMSNorm,
    rotary positions, a gated MLP, ``heads`` query heads on ``kv_heads`` key/value heads, on token
    ids below ``vocab``: ``sigprop module examples/my_nets.py:llama --vocab 1000 --input-shape 16``;
    ``family`` one of ``FAMILIES`` (``--arg family=llama,qwen3,olmo2,gemma2``: one run each).
    ``lm``: with its readout to the vocabulary (``...ForCausalLM``, untied), the net a coordinate
    check trains: ``sigprop width module examples/my_nets.py:llama --arg d=64,128,256 --arg lm=True
    --vocab 1000 --input-shape 16``."""
    import transformers  # the [models] extra: only this factory needs it

    cfg_name, model_name, extra = FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=2 * d,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=d // heads,
        max_position_embeddings=64,
        **extra,
        **({"tie_word_embeddings": False} if lm else {}),
    )
    if lm:
        cfg._attn_implementation = extra.get("attn_implementation", "sdpa")
        return getattr(transformers, model_name.replace("Model", "ForCausalLM"))(cfg)
    return getattr(transformers, model_name)(cfg)


def cnn(width: int = 16, depth: int = 3, classes: int = 10) -> nn.Module:
    """A plain ReLU conv net on 3 x 16 x 16 images: a 3 x 3 conv to ``width`` channels, ``depth``
    - 1 more at ``width``, a global average pool and a linear readout -- the channels are the
    width of ``sigprop width module examples/my_nets.py:cnn --arg width=16,32,64,128
    --input-shape 3,16,16``."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Conv2d(width, width, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))
