"""``sigprop sweep``: a grid of measurements, one JSON line per point, resumable, run here or on a
Dask cluster.  No torch.

``grid`` (the points: a net kind's configurations x inits, what each measures, its resume key),
``run`` (the loop and the file: the one writer), ``cluster`` (the Dask executor, loaded only
when asked for).  ``executor`` opens the executor a sweep names: ``local`` (``serial``: here,
one point after the other) or ``dask``.
"""

from __future__ import annotations

from typing import Callable

from sigprop.errors import SigpropError
from sigprop.results import FAILED_SCHEMA, SWEEP_SCHEMA
from sigprop.sweeps.grid import MEASURES, Point, configure, default_samples, grid, parse_inits, parse_ints
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

EXECUTORS = ("local", "dask")


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


def executor(
    name: str = "local",
    workers: int | None = None,
    scheduler: str | None = None,
    threads: int | None = None,
    resources: dict[str, float] | None = None,
    wait: float | None = None,
    scheduler_file: str | None = None,
    wait_workers: int | None = None,
):
    """The executor ``name`` (``EXECUTORS``) with its options, to be entered (``with``) before it
    runs points; an option that does not apply to it is refused naming it.  ``wait``: the
    seconds a Dask sweep waits for a worker (``cluster.WORKER_WAIT`` when None);
    ``wait_workers``: the workers a running scheduler should have before the points are sent."""
    if name not in EXECUTORS:
        raise SigpropError(f"expected local or dask, got {name!r}", field="executor")
    if name == "local":
        for field, value in (
            ("workers", workers),
            ("scheduler", scheduler),
            ("resources", resources),
            ("worker_wait", wait),
            ("scheduler_file", scheduler_file),
            ("wait_workers", wait_workers),
        ):
            if value:
                raise SigpropError("applies to --executor dask only", field=field)
        if threads is not None:
            raise SigpropError(
                "applies to --executor dask only (a local sweep's threads: OMP_NUM_THREADS)",
                field="worker_threads",
            )
        return Serial()
    if workers is not None and (scheduler is not None or scheduler_file is not None):
        raise SigpropError("a cluster at --scheduler has its own workers; give one of them", field="workers")
    if scheduler is not None and scheduler_file is not None:
        raise SigpropError(
            "give --scheduler ADDRESS or --scheduler-file PATH, not both", field="scheduler_file"
        )
    if (scheduler is not None or scheduler_file is not None) and threads is not None:
        raise SigpropError(
            "the workers of a running scheduler were started with their own threads", field="worker_threads"
        )
    from sigprop.sweeps.cluster import Dask  # the dask executor's room, loaded when named

    return Dask(
        workers,
        scheduler,
        threads or 1,
        resources,
        wait=wait,
        scheduler_file=scheduler_file,
        wait_workers=wait_workers,
    )


__all__ = [
    "EXECUTORS",
    "FAILED_SCHEMA",
    "SWEEP_SCHEMA",
    "MEASURES",
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
    "grid",
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
