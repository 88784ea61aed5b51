"""The norm ratios of a walk (torch): forward ln ||h|| / ||x||, backward ln ||dl/d(state)|| / ||e||
at every recorded state, and the branch ratio ln ||alpha F(h)|| / ||h|| of every residual unit --
the measurements of Arpit et al. 2019, Figure 1.  Their statistics beside the predictions are the
net kinds' (sigprop/kinds/, with sigprop/stats.py)."""

from __future__ import annotations

import torch

from sigprop.observers import Observer, collector


@collector("fwd")
class ForwardRatio(Observer):
    """ln ||h|| / ||x|| per draw, entry and sample [S, E, N] (float64)."""

    name = "fwd"

    def start(self, w, entries):
        self.buf = torch.empty(w.S, entries, w.n, dtype=torch.float64, device=w.device)

    def forward(self, w, entry, state, out):
        w.space.ln_forward(state, w.ref, self.buf[:, entry])

    def result(self):
        return self.buf


@collector("bwd")
class BackwardRatio(ForwardRatio):
    """ln ||dl/d(entry)|| / ||e|| [S, E, N]: the top entry is the reference (0)."""

    name = "bwd"

    def forward(self, w, entry, state, out):
        pass

    def top(self, w, entry):
        self.buf[:, entry].zero_()  # a fill kernel: no Python scalar lifted onto the device

    def backward(self, w, entry, grad, ref):
        w.space.ln_backward(grad, ref, self.buf[:, entry])


@collector("branch")
class BranchRatio(Observer):
    """ln ||alpha F(h)|| / ||h|| of every residual unit [S, B, N] (units that report ``branch``)."""

    name = "branch"

    def start(self, w, entries):
        count = sum(1 for u in w.units if u.branch)
        self.buf = torch.empty(w.S, count, w.n, dtype=torch.float64, device=w.device)
        self.k = 0

    def forward(self, w, entry, state, out):
        if out is not None and "branch" in out:
            self.buf[:, self.k].copy_(out["branch"])
            self.k += 1

    def result(self):
        return self.buf
