"""A run's record, assembled by the engine from what the kind declares (``Kind.run_theory``: a
``kinds.base.RunTheory``) and what the walks measured: per row the ratios' statistics beside the
prediction and its finite-width band (``stats.attach_prediction``), the branch ratio of a
residual net's block beside its own, then the kind's rows (``Kind.annotate``) and verdicts
(``Kind.verdicts``).  One loop for every net of the plan engine (until 0.17 each kind wrote its
own), and the sites of a user's model beside their traced predictions (``assemble_traced``, the
model engine's; until 0.17 the module kind's).  No torch here."""

from __future__ import annotations

import math

import numpy as np

from sigprop import plans, stats, theory
from sigprop.kinds.base import RunTheory
from sigprop.results import LayerRecord, RunResult


def _at(values, i: int):
    """values[i], or None where the theory has none."""
    return None if values is None or len(values) == 0 else values[i]


def rows(arrays: dict, th, dtype: str) -> list[LayerRecord]:
    """Per recorded row i (arrays ``fwd``/``bwd`` [S, R, draws]) its forward and backward
    statistics beside the prediction at i with the spread's variance there (and its exact drift
    where ``th.drift``), the separation and the rounding allowance of the probe's ``dtype`` over the
    rows (``stats.rounding_ln``: one rule for every kind); a residual net's row with its
    stage and, from ``th.first_branch`` on, the branch ratio of the block that produced it.  Row
    i's index is its position in ``th.widths`` (the last R of them: an MLP's and a CNN's widths
    begin with the input, which has no row)."""
    ln_f, ln_b = arrays["fwd"], arrays["bwd"]
    R = ln_f.shape[1]
    off, rounding = len(th.widths) - R, stats.rounding_ln(dtype, R)
    pred, sep, spread = th.pred, th.sep, th.spread
    ways = ((pred.ln_forward, spread.forward, sep.forward), (pred.ln_backward, spread.backward, sep.backward))
    layers = []
    for i in range(R):
        f, b = stats.ratio_stats(ln_f[:, i, :]), stats.ratio_stats(ln_b[:, i, :])
        for st, (ln_pred, cum, separation) in zip((f, b), ways):
            stats.attach_prediction(
                st,
                _at(ln_pred, i),
                float(cum[i, 1]),
                rounding=rounding,
                drift=float(cum[i, 0]) if th.drift else None,
                separation=_at(separation, i),
            )
        br = None
        k = -1 if th.first_branch is None else i - th.first_branch  # the block producing row i
        if k >= 0:
            br = stats.ratio_stats(arrays["branch"][:, k, :])
            stats.attach_prediction(br, _at(pred.ln_branch, k), spread.branch[k], rounding=rounding)
        rec = LayerRecord(index=i + off, width=th.widths[i + off], forward=f, backward=b, branch=br)
        if th.stages is not None:  # a residual net's row: its stage
            rec.stage, rec.resnet = th.stages[i], True
        layers.append(rec)
    return layers


def assemble(kind, name: str, scheme, spec, plan, arrays: dict, probe, gate) -> RunResult:
    """One init's ``RunResult``: the kind's theory of the run, its rows paired with it (``rows``),
    the kind's additions to them and its verdicts."""
    th = kind.run_theory(scheme, spec, plan, probe)
    layers = rows(arrays, th, probe.dtype)
    kind.annotate(layers, arrays, probe)
    return _judged(kind, name, th, spec, plan, arrays, layers, gate)


def _judged(kind, name: str, th, spec, plan, arrays: dict, layers: list, gate, ends=None) -> RunResult:
    """The ``RunResult`` of assembled rows with the kind's verdicts on them."""
    checks, stages = kind.verdicts(th, spec, plan, arrays, layers, gate)
    return RunResult(
        init=name,
        widths=list(th.widths),
        layers=layers,
        checks=checks,
        description=th.description,
        stages=stages,
        gate=gate.gate,
        ends=ends,
    )


def rms_over_draws(ln_pred) -> list[float | None]:
    """Per site the ln of the RMS over draws of each draw's predicted RMS ratio (None: no map)."""
    out: list[float | None] = []
    for col in np.asarray(ln_pred, dtype=np.float64).T:
        out.append(None if not np.all(np.isfinite(col)) else 0.5 * math.log(float(np.mean(np.exp(2 * col)))))
    return out


def site_rows(plan, arrays: dict, probe, reached, preds, z: float = theory.Z_CHECK) -> list[LayerRecord]:
    """One row per site of a user's model: the measured ratios with their traced predictions
    (``preds``: RMS over draws) and bands (``stats.attach_traced``: z standard errors of the run
    plus the maps' stated accuracy, docs/theory.md §15), the token statistics; a site off the
    output's path (``reached`` False: a side head) has no backward ratio."""
    pf, pb = preds
    rounding = stats.rounding_ln(probe.dtype, len(plan.sites))
    layers = []
    for i, site in enumerate(plan.sites):
        f = stats.ratio_stats(arrays["fwd"][:, i, :])
        b = stats.ratio_stats(arrays["bwd"][:, i, :]) if reached[i] else stats.no_ratio()
        stats.attach_traced(f, arrays["fwd"][:, i, :], pf[i], theory.MAP_ACCURACY_FORWARD, rounding, z)
        if reached[i]:
            stats.attach_traced(b, arrays["bwd"][:, i, :], pb[i], theory.MAP_ACCURACY_BACKWARD, rounding, z)
        layers.append(
            LayerRecord(
                i + 1, plan.entries[i], f, b, name=site, off_path=not reached[i], tokens=_tokens(arrays, i, z)
            )
        )
    return layers


def _tokens(arrays: dict, i: int, z: float):
    """Site i's token statistics (None: the run measured no token sequence there)."""
    if "cosine" not in arrays:
        return None
    entropy = arrays["entropy"][:, i, :] if "entropy" in arrays else None
    pred = arrays["pred_cosine"][:, i] if "pred_cosine" in arrays else None
    pred_h = arrays["pred_entropy"][:, i] if "pred_entropy" in arrays else None
    return stats.token_stats(arrays["cosine"][:, i, :], entropy, pred, z, pred_h)


def assemble_traced(kind, name: str, scheme, spec, plan, arrays: dict, probe, gate) -> RunResult:
    """One init's ``RunResult`` of a user's model: per site the ratios beside the traced
    prediction (the model engine's per-draw composed maps, ``arrays["pred_fwd"]``/``pred_bwd``)
    with its band (``site_rows``), then the kind's verdicts; the rows they read (``ends``: the
    last and the first site on the output's path)."""
    E = len(plan.sites)
    pf, pb = rms_over_draws(arrays["pred_fwd"]), rms_over_draws(arrays["pred_bwd"])
    reached = np.asarray(arrays.get("reached", np.ones((1, E)))).any(axis=0)
    layers = site_rows(plan, arrays, probe, reached, (pf, pb))
    th = RunTheory(
        plans.Prediction(pf, pb, None, None),
        plans.Separation(None, None),
        None,
        list(plan.entries),
        scheme.description,
    )
    on = [i for i in range(E) if reached[i]]
    return _judged(kind, name, th, spec, plan, arrays, layers, gate, (on[-1], on[0]) if on else None)
