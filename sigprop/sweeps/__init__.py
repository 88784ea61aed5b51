"""``sigprop sweep``: a grid of measurements, one JSON line per point, resumable, run here or on a
Dask cluster.  No torch.

``grid`` (the points: a net kind's configurations x inits, what each measures, its resume key),
``run`` (the loop and the file: the one writer), ``cluster`` (the Dask executor, loaded only
when asked for).  ``executor`` opens the executor a sweep names: ``local`` (``serial``: here,
one point after the other) or ``dask``.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, runtime_checkable

from sigprop.errors import SigpropError
from sigprop.registry import Registry
from sigprop.results import FAILED_SCHEMA, SWEEP_SCHEMA
from sigprop.sweeps.grid import (
    MEASURES,
    Measurement,
    Point,
    configure,
    default_samples,
    parse_inits,
    parse_ints,
    register_measurement,
)
from sigprop.sweeps.run import (
    append,
    axis_values,
    done_keys,
    failed,
    finish,
    plot_rows,
    read_rows,
    row,
    run,
    serial,
)
from sigprop.sweeps.shard import SHARD_SCHEMA, merge, parse_shard
from sigprop.sweeps.shard import start as start_shard

#: the executors by name (``register_executor``): ``local`` and ``dask`` built in, others added
#: from outside (a builder taking the options a sweep was given, returning an ``Executor``)
EXECUTORS: Registry[Callable[..., object]] = Registry("executor", field="executor", skip=(__name__,))


#: the options a sweep gives its executor (``executor``; the CLI's --workers, --scheduler, ...)
EXECUTOR_OPTIONS = (
    "workers",
    "scheduler",
    "worker_threads",
    "resources",
    "worker_wait",
    "scheduler_file",
    "wait_workers",
)


@runtime_checkable
class Executor(Protocol):
    """What a sweep, ``sigprop width`` and the API read of an executor (``EXECUTORS``' builders
    return one; ``Serial`` and ``cluster.Dask`` are two): entered with ``with`` before any point
    runs and left after the last; called as ``executor(fn, items)``, it yields ``fn(item)`` for
    every item as each finishes, in any order.  ``slots``: the points it runs at once (the
    progress bar's width before ``running`` is asked; read once entered); ``running(left)``: of
    ``left`` points not finished, how many run now; ``notes``: lines the run's header prints
    after it is entered (where it runs, what it was given); ``say``: set by the caller before
    entering, a callable for what the executor says while it waits (None: it stays quiet);
    ``describe()``: one line, where the points run."""

    slots: int
    notes: tuple[str, ...]
    say: Callable[[str], None] | None

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc) -> object: ...

    def describe(self) -> str: ...

    def running(self, left: int) -> int: ...

    def __call__(self, fn: Callable, items: list) -> Iterator: ...


#: the members of ``Executor``, named where a builder's object lacks one
EXECUTOR_MEMBERS = ("slots", "notes", "say", "__enter__", "__exit__", "describe", "running", "__call__")


def register_executor(name: str, build: Callable[..., object]) -> Callable[..., object]:
    """Add an executor's builder under ``name`` (a name taken is refused, naming both)."""
    return EXECUTORS.add(name, build)


class Serial:
    """The local executor as a context manager: ``serial``, one point at a time, here."""

    slots = 1
    notes: tuple[str, ...] = ()
    #: what the executor says while it waits (the Dask one, for its workers); unused here
    say: Callable[[str], None] | None = None

    def __enter__(self) -> "Serial":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def describe(self) -> str:
        return "here, one point after the other"

    def running(self, left: int) -> int:
        """Points running now, of ``left`` not finished: here, the one."""
        return min(1, left)

    def __call__(self, fn: Callable, items: list):
        return serial(fn, items)


def _local(**given) -> Serial:
    """``local``: every option is Dask's, refused naming it."""
    for field in EXECUTOR_OPTIONS:
        if field != "worker_threads" and given.get(field):
            raise SigpropError("applies to --executor dask only", field=field)
    if given.get("worker_threads") is not None:
        raise SigpropError(
            "applies to --executor dask only (a local sweep's threads: OMP_NUM_THREADS)",
            field="worker_threads",
        )
    return Serial()


def _dask(
    workers=None,
    scheduler=None,
    worker_threads=None,
    resources=None,
    worker_wait=None,
    scheduler_file=None,
    wait_workers=None,
):
    """``dask``: a local cluster of ``workers``, or the running scheduler at ``scheduler`` /
    ``scheduler_file``."""
    if workers is not None and (scheduler is not None or scheduler_file is not None):
        raise SigpropError("a cluster at --scheduler has its own workers; give one of them", field="workers")
    if scheduler is not None and scheduler_file is not None:
        raise SigpropError(
            "give --scheduler ADDRESS or --scheduler-file PATH, not both", field="scheduler_file"
        )
    if (scheduler is not None or scheduler_file is not None) and worker_threads is not None:
        raise SigpropError(
            "the workers of a running scheduler were started with their own threads", field="worker_threads"
        )
    from sigprop.sweeps.cluster import Dask  # the dask executor's room, loaded when named

    return Dask(
        workers,
        scheduler,
        worker_threads or 1,
        resources,
        wait=worker_wait,
        scheduler_file=scheduler_file,
        wait_workers=wait_workers,
    )


register_executor("local", _local)
register_executor("dask", _dask)


def executor(name: str = "local", **options):
    """The executor ``name`` (``EXECUTORS``) built with the ``options`` given (``EXECUTOR_OPTIONS``;
    those None left out), to be entered (``with``) before it runs points; an option that does not
    apply to it is refused naming it.  ``worker_wait``: the seconds a Dask sweep waits for a
    worker (``cluster.WORKER_WAIT`` when None); ``wait_workers``: the workers a running scheduler
    should have before the points are sent."""
    build = EXECUTORS.lookup(name)
    unknown = sorted(set(options) - set(EXECUTOR_OPTIONS))
    if unknown:
        raise SigpropError(
            f"not an executor option; they are {', '.join(EXECUTOR_OPTIONS)}", field=unknown[0]
        )
    built = build(**{k: v for k, v in options.items() if v is not None})
    have = dir(built)  # names, not values: ``slots`` may be read only once entered (Dask's)
    missing = [m for m in EXECUTOR_MEMBERS if m not in have]
    if missing:
        raise SigpropError(
            f"executor {name!r} built a {type(built).__name__}, not an executor: it has no "
            f"{', '.join(missing)} (sweeps.Executor)",
            field="executor",
        )
    return built


__all__ = [
    "Executor",
    "EXECUTORS",
    "EXECUTOR_OPTIONS",
    "register_executor",
    "FAILED_SCHEMA",
    "SWEEP_SCHEMA",
    "MEASURES",
    "Measurement",
    "register_measurement",
    "Point",
    "Serial",
    "append",
    "axis_values",
    "configure",
    "default_samples",
    "done_keys",
    "executor",
    "failed",
    "finish",
    "parse_inits",
    "parse_ints",
    "plot_rows",
    "read_rows",
    "row",
    "run",
    "serial",
    "parse_shard",
    "start_shard",
    "merge",
    "SHARD_SCHEMA",
]
