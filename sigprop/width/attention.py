"""μP's attention (Yang et al. 2021, section 4 and Table 3's footnote: attention logits q·k/d, not
q·k/sqrt(d)): a TorchFunctionMode that rescales each attention call's logits by sqrt(d0/d), d the
call's head dimension and d0 the same call's at the base width, so the logits read
q·k sqrt(d0)/d -- the user's attention at the base width, μP's 1/d as the width grows.  It
changes the calls, not the model: ``F.scaled_dot_product_attention``'s ``scale`` and
``F.multi_head_attention_forward``'s query projection (``nn.MultiheadAttention``, whose
``need_weights`` path computes its own logits)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from sigprop.errors import SigpropError

_MHA_NAMES = (
    "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias",
    "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training",
    "key_padding_mask", "need_weights", "attn_mask", "use_separate_proj_weight", "q_proj_weight",
)  # fmt: skip


class AttentionScale(TorchFunctionMode):
    """Records each attention call's head dimension (``base`` None: the base width's forward) or
    rescales each call's logits by sqrt(base[i] / d) (``base``: the dimensions recorded)."""

    def __init__(self, base: list[int] | None = None) -> None:
        super().__init__()
        self.base = base
        self.dims: list[int] = []

    def _factor(self, d: int) -> float:
        i = len(self.dims)
        self.dims.append(d)
        if self.base is None:
            return 1.0
        if i >= len(self.base):
            raise SigpropError(
                "the model makes more attention calls at this width than at the base width", field="arg"
            )
        return math.sqrt(self.base[i] / d)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is F.scaled_dot_product_attention:
            q = args[0] if args else kwargs["query"]
            d = q.shape[-1]
            m = self._factor(d)
            if self.base is not None:
                given = kwargs.get("scale")  # keyword-only in torch's signature
                kwargs["scale"] = (1.0 / math.sqrt(d) if given is None else given) * m
            return func(*args, **kwargs)
        if func is F.multi_head_attention_forward:
            kw = {**dict(zip(_MHA_NAMES, args)), **kwargs}
            d = kw["embed_dim_to_check"] // kw["num_heads"]
            m = self._factor(d)
            if self.base is not None and m != 1.0:
                if kw.get("use_separate_proj_weight"):
                    kw["q_proj_weight"] = kw["q_proj_weight"] * m
                else:
                    w = kw["in_proj_weight"]
                    e = kw["embed_dim_to_check"]
                    scale = torch.ones(w.shape[0], 1, dtype=w.dtype, device=w.device)
                    scale[:e] = m
                    kw["in_proj_weight"] = w * scale
                    if kw.get("in_proj_bias") is not None:
                        kw["in_proj_bias"] = kw["in_proj_bias"] * scale[:, 0]
            return func(**kw)
        return func(*args, **kwargs)
