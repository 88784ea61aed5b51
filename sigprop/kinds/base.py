"""The net kinds' common ground: ``Kind`` (what a kind declares), ``Opt`` (one option, from
sigprop/options.py), ``Hints`` (what rendering reads), ``RunTheory`` (a run's theory, which the
engine pairs with its measurements), ``Memory`` (a kind's memory plan), the registry ``KINDS``
with ``register``, ``get``, ``of``, and the helpers the kinds share.  No torch, and no kind
here: the kind files import this module, and sigprop/kinds/__init__.py imports them (so nothing
imports back the package that imports it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from sigprop import inits, plans, specs, stats
from sigprop.errors import SigpropError
from sigprop.options import Opt
from sigprop.registry import Registry
from sigprop.results import StageInfo


@dataclass(frozen=True)
class Hints:
    """What the table and the figure need to know of a kind (rendering reads these; it never
    names a kind).  ``residual``: the rows are states of a residual stream (b, stage, branch
    columns; stage bands); ``width``: the width column's label; ``row``: the first column's;
    ``footer``: the line under the tables; ``x``, ``forward``, ``backward``: the figure's axis
    labels (matplotlib mathtext); ``units``: what a row counts in notes ("layers", "blocks");
    ``energy``: the prediction is the energy-map RMS (conv nets: drawn dotted as such); ``names``:
    the rows have names (``LayerRecord.name``), which the table and the figure show;
    ``curvature_parameters``: the Hessian's parameters in words; ``spread``: where the
    spread line's sd comes from."""

    width: str = "n_l"
    row: str = "layer"
    residual: bool = False
    footer: str = ""
    x: str = r"layer $l$"
    forward: str = r"$\|h^l\| \,/\, \|x\|$"
    backward: str = r"$\|\partial\ell/\partial a^l\| \,/\, \|\partial\ell/\partial a^L\|$"
    units: str = "layers"
    energy: bool = False
    #: what the dotted RMS prediction is, in the figure's legend
    rms_label: str = "energy-map RMS ratio"
    #: rows carry names (a model's sites: ``layer3.4``), shown beside the index
    names: bool = False
    #: what ``sigprop hessian`` differentiates in, before the head ({head}: the head's words)
    curvature_parameters: str = "every trainable parameter (WN g, v, b; BN gamma, beta; {head})"
    #: where the across-draw sd of the end-to-end ratio in the spread line comes from: "theory"
    #: (an estimate), "envelope" (an upper envelope, the conv nets' law: measured 1.4x (CNN) to 30x
    #: (WRN) wider; docs/theory.md section 11) or "run" (a traced model's: one sample's spread in
    #: this run times the draw share; docs/theory.md section 13)
    spread: str = "theory"
    #: ``sigprop spectrum``'s theory in words, under its table
    spectrum_theory: str = (
        "theory (large width): mean ∏ g² E[φ'²]; var/mean² gains r·v + μ₂/μ₁² − 1 + max(r − 1, 0) − s₁ "
        "min(r, 1) a layer (r = n_out/n_in) and (2a + a² v_A)/(1 + a)² an identity-skip block "
        "(projections: §14) (free probability: Pennington, Schoenholz & Ganguli 2018); a ReLU output's "
        "inactive units make σ_min = 0 (docs/theory.md §14)"
    )


#: host bytes a recorded row costs a run per init, its plan step included: its statistics'
#: records and their JSON (measured with ``sigprop mlp --width 4 --samples 2`` at 10,000 and
#: 40,000 layers: 14.6 KiB a layer with --format json, 4.8 KiB for the table; 0.4 KiB the plan)
ROW_BYTES = 16 * 1024


@dataclass(frozen=True)
class SweepAxes:
    """How ``sigprop sweep`` sweeps a kind, declared once: its size axis (an option name: depth,
    blocks) and that axis's default values, the width axis's default values and what a width is
    (the help), whether ``--input-dim`` applies (the input set apart from the swept width), and
    the inits a sweep runs when none is named."""

    size: str = "depth"
    sizes: str = "10,20,50"
    widths: str = "128,512"
    width_help: str = "every layer's width"
    input_dim: bool = False
    inits: str = "proposed,he"


class Kind:
    """A net kind: subclass, set the class attributes, implement the methods, ``@register``."""

    name: ClassVar[str]
    #: the command's help (one sentence, cites the paper)
    summary: ClassVar[str]
    #: the spec dataclass; it carries ``kind = name``
    spec: ClassVar[type]
    #: the net's own options (CLI, TOML, API keywords, sweep); ``init`` is added by the CLI
    options: ClassVar[tuple[Opt, ...]] = ()
    #: the help of the --init option (its default inits)
    init_help: ClassVar[str] = "Init scheme (repeatable)."
    #: the inits a run takes when none is named (None: they depend on an option, e.g. --norm;
    #: ``make`` decides), shown as the API keyword's default
    default_inits: ClassVar[tuple[str, ...] | None] = None
    #: the structures inits may need that this net has (sigprop/inits.py: "blocks", "taps")
    provides: ClassVar[frozenset] = frozenset()
    #: inits defined for what it provides that it still does not offer (a model: datadep, which
    #: would calibrate on a batch inside a forward sigprop does not own)
    excluded_inits: ClassVar[frozenset] = frozenset()
    #: what the net does not take, per command ("probe", "hessian", "spectrum"): {option field:
    #: why}, its own options or the command's shared ones.  The CLI leaves them out of the
    #: command's help and refuses them in one line with the reason (the API: the driver)
    refuses: ClassVar[dict[str, dict[str, str]]] = {}
    #: the command's own probe defaults (e.g. fewer samples for a conv net)
    probe_defaults: ClassVar[dict] = {}
    #: ``sigprop hessian``'s synthetic samples when --samples is not given
    curvature_samples: ClassVar[int] = specs.HESSIAN_SAMPLES
    hints: ClassVar[Hints] = Hints()
    #: "the MLP", "ResNets": how messages name the net
    noun: ClassVar[str] = "this net"
    #: the spec fields a memory refusal names, "/"-joined (the probe's and the curvature's)
    size_fields: ClassVar[str] = "samples"
    #: how ``sigprop sweep`` sweeps it (``SweepAxes``; None: the sweep does not take it)
    sweep_axes: ClassVar[SweepAxes | None] = SweepAxes()
    #: the default ``--band`` in words (the CLI's help)
    band_help: ClassVar[str] = "0.1:10 around the reference"
    #: what measures it: "plan" (sigprop's walker over the kind's plan) or "model" (autograd on
    #: a torch.nn.Module the spec builds: sigprop/model/)
    engine: ClassVar[str] = "plan"
    #: ``sigprop hessian`` takes this kind
    curvature: ClassVar[bool] = True

    #: ``sigprop width KIND``'s own options, the net's (None: the kind has no coordinate check)
    width_options: ClassVar[tuple[Opt, ...] | None] = None

    # -- specs -------------------------------------------------------------------------------
    def make(self, values: dict, inits_: tuple[str, ...] | None) -> Any:
        """The spec from option values (CLI strings, TOML or JSON values, API keywords) and the
        init names (None: the kind's defaults)."""
        raise NotImplementedError

    def from_config(self, config: dict) -> Any:
        """The spec a result document's ``config`` records (``sigprop rerun``)."""
        values = {o.name: config[o.name] for o in self.options if o.name in config}
        return self.make(values, tuple(config["inits"]))

    def width_net(self, values: dict) -> Any:
        """The net ``sigprop width`` trains (``sigprop.width.spec.WidthNet``) from the values of
        ``width_options``."""
        raise NotImplementedError

    def width_values(self, values: dict) -> dict:
        """``width_options``' defaults under the ``values`` given, each given or default as text
        parsed by its option's ``parse`` (the API may give the value itself)."""
        out = {o.name: o.default for o in self.width_options} | dict(values)
        for o in self.width_options:
            if o.parse is not None and isinstance(out.get(o.name), str):
                out[o.name] = o.parse(out[o.name])
        return out

    def sweep_spec(self, size: int, width: int, init: str, input_dim: int | None) -> Any:
        """One point of ``sigprop sweep``: the net at this size and width, one init."""
        raise NotImplementedError

    def sweep_fields(self) -> tuple[str, ...]:
        """The options a sweep of this kind takes (``sigprop sweep``; others are refused): its size
        axis and the width, and the input dimension where it is set apart."""
        ax = self.sweep_axes
        return (ax.size, "width") + (("input_dim",) if ax.input_dim else ())

    def sweep_configurations(self, given: dict) -> list[tuple[tuple, Callable[[str], Any]]]:
        """The configurations of a sweep from ``given`` {option: values} (``sweep_fields``; a list
        or a comma-separated string, None: the defaults): per configuration its axes (the swept
        values in the order of the key) and the spec of one init.  Size x width here."""
        ax = self.sweep_axes
        sizes = specs.parse_ints(specs.joined(given.get(ax.size), ax.sizes), ax.size)
        widths = specs.parse_ints(specs.joined(given.get("width"), ax.widths), "width")
        input_dim = given.get("input_dim")
        return [
            (
                ((ax.size, size), ("width", width)),
                lambda init, size=size, width=width: self.sweep_spec(size, width, init, input_dim),
            )
            for size in sizes
            for width in widths
        ]

    def sweep_config(self, spec) -> dict:
        """What a sweep line's ``config`` adds for this kind (part of its resume key)."""
        return {}

    def expand(self, spec) -> list:
        """The specs one command line runs (a kind with a sweep in its options returns one per
        configuration: ``sigprop module --arg depth=10,20``)."""
        return [spec]

    def point_labels(self, points: list) -> list[str]:
        """The configurations of an expanded spec in words, what tells them apart (``depth=10``)."""
        return [""] * len(points)

    def banner(self, spec) -> str:
        """The net in words, for the line a run starts with."""
        raise NotImplementedError

    def describe(self, config: dict) -> str:
        """The net in words from a result's config (the figure's title)."""
        raise NotImplementedError

    # -- running -----------------------------------------------------------------------------
    def inits(self, spec) -> tuple[str, ...]:
        """The init names that run (resolved for the spec's normalization)."""
        return tuple(spec.inits)

    def scheme(self, spec, name: str) -> inits.InitScheme:
        """The scheme an init name means for this spec's net."""
        return inits.INITS[name]

    def plan(self, spec, seed: int):
        """The net as data: an object with ``steps`` (sigprop.plans), ``entries`` (the units of
        each recorded state), ``config`` (what the result's config adds: resolved widths)."""
        raise NotImplementedError

    def rows(self, spec) -> int:
        """The rows (layers or states) a run of ``spec`` records, from the spec alone -- no plan:
        with ``ROW_BYTES`` the host memory its records need, refused before a plan of 10^8
        layers is built (0: not said)."""
        return 0

    def memory(self, spec, probe, itemsize: int, free: int, check: Callable[..., None]) -> "Memory":
        """Plan the run's memory before anything is drawn (a ``Memory``): bounds that need no plan
        first (a plan of 10^9 layers would itself exhaust memory), then the plan and the bytes of
        one draw, streaming the weights when storing them would not fit in 80% of ``free`` (or
        as ``probe.stream`` says); ``check(need, fields, offer_stream=False)`` refuses a need that
        cannot fit, naming the spec fields to reduce (and --stream when it would help).  By default
        the plan's own estimate (``planned``: ``plans.memory`` from its steps); a kind whose plan
        could itself be too large to build adds a bound that needs no plan first."""
        plan = self.plan(spec, probe.seed)
        return planned(plan, probe.samples, itemsize, free, check, self.size_fields, probe.stream)

    def space(self, spec) -> str:
        """How the walker holds states: "log" (per-sample log space) or "plain" (batch-coupled)."""
        return "log"

    def observers(self, spec) -> tuple[str, ...]:
        """The observers (sigprop.observers) of a probe of this net."""
        return ("fwd", "bwd")

    def graphs(self, spec) -> bool:
        """Whether its steps may be captured as CUDA graphs (batch-coupled nets run eagerly)."""
        return True

    def run_theory(self, scheme, spec, plan, probe) -> "RunTheory":
        """What the theory says of one init's run (a ``RunTheory``): the engine pairs every row's
        statistics with it (sigprop/engines/shared.py) before the kind's ``verdicts`` read them."""
        raise NotImplementedError

    def verdicts(self, th: "RunTheory", spec, plan, arrays: dict, layers: list, gate) -> tuple[list, Any]:
        """The run's checks (both verdicts, ``stats``' rules) on its assembled rows ``layers``, and
        its stages' records (None: a net without stages)."""
        raise NotImplementedError

    def annotate(self, layers: list, arrays: dict, probe) -> None:
        """What a kind adds to its assembled rows beyond the ratios (the BN net's batch statistics)."""

    def correlation(self, scheme, spec, plan, c0: float, batch: int) -> tuple[list[float] | None, str]:
        """The infinite-width cosine at every row for inputs of cosine c0, and why there is none."""
        return None, "no correlation map for this net"

    #: the correlation agreement band applies (False: the prediction is shown, not tested)
    correlation_band: ClassVar[bool] = True

    def correlation_first(self, plan) -> int:
        """The first row that is not the input itself (the depth scale counts from it)."""
        return 0

    def band(self, gate) -> list[float]:
        """The ``preserved`` band as the result's tolerances record it."""
        return list(gate.band or specs.DECADE_BAND)

    def curvature_description(self, spec, scheme) -> str:
        """How ``sigprop hessian`` describes the net an init makes."""
        return scheme.description


KINDS: Registry[Kind] = Registry("net", field="command", skip=(__name__,))


def register(cls: type) -> type:
    """Register a Kind subclass (a decorator): ``KINDS[cls.name]``; its spec learns its kind."""
    KINDS.add(cls.name, cls())
    cls.spec.kind = cls.name
    return cls


def get(name: str, field: str = "command") -> Kind:
    """The kind ``name``; unknown names raise with a did-you-mean and the list."""
    try:
        return KINDS.lookup(name)
    except SigpropError as exc:
        raise SigpropError(exc.message, field=field) from None


def of(spec) -> Kind:
    """The kind of a spec (its class says which)."""
    return KINDS[type(spec).kind]


def names() -> list[str]:
    return list(KINDS)


# --------------------------------------------------------------------------------------------
# helpers the kinds share
# --------------------------------------------------------------------------------------------
def init_tuple(spec, provides, noun: str, resolve: Callable[[str], str] | None = None) -> None:
    """``inits`` as a tuple of registry names: a single string is one name (not its characters);
    every name must be defined for the net; none may be named twice (after ``resolve``: with
    --norm none, he is unnormalized-he)."""
    names_ = (spec.inits,) if isinstance(spec.inits, str) else tuple(spec.inits)
    object.__setattr__(spec, "inits", names_)
    if not names_:
        raise SigpropError("give at least one init", field="init")
    for name in names_:
        inits.get(name, provides, noun)
    resolved = tuple(resolve(n) for n in names_) if resolve else names_
    if len(set(resolved)) != len(resolved):
        raise SigpropError(
            "an init is named twice" + (" (with --norm none, he is unnormalized-he)" if resolve else ""),
            field="init",
        )


def need_two_samples(schemes, probe, bn: bool = False) -> None:
    """A data-dependent init or batch norm standardises over the probe batch: >= 2 samples."""
    for s in schemes:
        if s.standardizes and probe.samples < 2:
            raise SigpropError(
                f"init {s.name!r} standardises over the probe batch and needs >= 2 samples", field="samples"
            )
    if bn and probe.samples < 2:
        raise SigpropError("batch normalization needs >= 2 samples in the batch", field="samples")


@dataclass(frozen=True)
class StepSizes:
    """What a captured step of a CUDA-graphed walk keeps (``engines.plan.graph_pool_bytes``): the
    biggest layer's weight entries, the widest state's units and the weight layers a step
    holds."""

    biggest: int
    widest: int
    layers: int = 1


@dataclass(frozen=True)
class RunTheory:
    """What a kind declares of one init's run for the engine to pair with its measurements
    (sigprop/engines/shared.py): the prediction (``plans.Prediction``; its fields None where
    the init has none), the separation that decides whether a band is a test
    (``plans.Separation``), the finite-width spread (``plans.Spread``: per row the ln ratio's
    cumulants both ways, per block the branch's variance), the result's ``widths`` (row i's
    index is its position there), its description, whether the spread's first cumulant is the
    exact drift (the MLP's) or the band takes a log-normal's -var, and a residual net's stage per
    row and the row its first block's branch ratio belongs to.  The rounding allowance is not a
    kind's: the engine's one rule (``stats.rounding_ln`` of the probe's dtype over the rows)."""

    pred: Any
    sep: Any
    spread: Any
    widths: list
    description: str
    drift: bool = False
    stages: list | None = None
    first_branch: int | None = None

    def end(self, backward: bool) -> tuple[float | None, tuple[float, float, float], Any]:
        """What an end-to-end verdict (``stats.end_to_end``) reads of the theory at its row -- the
        last forward, the first backward: the prediction (ln RMS; None: none), the ln ratio's
        cumulants about it (the spread's where its drift is exact, else a log-normal's
        (-var, var, 0): the typical ratio var below the RMS) and the band's separation."""
        i = 0 if backward else -1
        pred = self.pred.ln_backward if backward else self.pred.ln_forward
        sep = self.sep.backward if backward else self.sep.forward
        c = (self.spread.backward if backward else self.spread.forward)[i]
        cumulants = tuple(float(x) for x in c) if self.drift else (-float(c[1]), float(c[1]), 0.0)
        return (pred[i] if pred else None), cumulants, (sep[i] if sep else None)


@dataclass
class Memory:
    """A kind's memory plan: its ``plan``, the bytes of one draw (``need``, weights stored
    unless ``stream``), the fields a refusal names, and the sizes of a captured step
    (``steps``; None for a kind that never walks) when graphs run."""

    plan: Any
    need: int
    stream: bool
    fields: str
    steps: StepSizes | None = None


def planned(plan, samples: int, itemsize: int, free: int, check, fields: str, stream: bool | None) -> Memory:
    """A kind's memory plan from its plan's steps (``plans.memory``): the weights stored where
    they fit in 0.8 of the ``free`` bytes (``stream`` None), else -- or where ``stream`` says so --
    streamed; ``check`` refuses a draw that does not fit even so, naming ``fields`` (and offering
    ``--stream`` where it was refused)."""
    stored = plans.memory(plan.steps, samples, itemsize)
    if stream is None:
        stream = stored.need > 0.8 * free
    est = plans.memory(plan.steps, samples, itemsize, stream=True) if stream else stored
    check(est.need, fields, stream is False)
    return Memory(plan, est.need, stream, fields, StepSizes(est.biggest, est.widest, est.block_layers))


def stage(
    k: int,
    span: tuple[int, int],
    bands,
    blocks: int,
    plan,
    arrays,
    pred,
    sep,
    own,
    ref,
    widen,
    z: float,
    where: str,
):
    """Stage k of a residual net (resnet, wrn: one algorithm): its ``StageInfo``, its two
    ``preserved`` checks -- the typical stage ratio forward and backward in the ln ``bands``
    (``where`` names them), widened by ``widen`` (``--band``) and by z sd of the reference
    allowance ``ref`` (the proposed gains' variances) -- and its two ``theory`` checks: the same
    ratio within z sd of the init's own prediction (``pred``'s ln RMS, ``own``'s variances).
    A failed preserved check says the typical ratio the theory predicts for the init (ln RMS
    less the variance: a log-normal's) beside its RMS."""
    first, last = span
    (fb, bb), dims = bands, plan.entries
    (var_f, var_b), (ref_f, ref_b) = own[:2], ref[:2]
    pf, pb = pred.ln_forward, pred.ln_backward
    ln_f, ln_b = arrays["fwd"], arrays["bwd"]
    sf = stats.exp_or_none(pf[last] - pf[first]) if pf else None
    sb = stats.exp_or_none(pb[first] - pb[last]) if pb else None
    info = StageInfo(
        k,
        first,
        last,
        dims[first],
        dims[last],
        blocks,
        (math.exp(fb[0]), math.exp(fb[1])),
        (math.exp(bb[0]), math.exp(bb[1])),
        sf,
        sb,
    )
    names = (
        f"stage {k} forward ||h^{last}||/||h^{first}||",
        f"stage {k} backward ||dl/dh^{first}||/||dl/dh^{last}||",
    )
    measured = (ln_f[:, last, :] - ln_f[:, first, :], ln_b[:, first, :] - ln_b[:, last, :])
    allowance = (float(ref_f[last] - ref_f[first]), float(ref_b[first] - ref_b[last]))
    ways = (
        (pf, var_f, last, first, sep.span("forward", last, first)),
        (pb, var_b, first, last, sep.span("backward", first, last)),
    )
    checks, theory_checks = [], []
    for cname, ln, band, v_ref, (lnp, var, a, e, shift) in zip(names, measured, (fb, bb), allowance, ways):
        c = stats.stage_check(cname, ln, (band[0] + widen[0], band[1] + widen[1]), v_ref, z)
        if not c.passed:
            c.note = f"outside {where} with its finite-width allowance"
        checks.append(c)
        if not lnp:
            theory_checks.append(stats.untestable(cname, c.log10_measured))
            continue
        centre, own_var = lnp[a] - lnp[e], abs(float(var[a] - var[e]))
        if not c.passed:
            typical, rms = stats.fmt((centre - own_var) / stats.LN10), stats.fmt(centre / stats.LN10)
            c.note += f"; the theory predicts a typical stage ratio of {typical} (RMS {rms}) for this init"
        t = stats.stage_check(cname, ln, (centre, centre), own_var, z, "theory", shift)
        if not t.passed and t.has_band:
            t.note = f"the theory predicts an RMS stage ratio of {stats.fmt(centre / stats.LN10)}"
        theory_checks.append(t)
    return info, checks, theory_checks
