"""Sweeps on a real Dask cluster (sigprop/sweeps/cluster.py): a ``distributed.LocalCluster`` with
worker processes, a scheduler and workers started from the ``dask`` command line on 127.0.0.1,
and the CLI's own local cluster (``--executor dask --workers 2``).  Every test compares the
cluster's lines with the serial sweep's on the same points: the same seeds on the same CPU
kernels (one torch thread everywhere) give the same bits, so they must be equal, not close."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

dask = pytest.importorskip("dask")  # the [cluster] extra (CI installs it)
distributed = pytest.importorskip("distributed")

from sigprop import api, specs, sweeps  # noqa: E402
from sigprop.cli import main  # noqa: E402
from sigprop.sweeps import cluster as dask_executor  # noqa: E402
from sigprop.version import __version__  # noqa: E402

NETS = Path(__file__).with_name("nets.py")
ONE_THREAD = specs.ProbeSpec(samples=64, device="cpu", threads=1)


@pytest.fixture(scope="module")
def cluster():
    """A real LocalCluster: two worker processes, one task and one torch thread each (the
    nanny's OMP_NUM_THREADS=1)."""
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        silence_logs=logging.CRITICAL,
    ) as c:
        yield c


def _untimed(value):
    """``value`` without its timings (``seconds``, the point's and each draw's): what may differ
    between two runs of the same numbers."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in ("seconds", "worker")}  # where it ran
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _lines(path: Path) -> dict[str, dict]:
    """The file's lines by key, each point once (asserted), untimed."""
    out = {}
    for text in path.read_text().splitlines():
        line = json.loads(text)
        key = json.dumps(line["config"], sort_keys=True)
        assert key not in out, f"written twice: {key}"
        out[key] = _untimed(line)
    return out


def _serial(tmp_path: Path, name: str, **sweep) -> dict[str, dict]:
    out = tmp_path / f"{name}-serial.jsonl"
    api.sweep(out=out, **sweep)
    return _lines(out)


GRIDS = {
    "mlp": dict(kind="mlp", depth=[3, 6], width=[16], init="proposed,he", probe_spec=ONE_THREAD),
    "module": dict(
        kind="module",
        target=f"{NETS}:make",
        arg=["depth=1,3"],
        input_shape=["3,8,8"],
        init="as-is,proposed",
        probe_spec=ONE_THREAD,
    ),
    "hessian": dict(
        kind="mlp",
        depth=[3],
        width=[8, 16],
        init="proposed",
        probe_spec=specs.ProbeSpec(samples=32, device="cpu", threads=1),
        measure="hessian",
    ),
    "spectrum": dict(
        kind="resnet",
        blocks=[2],
        width=[8, 16],
        init="proposed",
        probe_spec=specs.ProbeSpec(samples=2, device="cpu", threads=1),
        measure="spectrum",
    ),
}


@pytest.mark.parametrize("grid", list(GRIDS))
def test_a_local_cluster_equals_the_serial_sweep_bit_for_bit(cluster, tmp_path, grid):
    """Probes, a model's --arg grid, the curvature and the spectrum: every line of the cluster's
    sweep equals the serial sweep's (environment included: same host, versions, threads)."""
    serial = _serial(tmp_path, grid, **GRIDS[grid])
    out = tmp_path / f"{grid}-dask.jsonl"
    written = api.sweep(out=out, executor="dask", scheduler=cluster.scheduler_address, **GRIDS[grid])
    assert len(written) == len(serial) >= 2
    assert _lines(out) == serial
    assert not any("error" in line for line in serial.values())


def test_a_point_that_raises_is_a_failure_line_and_the_sweep_goes_on(cluster, tmp_path):
    """``fail=True`` raises inside the worker: one failure line with its error, the other points
    measured; the failure is not a result, so a rerun measures that point again (and only it)."""
    out = tmp_path / "f.jsonl"
    grid = dict(
        kind="module",
        target=f"{NETS}:make",
        arg=["fail=False,True"],
        input_shape=["3,8,8"],
        probe_spec=ONE_THREAD,
    )
    written = api.sweep(out=out, executor="dask", scheduler=cluster.scheduler_address, **grid)
    failed = [line for line in written if line["schema"] == sweeps.FAILED_SCHEMA]
    assert len(written) == 2 and len(failed) == 1
    assert failed[0]["config"]["args"] == ["fail=True"]
    # sigprop names the user's factory as what raised (a refusal of that point's input, as sigprop module's)
    assert failed[0]["error"].endswith("raised ValueError: this configuration is asked to fail")
    assert failed[0]["refused"] and failed[0]["environment"]["host"]
    again = api.sweep(out=out, **grid)  # serial: resumes a cluster's file
    assert [line["config"]["args"] for line in again] == [["fail=True"]]
    assert sweeps.read_rows(out)[0]["config"]["args"] == ["fail=False"]  # the plot reads results only


def test_a_worker_killed_mid_point_loses_nothing_and_writes_nothing_twice(tmp_path):
    """SIGKILL to a worker process while it runs a point: the nanny restarts it, the scheduler
    runs the point again, and every point is in the file once, equal to the serial sweep."""
    grid = dict(kind="mlp", depth=[150, 151, 152, 153, 154, 155], width=[128], init="proposed")
    probe = specs.ProbeSpec(samples=500, device="cpu", threads=1)
    serial = _serial(tmp_path, "kill", probe_spec=probe, **grid)
    killed = []

    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=":0",
            silence_logs=logging.CRITICAL,
        ) as c,
        distributed.Client(c, set_as_default=False) as client,
    ):
        pids = client.run(os.getpid)

        def kill_one(i, n, point, line):
            if killed:
                return
            busy = [w for w, keys in client.processing().items() if keys]
            assert busy, "no worker was running a point"
            os.kill(pids[busy[0]], signal.SIGKILL)
            killed.append(busy[0])

        out = tmp_path / "kill.jsonl"
        api.sweep(
            out=out,
            executor="dask",
            scheduler=c.scheduler_address,
            probe_spec=probe,
            on_point=kill_one,
            **grid,
        )
    assert killed
    assert _lines(out) == serial


def test_a_point_that_kills_its_workers_is_a_failure_line(tmp_path):
    """A point whose every worker dies (here: the model's factory ends the process) is retried
    ``allowed-failures`` times (1 here), then written once as a KilledWorker failure line; the
    other point is measured."""
    grid = dict(kind="module", target=f"{NETS}:make", arg=["die=False,True"], input_shape=["3,8,8"])
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 1}),
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=":0",
            silence_logs=logging.CRITICAL,
        ) as c,
    ):
        out = tmp_path / "die.jsonl"
        written = api.sweep(
            out=out, executor="dask", scheduler=c.scheduler_address, probe_spec=ONE_THREAD, **grid
        )
    assert len(written) == 2 and len(_lines(out)) == 2
    died = [line for line in written if line["schema"] == sweeps.FAILED_SCHEMA]
    assert [line["config"]["args"] for line in died] == [["die=True"]]
    assert died[0]["error"].startswith("KilledWorker") and not died[0]["refused"]


def _cli(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}
    return subprocess.Popen(
        [sys.executable, "-m", "sigprop", *args], env=env, stderr=subprocess.PIPE, text=True, **kw
    )


def test_ctrl_c_leaves_whole_lines_and_the_sweep_resumes(tmp_path, monkeypatch):
    """The CLI's own local cluster (--workers 2), interrupted after its first lines: exit 130,
    whole lines only; a rerun (serial) runs the rest, and the file equals the serial sweep."""
    args = ["sweep", "mlp", "--depth", "100,101,102,103,104,105,106,107", "--width", "128"]
    args += ["--samples", "500", "--init", "proposed", "--device", "cpu"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as the workers'
    serial = tmp_path / "serial.jsonl"
    assert main([*args, "--out", str(serial)]) == 0
    out = tmp_path / "r.jsonl"
    p = _cli([*args, "--out", str(out), "--executor", "dask", "--workers", "2"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or not out.read_text().count("\n")):
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "sigprop: interrupted" in err, err
    first = out.read_text()
    assert first.endswith("\n") and 1 <= first.count("\n") < 8
    for text in first.splitlines():
        json.loads(text)
    assert main([*args, "--out", str(out)]) == 0
    strip = lambda lines: {k: {**v, "environment": None} for k, v in lines.items()}
    assert strip(_lines(out)) == strip(_lines(serial))


def _start(args: list[str], env=None) -> subprocess.Popen:
    dask = Path(sys.executable).with_name("dask")
    return subprocess.Popen(
        [str(dask), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _fake_sigprop(root: Path, body: str) -> dict:
    """An environment whose ``import sigprop`` finds ``body`` first (a worker without sigprop,
    or with another version)."""
    (root / "sigprop").mkdir(parents=True)
    (root / "sigprop" / "__init__.py").write_text("")
    (root / "sigprop" / "version.py").write_text(body)
    return {**os.environ, "PYTHONPATH": str(root)}


def test_the_dask_command_line_scheduler_and_workers(tmp_path, capsys, monkeypatch):
    """As a user would: `dask scheduler` and `dask worker` on 127.0.0.1, the sweep sent with
    --scheduler equals the serial one; a worker with another sigprop version, then one without
    sigprop, is refused in one line, exit 2, nothing written."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as the workers'
    file = tmp_path / "scheduler.json"
    procs = [
        _start(
            [
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(file),
            ]
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(file.read_text())["address"]
        worker = ["worker", address, "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"]
        procs.append(_start(worker))
        args = ["sweep", "mlp", "--depth", "3,4", "--width", "16", "--samples", "64", "--init", "he"]
        args += ["--device", "cpu"]
        serial, out = tmp_path / "serial.jsonl", tmp_path / "r.jsonl"
        assert main([*args, "--out", str(serial)]) == 0
        assert main([*args, "--out", str(out), "--executor", "dask", "--scheduler", address]) == 0
        assert _lines(out) == _lines(serial)
        workers = {json.loads(t)["environment"].get("worker") for t in out.read_text().splitlines()}
        assert len(workers) == 1 and workers.pop().startswith("tcp://127.0.0.1:")  # the worker's address
        capsys.readouterr()

        for body, words in (
            ("__version__ = '0.0.1'\n", f"runs sigprop 0.0.1, this client {__version__}"),
            (
                "raise ImportError('no sigprop on this worker')\n",
                "cannot import sigprop (ImportError: no sigprop",
            ),
        ):
            procs[-1].send_signal(signal.SIGTERM)
            procs[-1].wait(timeout=30)
            fake = _fake_sigprop(tmp_path / f"fake{len(procs)}", body)
            procs.append(_start(worker, env=fake))
            refused = tmp_path / f"refused{len(procs)}.jsonl"
            time.sleep(0.5)
            code = main([*args, "--out", str(refused), "--executor", "dask", "--scheduler", address])
            err = capsys.readouterr().err
            assert code == 2 and words in err and err.count("\n") == 1 and "--scheduler" in err, err
            assert not refused.exists()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)


def test_bad_executor_input_is_one_line_and_nothing_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dask_executor, "CONNECT_TIMEOUT", 1.0)
    out = tmp_path / "r.jsonl"
    base = ["sweep", "mlp", "--depth", "3", "--width", "8", "--device", "cpu", "--out", str(out)]
    for extra, words in (
        (
            ["--executor", "dask", "--scheduler", "tcp://127.0.0.1:9"],
            "--scheduler: cannot reach a Dask scheduler at tcp://127.0.0.1:9: connection refused",
        ),
        (
            ["--executor", "dask"],
            "give one of --workers N (a local cluster), --scheduler ADDRESS or --scheduler-file",
        ),
        (["--workers", "2"], "--workers: applies to --executor dask only"),
        (["--executor", "dask", "--workers", "2", "--resources", "GPU"], "--resources: expected NAME=AMOUNT"),
        (
            ["--executor", "dask", "--scheduler", "tcp://h:1", "--workers", "2"],
            "--workers: a cluster at --scheduler",
        ),
        (
            ["--executor", "dask", "--workers", "1", "--resources", "GPU=1"],
            "--workers: 1 local workers with a GPU",
        ),
        (["--measure", "spectrum", "--curvature"], "--curvature: is --measure hessian"),
    ):
        if "GPU=1" in extra and torch.cuda.device_count():
            continue
        code = main(base + extra)
        err = capsys.readouterr().err
        assert code == 2 and words in err and err.count("\n") == 1, (extra, err)
        assert not out.exists()


def test_without_dask_the_executor_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` raises ImportError
    code = main(
        ["sweep", "mlp", "--depth", "3", "--out", str(tmp_path / "r"), "--executor", "dask", "--workers", "1"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'sigprop[cluster]'" in err and "--executor" in err, err


def test_local_gpu_workers_see_one_gpu_each():
    """CPU proxy of --resources GPU=1 on a local cluster: worker i's CUDA_VISIBLE_DEVICES is i
    (or the i-th of the client's own list), and every task asks for one GPU."""
    ex = dask_executor.Dask(workers=2, resources={"GPU": 1})
    with ex:
        ask = "__import__('os').environ.get('{}')"  # read there (os.environ.get would carry ours)
        seen = sorted(ex.client.run(eval, ask.format("CUDA_VISIBLE_DEVICES")).values())
        threads = set(ex.client.run(eval, ask.format("OMP_NUM_THREADS")).values())
        assert seen == ["0", "1"] and threads == {"1"}
        assert ex.slots == 2


def test_a_scheduler_file_finds_the_scheduler_and_its_dashboard(tmp_path, capsys, monkeypatch):
    """--scheduler-file: the address a `dask scheduler --scheduler-file` wrote, the sweep equal to
    the serial one, its dashboard named on the first line; a file that never appears, or is not
    a scheduler's, is one line naming --scheduler-file, nothing written."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    file = tmp_path / "scheduler.json"
    args = [
        "sweep",
        "mlp",
        "--depth",
        "3,4",
        "--width",
        "16",
        "--samples",
        "64",
        "--init",
        "he",
        "--device",
        "cpu",
    ]
    scheduler = ["scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0"]
    procs = [_start([*scheduler, "--scheduler-file", str(file)])]
    try:
        deadline = time.monotonic() + 60
        while not file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(file.read_text())["address"]
        procs.append(_start(["worker", address, "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"]))
        serial, out = tmp_path / "serial.jsonl", tmp_path / "r.jsonl"
        assert main([*args, "--out", str(serial)]) == 0
        capsys.readouterr()
        assert main([*args, "--out", str(out), "--executor", "dask", "--scheduler-file", str(file)]) == 0
        said = next(t for t in capsys.readouterr().err.splitlines() if " on Dask, " in t)
        assert f"on Dask, {address} (from {file})" in said and "dashboard http://127.0.0.1:" in said, said
        stale = (
            tmp_path / "stale.json"
        )  # the file as a scheduler killed hard leaves it (a clean stop removes it)
        stale.write_text(file.read_text())
        assert _lines(out) == _lines(serial)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    for path, words in (
        (tmp_path / "never.json", "no scheduler wrote"),
        (bad, "is not a Dask scheduler file"),
        (stale, f"{stale} holds {address}: connection refused"),  # its scheduler stopped: a stale file
    ):
        refused = tmp_path / "refused.jsonl"
        cmd = [*args, "--out", str(refused), "--executor", "dask", "--scheduler-file", str(path)]
        code = main([*cmd, "--worker-wait", "1"])
        err = capsys.readouterr().err
        assert code == 2 and words in err and err.count("\n") == 1 and "--scheduler-file" in err, err
        assert not refused.exists()
