"""A probe's records (``sigprop.result.v1``): per layer the ratio statistics beside their
prediction and band, the BN statistics and the cosines, per init the run with its two verdicts
(``preserved``, ``theory``), and the document.  Plain data; no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sigprop.results.common import RESULT_SCHEMA, VERDICTS, Check, Measurement, _num

#: an agreement band wider than this many decades cannot test the theory (docs/theory.md §4)
INFORMATIVE_DECADES = 2.0


#: the ``~`` mark in the kinds' footers
NO_TEST = "~ within a band wider than the step to every layer's variance halved or doubled: no test"


def separates(low: float, high: float, separation: tuple[float, float]) -> bool:
    """A band [low, high] is a test of the init when it is narrower than the shift of the
    prediction to either alternative (every weight layer's variance halved, doubled:
    ``separation`` = (down, up)): then the alternative's own band, as wide, does not overlap it,
    and a net of the alternative init reads outside it (docs/theory.md §4, "Which bands are a
    test")."""
    down, up = separation
    return min(up, -down) > high - low


@dataclass
class RatioStats:
    """One direction (forward or backward) at one layer: measured beside predicted (habit 4).

    ``mean``/``std``/``rms`` are of the ratio itself (None when they do not fit a float64);
    ``std`` is the spread across samples (pooled within draws), ``draw_std`` the spread of the
    per-draw mean across draws (None with one draw).  ``log10_*`` are of log10(ratio) and are
    always finite (``log10_mean`` is over the samples whose ratio is non-zero; ``dead_fraction``
    counts those that are exactly zero, e.g. all-dead ReLU layers at width 1).
    ``predicted`` is the closed-form RMS ratio (None where no closed form exists); ``agrees``
    tells whether the measured RMS lies within the finite-width band ``[log10_low, log10_high]``
    around it.
    """

    mean: float | None
    std: float | None
    rms: float | None
    log10_mean: float | None
    log10_std: float | None
    log10_rms: float | None
    draw_std: float | None
    log10_draw_std: float | None
    dead_fraction: float
    predicted: float | None = None
    log10_predicted: float | None = None
    log10_low: float | None = None
    log10_high: float | None = None
    agrees: bool | None = None
    #: the predicted *typical* (geometric-mean) ratio: the RMS prediction moved by the
    #: finite-width drift -- what ``log10_mean`` is compared with (docs/theory.md §4)
    log10_predicted_typical: float | None = None
    #: the predicted sd of log10(ratio) across samples and draws (sqrt of the finite-width
    #: variance, docs/theory.md §4): it bounds the spread of the typical ratio across draws
    log10_std_predicted: float | None = None
    #: (down, up): how far the prediction moves (log10) with every weight layer's variance halved
    #: and doubled -- what separates this init from one off by that factor (docs/theory.md §4,
    #: "Which bands are a test"); None where the kind does not say
    log10_separation: tuple[float, float] | None = None
    #: a traced band's power: the smallest miss of the maps (log10 of measured/predicted) it
    #: catches in ``theory.POWER_LEVEL`` of runs, and the draws (--seeds) at which it would catch
    #: ``theory.POWER_TARGET`` (this run's when it already does); None without a traced band
    #: (docs/theory.md §15, "A band's power")
    log10_power: float | None = None
    draws_for_power: int | None = None

    @property
    def informative(self) -> bool | None:
        """Whether the agreement band is a test: it must be narrower than the shift of the
        prediction with every weight layer's variance halved or doubled (``log10_separation``,
        ``separates``), else it cannot tell this init from one off by a factor of two per layer --
        a batch-normalised net, whose ratios do not depend on the weights' scale, or a band
        widened by few units.  A kind that gives no separation falls back on a width of
        ``INFORMATIVE_DECADES``."""
        if self.log10_low is None or self.log10_high is None or self.log10_predicted is None:
            return None
        if self.log10_separation is None:
            return self.log10_high - self.log10_low <= INFORMATIVE_DECADES
        return separates(self.log10_low, self.log10_high, self.log10_separation)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": _num(self.mean),
            "std": _num(self.std),
            "rms": _num(self.rms),
            "log10_mean": _num(self.log10_mean),
            "predicted": _num(self.predicted),
            "log10_std": _num(self.log10_std),
            "log10_rms": _num(self.log10_rms),
            "draw_std": _num(self.draw_std),
            "log10_draw_std": _num(self.log10_draw_std),
            "dead_fraction": float(self.dead_fraction),
            "log10_predicted": _num(self.log10_predicted),
            "log10_predicted_typical": _num(self.log10_predicted_typical),
            "log10_std_predicted": _num(self.log10_std_predicted),
            "agreement": {
                "log10_low": _num(self.log10_low),
                "log10_high": _num(self.log10_high),
                "agrees": self.agrees,
                "informative": self.informative,
                "log10_separation": None
                if self.log10_separation is None
                else [_num(v) for v in self.log10_separation],
                "log10_power": _num(self.log10_power),
                "draws_for_power": self.draws_for_power,
            },
        }


@dataclass
class BNStats:
    """Batch statistics of one BN-ResNet entry x^l (De & Smith 2020, appendix B/C), measured beside predicted:
    the variance of x^l over channels and examples, the mean over channels of the per-channel batch
    variance (moving variance with momentum 0) and of the squared per-channel batch mean.  Means
    over weight draws; ``*_draw_std`` their spread across draws (None with one draw)."""

    skip_variance: float
    moving_variance: float
    moving_squared_mean: float
    predicted_skip_variance: float
    predicted_moving_variance: float
    predicted_moving_squared_mean: float
    skip_variance_draw_std: float | None = None
    moving_variance_draw_std: float | None = None
    moving_squared_mean_draw_std: float | None = None

    KEYS = ("skip_variance", "moving_variance", "moving_squared_mean")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self.KEYS:
            out[k] = {
                "measured": _num(getattr(self, k)),
                "predicted": _num(getattr(self, f"predicted_{k}")),
                "draw_std": _num(getattr(self, f"{k}_draw_std")),
            }
        return out


@dataclass
class CorrelationStats:
    """One input cosine c0 at one layer: the cosine of the two forward states of a pair, mean and
    sd over the P pairs and the draws, beside the infinite-width prediction (docs/theory.md §10).
    ``agrees``: |mean - predicted| <= z sd, sd the spread of one pair's cosine (None without a
    prediction)."""

    c0: float
    mean: float
    std: float
    predicted: float | None = None
    agrees: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "c0": self.c0,
            "mean": _num(self.mean),
            "std": _num(self.std),
            "predicted": _num(self.predicted),
            "agrees": self.agrees,
        }


@dataclass
class TokenStats:
    """At one site whose output is a sequence of tokens: the mean cosine between the tokens of one
    sample (``model.measure.token_cosine``), its mean and sd over the samples (pooled over the
    draws), the sd of the per-draw mean across draws (None with one draw), beside a prediction
    where a map gives one (None: measured only); and the normalised entropy of the attention
    weights computed inside the site (``model.attention``; None: no attention read there), mean
    and sd over the samples (docs/theory.md §15)."""

    mean: float
    std: float
    draw_std: float | None = None
    predicted: float | None = None
    agrees: bool | None = None
    entropy: float | None = None
    entropy_std: float | None = None
    #: the entropy the traced attention's maps predict (docs/theory.md §16; None: no map)
    entropy_predicted: float | None = None
    #: the half-width of the prediction's band: z standard errors of the run's mean plus the
    #: maps' stated accuracy (``stats.token_stats``; None: no prediction)
    tolerance: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": _num(self.mean),
            "std": _num(self.std),
            "draw_std": _num(self.draw_std),
            "predicted": _num(self.predicted),
            "tolerance": _num(self.tolerance),
            "agrees": self.agrees,
        }

    def entropy_dict(self) -> dict[str, Any] | None:
        if self.entropy is None:
            return None
        return {
            "mean": _num(self.entropy),
            "std": _num(self.entropy_std),
            "predicted": _num(self.entropy_predicted),
        }


@dataclass
class CorrelationSummary:
    """One input cosine over the whole net: the last state's mean cosine, the depth scale
    (layers or blocks until 1 - c has fallen by e from 1 - c0; None: it never does), measured
    and predicted, and why there is no prediction when there is none."""

    c0: float
    end_mean: float
    end_predicted: float | None
    depth_scale: int | None
    predicted_depth_scale: int | None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "c0": self.c0,
            "end_mean": _num(self.end_mean),
            "end_predicted": _num(self.end_predicted),
            "depth_scale": self.depth_scale,
            "predicted_depth_scale": self.predicted_depth_scale,
            "no_prediction_because": self.reason or None,
        }


@dataclass
class LayerRecord:
    """One row: an MLP layer, or a ResNet entry h^index (then with ``stage``, the ``branch`` ratio
    ||alpha F_b(h^{b-1})||/||h^{b-1}|| of the block that produced it, and ``bn`` for the BN net)."""

    index: int
    width: int
    forward: RatioStats
    backward: RatioStats
    stage: int | None = None
    branch: RatioStats | None = None
    bn: BNStats | None = None
    resnet: bool = False
    #: one entry per input cosine of ``--correlation`` (empty without it)
    correlation: list[CorrelationStats] = field(default_factory=list)
    #: the row's name where rows have names (a model's site, ``layer3.4``)
    name: str | None = None
    #: a model's site that the output's gradient does not reach (a side head): no backward ratio,
    #: read by no verdict
    off_path: bool = False
    #: a model's site whose output is a sequence of tokens: the mean cosine between its tokens
    tokens: TokenStats | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"index": self.index, "width": self.width}
        if self.name is not None:
            d["site"] = self.name
            d["off_output_path"] = self.off_path
        if self.resnet:
            d["stage"] = self.stage
        d["forward"] = self.forward.to_dict()
        d["backward"] = self.backward.to_dict()
        if self.resnet:
            d["branch"] = None if self.branch is None else self.branch.to_dict()
            if self.bn is not None:
                d["bn"] = self.bn.to_dict()
        if self.correlation:
            d["correlation"] = [c.to_dict() for c in self.correlation]
        if self.name is not None:
            d["token_cosine"] = None if self.tokens is None else self.tokens.to_dict()
            d["attention_entropy"] = None if self.tokens is None else self.tokens.entropy_dict()
        return d


@dataclass
class CosineCheck:
    """``--max-correlation X``: the last state's mean cosine of input pairs with cosine 0 must
    not exceed X (verdict "correlation"); ``--max-token-cosine X``: the mean cosine between the
    tokens of one sample at the last site on the output's path must not exceed X (verdict
    "tokens").  ANDed into ``passed`` whatever the gate."""

    name: str
    passed: bool
    cosine: float
    high: float
    verdict: str = "correlation"
    note: str = ""
    has_band = True
    log10_measured = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "passed": self.passed,
            "note": self.note,
            "measured": _num(self.cosine),
            "low": None,
            "high": _num(self.high),
        }


@dataclass
class StageInfo:
    """A ResNet stage: entries h^first (its input) .. h^last, widths d_in -> d_out, and the
    --check band of its forward and backward ratios before the finite-width widening."""

    stage: int
    first: int
    last: int
    d_in: int
    d_out: int
    blocks: int
    forward_band: tuple[float, float]
    backward_band: tuple[float, float]
    predicted_forward: float | None = None
    predicted_backward: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "first": self.first,
            "last": self.last,
            "d_in": self.d_in,
            "d_out": self.d_out,
            "blocks": self.blocks,
            "forward_band": [_num(v) for v in self.forward_band],
            "backward_band": [_num(v) for v in self.backward_band],
            "predicted_forward": _num(self.predicted_forward),
            "predicted_backward": _num(self.predicted_backward),
        }


def _verdict_words(run) -> str:
    kept = "signal preserved" if run.preserved else "signal NOT preserved"
    agree = (
        "agrees with theory"
        if run.agrees_with_theory
        else ("not testable against theory" if run.untestable else "disagrees with theory")
    )
    return f"{kept}, {agree}"


@dataclass(repr=False)
class RunResult:
    init: str
    widths: list[int]
    layers: list[LayerRecord]
    checks: list[Check]
    description: str = ""
    #: ResNet runs: the stages (spans, bands); None for an MLP
    stages: list[StageInfo] | None = None
    #: the verdict ``passed`` (and ``--check``) reports: "preserved" or "theory"
    gate: str = "preserved"
    #: one per input cosine of ``--correlation``
    correlations: list[CorrelationSummary] = field(default_factory=list)
    #: one per plug-in observer (``--observe``; sigprop/observers/)
    measurements: list["Measurement"] = field(default_factory=list)
    #: the rows the verdicts read (forward, backward), where not the last and the first (a model
    #: whose last sites are off the output's path)
    ends: tuple[int, int] | None = None

    @property
    def end_rows(self) -> tuple["LayerRecord", "LayerRecord"]:
        """The rows whose end-to-end ratios the verdicts read: forward, backward."""
        last, first = self.ends if self.ends is not None else (-1, 0)
        return self.layers[last], self.layers[first]

    def verdict_checks(self, verdict: str) -> list[Check]:
        return [c for c in self.checks if c.verdict == verdict]

    def verdict(self, verdict: str) -> bool:
        """True when every check of that verdict passed (and there is at least one)."""
        cs = self.verdict_checks(verdict)
        return bool(cs) and all(c.passed for c in cs)

    @property
    def preserved(self) -> bool:
        """The signal survives: the typical ratios lie in the absolute band."""
        return self.verdict("preserved")

    @property
    def agrees_with_theory(self) -> bool:
        """The typical ratios agree with this init's own finite-width prediction."""
        return self.verdict("theory")

    def extra_checks(self) -> list:
        """The gates beside the two verdicts: the ``--max-correlation`` bound, a plug-in
        observer's; each is ANDed into ``passed`` whatever the gate."""
        return [c for c in self.checks if c.verdict not in VERDICTS]

    def gate_checks(self) -> list:
        """What ``--check`` gates on: the gate's checks and the extra gates (``extra_checks``)."""
        return self.verdict_checks(self.gate) + self.extra_checks()

    @property
    def untestable(self) -> bool:
        """The ``theory`` verdict fails only for want of a prediction: every check that has a
        band passed, and some have none (e.g. ``datadep`` backward).  ``agrees_with_theory`` is
        False then (nothing was verified); the words say "not testable", not "disagrees"."""
        cs = self.verdict_checks("theory")
        return any(not c.has_band for c in cs) and all(c.passed for c in cs if c.has_band)

    @property
    def passed(self) -> bool:
        """The verdict of the gate (``gate``), and the correlation bound when one was asked."""
        return self.verdict(self.gate) and all(c.passed for c in self.extra_checks())

    def __repr__(self) -> str:
        end = self.end_rows[0].forward if self.layers else None
        typical = (
            ""
            if end is None or end.log10_mean is None
            else f", typical end-to-end forward ratio 10^{end.log10_mean:.3g}"
        )
        return f"RunResult({self.init}: {_verdict_words(self)}{typical}, {len(self.layers)} layers)"

    def agreement(self) -> dict[str, Any]:
        out = {}
        directions = ("forward", "backward", "branch") if self.stages is not None else ("forward", "backward")
        for direction in directions:
            stats = [getattr(r, direction) for r in self.layers if getattr(r, direction) is not None]
            stats = [s for s in stats if s.agrees is not None]
            out[direction] = {
                "layers_compared": len(stats),
                "layers_agreeing": sum(s.agrees for s in stats),
                "layers_uninformative": sum(1 for s in stats if s.informative is False),
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "init": self.init,
            "description": self.description,
            "widths": list(self.widths),
            "layers": [r.to_dict() for r in self.layers],
            "checks": [c.to_dict() for c in self.checks],
            "gate": self.gate,
            "passed": self.passed,
            "preserved": self.preserved,
            "agrees_with_theory": self.agrees_with_theory,
            "agreement": self.agreement(),
            **({} if self.stages is None else {"stages": [st.to_dict() for st in self.stages]}),
            **({"correlation": [c.to_dict() for c in self.correlations]} if self.correlations else {}),
            **({"measurements": [m.to_dict() for m in self.measurements]} if self.measurements else {}),
        }


def probe_config(command: str, spec, probe, gate, **net: Any) -> dict[str, Any]:
    """The ``config`` of a result document: the command, the net's spec, the probe, the gate,
    then what the run resolved (``widths``; ``stage_dims``, ``hidden_widths``)."""
    return {"command": command, **spec.to_dict(), **probe.__dict__, **gate.to_dict(), **net}


@dataclass(repr=False)
class ProbeResult:
    command: str
    config: dict[str, Any]
    environment: dict[str, Any]
    runs: list[RunResult]
    tolerances: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.runs)

    def __repr__(self) -> str:
        shape = ", ".join(
            f"{k} {self.config[k]}"
            for k in ("depth", "blocks", "stages", "width", "samples", "seeds")
            if k in self.config
        )
        runs = "; ".join(f"{r.init}: {_verdict_words(r)}" for r in self.runs)
        return f"ProbeResult({self.command}, {shape}, device {self.environment.get('device')}: {runs})"

    def run(self, init: str) -> RunResult:
        """The run of one init: ``result.run("proposed").layers[0].forward.mean``."""
        for r in self.runs:
            if r.init == init:
                return r
        raise KeyError(f"no run for init {init!r}; runs: {', '.join(r.init for r in self.runs)}")

    @property
    def layers(self) -> list[LayerRecord]:
        """The layers of the only run (one init); with several inits use ``run(name).layers``."""
        if len(self.runs) != 1:
            raise AttributeError(
                f"{len(self.runs)} inits were probed; use result.run(name).layers or result.runs[i].layers"
            )
        return self.runs[0].layers

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": RESULT_SCHEMA,
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "tolerances": self.tolerances,
            "runs": [r.to_dict() for r in self.runs],
            "passed": self.passed,
        }
