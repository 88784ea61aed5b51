"""A coordinate check's points on a real Dask cluster (``executor="dask"``): the same lines, bit
for bit, as the local run's (one torch thread on both sides, the same CPU kernels), and the same
slopes and verdicts."""

from __future__ import annotations

import json
import logging

import pytest

dask = pytest.importorskip("dask")  # the [cluster] extra (CI installs it)
distributed = pytest.importorskip("distributed")

import sigprop  # noqa: E402

KW = dict(depth=3, input_dim=6, widths=[16, 32, 64], params=["sp", "mup"], steps=2, seeds=2, batch_size=8)


def _points(path):
    out = {}
    for text in path.read_text().splitlines():
        line = json.loads(text)
        assert line["schema"] == "sigprop.width.point.v1"
        out[json.dumps(line["config"], sort_keys=True)] = line["point"]
    return out


def test_the_cluster_runs_the_same_points(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    local = sigprop.width_check("mlp", out=str(tmp_path / "local.jsonl"), **KW)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0",
        silence_logs=logging.CRITICAL,
    ) as c:  # fmt: skip
        remote = sigprop.width_check(
            "mlp", out=str(tmp_path / "dask.jsonl"), executor="dask", scheduler=c.scheduler_address, **KW
        )
    assert _points(tmp_path / "dask.jsonl") == _points(tmp_path / "local.jsonl")
    assert [r.to_dict() for r in remote.runs] == [r.to_dict() for r in local.runs]
