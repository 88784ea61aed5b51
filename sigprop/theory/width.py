"""How a network's coordinates scale with its width through the first optimizer steps: the
abc-parametrizations of Yang & Hu (2021, "Tensor Programs IV", section 3 and Table 1) and the
maximal-update parametrization μP of Yang et al. (2021, "Tensor Programs V", Table 3), as the
width exponents sigprop's coordinate check (``sigprop width``) sets beside its fitted slopes.
numpy-free and torch-free: exponents are fractions of powers of the width n.

Each parametrization is written here in its *Table 3 form* (Yang et al. 2021, Table 3): no
multiplier, only each weight's init standard deviation and learning rate as powers of n relative
to a base width n0 (at n0 every parametrization is the same network, as in ``mup``'s base
shapes).  A parametrization with multipliers is the same training trajectory by the
abc-symmetry (Yang & Hu 2021, eq. 5: W = n^-a w with w ~ n^-b, lr ~ n^-c is invariant under
a -> a + θ, b -> b - θ, c -> c - 2θ for SGD and c -> c - θ for Adam): μP's readout multiplier
1/n (Table 8) is Table 3's init variance 1/n^2 and learning rate 1/n, and NTK's 1/sqrt(n)
multipliers (Jacot et al. 2018) are SP's init with SGD learning rate 1/n on the hidden and output
weights (docs/theory.md §17).

Roles, by which of a weight's dimensions grow with the width (``mup``'s "infinite" dimensions):
``input`` (fan-in fixed, fan-out grows: the first layer, an embedding), ``hidden`` (both grow),
``output`` (fan-in grows, fan-out fixed: the readout), ``vector`` (a bias or a norm's gain: one
dimension, growing), ``fixed`` (nothing grows: left as it is, trained at the base learning rate).

The update exponents at step 1 follow one recursion along the network (docs/theory.md §17,
derived there from Yang & Hu 2021, section 5's first-step analysis): with δ the coordinate size
of the loss's gradient at a layer's output (n^-ω for the hidden layers, where ω is the readout's
weight exponent, 1 for the readout itself) and the learning rate n^-γ,

    u = -γ - ω   (SGD: ΔW = -η δ xᵀ)        u = -γ   (Adam's first step: ΔW = -η sign(δ xᵀ))
    e_input  = u                            (a fixed fan-in: x·x = Θ(1))
    e_hidden = max(u + 1 + max(0, e_prev), e_prev)
    e_output = max(u + 1 + max(0, e_prev), e_prev + 1 - ω)

the second term of each max being the previous change carried through the layer's initial
weights; these are the asymptotes, and the smallest of the terms (u + 1, and the carried change:
at the readout a change with no correlation to it, e_prev + 1/2 - ω) bounds a slope fitted over a
finite grid from below (``Exponents``).  The asymptotes
give TP IV's tables: SP with SGD grows ∝ n^1/2, n^1, ... and its logits ∝ n^2 through a 3-layer
net; SP with Adam ∝ n, n^2, logits n^3; μP Θ(1) everywhere; NTK's features
move ∝ n^-1/2 and its logits Θ(1).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction as F

#: the parametrizations sigprop applies, with their citation
PARAMETRIZATIONS = {
    "sp": "the standard parametrization: init variance 1/fan_in, one learning rate (Yang & Hu 2021, Table 1)",
    "mup": "the maximal-update parametrization (Yang et al. 2021, Table 3)",
    "ntk": "the neural-tangent parametrization, SGD only (Jacot et al. 2018; Yang & Hu 2021, Table 1)",
}
#: the parametrization a model brings itself: read, not changed; no exponent predicted
AS_IS = "as-is"
OPTIMIZERS = ("sgd", "adam")
ROLES = ("input", "hidden", "output", "vector", "fixed")


@dataclass(frozen=True)
class Scaling:
    """One role's scaling under a parametrization and optimizer: its init standard deviation
    multiplies by (n/n0)^-init and its learning rate by (n/n0)^-lr, relative to SP's draw
    N(0, 1/fan_in) and the base learning rate at the base width n0."""

    init: F
    lr: F


def scaling(param: str, optimizer: str, role: str) -> Scaling:
    """Yang et al. (2021), Table 3 ("input weights & all biases", "output weights", "hidden
    weights"), relative to SP; NTK by the abc-symmetry (module docstring).  ``fixed`` weights
    are not scaled."""
    if param not in PARAMETRIZATIONS:
        raise ValueError(f"unknown parametrization {param!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    if role == "fixed" or param == "sp":
        return Scaling(F(0), F(0))
    if param == "ntk":
        if optimizer != "sgd":
            raise ValueError("the NTK parametrization is defined for SGD")
        return Scaling(F(0), F(1) if role in ("hidden", "output") else F(0))
    # μP: the readout's init variance 1/fan_in^2; learning rates by fan-in (Table 3)
    init = F(1, 2) if role == "output" else F(0)
    if optimizer == "sgd":
        return Scaling(init, {"input": F(-1), "vector": F(-1), "hidden": F(0), "output": F(1)}[role])
    return Scaling(init, {"input": F(0), "vector": F(0), "hidden": F(1), "output": F(1)}[role])


def _init_exponent(param: str, optimizer: str, role: str) -> F:
    """The exponent of a weight's entries: SP's 1/sqrt(fan_in) (1/2 where the fan-in grows, 0
    where it is fixed) plus the parametrization's init scaling."""
    base = F(1, 2) if role in ("hidden", "output") else F(0)
    return base + scaling(param, optimizer, role).init


@dataclass(frozen=True)
class Exponents:
    """The width exponents of one site: its activation's coordinate size at init (``init``) and
    the interval its change from init after the first step lies in (``low``, ``high``; None where
    not derived).  The change is a sum of terms, each a power of n (the module docstring's
    recursion); the slope of a sum of powers fitted over a finite grid is a weighted mean of
    their exponents, so it lies between the smallest (``low``: where a term with a small exponent
    but a large constant dominates the grid, as a first layer of fan-in 3072 does at widths up to
    1024) and the largest (``high``: the asymptote, Yang & Hu 2021).  The two are equal for a
    stable parametrization's hidden layers; at its readout a change of the features with no
    correlation to it, n^(e + 1/2 - ω), can lead on a grid (n^-1/2 under μP: docs/theory.md §17)."""

    init: F | None
    low: F | None = None
    high: F | None = None


#: the band a fitted slope may stray outside its predicted exponent (or interval): finite-width
#: corrections of relative size c/sqrt(n) bias a slope fitted over widths 64..1024 by about
#: c (1/8 - 1/32) / ln 16 = 0.034 c, so 0.2 allows c up to ~6 (docs/theory.md §17)
SLOPE_BAND = F(1, 5)


def _layer(role: str, u: F, prev: F | None, omega: F, asymptotic: bool) -> F:
    """One layer's update exponent from its input's: the largest of its terms (``asymptotic``)
    or the smallest (the own term at the input's init, u + 1, and the carried change)."""
    if role == "input" or prev is None:
        return u
    carried = prev if role == "hidden" else prev + 1 - omega
    if not asymptotic:
        # the readout's fixed fan-out sums n products: a change correlated with its rows (the
        # backward's direction) adds up, n^(1 - ω); one with no correlation adds as noise, n^(1/2 - ω)
        return min(u + 1, prev if role == "hidden" else prev + F(1, 2) - omega)
    return max(u + 1 + max(F(0), prev), carried)


def chain_exponents(param: str, optimizer: str, roles: list[str]) -> list[Exponents]:
    """The exponents at step 1 of the outputs of a chain of weight layers with these roles, in
    order (input, hidden..., output: an MLP; Yang & Hu 2021, section 5), by the recursion of the
    module docstring; a ``vector``/``fixed`` layer's output carries its input's exponents."""
    omega = _init_exponent(param, optimizer, "output")
    out: list[Exponents] = []
    lo: F | None = None
    hi: F | None = None
    for role in roles:
        if role in ("vector", "fixed"):
            out.append(out[-1] if out else Exponents(F(0)))
            continue
        sc = scaling(param, optimizer, role)
        delta = F(0) if role == "output" else omega  # the gradient's size at the layer's output
        u = -sc.lr - (delta if optimizer == "sgd" else F(0))
        lo = _layer(role, u, lo, omega, asymptotic=False)
        hi = _layer(role, u, hi, omega, asymptotic=True)
        init = F(1, 2) - omega if role == "output" else F(0)  # n terms of n^-ω, independent
        out.append(Exponents(init, lo, hi))
    return out


def stable(param: str) -> bool:
    """Whether the parametrization is stable, its exponents the same at every step (μP and NTK:
    Yang & Hu 2021, Theorem 3.3); SP's are derived for the first step only."""
    return param in ("mup", "ntk")


def logits_exponents(param: str, step: int) -> Exponents:
    """An attention call's logits (Yang et al. 2021, section 4): under μP's q·k sqrt(d0)/d a sum
    of d products of independent Θ(1) coordinates at init, n^-1/2; after a step q and k move Θ(1)
    along directions correlated with k and q (∂ℓ/∂q ∝ k), so q·k changes by Θ(d) and the logits by
    Θ(1) -- the change 1/sqrt(d) would let grow ∝ n^1/2; the part of their change across k and q
    adds as noise, sqrt(d), and the logits by n^-1/2: the interval's low end.  Under SP's and
    NTK's 1/sqrt(d) the logits at init are Θ(1); their change off a chain is not derived here."""
    if param == AS_IS:
        return Exponents(None)
    if param != "mup":
        return Exponents(F(0))
    return Exponents(F(-1, 2)) if step == 0 else Exponents(F(-1, 2), F(-1, 2), F(0))


def zero_readout_exponents(param: str, optimizer: str, roles: list[str], step: int) -> list[Exponents] | None:
    """The exponents with the readout drawn as zeros (Yang et al. 2021, Table 3's "or 0"): at
    init the readout's output is exactly 0 (no power of n: None); at step 1 no gradient reaches
    the layers below it (their change is exactly 0: None), and the readout's own change is its own
    term at its input's init, u + 1 with u = -γ (the loss's gradient at the logits is Θ(1)); from
    step 2 the readout's entries are one update's, of μP's size 1/n, so μP's exponents hold; SP's
    and NTK's are not derived.  None where the ordinary exponents apply."""
    if step == 0:
        return [
            Exponents(None) if r == "output" else Exponents(F(0) if r != "logits" else None) for r in roles
        ]
    if step == 1:
        u = -scaling(param, optimizer, "output").lr
        return [Exponents(None, u + 1, u + 1) if r == "output" else Exponents(None) for r in roles]
    return None


def site_exponents(
    param: str, optimizer: str, roles: list[str], step: int, chain: bool = True, zero_readout: bool = False
) -> list[Exponents]:
    """The exponents of each site at ``step`` (0: init only; a stable parametrization's at every
    step; SP's update at step 1 only).  ``chain``: the sites are a chain of weight layers in
    this order (an MLP), where the recursion holds; otherwise (a residual stream, a norm, several
    layers reading one tensor) only what does not depend on the position: a stable
    parametrization's exponents (the same for every layer of a role, Yang et al. 2021, Table 3's
    premise) and the first layer's update; SP's others are not derived.  ``as-is``: none.  A
    ``logits`` site (an attention call's) reads ``logits_exponents``; ``zero_readout``:
    ``zero_readout_exponents`` at steps 0 and 1, μP's after."""
    if zero_readout and param != AS_IS:
        zero = zero_readout_exponents(param, optimizer, roles, step)
        if zero is not None:
            return zero
        if param != "mup":
            return [Exponents(None) for _ in roles]
    layers = [r for r in roles if r != "logits"]
    if param == AS_IS:
        full = [Exponents(None) for _ in layers]
    else:
        full = chain_exponents(param, optimizer, layers)
        if not chain:
            three = ["input", "hidden", "output"]
            alone = dict(zip(three, chain_exponents(param, optimizer, three)))
            full = [alone[r] if (stable(param) or r == "input") else Exponents(alone[r].init) for r in layers]
        if not (step == 1 or (step > 1 and stable(param))):
            full = [Exponents(e.init) for e in full]
    it = iter(full)
    return [logits_exponents(param, step) if r == "logits" else next(it) for r in roles]


def fmt_exponent(e: F | float | None) -> str:
    """``1/2``-style words for an exponent, a fraction or a record's float of one (``—`` where
    not derived)."""
    return "—" if e is None else str(F(e).limit_denominator(12))
