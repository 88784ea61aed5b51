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

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from typing import Callable, Iterator

from sigprop.errors import SigpropError, described
from sigprop.specs import available_cores
from sigprop.sweeps.run import failed
from sigprop.version import __version__

#: what a worker is asked before any point runs: its sigprop version (evaluated there, so the
#: question does not itself need sigprop to unpickle)
VERSION_QUESTION = "__import__('sigprop.version', fromlist=['__version__']).__version__"
#: and then to load the API (torch) before the first point
LOAD_API = "__import__('sigprop.api') and None"
#: glibc's trim threshold, which Dask's nannies set to 65536 by default (docs/cluster.md)
TRIM = "MALLOC_TRIM_THRESHOLD_"
#: seconds to reach a scheduler
CONNECT_TIMEOUT = 10.0
#: seconds a sweep waits for a worker (``--worker-wait``): for the first to join, and whenever
#: none is left (killed, or their jobs expired) or none offers the points' ``--resources``
WORKER_WAIT = 60.0
#: seconds between two looks at the scheduler's workers while no point finishes
POLL = 0.25
#: Dask's loggers of the client's side, quiet while a sweep runs
QUIET_LOGGERS = (
    "distributed.client",
    "distributed.core",
    "distributed.comm",
    "distributed.batched",
    "distributed.deploy.spec",
    "distributed.nanny",
    "asyncio",
)


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
        wait: float | None = None,
        scheduler_file: str | None = None,
        wait_workers: int | None = None,
    ):
        given = [x is not None for x in (workers, scheduler, scheduler_file)]
        if sum(given) != 1:
            raise SigpropError(
                "give one of --workers N (a local cluster), --scheduler ADDRESS or --scheduler-file PATH",
                field="executor",
            )
        cores = available_cores()
        if workers is not None and workers > cores:  # each a process with its own torch
            raise SigpropError(
                f"{workers} worker processes on {cores} core(s): give at most {cores} (each worker runs "
                "its own torch; 100 on 2 cores ran 445 s without a point)",
                field="workers",
            )
        if wait is not None and not wait > 0:
            raise SigpropError(f"must be a number of seconds > 0, got {wait!r}", field="worker_wait")
        if wait_workers is not None and workers is not None:  # a local cluster starts all its workers
            raise SigpropError(
                "applies to --scheduler or --scheduler-file (a local cluster starts all its workers)",
                field="wait_workers",
            )
        if wait_workers is not None and not (isinstance(wait_workers, int) and wait_workers >= 1):
            raise SigpropError(
                f"must be a number of workers >= 1, got {wait_workers!r}", field="wait_workers"
            )
        self.workers, self.scheduler, self.threads = workers, scheduler, threads
        self.resources, self.timeout = dict(resources or {}), timeout or CONNECT_TIMEOUT
        self.wait = WORKER_WAIT if wait is None else float(wait)
        self.scheduler_file = scheduler_file
        #: workers a running scheduler should have before the points are sent (up to ``wait`` s)
        self.wait_workers = wait_workers or 1
        self.client = self.cluster = None
        #: what the client should say before the points run (a slow worker setting)
        self.notes: list[str] = []
        #: Dask's own loggers' levels, kept while the sweep runs (``__enter__``)
        self._levels: dict[str, int] = {}
        #: where the executor says what it waits for (no worker yet, none left): a line each time
        self.say: Callable[[str], None] | None = None

    # -- connecting ---------------------------------------------------------------------------
    def __enter__(self) -> "Dask":
        try:
            import distributed  # the cluster extra, optional
        except ImportError:
            raise SigpropError(
                "the dask executor needs Dask distributed: pip install 'sigprop[cluster]'", field="executor"
            ) from None
        # the client's own tracebacks (a lost scheduler, a worker's heartbeat) are not the user's:
        # the sweep says what happened in one line
        for name in QUIET_LOGGERS:
            self._levels[name] = logging.getLogger(name).level
            logging.getLogger(name).setLevel(logging.CRITICAL)
        try:
            if self.scheduler_file is not None:  # a batch job's scheduler writes it
                self.scheduler = _address_in(self.scheduler_file, self.wait)
            if self.scheduler is not None:
                self.client = (
                    self._from_file(distributed) if self.scheduler_file else self._connect(distributed)
                )
            else:
                self.cluster = self._local(distributed)
                self.client = distributed.Client(self.cluster, set_as_default=False)
            self._check_workers()
        except BaseException as exc:
            # Ctrl-C while the cluster starts: its half-started tasks' complaints (a nanny that
            # failed to start, an exception never retrieved) stay quiet to the end
            self.__exit__(None, None, None, quiet=isinstance(exc, KeyboardInterrupt))
            raise
        return self

    def _from_file(self, distributed):
        """``_connect`` to the address a ``--scheduler-file`` holds: a file left by a scheduler that
        is gone is named (0.18.0 named --scheduler, which was not given)."""
        try:
            return self._connect(distributed)
        except SigpropError as exc:
            if exc.field != "scheduler":
                raise
            raise SigpropError(
                f"{self.scheduler_file} holds {self.scheduler}: {exc.message.split(': ', 1)[-1]} (a stale "
                "file? its scheduler may be gone: start it again, or remove the file)",
                field="scheduler_file",
            ) from None

    def _connect(self, distributed):
        _check_address(self.scheduler)
        _handshake(self.scheduler, self.timeout)  # before a Client: a failed one hangs in its __del__
        try:
            client = distributed.Client(self.scheduler, timeout=self.timeout, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SigpropError(
                f"cannot reach a Dask scheduler at {self.scheduler}: {first}", field="scheduler"
            ) from None
        try:
            self._await_workers(client)
        except BaseException:
            client.close()
            raise
        return client

    def _await_workers(self, client) -> None:
        """Wait up to ``wait`` s for ``wait_workers`` workers at the scheduler (a queue starts its
        jobs over minutes), saying "waiting for workers (k of N)" once the wait is not a moment
        and again whenever k changes.  None after the wait is one line; some, fewer than N, go on
        (the queue may still bring the rest: the sweep runs on whatever joins)."""
        need, start, said = self.wait_workers, time.monotonic(), None
        while True:
            try:
                joined = len(_workers_of(client))
            except (TimeoutError, OSError):
                joined = 0
            waited = time.monotonic() - start
            if joined >= need or waited >= self.wait:
                break
            if self.say is not None and joined != said and (waited >= _Watch.QUIET or said is not None):
                self.say(
                    f"connected to {self.scheduler}; waiting for workers ({joined} of {need}), up to "
                    f"{self.wait:g} s (--worker-wait)"
                )
                said = joined
            time.sleep(POLL)
        if joined == 0:
            raise SigpropError(
                f"no worker joined the scheduler at {self.scheduler} within {self.wait:g} s (--worker-wait)",
                field="scheduler",
            )
        if joined < need:
            self.notes.append(
                f"{joined} of {need} workers (--wait-workers) joined {self.scheduler} within {self.wait:g} s "
                f"(--worker-wait): the sweep runs on them and on any that join later"
            )

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
        started = set(distributed.SpecCluster._instances)
        try:
            with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn}):
                return distributed.SpecCluster(
                    workers=spec, scheduler=scheduler, silence_logs=logging.CRITICAL
                )
        except BaseException:  # Ctrl-C while it starts: closed here, not by Dask's atexit hook
            for half in set(distributed.SpecCluster._instances) - started:
                distributed.SpecCluster._instances.discard(half)  # its AssertionError at exit
                try:
                    half.close(timeout=2)
                except BaseException:  # a half-started cluster's close may fail: it is going
                    pass
            raise
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

    def __exit__(self, *exc, quiet: bool = False) -> None:
        for closing in (self.client, self.cluster):
            if closing is not None:
                try:
                    closing.close()
                except Exception:  # closing after a failure must not hide the failure
                    pass
        self.client = self.cluster = None
        if not quiet:
            for name, level in self._levels.items():
                logging.getLogger(name).setLevel(level)
            self._levels.clear()

    def _lost(self, exc: BaseException) -> None:
        """A point cancelled because the client lost its scheduler (it died, or its job ended):
        one line, nothing written for the points not run (a rerun finishes them)."""
        cancelled = type(exc).__name__ in ("FutureCancelledError", "CancelledError")
        if cancelled or self.client.status in ("closing", "closed", "connecting"):
            where = self.scheduler or "the local cluster's scheduler"
            raise SigpropError(
                f"lost the scheduler at {where}: the points done are kept; a rerun finishes the rest",
                field="scheduler" if self.scheduler else "workers",
            ) from None

    # -- running ------------------------------------------------------------------------------
    def _offering(self) -> int:
        """The task threads of the workers that offer the points' ``resources`` (all: none asked)."""
        threads = self.client.nthreads()
        if not self.resources:
            return sum(threads.values())
        try:
            workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        except Exception:  # the scheduler is gone: the sweep says so
            return 0
        return sum(
            n
            for a, n in threads.items()
            if _offers(workers.get(a, {}).get("resources") or {}, self.resources)
        )

    @property
    def slots(self) -> int:
        """Points that may run at once: the task threads of the workers that offer the points'
        ``resources`` (at least one: the sweep's progress counts them)."""
        return max(1, self._offering())

    def describe(self) -> str:
        where = self.scheduler or f"a local cluster of {self.workers} worker process(es)"
        if self.scheduler_file is not None:
            where += f" (from {self.scheduler_file})"
        board = self.dashboard()
        offering = self._offering()
        if offering:
            at_once = f"{offering} point(s) at a time"
        else:  # 0.18.0 said "2 point(s) at a time" of workers the points cannot run on
            wanted = ",".join(f"{k}={v:g}" for k, v in self.resources.items())
            at_once = f"no worker offers {wanted} yet: the points wait for one (--worker-wait)"
        return f"Dask, {where}, {at_once}" + (f"; dashboard {board}" if board else "")

    def running(self, left: int) -> int:
        """Points running now: the tasks the scheduler's workers are processing (not the slots:
        a worker that has not joined runs nothing)."""
        try:
            return min(left, sum(len(keys) for keys in self.client.processing().values()))
        except Exception:  # the scheduler is gone: the sweep says so
            return 0

    def dashboard(self) -> str | None:
        """The scheduler's dashboard, where it serves one (a local cluster's does not)."""
        if self.workers is not None:
            return None
        try:
            services = self.client.scheduler_info(n_workers=0).get("services", {})
            return self.client.dashboard_link if "dashboard" in services else None
        except Exception:  # no dashboard to name
            return None

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
        watch = _Watch(self)
        try:
            with self.client.as_current():  # as_completed asks for the current client
                done = as_completed(futures)
            while not done.is_empty():
                if not done.has_ready():  # nothing finished: is any worker left to finish it?
                    watch.check()
                    time.sleep(POLL)
                    continue
                for future in done.next_batch(block=False):
                    try:
                        point, line = future.result()
                    except Exception as exc:  # KilledWorker: the point's workers died; the sweep goes on
                        self._lost(exc)
                        item = item_of[future.key]
                        yield item, failed(item, exc, None, _last_host(exc))
                        continue
                    _same_version(line)
                    yield point, line
                watch.seen()
        finally:
            self.client.cancel(futures)


class _Watch:
    """While no point finishes: the scheduler's workers, looked at; none for ``--worker-wait``
    seconds (killed, their jobs expired), or none that offers the points' ``--resources``, is
    one line (the points done are kept: a rerun finishes the rest)."""

    #: seconds of no point finishing and no worker before the sweep says it waits
    QUIET = 2.0

    def __init__(self, dask: Dask) -> None:
        self.dask = dask
        self.since: float | None = None
        self.said = False

    def seen(self) -> None:
        self.since, self.said = None, False

    def check(self) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
            return
        if not self.said and now - self.since >= self.QUIET and self.dask.say is not None:
            self._say_waiting()
        if now - self.since < self.dask.wait:
            return
        try:
            workers = self._workers()
        except Exception as exc:  # the scheduler is gone
            self.dask._lost(exc)
            raise
        where = self._where()
        field = "scheduler" if self.dask.scheduler else "workers"
        done = "the points done are kept; a rerun finishes the rest"
        if not workers:
            raise SigpropError(
                f"no worker at {where} for {self.dask.wait:g} s (--worker-wait): {done}", field=field
            )
        asked = self.dask.resources
        if asked and not any(_offers(w.get("resources") or {}, asked) for w in workers.values()):
            wanted = ",".join(f"{k}={v:g}" for k, v in asked.items())
            raise SigpropError(
                f"none of the {len(workers)} worker(s) at {where} offers {wanted} (--resources) after "
                f"{self.dask.wait:g} s (--worker-wait): {done}",
                field="resources",
            )
        self.since = now  # workers are there and busy: a long point is no hang

    def _say_waiting(self) -> None:
        """Once per wait: that no worker is there (none joined yet, or all left), and for how long
        the sweep waits."""
        try:
            workers = self._workers()
        except Exception:  # the scheduler is gone: check() says so
            return
        self.said = True
        if not workers:
            self.dask.say(f"no worker at {self._where()}: waiting up to {self.dask.wait:g} s (--worker-wait)")

    def _workers(self) -> dict:
        return _workers_of(self.dask.client)

    def _where(self) -> str:
        return self.dask.scheduler or "the local cluster"


def _workers_of(client) -> dict:
    """The scheduler's workers now, by address."""
    return client.scheduler_info(n_workers=-1).get("workers", {})


def _offers(has: dict, asked: dict) -> bool:
    return all(has.get(k, 0) >= v for k, v in asked.items())


def _last_host(exc: BaseException) -> str | None:
    """The host of the worker a KilledWorker names last (where the point ran), where it says."""
    worker = getattr(exc, "last_worker", None)
    address = getattr(worker, "address", worker)
    if not isinstance(address, str):
        return None
    return address.split("://")[-1].rsplit(":", 1)[0] or None


def _same_version(line: dict) -> None:
    """A point's line records the sigprop of the worker that ran it: a worker that joined after
    the start with another version is refused in one line, nothing of it written."""
    env = line.get("environment") or {}
    theirs = env.get("sigprop")
    if theirs != __version__:
        who = env.get("worker") or env.get("host", "?")  # its address, which the scheduler lists
        if env.get("worker") and env.get("host"):
            who += f" (host {env['host']})"
        raise SigpropError(
            f"worker {who} runs sigprop {theirs or '(unknown)'}, this client "
            f"{__version__} (it joined after the start): install the same version on every worker; "
            "the points done are kept",
            field="scheduler",
        )


def _check_address(address: str) -> None:
    """A scheduler's address as Dask reads it (SCHEME://HOST:PORT, tcp:// by default): anything
    else is one line naming --scheduler, before any connection is tried."""
    from distributed.comm import registry  # the cluster extra (the executor's own room)
    from distributed.comm.addressing import parse_address, parse_host_port  # the cluster extra

    try:
        scheme, where = parse_address(str(address).strip(), strict=False)
        if scheme not in registry.backends:
            raise ValueError(f"no Dask scheme {scheme!r}")
        host, port = parse_host_port(where)
        if not host or not 0 < int(port) < 65536:
            raise ValueError("no host or port")
    except (ValueError, TypeError) as exc:
        raise SigpropError(
            f"expected a Dask scheduler's address tcp://HOST:PORT, got {address!r} ({exc})", field="scheduler"
        ) from None


def _handshake(address: str, timeout: float) -> None:
    """Dask's own handshake with ``address`` within ``timeout`` seconds: a port that refuses, one
    that answers as something else (SSH's banner read as a frame of exabytes, an HTTP server
    waiting for a request) or not at all is one line, not a client that hangs in its __del__."""
    from distributed.comm import connect  # the cluster extra (the executor's own room)

    refused = _refused(address, timeout)
    if refused:  # at once: Dask's connect retries a refused port until its timeout
        raise SigpropError(f"cannot reach a Dask scheduler at {address}: {refused}", field="scheduler")

    async def shake() -> None:
        comm = await asyncio.wait_for(connect(address, timeout=timeout), timeout + 1.0)
        await comm.close()

    try:
        asyncio.run(shake())
    except (TimeoutError, asyncio.TimeoutError):
        why = f"no Dask handshake within {timeout:g} s (is a Dask scheduler listening there?)"
    except OSError as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    except Exception as exc:  # a reply that is not Dask's (MemoryError: a banner read as a length)
        why = f"the port answers, but not as a Dask scheduler ({type(exc).__name__})"
    else:
        return
    raise SigpropError(f"cannot reach a Dask scheduler at {address}: {why}", field="scheduler")


def _refused(address: str, timeout: float) -> str:
    """Why a TCP address refuses a connection, at once ("" where it accepts, or is not TCP, or does
    not answer: Dask's handshake says what then)."""
    from distributed.comm.addressing import parse_address, parse_host_port  # the cluster extra

    scheme, where = parse_address(str(address).strip(), strict=False)
    if scheme != "tcp":
        return ""
    host, port = parse_host_port(where)
    try:
        socket.create_connection((host, int(port)), timeout=min(timeout, 5.0)).close()
    except ConnectionRefusedError:
        return f"connection refused (nothing listens on port {port} of {host})"
    except OSError:
        return ""
    return ""


def _address_in(path: str, wait: float) -> str:
    """The address a scheduler wrote to its ``--scheduler-file`` (``dask scheduler
    --scheduler-file``, a batch job's), waited for up to ``wait`` seconds while the file does not
    exist yet; one line naming --scheduler-file otherwise."""
    deadline = time.monotonic() + wait
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(POLL)
    try:
        with open(path, encoding="utf-8") as f:
            address = json.load(f)["address"]
    except FileNotFoundError:
        raise SigpropError(
            f"no scheduler wrote {path} within {wait:g} s (--worker-wait)", field="scheduler_file"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SigpropError(
            f'{path} is not a Dask scheduler file (a JSON object with its "address"): {described(exc)}',
            field="scheduler_file",
        ) from None
    if not isinstance(address, str):
        raise SigpropError(f'{path}: its "address" is not a string', field="scheduler_file")
    return address
