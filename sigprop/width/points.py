"""A coordinate check's points through a sweep's machinery (sigprop/sweeps/): one task per
(parametrization, width, seed), run by an executor (``local`` here, or ``dask``: a cluster's
workers), each finished point one JSON line appended by the one writer to ``--out`` where given,
so a check that is stopped -- a SLURM job's time, a Ctrl-C -- resumes where it was: a rerun reads
the points already there (``sigprop.width.point.v1``, keyed by the check's configuration and the
point) and runs only the others.  A point that raises is a failure line
(``sigprop.sweep.failed.v1``), not a result: a rerun runs it again."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from sigprop import data, specs, sweeps
from sigprop.errors import SigpropError
from sigprop.kernels.device import resolve_device
from sigprop.model.build import build
from sigprop.specs import parse_shard
from sigprop.sweeps.grid import config_key
from sigprop.sweeps.run import append, failed, owned, where_it_ran, written_by
from sigprop.sweeps.shard import begin, differs, grid_identity
from sigprop.targets import resolve_target
from sigprop.version import __version__
from sigprop.width import cost, train
from sigprop.width import params as P
from sigprop.width.spec import RUN_OPTIONS, WidthNet, WidthSpec

POINT_SCHEMA = "sigprop.width.point.v1"
#: the first line of a part's file (``--shard i/N``): the whole check's identity
PART_SCHEMA = "sigprop.width.shard.v1"
#: seed streams of the check (specs.derive_seed)
STREAM_BATCH, STREAM_PARAMS = 11, 12


def optimizer_of(spec: WidthSpec):
    """The model's own optimizer (``--optimizer MODULE:CALLABLE``, resolved where the point runs),
    or None for torch.optim's adam or sgd; a target that does not resolve names --optimizer."""
    if not spec.own_optimizer:
        return None
    try:
        return resolve_target(spec.optimizer)
    except SigpropError as exc:
        raise SigpropError(exc.message, field="optimizer") from None


def factory_of(net: WidthNet):
    """width -> module: the net's target (a callable, or ``MODULE:CALLABLE`` /
    ``FILE.py:CALLABLE``, resolved where the point runs) with its keyword arguments and the
    width."""
    target = resolve_target(net.target) if isinstance(net.target, str) else net.target
    return lambda w: target(**net.kwargs, **{net.width_arg: w})


def _data(path: str, shape: tuple[int, ...]) -> data.Data:
    """--data, read once per process while the file is unchanged (each seed's point reads it)."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        stamp = None  # data.load says why, in one line
    return _read(path, tuple(shape), stamp)


@functools.lru_cache(maxsize=2)
def _read(path: str, shape: tuple[int, ...], stamp) -> data.Data:
    return data.load(path, shape, None)


def rows_of(spec: WidthSpec, net: WidthNet, seed_index: int) -> data.Data:
    """Seed k's rows of --data: k B .. (k + 1) B - 1."""
    d = _data(spec.data, tuple(net.input_shape))
    need = spec.seeds * spec.batch_size
    if d.count < need:
        raise SigpropError(
            f"{spec.data} holds {d.count} samples; {spec.seeds} seeds x --batch-size {spec.batch_size} "
            f"need {need}",
            field="data",
        )
    lo = seed_index * spec.batch_size
    return data.Data(d.x[lo : lo + spec.batch_size], d.y[lo : lo + spec.batch_size], d.path)


def batch(spec: WidthSpec, net: WidthNet, seed_index: int, device) -> torch.Tensor:
    """The fixed batch of one seed: Gaussian inputs, token ids uniform below the vocabulary, or
    --data's rows; the same at every width and for every parametrization (their slopes share its
    noise)."""
    if spec.data is not None:
        rows = rows_of(spec, net, seed_index)
        return data.inputs(rows, device, torch.float32).reshape(spec.batch_size, *net.input_shape)
    gen = torch.Generator().manual_seed(specs.derive_seed(spec.seed, STREAM_BATCH, seed_index))
    shape = (spec.batch_size, *net.input_shape)
    if net.vocab is not None:
        return torch.randint(net.vocab, shape, generator=gen).to(device)
    return torch.randn(shape, generator=gen).to(device)


def targets(spec: WidthSpec, seed_index: int, net: WidthNet):
    """The targets of one seed, shaped by the output: random labels over its last dimension
    (xent) or Gaussians (mse), or --data's labels (its outputs must be [B, classes])."""

    def target_of(y: torch.Tensor) -> torch.Tensor:
        if spec.data is not None:
            rows = rows_of(spec, net, seed_index)
            if y.dim() != 2 or y.shape[0] != spec.batch_size:
                raise SigpropError(
                    f"--data's labels are one per sample: the model's output must be [batch, classes], got "
                    f"{list(y.shape)}",
                    field="data",
                )
            data.check_labels(rows, y.shape[-1])
            return torch.as_tensor(rows.y, device=y.device)
        gen = torch.Generator().manual_seed(specs.derive_seed(spec.seed, STREAM_BATCH, seed_index, 1))
        if spec.loss == "xent":
            return torch.randint(y.shape[-1], y.shape[:-1], generator=gen).to(y.device)
        return torch.randn(y.shape, generator=gen).to(y.device)

    return target_of


def net_config(net: WidthNet, spec: WidthSpec) -> dict:
    """What a point's result depends on: the net and every option but where and how it runs."""
    target = (
        net.target if isinstance(net.target, str) else getattr(net.target, "__qualname__", repr(net.target))
    )
    own = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name not in RUN_OPTIONS}
    plain = (int, float, str, bool, type(None))
    return {
        **own,
        "params": list(spec.params),
        "target": target,
        "kwargs": {k: v if isinstance(v, plain) else repr(v) for k, v in net.kwargs.items()},
        "width_arg": net.width_arg,
        "input_shape": list(net.input_shape),
        "vocab": net.vocab,
        "widths": sorted(net.widths),
    }


@dataclass(frozen=True)
class Task:
    """One point, as an executor runs it: the net, the spec, which point, and what the client
    read once for every point (the base width, μP's attention dimensions, the roles)."""

    net: WidthNet
    spec: WidthSpec
    param: str
    width: int
    seed: int
    base: int
    dims: tuple[int, ...] = ()
    roles: tuple = ()
    #: a sweep's failure line reads ``init``: a width point has none
    init: str = ""
    config: dict = field(default_factory=dict)
    #: attention written out by hand: (its product's order, d at the base width) of each call
    written: tuple = ()
    #: the model's output is a site of its own (no module's site returns it)
    output_site: bool = False

    @property
    def key(self) -> str:
        return config_key(self.config)


def tasks(
    net: WidthNet, spec: WidthSpec, base: int, dims, roles: list, written=(), output_site=False
) -> list[Task]:
    """Every point of the check, in the order a local run takes them."""
    shared = {k: v for k, v in net_config(net, spec).items() if k != "params"}
    return [
        Task(
            net,
            spec,
            param,
            w,
            k,
            base,
            tuple(dims),
            tuple(roles),
            # a point whose output is a site of its own has other sites: its key says so (only then,
            # so that the points of a model without one keep 0.18.0's keys)
            config={
                **shared,
                "param": param,
                "width": w,
                "seed": k,
                **({"output_site": True} if output_site else {}),
            },
            written=tuple(written),
            output_site=output_site,
        )  # fmt: skip
        for param in spec.params
        for k in range(spec.seeds)
        for w in sorted(net.widths)
    ]


#: the clock of the check running here (``run_all`` with the local executor), which each point's
#: steps tick: the time left said as it runs (sigprop/width/cost.py); None on a cluster's worker
_clock: cost.Clock | None = None
_on_tick = None


def run_task(task: Task) -> tuple[Task, dict]:
    """One point, wherever it runs: (the task, its line) -- the point's records, or its failure."""
    t0 = time.perf_counter()
    if _clock is not None:
        _clock.start(task.width, task.spec.steps)
    try:
        point = _train(task, _on_tick)
    except Exception as exc:  # a failure line: the check says it after the points that finished
        line = failed(task, exc, time.perf_counter() - t0)
        # sigprop's own net failing to build or train is the widths' doing (their size), not TARGET's
        line["field"] = getattr(exc, "field", None) or (task.net.field if task.net.own else "target")
        if isinstance(exc, SigpropError):  # its own words, without the type and the field
            line["error"] = exc.message
        return task, line
    return task, {
        "schema": POINT_SCHEMA,
        "config": task.config,
        "point": asdict(point),
        "seconds": round(time.perf_counter() - t0, 3),
        "environment": {"sigprop": __version__, **where_it_ran(), "torch": torch.__version__},
    }


def _train(task: Task, on_step=None) -> train.Point:
    spec, net, w, k = task.spec, task.net, task.width, task.seed
    device = resolve_device(spec.device)
    factory = factory_of(net)
    model = build(lambda: factory(w), spec.seed, 1 + k).to(device)
    gen = torch.Generator().manual_seed(specs.derive_seed(spec.seed, STREAM_PARAMS, k, w))
    dims = list(task.dims)
    return train.run_point(
        model, P.at(model, list(task.roles), w), param=task.param, optimizer=spec.optimizer, lr=spec.lr,
        ratio=w / task.base, steps=spec.steps, x=batch(spec, net, k, device),
        target_of=targets(spec, k, net), loss=spec.loss, gen=gen,
        width=w, seed=k, attention=dims, zero_readout=spec.zero_readout, on_step=on_step,
        written=list(task.written), make_optimizer=optimizer_of(spec), output_site=task.output_site,
    )  # fmt: skip


def point_of(line: dict) -> train.Point:
    """A point from its line."""
    d = dict(line["point"])
    d["sites"] = [train.Site(**s) for s in d["sites"]]
    return train.Point(**d)


def width_line(line, header: bool = False) -> bool:
    """Whether a JSON line is one ``sigprop width`` writes: a point, a failed point of a check
    (its config names the ``width_arg``), or (``header``) a part's header (``--shard``)."""
    return written_by(line, POINT_SCHEMA, "width_arg", PART_SCHEMA if header else None)


@dataclass
class Read:
    """What a points file holds for this check: its points (by key), how many points of other
    options it holds and how they differ (words), its part header (None: not a part's file)."""

    points: dict[str, train.Point]
    others: int = 0
    differs: str = ""
    header: dict | None = None


def read(path: Path, every: list[Task], field: str = "out") -> Read:
    """The points of this check (``every``'s keys) already in ``path`` -- ``--out`` (a missing
    file: none yet) or one of ``--points`` (a missing file is refused).  A file that is not
    sigprop width's (a sweep's, a junk line) is refused in one line naming ``field``; points of
    other options are counted, not read."""
    flag = f"--{field}"
    if not path.exists():
        if field == "points":
            raise SigpropError(f"no such file: {path} (a points file of sigprop width --out)", field=field)
        return Read({})
    if path.is_dir():
        raise SigpropError(f"{path} is a directory, not a points file", field=field)
    advice = (
        "; sigprop width appends only to its own JSON-lines files (give another --out)"
        if field == "out"
        else f"; {flag} reads the points files sigprop width --out writes"
    )
    keys = {t.key for t in every}
    out, other, header = {}, [], None
    for number, line in owned(path, field, "sigprop width", lambda x: width_line(x, True), advice):
        if line["schema"] == PART_SCHEMA:
            header = line
        elif line["schema"] == POINT_SCHEMA:
            key = config_key(line.get("config", {}))
            if key in keys:
                out[key] = point_of(line)
            else:
                other.append(line.get("config", {}))
    words = ""
    if other:
        names = (str(path), "this check")
        words = differs(grid_identity(other), grid_identity([t.config for t in every]), names, within=True)
    return Read(out, len(other), words, header)


def part_header(every: list[Task], i: int, n: int) -> dict:
    """A part's header (``--shard i/N``): which part, of how many, of which check (the whole
    check's identity: every option, every point; sigprop/sweeps/shard.py)."""
    return {
        "schema": PART_SCHEMA,
        "shard": i,
        "of": n,
        "points": len(every),
        "grid": grid_identity([t.config for t in every]),
    }


def start_part(out: Path, every: list[Task], text: str) -> list[Task]:
    """The tasks of part ``text`` ("i/N"), its file ``out`` begun with its header, or checked to
    be this part's of this check (``sweeps.shard.begin``, as ``sigprop sweep --shard`` does:
    another part's file, or another check's, is refused)."""
    i, n = parse_shard(text)
    begin(out, part_header(every, i, n), "check")
    return every[i::n]


def order(todo: list[Task]) -> list[Task]:
    """The order a local run takes the points: per parametrization and seed, the widest first, then
    the narrowest, then the rest (the clock times the two ends first: its estimate of the others
    is then read between them)."""

    def rank(t: Task):
        ws = sorted({u.width for u in todo if (u.param, u.seed) == (t.param, t.seed)})
        return (t.param != todo[0].param, t.param, t.seed, [ws[-1], ws[0], *ws[1:-1]].index(t.width))

    return sorted(todo, key=rank)


def run_all(
    todo: list[Task], spec: WidthSpec, progress=None, counts: dict | None = None
) -> dict[str, train.Point]:
    """The points of ``todo`` run by the spec's executor, each line appended to ``--out`` (where
    given) as it finishes; a point that failed is one SigpropError after the others finished.
    ``counts`` (width -> parameters): a local run's clock, whose estimate of the time left
    ``progress.remaining(seconds)`` is told as the steps run."""
    global _clock, _on_tick
    out = Path(spec.out) if spec.out else None
    results: dict[str, train.Point] = {}
    failures = []
    options = {"workers": spec.workers, "scheduler": spec.scheduler}
    local = spec.executor == "local"
    if local:
        todo = order(todo)
    tell = getattr(progress, "remaining", None)
    if local and counts and tell is not None:
        _clock = cost.Clock(counts, [(t.width, spec.steps) for t in todo])
        last = [0.0]

        def on_tick() -> None:
            _clock.tick()
            now = time.perf_counter()
            if _clock.ready() and now - last[0] >= 1.0:
                last[0] = now
                tell(_clock.left())

        _on_tick = on_tick
    try:
        with sweeps.executor(spec.executor, **options) as run:
            for i, (task, line) in enumerate(run(run_task, todo), 1):
                if _clock is not None:
                    _clock.done()
                if out is not None:
                    append(out, line)
                if line.get("schema") == POINT_SCHEMA:
                    results[task.key] = point_of(line)
                else:
                    failures.append((task, line))
                    if local:  # here, one after the other: stop at the first
                        break
                if progress:
                    progress(i, len(todo), f"{task.param} width {task.width} seed {task.seed}")
                if _clock is not None and _clock.ready():
                    tell(_clock.left())
    finally:
        _clock = _on_tick = None
    if failures:
        task, line = failures[0]
        error = line["error"]
        more = f" ({len(failures)} points failed; the first, seed {task.seed})" if len(failures) > 1 else ""
        kept = f"; the {len(results)} that finished are in {out}: a rerun runs only the rest" if out else ""
        raise SigpropError(f"{error}{more}{kept}", field=line.get("field") or "target")
    return results
