"""The attention a model computes, read while it runs (docs/theory.md §15): every call of
``scaled_dot_product_attention`` (Hugging Face's sdpa attention, a hand-written block) and of
``multi_head_attention_forward`` (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``) is
seen by a ``TorchFunctionMode``, its attention weights recomputed beside it from the same query
and key (no change to what the model computes), and their normalised entropy kept per sample
under the module that made the call; and every ``softmax`` over the last axis of a [B, H, T_q,
T_k] tensor -- attention written out (nanoGPT's, Hugging Face's eager one) -- from its own logits
(the calls inside the two above are not seen: a TorchFunctionMode is off while it handles one)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from sigprop.model.sites import call_name

SDPA = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
MHA = (F.multi_head_attention_forward,)
#: a softmax written out (nanoGPT's ``F.softmax(att, dim=-1)``, Hugging Face's eager attention):
#: over the last axis of [B, H, T_q, T_k] logits, an attention's weights
SOFTMAX = (F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax)


def normalised_entropy(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Per sample the mean over heads and queries of H(softmax(logits)) / ln(keys allowed), float64
    [B], from logits [B, H, Tq, Tk], finite wherever a key may be read, and a boolean mask
    broadcastable to them of the keys each query may read (None: all); a query that may read one
    key only (a causal first token) has no entropy to compare and is left out.  1: uniform over
    the keys allowed; 0: all weight on one key.  H = - sum_k p_k ln p_k per query
    (``torch.special.entr`` of the softmax, 0 at p = 0) in float32 at least (float64 logits stay
    so): the entropy of T_k <= 10^4 keys to 10^-6 relative, its mean over queries in float64.
    The keys allowed are counted on the mask as given (a causal [T, T] mask: T^2 elements, not
    the logits' B H T^2): 0.16.0.dev0 took every element to float64 (7% of a warm probe of a
    small Llama), then counted the finite logits (a further pass over all of them)."""
    z = logits if logits.dtype == torch.float64 else logits.float()
    if allowed is None:
        n = torch.full(z.shape[:-1], z.shape[-1], device=z.device)
    else:
        z = z.masked_fill(~allowed, -math.inf)
        n = allowed.sum(-1).expand(z.shape[:-1])
    h = torch.special.entr(torch.softmax(z, dim=-1)).sum(-1)
    keep = n >= 2
    h = h.double()
    ratio = torch.where(keep, h / n.clamp(min=2).double().log(), torch.zeros_like(h))
    count = keep.flatten(1).sum(1).clamp(min=1)
    return ratio.flatten(1).sum(1) / count


def _additive(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the keys a float attention mask lets a query read, its finite bias where it does): an
    entry of -inf, or at or below half the dtype's lowest value (Hugging Face masks with
    ``torch.finfo(dtype).min``), hides its key; any other is a bias added to the logit (ALiBi)."""
    mask = mask.detach()
    hides = mask <= torch.finfo(mask.dtype).min / 2
    return ~hides, mask.masked_fill(hides, 0.0)


def _sdpa_entropy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **_):
    """The entropy of an ``F.scaled_dot_product_attention`` call's weights ([B, H, T, E] inputs;
    a boolean mask True where a key may be read, a float one added to the logits, ``_additive``)."""
    q, k = q.detach(), k.detach()
    if q.dim() != 4 or k.dim() != 4:
        return None
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each key head serves several queries
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q @ k.transpose(-2, -1)) * s
    allowed = None
    if is_causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool:
            attn_mask, bias = _additive(attn_mask)
            logits = logits + bias
        allowed = attn_mask if allowed is None else allowed & attn_mask
    return normalised_entropy(logits, allowed)


def _mha_entropy(query, key, value, embed_dim, num_heads, in_proj_weight, in_proj_bias, *rest, **kw):
    """The entropy of an ``F.multi_head_attention_forward`` call's weights: the query and key
    projected as it projects them ([T, B, E] inputs, one head of E/H per slice), its masks as it
    reads them (boolean True: not read; float: added); a call with extra key/value biases or a
    zero attention row is not read (None)."""
    names = ("bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training")
    kw = {**dict(zip(names, rest)), **kw}
    if kw.get("bias_k") is not None or kw.get("add_zero_attn") or query.dim() != 3:
        return None
    if kw.get("use_separate_proj_weight"):
        wq, wk = kw.get("q_proj_weight"), kw.get("k_proj_weight")
    else:
        wq, wk, _ = in_proj_weight.detach().chunk(3)
    bq, bk = (None, None) if in_proj_bias is None else in_proj_bias.detach().chunk(3)[:2]
    T, B, _ = query.shape
    S = key.shape[0]
    hd = embed_dim // num_heads
    q = F.linear(query.detach(), wq.detach(), bq).reshape(T, B, num_heads, hd).permute(1, 2, 0, 3)
    k = F.linear(key.detach(), wk.detach(), bk).reshape(S, B, num_heads, hd).permute(1, 2, 0, 3)
    logits = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    allowed = torch.ones(T, S, dtype=torch.bool, device=logits.device)
    mask = kw.get("attn_mask")
    if mask is not None:
        mask = mask.detach()
        mask = mask.reshape(B, num_heads, T, S) if mask.dim() == 3 else mask
        if mask.dtype != torch.bool:
            mask, bias = _additive(mask)
            logits, mask = logits + bias, ~mask
        allowed = allowed & ~mask
    pad = kw.get("key_padding_mask")
    if pad is not None:
        pad = pad.detach()[:, None, None, :]
        if pad.dtype != torch.bool:
            pad, bias = _additive(pad)
            logits, pad = logits + bias, ~pad
        allowed = allowed & ~pad
    return normalised_entropy(logits, allowed)


def _softmax_entropy(x, dim=None, *args, **kwargs):
    """The entropy of a written-out attention's weights, softmax(logits) over the last axis of
    [B, H, T_q, T_k] logits (another softmax: None): a key whose logit is -inf (``masked_fill``)
    or at or below half its dtype's lowest value (Hugging Face's additive mask) is not read."""
    dim = kwargs.get("dim", dim)
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or dim not in (-1, 3) or not x.is_floating_point():
        return None
    allowed, logits = _additive(x)  # a logit of -inf or HF's finfo.min hides its key, as a mask's
    return normalised_entropy(logits, allowed & torch.isfinite(logits))


class AttentionReader(TorchFunctionMode):
    """While active, every attention call's per-sample normalised entropy (``normalised_entropy``)
    under the module calls running it (global forward hooks keep the stack):
    ``calls`` is a list of (the module calls running it, outermost first, entropy [B])."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.paths = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
        self.stack: list[str] = []
        self.calls: list[tuple[tuple, torch.Tensor]] = []
        self._hooks: list = []
        self.count: dict[str, int] = {}

    def __enter__(self):
        def push(mod, args):  # each call named as a site names it: ``block@1``, its second
            path = self.paths.get(id(mod), "")
            k = self.count[path] = self.count.get(path, -1) + 1
            self.stack.append(call_name(path, k) if path else "")

        def pop(mod, args, out):
            if self.stack:
                self.stack.pop()

        self._hooks = [
            nn.modules.module.register_module_forward_pre_hook(push),
            nn.modules.module.register_module_forward_hook(pop, always_call=True),
        ]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks, self.stack = [], []
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        read = _sdpa_entropy if func in SDPA else _mha_entropy if func in MHA else None
        read = _softmax_entropy if func in SOFTMAX else read
        if read is not None:
            try:
                with torch.no_grad():
                    h = read(*args, **kwargs)
            except Exception:  # a call of a form not read here: its site shows no entropy
                h = None
            if h is not None:
                self.calls.append((tuple(p for p in self.stack if p), h))
        return out

    def at(self, site: str) -> torch.Tensor | None:
        """The mean entropy per sample over the calls inside site ``site`` -- a module's call
        (``block@1``) or a module's only call -- (None: none)."""
        got = [h for stack, h in self.calls if site in stack]
        return None if not got else torch.stack(got).mean(0)
