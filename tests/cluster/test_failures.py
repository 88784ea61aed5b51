"""A sweep's cluster when it fails (issue 49): no worker left, none that offers the points'
resources, more local workers than cores, a worker that joins late with another sigprop.  Each
ends in one line within ``--worker-wait`` seconds, the points done kept -- 0.14.x waited
forever (no worker: 120 s seen; resources: 90 s), ran 100 workers on 2 cores for 445 s, and
wrote a late worker's other-version lines into the file."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")  # the [cluster] extra (CI installs it)

from sigprop import api, specs  # noqa: E402
from sigprop.cli import main  # noqa: E402
from sigprop.errors import SigpropError  # noqa: E402
from sigprop.sweeps import cluster as dask_executor  # noqa: E402
from sigprop.version import __version__  # noqa: E402

#: slow enough (about 1 s a point on one thread) that the later points are still queued when the
#: test takes the workers away
SLOW = dict(kind="mlp", depth=[150, 151, 152, 153], width=[128], init="proposed")
PROBE = specs.ProbeSpec(samples=500, device="cpu", threads=1)


def _within(seconds: float, fn) -> dict:
    """``fn()`` in a thread: its value or its error, or a failed test if it is still running after
    ``seconds`` (the hang this file is about)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"the sweep still waits after {seconds} s"
    return box


def _sweep_on(c, out: Path, seconds: float, **kw) -> dict:
    """``SLOW``'s sweep into ``out`` on cluster ``c`` (``_within`` ``seconds``)."""
    return _within(
        seconds,
        lambda: api.sweep(
            out=out, executor="dask", scheduler=c.scheduler_address, probe_spec=PROBE, **kw, **SLOW
        ),
    )


def _cluster(n: int = 1) -> distributed.LocalCluster:
    return distributed.LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=":0",
        silence_logs=logging.CRITICAL,
    )


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_no_worker_left_is_one_line_and_the_points_done_are_kept(tmp_path):
    """The only worker leaves after the first point (its job expired): the sweep stops after
    --worker-wait (2 s here), naming it, with the first point's line in the file."""
    out = tmp_path / "r.jsonl"
    with _cluster() as c:

        def leave(i, n, point, line):
            if i == 1:
                c.scale(0)

        box = _sweep_on(c, out, 90, on_point=leave, worker_wait=2)
    err = box.get("error")
    assert isinstance(err, SigpropError) and err.field == "scheduler", box
    assert "no worker at" in str(err) and "for 2 s (--worker-wait)" in str(err)
    assert "the points done are kept" in str(err)
    assert 1 <= len(_lines(out)) < 4


def test_resources_no_worker_offers_are_one_line(tmp_path):
    """GPU=1 asked of CPU workers: no point can start; after --worker-wait the sweep says which
    resource no worker offers, nothing written."""
    out = tmp_path / "r.jsonl"
    with _cluster() as c:
        box = _sweep_on(c, out, 90, resources={"GPU": 1}, worker_wait=2)
    err = box.get("error")
    assert isinstance(err, SigpropError) and err.field == "resources", box
    assert "offers GPU=1 (--resources) after 2 s (--worker-wait)" in str(err)
    assert not _lines(out)


def test_no_worker_offering_the_resources_is_no_slot(tmp_path):
    """0.18.0 printed "on Dask, ..., 2 point(s) at a time" when no worker offered --resources."""
    with _cluster(2) as c:
        with dask_executor.Dask(scheduler=c.scheduler_address, resources={"GPU": 1}, wait=2) as ex:
            said = ex.describe()
        with dask_executor.Dask(scheduler=c.scheduler_address, wait=2) as ex:
            plain = ex.describe()
    assert "no worker offers GPU=1 yet: the points wait for one (--worker-wait)" in said, said
    assert "point(s) at a time" not in said and "2 point(s) at a time" in plain, plain


def test_more_local_workers_than_cores_are_refused(tmp_path, capsys):
    cores = specs.available_cores()
    out = tmp_path / "r.jsonl"
    args = ["sweep", "mlp", "--depth", "3", "--width", "8", "--device", "cpu", "--out", str(out)]
    code = main([*args, "--executor", "dask", "--workers", str(cores + 1)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"--workers: {cores + 1} worker processes on {cores} core(s): give at most {cores}" in err
    assert not out.exists()
    code = main([*args, "--worker-wait", "5"])  # a local sweep waits for no worker
    assert code == 2 and "--worker-wait: applies to --executor dask only" in capsys.readouterr().err


def test_a_worker_that_joins_late_with_another_version_writes_nothing(tmp_path):
    """A worker that passed the start's check leaves; one whose sigprop says 0.0.1 joins after the
    start and runs the next point: its line is refused in one line (the worker and both
    versions named), and the file holds this version's lines only."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sigprop.version\nsigprop.version.__version__ = '0.0.1'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = "1"
    out = tmp_path / "r.jsonl"
    late = []
    with _cluster() as c:

        def swap(i, n, point, line):
            if i == 1:
                dask = Path(sys.executable).with_name("dask")
                worker = [str(dask), "worker", c.scheduler_address, "--nthreads", "1", "--no-dashboard"]
                late.append(
                    subprocess.Popen(
                        [*worker, "--host", "127.0.0.1"],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
                c.scale(0)

        try:
            box = _sweep_on(c, out, 120, on_point=swap)
        finally:
            for p in late:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    err = box.get("error")
    assert isinstance(err, SigpropError), box
    assert f"runs sigprop 0.0.1, this client {__version__}" in str(err)
    # named as the scheduler lists it (its address), its host beside (0.18.0: the host alone)
    assert "worker tcp://127.0.0.1:" in str(err) and "(host " in str(err), str(err)
    lines = _lines(out)
    assert 1 <= len(lines) < 4 and all(f'"sigprop": "{__version__}"' in t for t in lines)


@pytest.mark.parametrize("seconds", ["0", "-1", "nan"])
def test_a_worker_wait_that_is_no_time_is_refused(tmp_path, capsys, seconds):
    out = tmp_path / "r.jsonl"
    args = ["sweep", "mlp", "--depth", "3", "--width", "8", "--device", "cpu", "--out", str(out)]
    code = main([*args, "--executor", "dask", "--workers", "1", "--worker-wait", seconds])
    err = capsys.readouterr().err
    assert code == 2 and "--worker-wait: must be a number of seconds > 0" in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_sweep_that_waits_for_its_workers_says_nothing_wrong_when_they_are_busy(tmp_path):
    """A point longer than --worker-wait is no hang: workers are there and busy."""
    out = tmp_path / "r.jsonl"
    t0 = time.monotonic()
    with _cluster() as c:
        box = _sweep_on(c, out, 120, worker_wait=0.5)
    assert "error" not in box, box
    assert len(_lines(out)) == 4 and time.monotonic() - t0 > 0.5


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "sigprop", *args], env=env, capture_output=True, text=True, timeout=120
    )


def _serve(reply: bytes | None):
    """A TCP server on 127.0.0.1 that sends ``reply`` to whoever connects (an SSH banner), or
    nothing (None: a service waiting for its own request); its address."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if reply is not None:
                conn.sendall(reply)
            threading.Thread(target=conn.recv, args=(65536,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, "tcp://127.0.0.1:%d" % server.getsockname()[1]


@pytest.mark.parametrize("address", ["garbage", "tcp://", ":notaport", "http://", "", "banner"])
def test_a_scheduler_that_is_not_one_is_one_line(tmp_path, address):
    """A malformed --scheduler, a port that answers as something else (an SSH banner: 0.14.x read
    it as a frame of exabytes and said "out of memory"), one that never answers (an HTTP server
    waiting for its request: 0.14.x over 4 minutes): one line on stderr, exit 2, quickly, nothing
    written (0.14.x added a 9-line Client.__del__ traceback after 20 s)."""
    server = None
    if address == "banner":
        server, address = _serve(b"SSH-2.0-OpenSSH_9.6p1\r\n")
    out = tmp_path / "r.jsonl"
    t0 = time.monotonic()
    try:
        r = _cli(["sweep", "mlp", "--depth", "3", "--width", "8", "--device", "cpu", "--out", str(out),
                  "--executor", "dask", "--scheduler", address])  # fmt: skip
    finally:
        if server is not None:
            server.close()
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("sigprop: error: --scheduler: "), r.stderr
    assert time.monotonic() - t0 < 30 and not out.exists()


def test_a_port_that_never_answers_is_one_line_after_the_connect_timeout(tmp_path, capsys, monkeypatch):
    """A service that waits for its own request (an HTTP server): Dask's handshake gets no reply;
    one line after the connect timeout (1 s here, 10 s by default), nothing written."""
    monkeypatch.setattr(dask_executor, "CONNECT_TIMEOUT", 1.0)
    server, address = _serve(None)
    out = tmp_path / "r.jsonl"
    t0 = time.monotonic()
    try:
        code = main(["sweep", "mlp", "--depth", "3", "--width", "8", "--device", "cpu", "--out", str(out),
                     "--executor", "dask", "--scheduler", address])  # fmt: skip
    finally:
        server.close()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no Dask handshake within 1 s" in err, err
    assert time.monotonic() - t0 < 10 and not out.exists()


def test_a_lost_scheduler_is_one_line_and_a_rerun_finishes(tmp_path):
    """The scheduler dies after the first point (its job ended): one line naming it, no failure
    line for the points not run; a rerun on a new cluster finishes them."""
    out = tmp_path / "r.jsonl"
    c = _cluster()
    try:

        def lose(i, n, point, line):
            if i == 1:
                c.close(timeout=5)

        box = _sweep_on(c, out, 120, on_point=lose)
    finally:
        c.close()
    err = box.get("error")
    assert isinstance(err, SigpropError) and "lost the scheduler at tcp://" in str(err), box
    first = _lines(out)
    assert 1 <= len(first) < 4 and all('"schema": "sigprop.sweep.v' in t for t in first), first
    with _cluster() as again:
        api.sweep(out=out, executor="dask", scheduler=again.scheduler_address, probe_spec=PROBE, **SLOW)
    assert len(_lines(out)) == 4


def test_a_sweep_says_what_it_waits_for(tmp_path, capsys, monkeypatch):
    """A scheduler with no worker yet (a queue that starts its jobs late): the sweep says it is
    connected and waiting, then runs when a worker joins; a worker that leaves mid-sweep is said
    too (0.14.x showed nothing for up to 55 s)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with distributed.LocalCluster(
        n_workers=0, host="127.0.0.1", dashboard_address=":0", silence_logs=logging.CRITICAL
    ) as c:
        threading.Timer(4.0, lambda: c.scale(1)).start()
        args = [
            "sweep",
            "mlp",
            "--depth",
            "3,4",
            "--width",
            "8",
            "--samples",
            "32",
            "--device",
            "cpu",
            "--init",
            "he",
        ]
        code = main([*args, "--out", str(tmp_path / "r.jsonl"), "--executor", "dask",
                     "--scheduler", c.scheduler_address])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert (
        f"connected to {c.scheduler_address}; waiting for workers (0 of 1), up to 60 s (--worker-wait)" in err
    )
    assert len(_lines(tmp_path / "r.jsonl")) == 2


FAST = dict(kind="mlp", depth=[3, 4], width=[8], init="he")
FAST_PROBE = specs.ProbeSpec(samples=32, device="cpu", threads=1)


def _fast_sweep_on(c, out: Path, said: list, **kw) -> dict:
    """``FAST``'s two points on cluster ``c``, what the sweep says kept in ``said``."""
    return _within(
        120,
        lambda: api.sweep(
            out=out,
            executor="dask",
            scheduler=c.scheduler_address,
            probe_spec=FAST_PROBE,
            on_note=said.append,
            **kw,
            **FAST,
        ),
    )


def test_a_sweep_waits_for_n_workers_saying_k_of_n(tmp_path):
    """--wait-workers 2 on a scheduler whose workers join late (a queue starts its jobs over
    minutes): "waiting for workers (0 of 2)", then "(1 of 2)", and no point is sent before the
    second joins (0.14.x sent them to the first worker after at most 10 s, its only wait)."""
    said, seen = [], []
    with distributed.LocalCluster(
        n_workers=0,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=":0",
        silence_logs=logging.CRITICAL,
    ) as c:
        timers = [threading.Timer(3.0, lambda: c.scale(1)), threading.Timer(6.0, lambda: c.scale(2))]
        for t in timers:
            t.start()
        box = _fast_sweep_on(
            c,
            tmp_path / "r.jsonl",
            said,
            wait_workers=2,
            on_plan=lambda total, to_run: seen.append(len(c.scheduler_info["workers"])),
        )
    assert "error" not in box, box
    assert seen == [2], seen
    waits = [t for t in said if "waiting for workers" in t]
    assert waits[0] == (
        f"connected to {c.scheduler_address}; waiting for workers (0 of 2), up to 60 s (--worker-wait)"
    ), said
    assert any("(1 of 2)" in t for t in waits), said
    assert len(_lines(tmp_path / "r.jsonl")) == 2


def test_fewer_workers_than_waited_for_run_the_sweep_and_say_so(tmp_path):
    """--wait-workers 3 with one worker: after --worker-wait the sweep runs on the one that joined
    and says so (the queue may still bring the rest)."""
    said = []
    start = time.monotonic()
    with _cluster() as c:
        box = _fast_sweep_on(c, tmp_path / "r.jsonl", said, wait_workers=3, worker_wait=2)
    assert "error" not in box, box
    assert time.monotonic() - start >= 2
    note = f"1 of 3 workers (--wait-workers) joined {c.scheduler_address} within 2 s (--worker-wait)"
    assert any(t.startswith(note) for t in said), said
    assert len(_lines(tmp_path / "r.jsonl")) == 2


@pytest.mark.parametrize(
    "extra, words",
    [
        (
            ["--executor", "dask", "--workers", "1", "--wait-workers", "2"],
            "--wait-workers: applies to --scheduler",
        ),
        (["--wait-workers", "2"], "--wait-workers: applies to --executor dask only"),
        (["--executor", "dask", "--scheduler", "tcp://127.0.0.1:1", "--wait-workers", "0"], "--wait-workers"),
    ],
)
def test_a_wait_for_workers_that_cannot_apply_is_refused(tmp_path, capsys, extra, words):
    out = tmp_path / "r.jsonl"
    args = ["sweep", "mlp", "--depth", "3", "--width", "8", "--device", "cpu", "--out", str(out)]
    code = main([*args, *extra])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_local_cluster_says_it_is_starting(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = ["sweep", "mlp", "--depth", "3", "--width", "8", "--samples", "32", "--device", "cpu"]
    assert main([*args, "--out", str(tmp_path / "r.jsonl"), "--executor", "dask", "--workers", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "sigprop sweep: starting a local cluster of 1 worker process(es) ...", err


@pytest.mark.parametrize("after", [0.0, 0.5, 1.0])
def test_ctrl_c_while_the_local_cluster_starts_is_one_line(tmp_path, after):
    """SIGINT while the local cluster's workers start (``after`` seconds past the line that says
    so): "sigprop: interrupted", exit 130, and nothing after it -- 0.14.x printed Dask's atexit
    AssertionError (a half-started cluster closed at exit) in 2 of 5 tries."""
    out = tmp_path / "r.jsonl"
    args = ["sweep", "mlp", "--depth", "100,101", "--width", "128", "--samples", "500", "--device", "cpu"]
    p = subprocess.Popen(
        [sys.executable, "-m", "sigprop", *args, "--out", str(out), "--executor", "dask", "--workers", "2"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    first = p.stderr.readline()
    assert "starting a local cluster" in first, first
    time.sleep(after)
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    p.wait(timeout=60)
    assert p.returncode == 130, rest
    assert rest.rstrip().endswith("sigprop: interrupted"), rest
    assert "Traceback" not in rest and "Exception" not in rest, rest
