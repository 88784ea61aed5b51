"""The preservation verdict of a transformer, read across its layers (issue 67; docs/theory.md
§18): the stream's growth and the gradient's from the first layer site to the last, and the
tokens kept apart, each in a band that widens with the layers -- not from an embedding's scale to
a final norm's.  Plain numpy on a probe's arrays; the module kind reads it
(sigprop/kinds/module.py ``verdicts``)."""

from __future__ import annotations

import math

import numpy as np

from sigprop import specs, stats
from sigprop.results import Check


def across_layers(tokens: bool, plan, arrays, layers, band_given, on) -> list | None:
    """The ``preserved`` verdict of a model whose input is an embedding table (token ids) or whose
    output is a normalisation, and which has a repeated stack of layers (``plan.stack``): read
    across the layers, from the first layer site to the last, forward (the stream's growth) and
    backward (the gradient from the last layer to the first) -- not from the embedding's scale to
    the final norm's, which are scales the model chose (GPT-2's 0.02 table against its final
    norm's gain 1: 49.6 end to end while nothing is lost on the way).  The band is ``--band``
    (a decade each way by default) widened to [1/L, L] for L layers beyond 10: what a healthy
    pre-norm stack does grows polynomially with depth (its stream ∝ sqrt(L), its gradient up to
    ∝ L: Llama-3.2-1B's 9.5 over 16 layers), while signal that is lost compounds per layer,
    exponentially (docs/theory.md §18).  ``tokens``: the input is token ids; ``band_given``: the
    user's ``--band`` (None: the decade).  None where the rule does not apply (the end-to-end
    verdict then)."""
    if plan.stack is None or not (tokens or plan.final_norm):
        return None
    i, j = plan.stack
    if i not in on or j not in on:
        return None
    count = j - i + 1
    low, high = band_given or specs.DECADE_BAND
    widen = max(1.0, count / 10.0)
    band = (math.log(low / widen), math.log(high * widen))
    ln_f, ln_b = np.asarray(arrays["fwd"]), np.asarray(arrays["bwd"])
    across = (
        (f"forward ratio across the layers, {plan.sites[i]} to {plan.sites[j]} ({count} layers)",
         stats.ratio_stats(ln_f[:, j, :] - ln_f[:, i, :])),
        (f"backward ratio across the layers, {plan.sites[j]} to {plan.sites[i]} ({count} layers)",
         stats.ratio_stats(ln_b[:, i, :] - ln_b[:, j, :])),
    )  # fmt: skip
    out = []
    for k, (name, st) in enumerate(across):
        c = stats.gate(name, "preserved", st, *band)
        ends = _ends_note(plan, layers, i, j, on) if k == 0 else ""
        if not c.passed:
            ends = f"it compounds across the layers{'; ' + ends if ends else ''}"
        c.note = ends
        out.append(c)
    apart = _tokens_apart(plan, arrays, i, j, count, band[0])
    return out + ([apart] if apart is not None else [])


def _tokens_apart(plan, arrays, i: int, j: int, count: int, low: float):
    """Tokens kept apart across the layers (where the sites hold token sequences): 1 - the mean
    cosine between one sample's tokens, at the last layer over the first, above the band's low
    end.  Rank collapse (Dong et al. 2021: attention without skips maps every token onto one,
    doubly exponentially in depth) loses the signal while every norm is kept -- a stack of 24
    such layers reads forward 1.0, backward 0.3 and 1 - cosine 1e-300 of its first layer's."""
    cos = arrays.get("cosine")
    if cos is None:
        return None
    a, b = np.asarray(cos)[:, i, :], np.asarray(cos)[:, j, :]
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    first, last = float(np.mean(1.0 - a)), float(np.mean(1.0 - b))
    if first <= 0:
        return None
    ratio = max(last, 1e-300) / first
    name = (
        f"tokens kept apart across the layers (1 - token cosine, {plan.sites[j]} over {plan.sites[i]}, "
        f"{count} layers)"
    )
    c = Check(name, bool(math.log(ratio) >= low), math.log10(ratio), low / stats.LN10, math.inf, "preserved")
    c.note = f"1 - cosine {first:.3g} at {plan.sites[i]}, {last:.3g} at {plan.sites[j]}"
    if not c.passed:
        c.note += ": the tokens collapse onto one direction (rank collapse)"
    return c


def _ends_note(plan, layers, i: int, j: int, on) -> str:
    """The scales at the ends that the verdict does not read: the first site to the first layer
    (an embedding's), the last layer to the last site (a final norm's gain)."""
    first, last = on[0], on[-1]
    f = lambda k: layers[k].forward.log10_mean
    parts = []
    if first < i and f(i) is not None and f(first) is not None:
        parts.append(f"{plan.sites[first]} to {plan.sites[i]} x{10 ** (f(i) - f(first)):.3g}")
    if last > j and f(j) is not None and f(last) is not None:
        parts.append(f"{plan.sites[j]} to {plan.sites[last]} x{10 ** (f(last) - f(j)):.3g}")
    if not parts:
        return ""
    return f"the ends' scales, the model's choice, not read: {', '.join(parts)}"
