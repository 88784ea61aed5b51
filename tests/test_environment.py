"""One thread default, stated once (issue 27, item 5): the API, the CLI and `sigprop env` use the same
number, it is recorded in every result, and a library call leaves torch's setting as it found it."""

import json
import re

import torch

import sigprop
from sigprop import environment
from sigprop.cli import main


def test_the_default_is_omp_num_threads_else_half_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert environment.probe_threads() == (
        environment.default_threads(),
        "half the cores this process may run on",
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert environment.probe_threads() == (3, "OMP_NUM_THREADS")
    assert environment.probe_threads(5) == (5, "--threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    assert environment.probe_threads()[0] == environment.default_threads()


def test_api_and_cli_run_on_the_same_threads_and_record_them(monkeypatch, capsys):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(
        environment.default_threads() + 1
    )  # a caller's own setting: not what sigprop runs on
    try:
        r = sigprop.probe_mlp(depth=2, width=4, input_dim=5, samples=3, inits="he", device="cpu")
        assert r.environment["threads"] == environment.default_threads()
        assert torch.get_num_threads() == environment.default_threads() + 1  # restored
        assert (
            main(
                [
                    "mlp",
                    "--depth",
                    "2",
                    "--width",
                    "4",
                    "--input-dim",
                    "5",
                    "--samples",
                    "3",
                    "--init",
                    "he",
                    "--device",
                    "cpu",
                    "--format",
                    "json",
                ]
            )
            == 0
        )
        assert json.loads(capsys.readouterr().out)["environment"]["threads"] == environment.default_threads()
        r = sigprop.probe_mlp(depth=2, width=4, input_dim=5, samples=3, inits="he", device="cpu", threads=2)
        assert r.environment["threads"] == 2
    finally:
        torch.set_num_threads(before)


def test_env_reports_the_run_default(monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^run threads +3 \(.*OMP_NUM_THREADS\)$", out, re.M)
