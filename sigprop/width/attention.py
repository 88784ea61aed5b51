"""μP's attention (Yang et al. 2021, section 4 and Table 3's footnote: attention logits q·k/d, not
q·k/sqrt(d)): a TorchFunctionMode that rescales each attention call's logits by sqrt(d0/d), d the
call's head dimension and d0 the same call's at the base width, so the logits read
q·k sqrt(d0)/d -- the user's attention at the base width, μP's 1/d as the width grows.  It
changes the calls, not the model: ``F.scaled_dot_product_attention``'s ``scale`` and
``F.multi_head_attention_forward``'s query projection (``nn.MultiheadAttention``, whose
``need_weights`` path computes its own logits) -- and attention written out by hand (nanoGPT's
``(q @ k.transpose(-2, -1)) * s``, then a mask and a softmax; ``torch.bmm``, ``torch.einsum``):
a product of two activations whose result reaches a softmax through elementwise ops only is
read as an attention call's logits at the base width, and that product, the same call by its
order at every width, is rescaled by sqrt(d0/d), d its contracted dimension.  A softmax whose
input is not such a product is counted (``other_softmax``): it is not rescaled, and said."""

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
    """Records each attention call's head dimension (``base`` None: the base width's forward),
    rescales each call's logits by sqrt(base[i] / d) (``base`` given and ``rescale``: μP), and
    with ``record`` keeps each call's logits as the call computes them (``logits``: [B, H, T, S],
    detached, before any mask), the coordinate check's attention sites."""

    def __init__(
        self,
        base: list[int] | None = None,
        rescale: bool = True,
        record: bool = False,
        written: list[tuple[int, int]] | None = None,
    ) -> None:
        super().__init__()
        self.base = base
        self.rescale = rescale and base is not None
        self.record = record
        self.dims: list[int] = []
        self.logits: list[torch.Tensor] = []
        #: attention written out: (the product's order among the forward's products, d) read at
        #: the base width (``written`` given: those to rescale), and found in this forward
        self.base_written = {i: d for i, d in (written or [])}
        self.written: list[tuple[int, int]] = []
        self.other_softmax = 0
        self._products = 0
        self._tags: dict[int, tuple[int, int, torch.Tensor]] = {}

    def _factor(self, d: int) -> float:
        i = len(self.dims)
        self.dims.append(d)
        if not self.rescale:
            return 1.0
        if i >= len(self.base):
            raise SigpropError(
                "the model makes more attention calls at this width than at the base width", field="arg"
            )
        return math.sqrt(self.base[i] / d)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is F.scaled_dot_product_attention:
            return self._sdpa(func, args, kwargs)
        if func is F.multi_head_attention_forward:
            return self._mha(func, {**dict(zip(_MHA_NAMES, args)), **kwargs})
        if func in _PRODUCTS:
            return self._product(func, args, kwargs)
        if func in _SOFTMAX:
            x = args[0] if args else kwargs.get("input")
            tag = self._tags.get(id(x))
            if tag is not None and all(i != tag[0] for i, _ in self.written):
                self.written.append(tag[:2])
            elif tag is None:
                self.other_softmax += 1
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if self._tags and isinstance(out, torch.Tensor):  # the logits through a scale, a mask, a cast
            for a in (*args, *kwargs.values()):
                tag = self._tags.get(id(a)) if isinstance(a, torch.Tensor) else None
                if tag is not None and out.shape == a.shape:
                    self._tags[id(out)] = (tag[0], tag[1], out)
                    break
        return out

    def _product(self, func, args, kwargs):
        """A product: of two activations (no parameter) of rank 3 or more, a candidate for an
        attention call's logits (tagged with its order and d); rescaled where the base width's
        forward found it to be one."""
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        out = func(*args, **kwargs)
        if len(tensors) != 2 or any(isinstance(t, torch.nn.Parameter) or t.dim() < 3 for t in tensors):
            return out
        d = _contracted(func, args, tensors)
        if d is None:
            return out
        i = self._products
        self._products += 1
        if self.rescale and i in self.base_written:
            out = out * math.sqrt(self.base_written[i] / d)
        self._tags[id(out)] = (i, d, out)
        return out

    def _sdpa(self, func, args, kwargs):
        q = args[0] if args else kwargs["query"]
        d = q.shape[-1]
        m = self._factor(d)
        given = kwargs.get("scale")  # keyword-only in torch's signature
        scale = (1.0 / math.sqrt(d) if given is None else given) * m
        if self.rescale:
            kwargs["scale"] = scale
        if self.record:
            k = args[1] if len(args) > 1 else kwargs["key"]
            if k.shape[-3] != q.shape[-3]:  # grouped-query attention: each key head serves a group
                k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
            self.logits.append((q.detach() @ k.detach().transpose(-2, -1)) * scale)
        return func(*args, **kwargs)

    def _mha(self, func, kw):
        e, heads = kw["embed_dim_to_check"], kw["num_heads"]
        d = e // heads
        m = self._factor(d)
        if self.rescale and m != 1.0:
            if kw.get("use_separate_proj_weight"):
                kw["q_proj_weight"] = kw["q_proj_weight"] * m
            else:
                w = kw["in_proj_weight"]
                scale = torch.ones(w.shape[0], 1, dtype=w.dtype, device=w.device)
                scale[:e] = m
                kw["in_proj_weight"] = w * scale
                if kw.get("in_proj_bias") is not None:
                    kw["in_proj_bias"] = kw["in_proj_bias"] * scale[:, 0]
        if self.record:
            self.logits.append(_mha_logits(kw, e, heads))
        return func(**kw)


#: the products attention's logits are written with, and the softmax they reach
_PRODUCTS = (
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.bmm,
    torch.Tensor.bmm,
    torch.einsum,
)
_SOFTMAX = (F.softmax, torch.softmax, torch.Tensor.softmax)


def _contracted(func, args, tensors) -> int | None:
    """The size of a product's contracted dimension (d of q @ k^T), None where it is not read (an
    einsum with an ellipsis or more than one contracted index)."""
    if func is not torch.einsum:
        return int(tensors[0].shape[-1])
    equation = str(args[0]).replace(" ", "")
    if "..." in equation or "->" not in equation:
        return None
    lhs, result = equation.split("->")
    a, _, b = lhs.partition(",")
    gone = [c for c in a if c in b and c not in result]
    if len(gone) != 1 or len(a) != tensors[0].dim():
        return None
    return int(tensors[0].shape[a.index(gone[0])])


def _mha_logits(kw: dict, e: int, heads: int) -> torch.Tensor:
    """``F.multi_head_attention_forward``'s logits as it computes them ([T, B, E] inputs: the
    query and key projected, one head of E/H per slice, times 1/sqrt(E/H)), [B, H, T, S]."""
    if kw.get("use_separate_proj_weight"):
        wq, wk = kw["q_proj_weight"], kw["k_proj_weight"]
    else:
        wq, wk, _ = kw["in_proj_weight"].chunk(3)
    bias = kw.get("in_proj_bias")
    bq, bk = (None, None) if bias is None else bias.chunk(3)[:2]
    query, key = kw["query"].detach(), kw["key"].detach()
    d = e // heads

    def split(x, w, b):
        t = F.linear(x, w.detach(), None if b is None else b.detach())
        return t.reshape(t.shape[0], t.shape[1], heads, d).permute(1, 2, 0, 3)

    return split(query, wq, bq) @ split(key, wk, bk).transpose(-2, -1) / math.sqrt(d)
