"""Inputs that 0.3.0 silently ignored, half-applied or crashed on: each now gets a one-line error
naming the option, or the behaviour the user meant (issue: "silent wrong input")."""

import json

import pytest

import sigprop
import sigprop.specs
from sigprop import api
from sigprop.cli import main
from sigprop.kinds.mlp import MLPSpec
from sigprop.kinds.resnet import ResNetSpec


def _run(capsys, args):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_sweep_resnet_refuses_depth(capsys, tmp_path):
    code, _, err = _run(capsys, ["sweep", "resnet", "--out", str(tmp_path / "r.jsonl"), "--depth", "3"])
    assert code == 2 and "--depth" in err and "it takes --blocks" in err and err.count("\n") == 1
    assert not (tmp_path / "r.jsonl").exists()


def test_sweep_mlp_refuses_blocks_and_resnet_refuses_input_dim(capsys, tmp_path):
    assert _run(capsys, ["sweep", "mlp", "--out", str(tmp_path / "r.jsonl"), "--blocks", "3"])[0] == 2
    code, _, err = _run(capsys, ["sweep", "resnet", "--out", str(tmp_path / "r.jsonl"), "--input-dim", "3"])
    assert code == 2 and "--input-dim" in err


def test_sweep_runs_every_repeated_init(capsys, tmp_path):
    out = tmp_path / "r.jsonl"
    code, _, err = _run(
        capsys,
        [
            "sweep",
            "mlp",
            "--out",
            str(out),
            "--init",
            "proposed",
            "--init",
            "he",
            "--depth",
            "2",
            "--width",
            "8",
            "--samples",
            "4",
            "--device",
            "cpu",
        ],
    )
    assert code == 0, err
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert sorted(r["init"] for r in rows) == ["he", "proposed"]
    assert all({"preserved", "agrees_with_theory"} <= set(r) for r in rows)
    assert all("log10_draw_std" in r["end_to_end"]["forward"] for r in rows)


def test_plot_refuses_a_file_mixing_mlp_and_resnet_rows(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.jsonl"
    for cmd in (["mlp", "--depth", "2"], ["resnet", "--blocks", "2"]):
        code, _, err = _run(
            capsys,
            [
                "sweep",
                cmd[0],
                "--out",
                str(out),
                cmd[1],
                cmd[2],
                "--width",
                "8",
                "--samples",
                "4",
                "--init",
                "he",
                "--device",
                "cpu",
            ],
        )
        assert code == 0, err
    code, _, err = _run(capsys, ["plot", str(out), "--out", str(tmp_path / "f.png")])
    assert code == 2 and "mixes sweeps of mlp and resnet" in err and "internal error" not in err
    assert not (tmp_path / "f.png").exists()


def test_check_config_refuses_a_resnet_only_init_for_mlp(capsys, tmp_path, monkeypatch):
    (tmp_path / "sigprop.toml").write_text('[checks.a]\ncommand = "mlp"\ndepth = 2\ninit = "skipinit"\n')
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, ["check"])
    assert code == 2 and "sigprop.toml:4" in err and "skipinit" in err and "not defined for the MLP" in err


def test_api_refuses_a_resnet_only_init_for_mlp():
    with pytest.raises(sigprop.errors.SigpropError, match="not defined for the MLP"):
        api.probe_mlp(depth=2, width=8, inits=["skipinit"], device="cpu")


def test_api_takes_one_init_as_a_string_and_the_cli_defaults():
    import inspect

    r = sigprop.probe_mlp(depth=2, width=8, input_dim=8, samples=4, inits="proposed", device="cpu")
    assert [run.init for run in r.runs] == ["proposed"]
    sig = inspect.signature(sigprop.probe_mlp)  # a real signature, not (*args, **kwargs)
    assert sig.parameters["inits"].default == ("he", "proposed", "proposed-gaussian")
    assert sig.parameters["samples"].default == 1000 and sig.parameters["width"].default == "150:250"
    assert inspect.signature(sigprop.probe_resnet).parameters["blocks"].default == 40


@pytest.mark.parametrize(
    "args, words",
    [
        (["mlp", "--init", "he,proposed"], ["give one per option", "--init he --init proposed"]),
        (["mlp", "--init", "propsed"], ["did you mean 'proposed'"]),
        (["resnet", "--init", "skipnit"], ["did you mean 'skipinit'"]),
        (["mlp", "--depth", "10,20"], ["--depth", "one integer", "sigprop sweep"]),
    ],
)
def test_usage_errors_hint_and_drop_the_validator_prefix(capsys, args, words):
    code, _, err = _run(capsys, args)
    assert code == 2 and err.count("\n") == 1 and "Value error" not in err
    for w in words:
        assert w in err, err


def test_one_sample_prints_no_spread(capsys):
    code, out, err = _run(
        capsys,
        ["mlp", "--depth", "2", "--width", "8", "--samples", "1", "--device", "cpu", "--init", "proposed"],
    )
    assert code == 0, err
    assert "(1 sample)" in out and "±0 " not in out


def test_print_result_is_readable():
    r = sigprop.probe_mlp(
        depth=20, width=32, input_dim=32, samples=20, device="cpu", inits=["he", "proposed"]
    )
    text = repr(r)
    assert text.startswith("ProbeResult(mlp, depth 20, width 32") and len(text) < 300
    assert "he: signal NOT preserved, agrees with theory" in text and "proposed: signal preserved" in text
    assert repr(r.run("he")).startswith("RunResult(he: signal NOT preserved")


def test_progress_names_the_init_and_the_pass():
    seen = []
    api.probe(
        MLPSpec(depth=3, input_dim=8, width=sigprop.specs.WidthSpec(8, 8), inits=("he", "proposed")),
        sigprop.specs.ProbeSpec(samples=4, device="cpu"),
        progress=lambda d, t, label: seen.append((d, t, label)),
    )
    assert seen[-1][0] == seen[-1][1] == 10  # 3 forward + 2 backward steps per init: the bar ends full
    assert [s[2] for s in seen] == ["he: forward"] * 3 + ["he: backward"] * 2 + ["proposed: forward"] * 3 + [
        "proposed: backward"
    ] * 2


@pytest.mark.parametrize("norm", ["wn", "bn"])
def test_resnet_progress_ends_at_its_total(norm):
    seen = []
    spec = ResNetSpec(blocks=3, dim=8, width=sigprop.specs.WidthSpec(8, 8), norm=norm, inits=("he",))
    api.probe(
        spec,
        sigprop.specs.ProbeSpec(samples=4, device="cpu"),
        progress=lambda d, t, label: seen.append((d, t, label)),
    )
    assert seen[-1][0] == seen[-1][1] and seen[0][2] == "he: forward" and seen[-1][2] == "he: backward"


def test_library_errors_name_the_field_and_the_cli_its_flag(capsys):
    """The library speaks of its own fields (``input_dim``); only the CLI says ``--input-dim``."""
    with pytest.raises(sigprop.errors.SigpropError) as err:
        sigprop.probe_mlp(input_dim=0, device="cpu")
    assert (
        err.value.field == "input_dim"
        and str(err.value).startswith("input_dim: ")
        and "--" not in str(err.value)
    )
    code, _, err_text = _run(capsys, ["mlp", "--input-dim", "0", "--device", "cpu"])
    assert code == 2 and err_text.startswith("sigprop: error: ") and "--input-dim" in err_text
    code, _, err_text = _run(
        capsys, ["mlp", "--depth", "40000", "--width", "16384", "--no-stream", "--device", "cpu"]
    )  # its weights (43 TB) cannot fit, not its records (2 GiB: Kind.rows)
    assert code == 2 and "--depth/--width/--samples: this run needs" in err_text


@pytest.mark.parametrize(
    "command", [["plot", "{f}", "--out", "{png}"], ["rerun", "{f}"], ["sweep", "mlp", "--out", "{f}"]]
)
def test_a_binary_file_is_refused_alike_by_plot_rerun_and_sweep(capsys, tmp_path, command):
    """0.7.0: `sigprop plot` on a binary file was an internal UnicodeDecodeError (exit 1) while
    `sigprop rerun` refused it (exit 2): now one line, exit 2, for every command that reads one."""
    pytest.importorskip("matplotlib")
    f = tmp_path / "bin.jsonl"
    f.write_bytes(bytes(range(128, 256)))
    args = [a.format(f=f, png=tmp_path / "x.png") for a in command]
    code, _, err = _run(capsys, args)
    assert code == 2 and err.count("\n") == 1 and "internal error" not in err and "not" in err
    assert f.read_bytes() == bytes(range(128, 256))


def test_top_is_refused_at_or_above_the_parameter_count(capsys):
    """0.7.0: --top 100000 on a 4-layer width-32 net ran for minutes; --top 1000 on a 40-parameter
    net silently returned 39 values.  Now refused before anything is drawn, naming the count."""
    import time

    t0 = time.perf_counter()
    code, _, err = _run(
        capsys, ["hessian", "mlp", "--depth", "4", "--width", "32", "--top", "100000", "--device", "cpu"]
    )
    assert code == 2 and err.startswith("sigprop: error: --top: at most ") and "trainable parameters" in err
    assert time.perf_counter() - t0 < 60  # refused up front (generous: a slow machine), not after Lanczos ran
    code, _, err = _run(
        capsys,
        [
            "hessian",
            "mlp",
            "--depth",
            "1",
            "--width",
            "3",
            "--input-dim",
            "3",
            "--top",
            "55",
            "--device",
            "cpu",
            "--init",
            "proposed",
        ],
    )
    assert code == 2 and "at most 54: the net has 55 trainable parameters" in err


def test_a_long_top_list_keeps_the_table_readable_and_the_json_whole(capsys, tmp_path):
    args = [
        "hessian",
        "mlp",
        "--depth",
        "1",
        "--width",
        "3",
        "--input-dim",
        "3",
        "--top",
        "30",
        "--seeds",
        "1",
        "--samples",
        "16",
        "--device",
        "cpu",
        "--init",
        "proposed",
    ]
    code, out, err = _run(capsys, args)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "… (all 30: --format json)" in flat and "at least 55 Hessian-vector products per draw" in err
    assert "init draw λ log10 |λ| products residual status" in flat  # no column cut to "…"
    row = flat[flat.index("converged") : flat.index("(all 30")]
    assert row.count(",") == 5  # five values, then the pointer to the JSON
    code, out, _ = _run(capsys, args + ["--format", "json"])
    assert len(json.loads(out)["runs"][0]["draws"][0]["top"]) == 30


def test_ctrl_c_while_the_cli_loads_is_one_line(monkeypatch, capsys):
    """Ctrl-C in the first half second, while the console script imports typer and the commands:
    one line, exit 130 (0.15.0's entry point, ``sigprop.cli:run``, imported the CLI before any
    handler and printed a 35-line KeyboardInterrupt traceback).  The script is the one
    pyproject.toml declares; the interrupt is raised by the import of ``sigprop.cli``."""
    import importlib
    import re
    import sys
    from pathlib import Path

    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    module, _, name = re.search(r'^sigprop = "([^"]+)"', pyproject, re.M).group(1).partition(":")

    class Interrupt:
        def find_spec(self, fullname, path=None, target=None):
            if fullname == "sigprop.cli":
                raise KeyboardInterrupt
            return None

    for loaded in [
        m for m in sys.modules if m == "sigprop.cli" or m.startswith("sigprop.cli.") or m == module
    ]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setattr(sys, "meta_path", [Interrupt(), *sys.meta_path])
    monkeypatch.setattr(sys, "argv", ["sigprop", "inits"])
    with pytest.raises(SystemExit) as stop:
        getattr(importlib.import_module(module), name)()
    assert stop.value.code == 130
    assert capsys.readouterr().err == "sigprop: interrupted\n"
