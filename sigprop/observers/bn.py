"""The batch statistics of the BN ResNet's states (torch): what a BN layer at x would record (De &
Smith 2020, appendix B) -- the variance of x over channels and examples, the mean per-channel
batch variance, the mean squared per-channel batch mean; beside l, l(1 - 1/pi), l/pi in the
ResNet kind (sigprop/kinds/resnet.py, ``bn_record``)."""

from __future__ import annotations

import torch

from sigprop.kernels.logspace import bn_record
from sigprop.observers import Observer, collector


@collector("bn")
class BNStatistics(Observer):
    """Per draw and entry [S, E, 3] (plain-float states: ``state["X"]``)."""

    name = "bn"

    def start(self, w, entries):
        self.buf = torch.empty(w.S, entries, 3, dtype=torch.float64, device=w.device)

    def forward(self, w, entry, state, out):
        X = state["X"]
        mu = X.mean(dim=-2, keepdim=True)
        var = X.var(dim=-2, unbiased=False, keepdim=True)
        self.buf[:, entry] = bn_record(X, mu, var)

    def result(self):
        return self.buf
