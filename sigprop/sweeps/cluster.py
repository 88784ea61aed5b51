"""The Dask executor of a sweep (``--executor dask``; the ``cluster`` extra: pip install
'sigprop[cluster]').  No torch: the workers import it when a point runs.

A local cluster of worker processes (``workers``; each runs one point at a time with
``threads`` torch threads) or any running Dask scheduler (``scheduler``: tcp://HOST:PORT -- one
started by ``dask scheduler``, dask-jobqueue on SLURM/PBS, the Kubernetes operator).  Each point
is one task; the scheduler retries a task whose worker died (``distributed.scheduler.allowed-
failures``, 3 by default) and the client writes each point once, as its result arrives
(sigprop/sweeps/run.py).  ``resources`` (e.g. {"GPU": 1}) is what every task asks of a worker:
one point per GPU; a local cluster's worker i is then given GPU i alone (CUDA_VISIBLE_DEVICES).

Before a point runs every worker is asked for its sigprop version: a worker without sigprop or
with another version is refused in one line (nothing written), as is a scheduler that cannot be
reached or has no worker.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Callable, Iterator

from sigprop.errors import SigpropError, described
from sigprop.sweeps.run import failed
from sigprop.version import __version__

#: what a worker is asked before any point runs: its sigprop version (evaluated there, so the
#: question does not itself need sigprop to unpickle)
VERSION_QUESTION = "__import__('sigprop.version', fromlist=['__version__']).__version__"
#: and then to load the API (torch) before the first point
LOAD_API = "__import__('sigprop.api') and None"
#: glibc's trim threshold, which Dask's nannies set to 65536 by default (docs/cluster.md)
TRIM = "MALLOC_TRIM_THRESHOLD_"
#: seconds to reach a scheduler, and for its first worker to join
CONNECT_TIMEOUT = 10.0


def parse_resources(text: str | None) -> dict[str, float]:
    """``GPU=1`` or ``GPU=1,MEM=2`` -> {"GPU": 1.0, ...}, or one line naming ``--resources``."""
    if not text:
        return {}
    out = {}
    for item in str(text).split(","):
        name, eq, value = item.strip().partition("=")
        try:
            amount = float(value)
        except ValueError:
            amount = -1.0
        if not eq or not name.strip() or amount <= 0:
            raise SigpropError(f"expected NAME=AMOUNT such as GPU=1, got {item.strip()!r}", field="resources")
        out[name.strip()] = amount
    return out


class Dask:
    """A context manager: on entry a connected, checked client (and its local cluster), on exit
    both closed; called as ``executor(fn, items)`` it yields ``fn(item)`` as the items finish."""

    def __init__(
        self,
        workers: int | None = None,
        scheduler: str | None = None,
        threads: int = 1,
        resources: dict[str, float] | None = None,
        timeout: float | None = None,
    ):
        if (workers is None) == (scheduler is None):
            raise SigpropError("give --workers N (a local cluster) or --scheduler ADDRESS", field="executor")
        self.workers, self.scheduler, self.threads = workers, scheduler, threads
        self.resources, self.timeout = dict(resources or {}), timeout or CONNECT_TIMEOUT
        self.client = self.cluster = None
        #: what the client should say before the points run (a slow worker setting)
        self.notes: list[str] = []

    # -- connecting ---------------------------------------------------------------------------
    def __enter__(self) -> "Dask":
        try:
            import distributed  # the cluster extra, optional
        except ImportError:
            raise SigpropError(
                "the dask executor needs Dask distributed: pip install 'sigprop[cluster]'", field="executor"
            ) from None
        try:
            if self.scheduler is not None:
                self.client = self._connect(distributed)
            else:
                self.cluster = self._local(distributed)
                self.client = distributed.Client(self.cluster, set_as_default=False)
            self._check_workers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _connect(self, distributed):
        try:
            client = distributed.Client(self.scheduler, timeout=self.timeout, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SigpropError(
                f"cannot reach a Dask scheduler at {self.scheduler}: {first}", field="scheduler"
            ) from None
        try:
            client.wait_for_workers(1, timeout=self.timeout)
        except (TimeoutError, OSError):
            client.close()
            raise SigpropError(
                f"no worker joined the scheduler at {self.scheduler} within {self.timeout:g} s",
                field="scheduler",
            ) from None
        return client

    def _local(self, distributed):
        """Worker processes on this machine: ``workers`` nannies on 127.0.0.1, one task at a time
        each, ``threads`` torch threads (OMP_NUM_THREADS), GPU i for worker i when the tasks ask
        for GPUs."""
        import dask  # the cluster extra, with distributed

        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        spec = {}
        for i in range(self.workers):
            env = {"CUDA_VISIBLE_DEVICES": visible[i] if i < len(visible) else str(i)}
            # a worker's own logs (its heartbeat failing while the cluster closes) are not the user's
            options = {"host": "127.0.0.1", "silence_logs": logging.CRITICAL, "nthreads": 1}
            if "GPU" in self.resources:
                options["env"] = env
            if self.resources:
                options["resources"] = dict(self.resources)
            spec[i] = {"cls": distributed.Nanny, "options": options}
        scheduler = {
            "cls": distributed.Scheduler,
            "options": {"host": "127.0.0.1", "dashboard": False, "dashboard_address": ":0"},  # no fixed port
        }
        # Set before the workers' interpreters start (a nanny puts them in this process's environment
        # and spawns): the torch threads, and no MALLOC_TRIM_THRESHOLD_ -- Dask's 65536 (which also
        # fixes glibc's mmap threshold) made a 2 s MLP point take 3.3 s, mostly in page faults
        spawn = {k: str(self.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        saved = dict(os.environ)
        os.environ.pop(TRIM, None)
        # multiprocessing's resource tracker (started with the first worker) would warn at exit of a
        # semaphore a killed worker leaked -- the OS frees it; the sweep already said what happened
        os.environ["PYTHONWARNINGS"] = ",".join(
            w for w in (saved.get("PYTHONWARNINGS"), "ignore:resource_tracker:UserWarning") if w
        )
        try:
            with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn}):
                return distributed.SpecCluster(
                    workers=spec, scheduler=scheduler, silence_logs=logging.CRITICAL
                )
        finally:  # this process keeps its own environment
            os.environ.clear()
            os.environ.update(saved)

    def _ask(self, question: str, failing: str, advice: str = "") -> dict:
        """Every worker's answer to ``question`` (a Python expression, evaluated there, so that
        asking needs nothing of sigprop's to unpickle); a worker that raises is refused in one
        line: it ``failing`` (its error), then ``advice``."""
        answers = self.client.run(eval, question, on_error="return")
        for address, answer in sorted(answers.items()):
            if isinstance(answer, BaseException):
                raise SigpropError(
                    f"worker {address} {failing} ({described(answer)}){advice}",
                    field="scheduler" if self.scheduler else "workers",
                )
        return answers

    def _check_workers(self) -> None:
        """Every worker's sigprop: importable, and this client's version; its environment (a slow
        setting is noted); then its API loaded."""
        versions = self._ask(
            VERSION_QUESTION, "cannot import sigprop", f"; install sigprop {__version__} on every worker"
        )
        for address, answer in sorted(versions.items()):
            if answer != __version__:
                raise SigpropError(
                    f"worker {address} runs sigprop {answer}, this client {__version__}: install the same "
                    "version on every worker",
                    field="scheduler" if self.scheduler else "workers",
                )
        trims = self._ask(f"__import__('os').environ.get('{TRIM}')", "cannot read its environment")
        slow = sorted(a for a, v in trims.items() if v is not None)
        if slow:
            self.notes.append(
                f"{len(slow)} worker(s) run with {TRIM}={trims[slow[0]]} (Dask's nanny default), which "
                "slows a point up to 1.6x; docs/cluster.md says how to start workers without it"
            )
        # each worker loads the API (torch) now, all at once, not inside its first point
        self._ask(LOAD_API, "cannot load sigprop's API")

    def __exit__(self, *exc) -> None:
        for closing in (self.client, self.cluster):
            if closing is not None:
                try:
                    closing.close()
                except Exception:  # closing after a failure must not hide the failure
                    pass
        self.client = self.cluster = None

    # -- running ------------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        """Points that may run at once: the workers' task threads."""
        return max(1, sum(self.client.nthreads().values()))

    def describe(self) -> str:
        where = self.scheduler or f"a local cluster of {self.workers} worker process(es)"
        return f"Dask, {where}, {self.slots} point(s) at a time"

    def __call__(self, fn: Callable, items: list) -> Iterator:
        """Submit every item, yield ``fn(item)`` as each finishes; an item whose task could not
        finish (its workers died ``allowed-failures`` times) yields its failure line.  Leaving
        early (Ctrl-C) cancels what is still queued or running."""
        from distributed import as_completed  # the cluster extra (imported in __enter__)

        token = uuid.uuid4().hex[:8]
        futures = [
            self.client.submit(
                fn, item, key=f"sigprop-point-{token}-{i}", pure=False, resources=self.resources or None
            )
            for i, item in enumerate(items)
        ]
        item_of = {f.key: item for f, item in zip(futures, items)}
        try:
            with self.client.as_current():  # as_completed asks for the current client
                done = as_completed(futures)
            for future in done:
                try:
                    yield future.result()
                except Exception as exc:  # KilledWorker: the point's workers died; the sweep goes on
                    yield item_of[future.key], failed(item_of[future.key], exc, None)
        finally:
            self.client.cancel(futures)
