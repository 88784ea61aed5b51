"""The cosine of two inputs' forward states (``--correlation C0``; docs/theory.md §10): the walk
runs P input pairs (rows i and P + i, ``kernels.sampling.pair_inputs``) and this observer reads
the cosine of each pair's states at every row; ``attach`` puts its statistics beside the net
kind's infinite-width prediction, summarises each input cosine and adds the
``--max-correlation`` gate."""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from sigprop import stats, theory
from sigprop.observers import Observer, collector
from sigprop.results import CorrelationStats, CorrelationSummary, CosineCheck, RunResult


@collector("correlation")
class Correlation(Observer):
    """The cosine of the two forward states of each input pair [S, E, P], computed in float64
    (so it stays in [-1, 1] to rounding whatever the compute dtype; nan where a state is zero,
    e.g. an all-dead ReLU layer)."""

    name = "correlation"

    def start(self, w, entries):
        self.pairs = w.n // 2
        self.buf = torch.empty(w.S, entries, self.pairs, dtype=torch.float64, device=w.device)

    def forward(self, w, entry, state, out):
        r = w.space.rows(state).to(torch.float64)
        a, b = r[:, : self.pairs], r[:, self.pairs :]
        norms = torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1)
        dot = (a * b).sum(dim=-1)
        torch.where(
            norms > 0,
            dot / torch.where(norms > 0, norms, 1.0),
            torch.full_like(dot, math.nan),
            out=self.buf[:, entry],
        )

    def result(self):
        return self.buf


def attach(
    run: RunResult,
    kind,
    scheme,
    spec,
    plan,
    arr: np.ndarray | None,
    c0s,
    pairs: int,
    max_correlation: float | None,
    dtype: str = "float32",
    z: float = theory.Z_AGREEMENT,
) -> None:
    """Per row and input cosine the measured mean and sd of the pairs' cosines (``arr`` [S, C,
    E, P]: over pairs and draws) beside the kind's prediction (``kind.correlation``), a summary
    per cosine, and the ``--max-correlation`` check (the last state's mean for c0 = 0).

    Agreement (docs/theory.md §10, "Finite-width band"; only where ``kind.correlation_band``):
    the mean lies within z sd of the prediction (sd: one pair's spread; plus the rounding of the
    compute dtype -- a cosine of rows perturbed by a relative d moves by at most 2d,
    ``stats.rounding_ln`` over the entries -- so that an exact c = 1 can be met in float32), or
    1 - mean lies within a factor exp(z s) of 1 - predicted, s the fitted across-draw sd of
    ln(1 - c) (``theory.correlation_collapse_sd``): near collapse the pairs agree with each
    other far better than one draw agrees with the infinite width."""
    if arr is None:
        return
    slack = 2.0 * stats.rounding_ln(dtype, arr.shape[2])
    collapse = theory.correlation_collapse_sd([r.width for r in run.layers])
    first = kind.correlation_first(plan)
    for k, c0 in enumerate(c0s):
        a = arr[:, k]
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", RuntimeWarning
            )  # an entry where every pair is dead: nan (JSON null)
            mean, sd = np.nanmean(a, axis=(0, 2)), np.nanstd(a, axis=(0, 2))
        pred, reason = kind.correlation(scheme, spec, plan, c0, 2 * pairs)
        for i, rec in enumerate(run.layers):
            p = None if pred is None else pred[i]
            agrees = (
                stats.cosine_agrees(float(mean[i]), float(sd[i]), p, collapse[i], slack, z)
                if kind.correlation_band
                else None
            )
            rec.correlation.append(CorrelationStats(c0, float(mean[i]), float(sd[i]), p, agrees))
        run.correlations.append(
            CorrelationSummary(
                c0,
                float(mean[-1]),
                None if pred is None else pred[-1],
                theory.correlation_depth_scale(c0, [float(v) for v in mean[first:]]),
                None if pred is None else theory.correlation_depth_scale(c0, pred[first:]),
                reason,
            )
        )
        if max_correlation is not None and c0 == 0.0:
            passed = bool(math.isfinite(mean[-1]) and mean[-1] <= max_correlation)
            note = "" if passed else "deep ReLU nets map inputs towards one direction (docs/theory.md §10)"
            run.checks.append(
                CosineCheck(
                    "end-to-end mean cosine of input pairs with cosine 0",
                    passed,
                    float(mean[-1]),
                    max_correlation,
                    note=note,
                )
            )
