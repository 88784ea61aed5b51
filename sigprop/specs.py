"""Frozen descriptions of a probe (``ProbeSpec``), a verdict (``GateSpec``) and a curvature run
(``HessianSpec``), and the pieces the net kinds' specs share (sizes, widths, images, seeds).  No
torch here; each net kind's own spec lives in its file (sigprop/kinds/).

Everything random that is decided before the walker runs (the per-layer widths) is resolved
from the seed with numpy, so the CLI can print and record it without touching tensors.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, replace

import numpy as np

from sigprop.errors import SigpropError
from sigprop.options import Opt, declared, declared_options

DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
DTYPES = ("float32", "float64")
PRECISIONS = ("fp32", "tf32")

#: no size option may exceed this (10^12): far beyond any memory, and below the 64-bit limits of
#: numpy and torch indexing, so a huge value is refused with its option named, not overflowed
MAX_SIZE = 10**12


def check_size(value: int, field: str) -> None:
    """>= 1 and <= MAX_SIZE, or a SigpropError naming the field."""
    if value < 1:
        raise SigpropError(f"must be >= 1, got {value}", field=field)
    if value > MAX_SIZE:
        raise SigpropError(f"must be <= {MAX_SIZE:.0e}, got {value}", field=field)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_threads(value: int) -> None:
    """``--threads``: at least 1 and at most the cores this process may run on (more only
    oversubscribes them: 999 threads on 2 cores ran, recorded as 999, without a word)."""
    check_size(value, "threads")
    cores = available_cores()
    if value > cores:
        raise SigpropError(
            f"{value} threads on the {cores} core(s) this process may run on would oversubscribe them; "
            f"give at most {cores}",
            field="threads",
        )


#: spawn keys of the independent random streams derived from one --seed
STREAM_WIDTHS, STREAM_INPUTS, STREAM_ERRORS, STREAM_WEIGHTS, STREAM_PAIRS = 0, 1, 2, 3, 4
#: ``sigprop hessian``: the synthetic labels and the eigenvalue search's start vectors
STREAM_LABELS, STREAM_POWER = 5, 6
#: the stochastic Lanczos quadrature's probes (``sigprop hessian --density``)
STREAM_DENSITY = 7
#: ``sigprop module``: torch's global generator while a draw of the user's model is built
STREAM_MODEL = 7


@functools.lru_cache(maxsize=1 << 16)  # a pure function of ints; numpy's SeedSequence costs ~60 us a call
def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for one random stream, from the user's seed and a path of keys."""
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=tuple(int(k) for k in keys))
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class WidthSpec:
    """``N`` (fixed) or ``LO:HI`` (each layer's width uniform on LO..HI inclusive)."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str, field: str = "width") -> "WidthSpec":
        text = str(text).strip()
        parts = text.split(":")
        if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
            raise SigpropError(
                f"expected an integer N or a range LO:HI of integers, got {text!r}", field=field
            )
        lo, hi = int(parts[0]), int(parts[-1])
        if lo < 1:
            raise SigpropError(f"widths must be >= 1, got {text!r}", field=field)
        if hi > MAX_SIZE:
            raise SigpropError(f"widths must be <= {MAX_SIZE:.0e}, got {text!r}", field=field)
        if hi < lo:
            raise SigpropError(f"range {text!r} is reversed: LO must be <= HI", field=field)
        return cls(lo, hi)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"

    def draw(self, count: int, seed: int, stream: int = STREAM_WIDTHS) -> list[int]:
        rng = np.random.default_rng(derive_seed(seed, stream))
        return [int(w) for w in rng.integers(self.lo, self.hi + 1, size=count)]


#: the help of the options every measurement takes (``ProbeSpec``, ``HessianSpec``,
#: ``SpectrumSpec`` declare them each, with these words)
SEED_HELP = "Base seed of widths, inputs, errors and weights."
DEVICE_HELP = "auto, cpu, cuda or cuda:K (auto = CUDA when available)."
DTYPE_HELP = "Floating-point type of the probe."
THREADS_HELP = "CPU threads torch may use (recorded in the result)."
THREADS_SHOWN = "half the cores this process may run on; OMP_NUM_THREADS where set"


@dataclass(frozen=True)
class ProbeSpec:
    """How to probe: sample count, seeds, device, dtype."""

    samples: int = declared(
        int, 1000, "Random inputs (and error vectors) N.", min=1, sweep=True, keyed="always"
    )
    seed: int = declared(int, 0, SEED_HELP, min=0, sweep=True, keyed="always")
    seeds: int = declared(int, 1, "Independent weight draws S.", min=1, sweep=True, keyed="always")
    device: str = declared(
        str,
        "auto",
        DEVICE_HELP,
        sweep=True,
        keyed="",
        recorded="environment",
    )
    dtype: str = declared(str, "float32", DTYPE_HELP, choices=DTYPES, sweep=True, keyed="always")
    #: True redraws the weights in the backward pass instead of storing them, False stores
    #: them, None decides from the free memory (docs/cli.md)
    stream: bool | None = declared(
        bool,
        None,
        "Redraw the weights in the backward pass instead of storing them.",
        off="--no-stream",
        shown="only when they would not fit",
        recorded="environment",
    )
    #: matmul precision for float32 on CUDA: "fp32" (IEEE) or "tf32" (tensor cores)
    precision: str = declared(
        str,
        "fp32",
        "float32 matmuls on CUDA: fp32 (IEEE) or tf32 (tensor cores; docs/theory.md for its bias).",
        choices=PRECISIONS,
    )
    #: draws computed at once (None: as many as fit in half the free memory); ``rerun`` pins it
    batch: int | None = declared(
        int,
        None,
        "Draws computed at once (recorded in the result).",
        cli=False,
        api=False,
        check=False,
        recorded="environment",
    )
    #: capture each layer step as a CUDA graph and replay it (None: on with CUDA; sigprop/kernels/replay.py)
    graphs: bool | None = declared(
        bool,
        None,
        "Capture each layer's kernels once as a CUDA graph and replay it (CUDA only; checked against "
        "the eager step).",
        off="--no-graphs",
        shown="on with CUDA",
    )
    #: compile a dense or conv layer's bookkeeping (ReLU, packed mask, log-space normalisation)
    #: with torch.compile (sigprop/kernels/fused.py; off by default: slower on a CPU)
    fuse: bool = declared(
        bool,
        False,
        "Compile each dense or conv layer's bookkeeping (ReLU, packed mask, log-space normalisation) "
        "with torch.compile: fewer kernels per layer (issue 41; slower on a CPU).",
        off="--no-fuse",
    )
    #: input cosines whose propagation is measured (``--correlation``, each in [-1, 1]; empty:
    #: none) and the input pairs per cosine (``--pairs``); docs/theory.md section 10
    correlations: tuple[float, ...] = declared(
        str,
        (),
        "Also measure how the cosine of two inputs propagates, from input pairs of cosine C0 in [-1, 1], "
        "beside the infinite-width prediction (repeatable or comma-separated; docs/theory.md section 10).",
        flag="--correlation",
        repeat=True,
        key="correlation",
        toml=(list, int, float),
        parse=lambda texts: parse_cosines(texts),
        sweep=True,
    )
    pairs: int = declared(
        int, 256, "Input pairs per --correlation cosine.", min=1, sweep=True, keyed="correlations"
    )
    #: CPU threads of the run (None: ``environment.probe_threads``: OMP_NUM_THREADS where set,
    #: else half the cores); the number used is recorded in the result's environment
    threads: int | None = declared(
        int,
        None,
        THREADS_HELP,
        min=1,
        shown=THREADS_SHOWN,
        check=False,
        recorded="",
    )
    #: plug-in measurements (sigprop/observers/) run beside the net kind's (``--observe NAME``)
    observe: tuple[str, ...] = declared(
        str,
        (),
        "Also run this plug-in measurement (repeatable): a name registered with "
        'sigprop.observers.register (docs/architecture.md, "Add a measurement"); its values join the table, '
        "the JSON and the figure, its gates --check.",
        repeat=True,
        check=False,
    )

    def __post_init__(self) -> None:
        check_size(self.samples, "samples")
        object.__setattr__(
            self, "observe", (self.observe,) if isinstance(self.observe, str) else tuple(self.observe)
        )
        if len(set(self.observe)) != len(self.observe):
            raise SigpropError("a measurement is named twice", field="observe")
        if self.threads is not None:
            check_threads(self.threads)
        check_size(self.pairs, "pairs")
        cs = (self.correlations,) if isinstance(self.correlations, (int, float)) else tuple(self.correlations)
        for c in cs:
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not -1.0 <= float(c) <= 1.0:
                raise SigpropError(
                    f"an input cosine must be a number in [-1, 1], got {c!r}", field="correlation"
                )
        cs = tuple(float(c) for c in cs)
        if len(set(cs)) != len(cs):
            raise SigpropError(
                f"an input cosine is given twice: {', '.join(f'{c:g}' for c in cs)}", field="correlation"
            )
        object.__setattr__(self, "correlations", cs)
        check_size(self.seeds, "seeds")
        if self.seed < 0 or self.seed >= 2**63:
            raise SigpropError(f"must be in [0, 2^63), got {self.seed}", field="seed")
        if not DEVICE_RE.match(self.device):
            raise SigpropError(f"expected auto, cpu, cuda or cuda:K, got {self.device!r}", field="device")
        if self.dtype not in DTYPES:
            raise SigpropError(f"expected one of {', '.join(DTYPES)}, got {self.dtype!r}", field="dtype")
        if self.batch is not None and self.batch < 1:
            raise SigpropError(f"must be >= 1, got {self.batch}", field="batch")
        if self.precision not in PRECISIONS:
            raise SigpropError(
                f"expected one of {', '.join(PRECISIONS)}, got {self.precision!r}", field="precision"
            )
        if self.precision == "tf32" and self.dtype != "float32":
            raise SigpropError(f"tf32 applies to float32 matmuls; --dtype is {self.dtype}", field="precision")


def parse_depths(text: str) -> tuple[int, ...]:
    """``--at 5,10,20`` -> (5, 10, 20) (checked by ``SpectrumSpec``: each >= 1, none twice)."""
    try:
        return tuple(int(v) for v in str(text).split(",")) if text else ()
    except ValueError:
        raise SigpropError(f"expected depths like 5,10,20, got {text!r}", field="at") from None


def parse_ints(text: str, field: str) -> list[int]:
    """``10,20,50`` -> [10, 20, 50] (a sweep's axis): every value an integer >= 1, no duplicates."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise SigpropError(f"expected comma-separated integers such as 10,20,50, got {text!r}", field=field)
    values = [int(p) for p in parts]
    if min(values) < 1:
        raise SigpropError(f"values must be >= 1, got {text!r}", field=field)
    if len(set(values)) != len(values):
        raise SigpropError(f"a value is repeated in {text!r}", field=field)
    return values


def joined(values, default: str | None = None) -> str | None:
    """A sweep axis given as a list (repeated options) or one comma-separated string, as one
    string (``default`` when nothing is given)."""
    if not values:
        return default
    return values if isinstance(values, str) else ",".join(str(v) for v in values)


def parse_cosines(texts) -> tuple[float, ...]:
    """``--correlation`` values, repeated or comma-separated, as floats (range checked by
    ProbeSpec); a word that is not a number is refused naming the option."""
    out = []
    for text in texts:
        for part in str(text).split(","):
            try:
                out.append(float(part))
            except ValueError:
                raise SigpropError(
                    f"expected a cosine in [-1, 1], got {part.strip()!r}", field="correlation"
                ) from None
    return tuple(out)


def parse_image(text) -> tuple[int, int, int]:
    """``--image CxHxW`` (e.g. 3x32x32) as three positive integers."""
    parts = str(text).lower().replace("×", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise SigpropError(
            f"expected CxHxW with three positive integers (e.g. 3x32x32), got {text!r}", field="image"
        )
    return shape


def image(value) -> tuple[int, int, int]:
    """A spec's ``image``: a CxHxW string or a (C, H, W) tuple, each size within bounds."""
    shape = parse_image(value if isinstance(value, str) else "x".join(map(str, value)))
    for n in shape:
        check_size(n, "image")
    return shape


def image_text(shape) -> str:
    return "x".join(map(str, shape))


#: what ``--check`` gates on (docs/cli.md, "Two verdicts"):
#: preserved -- the typical end-to-end ratio lies in an absolute band (the signal survives);
#: theory -- the typical ratio agrees with this init's own finite-width prediction
GATES = ("preserved", "theory")
#: the default ``--band`` of the nets without stages (mlp, cnn): the typical ratio within a decade
#: of the reference (docs/cli.md); the staged nets default to (1, 1) around their stage band
DECADE_BAND = (0.1, 10.0)


def parse_band(text: str, field: str = "band") -> tuple[float, float]:
    """``LO:HI`` with 0 < LO <= 1 <= HI (finite): a band that excludes the norm-preserving
    value 1 would fail a network that keeps the norm exactly."""
    parts = str(text).split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        lo, hi = float(parts[0]), float(parts[1])
    except ValueError:
        raise SigpropError(f"expected LO:HI (two numbers, e.g. 0.5:2), got {text!r}", field=field) from None
    return check_band((lo, hi), field)


def check_band(band, field: str = "band") -> tuple[float, float]:
    if (
        isinstance(band, (str, bytes))
        or len(band) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in band)
    ):
        raise SigpropError(f"expected two numbers [LO, HI], got {band!r}", field=field)
    lo, hi = (float(v) for v in band)
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo <= 0:
        raise SigpropError(f"LO and HI must be finite and LO > 0, got {lo:g}:{hi:g}", field=field)
    if not lo <= 1.0 <= hi:
        raise SigpropError(
            f"the band must contain 1 (the norm-preserving ratio), got {lo:g}:{hi:g}", field=field
        )
    return lo, hi


@dataclass(frozen=True)
class GateSpec:
    """What ``--check`` asks (``gate``) and the band of the ``preserved`` verdict, as factors
    around the norm-preserving reference (None: the net kind's default, e.g. ``DECADE_BAND`` for
    an MLP; for a ResNet stage (1, 1) around [sqrt 2, sqrt e] with its finite-width allowance,
    docs/theory.md §7)."""

    gate: str = declared(
        str,
        "preserved",
        "What --check asks: preserved (the typical end-to-end ratio lies in --band: the signal survives) "
        "or theory (it agrees with the init's own finite-width prediction).",
        choices=GATES,
    )
    band: tuple[float, float] | None = declared(
        str,
        None,
        "LO:HI factors around the reference for the 'preserved' verdict; must contain 1.",
        toml=(list,),
        parse=lambda text: parse_band(text),
    )
    #: ``--max-correlation X``: also fail when the last state's mean cosine of input pairs with
    #: cosine 0 exceeds X (the probe then measures c0 = 0; docs/ci.md)
    max_correlation: float | None = declared(
        float,
        None,
        "Also fail --check when the last state's mean cosine of input pairs with cosine 0 exceeds X "
        "(inputs mapped to one direction; measures C0 = 0; docs/ci.md).",
        toml=(int, float),
    )

    def __post_init__(self) -> None:
        if self.gate not in GATES:
            raise SigpropError(f"expected one of {', '.join(GATES)}, got {self.gate!r}", field="gate")
        if self.band is not None:
            object.__setattr__(self, "band", check_band(self.band))
        x = self.max_correlation
        if x is not None and (
            isinstance(x, bool) or not isinstance(x, (int, float)) or not -1.0 <= float(x) <= 1.0
        ):
            raise SigpropError(
                f"a cosine bound must be a number in [-1, 1], got {x!r}", field="max_correlation"
            )

    def probe(self, probe: "ProbeSpec") -> "ProbeSpec":
        """The probe with c0 = 0 measured when a correlation bound is asked."""
        if self.max_correlation is None or 0.0 in probe.correlations:
            return probe
        return replace(probe, correlations=(0.0, *probe.correlations))

    def to_dict(self) -> dict:
        return {
            "gate": self.gate,
            "band": None if self.band is None else list(self.band),
            "max_correlation": self.max_correlation,
        }


def probe_options() -> tuple[Opt, ...]:
    """The probe's and the gate's options, declared once in the fields of ``ProbeSpec`` and
    ``GateSpec`` (sigprop/options.py): the CLI, the API's keywords, a TOML check, ``sweep`` and
    ``rerun`` derive theirs from these."""
    return declared_options(ProbeSpec, GateSpec)


def probe_specs(values: dict, defaults: dict | None = None) -> tuple[ProbeSpec, GateSpec]:
    """The probe and the gate of option values by name (``probe_options``; the others their
    defaults: ``defaults``, a kind's ``probe_defaults``, then the fields')."""
    given = {**(defaults or {}), **values}
    probe = {o.name for o in declared_options(ProbeSpec)}
    gate = {o.name for o in declared_options(GateSpec)}
    unknown = sorted(set(given) - probe - gate)
    if unknown:
        raise SigpropError(f"not a probe option: {', '.join(unknown)}", field=unknown[0])
    return (
        ProbeSpec(**{k: v for k, v in given.items() if k in probe}),
        GateSpec(**{k: v for k, v in given.items() if k in gate}),
    )


#: the 10-way linear head of ``sigprop hessian`` -> how the output names it: "pytorch" -- the paper's
#: nets' plain nn.Linear at PyTorch's default init, the same for every init under test (the authors'
#: code, Arpit et al. 2019, section 5); "init" -- drawn by the init under test with gain 1 (WN where
#: the init is)
HEADS = {
    "pytorch": "the paper's head (plain nn.Linear, PyTorch's default init, the same for every init)",
    "init": "each init's own head (gain 1)",
}


#: the curvature's synthetic samples when none are given, unless the kind says fewer
#: (``Kind.curvature_samples``: an image net's product costs ~100x a dense net's a sample)
HESSIAN_SAMPLES = 512


@dataclass(frozen=True)
class HessianSpec:
    """How to measure the curvature at init (``sigprop hessian``, Arpit et al. 2019, section 5.3):
    ``samples`` synthetic inputs x ~ N(0, I) with uniform labels over 10 classes (None:
    ``HESSIAN_SAMPLES``), or the user's ``data`` (a .pt or .npz file with ``x`` and ``y``,
    ``sigprop.data``), of which ``samples`` takes the first N (None: all of them; the result
    records the count measured), ``seeds`` weight draws, the power
    iteration's ``iters`` and relative ``tol``, ``top`` eigenvalues by Lanczos (0: none),
    ``trace`` Hutchinson probes (0: none), the 10-way ``head`` (``HEADS``), and ``batch_size``: None
    takes the whole data at once (the gradient's graph kept, one backward per product); B
    accumulates each product over minibatches of B (the paper's way: memory of one minibatch,
    each product a forward and two backwards per minibatch; a data-dependent init calibrated on
    the first minibatch, as the authors' code does; a BN net's statistics per minibatch)."""

    samples: int | None = declared(
        int,
        None,
        "Data points N: synthetic x ~ N(0, I) with labels uniform over 10 classes, or with --data the "
        "first N of the file.",
        min=1,
        shown=f"{HESSIAN_SAMPLES} synthetic; all of --data",
        check=False,
    )
    seed: int = declared(int, 0, SEED_HELP, min=0, check=False)
    seeds: int = declared(int, 3, "Weight draws; the table gives mean ± sd over them.", min=1, check=False)
    device: str = declared(str, "auto", DEVICE_HELP, check=False)
    dtype: str = declared(str, "float32", DTYPE_HELP, choices=DTYPES, check=False)
    iters: int = declared(
        int,
        100,
        "Hessian-vector products at most for the largest-magnitude eigenvalue (restarted Lanczos).",
        min=1,
    )
    tol: float = declared(
        float,
        1e-3,
        "Converged when the relative residual ||Hy - λy||/|λ| is at most this (an eigenvalue then lies "
        "within tol |λ| of λ).",
        toml=(int, float),
    )
    top: int = declared(
        int, 0, "Also the K largest-magnitude eigenvalues by Lanczos (0: no).", min=0, check=False
    )
    trace: int = declared(
        int,
        0,
        "Also the trace by Hutchinson's estimator with M Rademacher probes (0: no).",
        min=0,
        check=False,
    )
    data: str | None = declared(
        str,
        None,
        "Your data instead of synthetic: a .pt or .npz with x [N, ...] and integer labels y [N] in 0..9.",
        path=True,
        check=False,
    )
    head: str = declared(
        str,
        "pytorch",
        "The 10-way head: pytorch (the paper's nets: plain nn.Linear at PyTorch's default init, the same "
        "for every init) or init (drawn by the init under test, gain 1; docs/theory.md section 12).",
        choices=tuple(HEADS),
    )
    batch_size: int | None = declared(
        int,
        None,
        "Accumulate each Hessian-vector product over minibatches of B samples (memory of one minibatch; "
        "a data-dependent init calibrated on the first, as the paper's code does).",
        min=1,
        shown="all samples at once",
    )
    #: CPU threads (None: ``environment.probe_threads``), as ``ProbeSpec.threads``
    threads: int | None = declared(int, None, THREADS_HELP, min=1, shown=THREADS_SHOWN, check=False)
    #: the eigenvalue density by stochastic Lanczos quadrature: ``probes`` Rademacher probes of
    #: ``steps`` Lanczos steps each (the command line: a quick look by default -- issue 47: a
    #: documented --density example ran 22 h on a laptop CPU; Ghorbani et al. 2019's scale is
    #: --probes 10 --steps 90 --, and either refused without --density, which alone reads them)
    density: bool = declared(
        bool,
        False,
        "Also the eigenvalue density by stochastic Lanczos quadrature (--probes x --steps Hessian-vector "
        "products a draw); --plot draws it on a symmetric log axis.",
        check=False,
    )
    probes: int = declared(int, 4, "--density: Rademacher probes.", min=1, check=False, needs="density")
    steps: int = declared(
        int, 20, "--density: Lanczos steps a probe (quadrature nodes).", min=2, check=False, needs="density"
    )
    #: also the largest-magnitude eigenvalue of each layer's diagonal block
    per_layer: bool = declared(
        bool,
        False,
        "Also the largest-magnitude eigenvalue of each layer's diagonal block of the Hessian (restarted "
        "Lanczos, up to --iters products a layer): where the curvature sits.",
        check=False,
    )

    def __post_init__(self) -> None:
        if self.threads is not None:
            check_threads(self.threads)
        check_size(self.probes, "probes")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 2:
            raise SigpropError(f"must be an integer >= 2, got {self.steps!r}", field="steps")
        if self.head not in HEADS:
            raise SigpropError(f"expected one of {', '.join(HEADS)}, got {self.head!r}", field="head")
        if self.batch_size is not None:
            check_size(self.batch_size, "batch_size")
        ProbeSpec(
            samples=HESSIAN_SAMPLES if self.samples is None else self.samples,
            seed=self.seed,
            seeds=self.seeds,
            device=self.device,
            dtype=self.dtype,
        )  # same checks
        check_size(self.iters, "iters")
        if not (isinstance(self.tol, (int, float)) and 0 < self.tol < 1):
            raise SigpropError(f"must be in (0, 1), got {self.tol!r}", field="tol")
        for field_, v in (("top", self.top), ("trace", self.trace)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SigpropError(f"must be an integer >= 0, got {v!r}", field=field_)


@dataclass(frozen=True)
class SpectrumSpec:
    """How to measure the input-output Jacobian's spectrum (``sigprop spectrum``, issue 30):
    ``samples`` inputs x ~ N(0, I) at which J is taken exactly, ``seeds`` weight draws, the
    device, the dtype of the net (the singular values are computed in float64), the CPU threads,
    and ``depths``: the Jacobian of every unit's output too (the spectrum against depth)."""

    samples: int = declared(
        int, 8, "Inputs x ~ N(0, I) at which the Jacobian is taken exactly.", min=1, check=False
    )
    seed: int = declared(int, 0, SEED_HELP, min=0, check=False)
    seeds: int = declared(int, 3, "Weight draws.", min=1, check=False)
    device: str = declared(str, "auto", DEVICE_HELP, check=False)
    dtype: str = declared(str, "float32", DTYPE_HELP, choices=DTYPES, check=False)
    threads: int | None = declared(int, None, THREADS_HELP, min=1, shown=THREADS_SHOWN, check=False)
    #: also the Jacobian of every recorded state (each unit's output) in the input: the spectrum
    #: against depth
    depths: bool = declared(
        bool,
        False,
        "Also the Jacobian of every layer's (block's) output in the input: the spread against depth beside "
        "its theory (n_l reverse products a sample for each depth l).",
        check=False,
    )
    #: "exact" (J formed, an SVD), "lanczos" (J^T J as an operator: restarted Lanczos for
    #: sigma_max, stochastic Lanczos quadrature of ``probes`` x ``steps`` for the rest), or
    #: "auto": exact when it fits in memory
    path: str = declared(
        str,
        "auto",
        "exact (J formed, an SVD a sample), lanczos (J^T J as an operator: Lanczos for sigma_max, "
        "stochastic Lanczos quadrature for the rest), or auto: exact when it fits in memory.",
        check=False,
    )
    probes: int = declared(int, 10, "lanczos path: quadrature probes a sample.", min=1, check=False)
    steps: int = declared(int, 30, "lanczos path: Lanczos steps a probe.", min=2, check=False)
    #: the Jacobian of these recorded states only (1-based depths), as ``depths`` does for all
    at: tuple[int, ...] = declared(
        str,
        (),
        "Also the Jacobian of the input to these depths only (a comma list, e.g. 5,10,20: the recorded "
        "states of --depths), beside its theory.",
        parse=lambda text: parse_depths(text),
        check=False,
    )
    #: also the ``top`` largest and smallest singular values per draw (0: none)
    top: int = declared(
        int,
        0,
        "Also the K largest and K smallest singular values (mean over samples; lanczos path: Lanczos on "
        "J^T J or J J^T, the smaller).",
        min=0,
        check=False,
    )
    #: the exact path's Jacobians this many samples at a time (None: all at once)
    batch_size: int | None = declared(
        int,
        None,
        "exact path: the samples' Jacobians B at a time (the memory of B).",
        min=1,
        shown="all",
        check=False,
    )

    def __post_init__(self) -> None:
        if self.threads is not None:
            check_threads(self.threads)
        if self.path not in ("auto", "exact", "lanczos"):
            raise SigpropError(f"expected auto, exact or lanczos, got {self.path!r}", field="path")
        check_size(self.probes, "probes")
        if isinstance(self.top, bool) or not isinstance(self.top, int) or self.top < 0:
            raise SigpropError(f"must be an integer >= 0, got {self.top!r}", field="top")
        if self.batch_size is not None:
            check_size(self.batch_size, "batch_size")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 2:
            raise SigpropError(f"must be an integer >= 2, got {self.steps!r}", field="steps")
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in self.at):
            raise SigpropError(f"expected depths >= 1, got {list(self.at)!r}", field="at")
        twice = sorted({d for d in self.at if list(self.at).count(d) > 1})
        if twice:
            raise SigpropError(f"depth {twice[0]} given twice in {list(self.at)!r}", field="at")
        if self.at and self.depths:
            raise SigpropError("every depth (depths) or some (at): give one of them", field="at")
        if self.at and self.path == "lanczos":
            raise SigpropError("the spectrum at a depth is measured on the exact path", field="at")
        if self.depths and self.path == "lanczos":
            raise SigpropError("the spectrum against depth is measured on the exact path", field="depths")
        ProbeSpec(
            samples=self.samples, seed=self.seed, seeds=self.seeds, device=self.device, dtype=self.dtype
        )


def parse_shard(text: str) -> tuple[int, int]:
    """``i/N`` (0 <= i < N: SLURM's ``$SLURM_ARRAY_TASK_ID`` of ``--array=0-(N-1)``) -> (i, N)."""
    index, slash, count = str(text).strip().partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = -1
    if not slash or n < 1 or not 0 <= i < n:
        raise SigpropError(f"expected i/N with 0 <= i < N (the i-th of N parts), got {text!r}", field="shard")
    return i, n
