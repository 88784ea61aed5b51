"""A weight layer's energy map, dense or a zero-padded convolution's per position (docs/theory.md
§11, §13), and the ln arithmetic of energies the plans carry (``safe_log``, ``logaddexp``)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def safe_log(x: float) -> float:
    """ln x, -inf for x <= 0 (a zero energy: an all-dead layer)."""
    return math.log(x) if x > 0 else -math.inf


def logaddexp(a: float, b: float) -> float:
    """ln(e^a + e^b) of two ln energies."""
    return float(np.logaddexp(a, b))


# --------------------------------------------------------------------------------------------
# Convolutions: the per-position energy map (docs/theory.md §11; issue 18)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvMoments:
    """One conv layer as the theory sees it: c_in -> c_out channels, a k x k kernel, stride,
    zero padding, the row second moment E||w_c||^2 (g^2 for WN rows, over the c_in k^2 entries
    of an output channel's kernel), the bias variance, and how a row's energy sits on the taps:
    ``"isotropic"`` (every tap alike: Gaussian, orthogonal rows of the [c_out, c_in k^2] kernel
    matrix, PyTorch's uniform) or ``"centre"`` (delta-orthogonal, Xiao et al. 2018: all of it on
    the centre tap)."""

    c_in: int
    c_out: int
    kernel: int
    stride: int = 1
    padding: int = 0
    row_sq: float = 1.0
    bias_var: float = 0.0
    taps: str = "isotropic"

    def out_size(self, h: int) -> int:
        return (h + 2 * self.padding - self.kernel) // self.stride + 1


@functools.lru_cache(maxsize=256)
def conv_window(
    n_in: int,
    n_out: int,
    kernel: int,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    centre: bool = False,
) -> np.ndarray:
    """A conv's window along one spatial axis, the one both engines read (a plan's energy map,
    ``conv_box``; a traced conv's profile, sigprop/model/ops/linear.py): entry (q, p) counts the
    taps t of output position q that read input position p = stride q + dilation t - padding,
    zero padding reading nothing ([n_out, n_in]; ``centre``: the centre tap alone).  Read-only:
    it is cached."""
    a = np.zeros((n_out, n_in))
    taps = [(kernel - 1) // 2] if centre else range(kernel)
    for q in range(n_out):
        for t in taps:
            p = stride * q + dilation * t - padding
            if 0 <= p < n_in:
                a[q, p] += 1.0
    a.setflags(write=False)
    return a


def window_map(
    field_: np.ndarray, windows: Sequence[np.ndarray], transpose: bool = False, power: int = 1
) -> np.ndarray:
    """The separable map whose axis matrices are ``windows`` (each n_out x n_in: a conv's
    ``conv_window``, a pooling's or interpolation's weights; transposed, or entrywise to a
    ``power``) applied to ``field_`` over its last len(windows) axes -- the one both engines apply
    to a field over the positions (a plan's energy map, a traced op's profile)."""
    out = field_
    d = len(windows)
    for ax, A in enumerate(windows):
        A = A.T if transpose else A
        A = A**power if power != 1 else A
        axis = out.ndim - d + ax
        out = np.moveaxis(np.tensordot(A, out, axes=([1], [axis])), 0, axis)
    return out


def weight_map(
    field_: np.ndarray,
    gain: float,
    windows: Sequence[np.ndarray] = (),
    bias: float = 0.0,
    transpose: bool = False,
) -> np.ndarray:
    """The one moment map of a weight layer (a dense layer: no windows; a conv: its windows over
    the positions), forward ``gain`` W(field) + ``bias``, backward (``transpose``) gain W^T(field):
    each output sums the products of its row with the input elements its taps read, so its second
    moment is the row's per-entry second moment times the sum of the input's over the window, plus
    the bias's (docs/theory.md §11, §13).  Both engines read it: a plan's step at the init's
    expected row moment (``conv_layer_energy``, ``conv_box_adjoint``: a field of energies summed
    over the channels) and a traced layer at its draw's ||W||^2 (sigprop/model/ops/linear.py: a
    field of per-element moments)."""
    return gain * window_map(field_, windows, transpose) + bias


def _windows(m: ConvMoments, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The layer's window along each axis of an input map of ``shape``."""
    return tuple(
        conv_window(n, m.out_size(n), m.kernel, m.stride, m.padding, 1, m.taps == "centre") for n in shape
    )


def conv_box(e: np.ndarray, m: ConvMoments) -> np.ndarray:
    """sum over the taps t of e(s q + t - pad), zeros outside the image (isotropic taps), or the
    centre tap alone: [H, W] -> [H', W'] (the windows of each axis, ``conv_window``)."""
    return window_map(e, _windows(m, e.shape))


def conv_box_adjoint(d: np.ndarray, m: ConvMoments, shape: tuple[int, int]) -> np.ndarray:
    """The transpose of ``conv_box``: scatter d(q) onto the input positions its taps read."""
    return window_map(d, _windows(m, shape), transpose=True)


def conv_layer_energy(e: np.ndarray, m: ConvMoments, relu: bool) -> np.ndarray:
    """The input-driven part of E sum_c a_{c,q}^2 per output position, from the input's
    E sum_c h_{c,p}^2 = e(p).

    Conditioned on the input, a_{c,q} = w_c . patch_q + b_c with w_c isotropic over its c_in k^2
    entries: E a^2 = row_sq ||patch_q||^2 / (c_in k^2) + beta, and ||patch_q||^2 sums e over
    the k x k window (zero padding reads nothing); summed over c_out channels:
        e'(q) = (c_out row_sq / (c_in k^2)) box(e)(q) + c_out beta
    (the bias term: ``conv_bias_energy``).  With all of the row on the centre tap
    (delta-orthogonal) E a^2 = row_sq ||h_q||^2 / c_in and e'(q) = (c_out row_sq / c_in) e(s q).
    A ReLU halves it (the pre-activation is symmetric)."""
    per_tap = m.c_out * m.row_sq / (m.c_in * (1 if m.taps == "centre" else m.kernel**2))
    return weight_map(e, 0.5 * per_tap if relu else per_tap, _windows(m, e.shape))


def conv_bias_energy(m: ConvMoments, relu: bool) -> float:
    """The bias part of e'(q): c_out beta per position (halved by a ReLU)."""
    return (0.5 if relu else 1.0) * m.c_out * m.bias_var
