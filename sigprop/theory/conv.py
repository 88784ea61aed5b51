"""Convolutions: the per-position energy map of a zero-padded conv layer (docs/theory.md §11)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


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


def _windows(m: ConvMoments, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The layer's window along each axis of an input map of ``shape``."""
    return tuple(
        conv_window(n, m.out_size(n), m.kernel, m.stride, m.padding, 1, m.taps == "centre") for n in shape
    )


def conv_box(e: np.ndarray, m: ConvMoments) -> np.ndarray:
    """sum over the taps t of e(s q + t - pad), zeros outside the image (isotropic taps), or the
    centre tap alone: [H, W] -> [H', W'] (the windows of each axis, ``conv_window``)."""
    a_h, a_w = _windows(m, e.shape)
    return a_h @ e @ a_w.T


def conv_box_adjoint(d: np.ndarray, m: ConvMoments, shape: tuple[int, int]) -> np.ndarray:
    """The transpose of ``conv_box``: scatter d(q) onto the input positions its taps read."""
    a_h, a_w = _windows(m, shape)
    return a_h.T @ d @ a_w


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
    out = per_tap * conv_box(e, m)
    return 0.5 * out if relu else out


def conv_bias_energy(m: ConvMoments, relu: bool) -> float:
    """The bias part of e'(q): c_out beta per position (halved by a ReLU)."""
    return (0.5 if relu else 1.0) * m.c_out * m.bias_var
