"""The CLI: CliRunner, the one-line error wrapper, the installed entry point, the JSON contract."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sigprop import inits, kinds
from sigprop.cli import build, main

app = build()  # the application as main builds it (a test may register a kind first)

runner = CliRunner()
SMALL = ["--depth", "4", "--input-dim", "40", "--width", "30:50", "--samples", "64", "--device", "cpu"]


def run_main(capsys, args):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_choices_match_registry(capsys, monkeypatch):
    """What each command's --init accepts, found by running the real parser on every name: the
    registry's names for that net reach the core, every other registered name is refused naming
    --init.  (The core is stubbed: nothing is probed.)"""
    from sigprop import api
    from sigprop.errors import SigpropError

    def reached(spec, probe, **kw):
        raise SigpropError(f"reached the core with {','.join(spec.inits)}", exit_code=3)

    monkeypatch.setattr(api, "probe", reached)
    required = {"module": ["pkg:make", "--input-shape", "4"]}  # a model's command needs its model
    for cmd, kind in kinds.KINDS.items():
        accepted = []
        for name in inits.names():
            code = main([cmd, *required.get(cmd, []), "--init", name, "--samples", "2", "--device", "cpu"])
            err = capsys.readouterr().err
            if code == 3:
                accepted.append(name)
            else:
                assert code == 2 and "--init" in err, (cmd, name, err)
        offered = [n for n in inits.names(kind.provides) if n not in kind.excluded_inits]
        assert accepted == offered, (cmd, accepted)
    for name in inits.names():
        assert main(["cite", "--init", name]) == 0
    capsys.readouterr()


def test_mlp_table_default_inits():
    res = runner.invoke(app, ["mlp", *SMALL])
    assert res.exit_code == 0, res.output
    for name in ("he", "proposed", "proposed-gaussian"):
        assert name in res.output
    # the verdicts are stated (he at depth 4: 2^-2, within a decade), never a red "checks failed"
    assert (
        "signal preserved (typical ratio in the band) by every init: he, proposed, proposed-gaussian"
        in res.output
    )
    assert "none" not in res.output
    assert "checks:" not in res.output and "FAIL" not in res.output


def test_default_run_states_the_he_baseline_without_reporting_a_failure(capsys):
    """Depth 20: he (g = 1) halves the signal per layer; the default run names it among the inits
    that do not preserve the signal, exits 0, and prints no failed check."""
    code, out, err = run_main(capsys, ["mlp", "--samples", "100", "--device", "cpu"])
    assert code == 0, err
    assert "by: proposed, proposed-gaussian; not preserved by: he" in out
    assert "check failed" not in err and "FAIL" not in out


def test_json_contract(capsys):
    code, out, err = run_main(
        capsys, ["mlp", *SMALL, "--init", "proposed", "--init", "datadep", "--seeds", "2", "--format", "json"]
    )
    assert code == 0
    doc = json.loads(out)  # only JSON on stdout
    assert doc["schema"] == "sigprop.result.v1" and doc["command"] == "mlp"
    assert {"sigprop", "torch", "device", "dtype"} <= set(doc["environment"])
    assert doc["config"]["depth"] == 4 and doc["config"]["seeds"] == 2
    assert [r["init"] for r in doc["runs"]] == ["proposed", "datadep"]
    for run in doc["runs"]:
        assert len(run["widths"]) == 5 and len(run["layers"]) == 4
        for layer in run["layers"]:
            assert {"index", "width", "forward", "backward"} <= set(layer)
            for d in (layer["forward"], layer["backward"]):
                assert {"mean", "std", "rms", "log10_mean", "predicted"} <= set(d)
                assert isinstance(d["log10_mean"], float)
        for c in run["checks"]:
            assert {"name", "passed", "measured", "low", "high"} <= set(c)
        assert isinstance(run["passed"], bool)
    assert doc["runs"][1]["layers"][0]["backward"]["predicted"] is None  # datadep: no closed form
    assert "device" in err  # the banner goes to stderr


def test_csv(capsys):
    code, out, _ = run_main(capsys, ["mlp", *SMALL, "--init", "he", "--format", "csv"])
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("init,layer,width,forward_mean")
    assert len(lines) == 1 + 4


def test_check_exit_codes(capsys):
    args = ["mlp", "--depth", "20", "--samples", "200", "--device", "cpu", "--check"]
    code, _, err = run_main(capsys, [*args, "--init", "proposed"])
    assert code == 0, err
    code, _, err = run_main(capsys, [*args, "--init", "proposed", "--init", "he"])
    assert code == 1
    assert (
        "check failed (signal preserved): he" in err
        and "check failed (signal preserved): proposed" not in err
    )


@pytest.mark.parametrize(
    "args, option",
    [
        (["mlp", "--depth", "0"], "--depth"),
        (["mlp", "--samples", "-3"], "--samples"),
        (["mlp", "--input-dim", "0"], "--input-dim"),
        (["mlp", "--width", "250:150"], "--width"),
        (["mlp", "--width", "abc"], "--width"),
        (["mlp", "--width", "0"], "--width"),
        (["mlp", "--init", "nope"], "--init"),
        (["mlp", "--format", "xml"], "--format"),
        (["mlp", "--dtype", "float16"], "--dtype"),
        (["mlp", "--device", "tpu"], "--device"),
        (["mlp", "--depth"], "--depth"),
        (["mlp", "--init", "he", "--init", "he"], "--init"),
        (["mlp", "--depth", "100000", "--width", "100000", "--device", "cpu"], "--depth/--width/--samples"),
        (["mlp", "--depth", "99999999999999999999"], "--depth"),
        (["mlp", "--depth", "999999999999", "--device", "cpu"], "--depth"),  # its records, before its plan
        (["mlp", "--output", "/nonexistent-dir/x.json"], "--output"),
        (["mlp", "--output", "/"], "--output"),
        (["mlp", "--width", "5:"], "--width"),
        (["theory", "--format", "csv"], "--format"),
        (["mlp", "--init", "skipinit"], "--init"),
        (["resnet", "--blocks", "0"], "--blocks"),
        (["resnet", "--stages", "0"], "--stages"),
        (["resnet", "--dim", "0"], "--dim"),
        (["resnet", "--block-depth", "0"], "--block-depth"),
        (["resnet", "--norm", "ln"], "--norm"),
        (["resnet", "--width", "9:1"], "--width"),
        (["resnet", "--init", "nope"], "--init"),
        (["resnet", "--norm", "bn", "--width", "100"], "--width"),
        (["resnet", "--norm", "bn", "--stages", "2"], "--stages"),
        (["resnet", "--norm", "bn", "--block-depth", "2"], "--block-depth"),
        (["resnet", "--norm", "bn", "--init", "proposed"], "--init"),
        (["resnet", "--norm", "bn", "--samples", "1", "--device", "cpu"], "--samples"),
        (["resnet", "--norm", "none", "--init", "proposed"], "--init"),
        (["resnet", "--norm", "none", "--init", "he", "--init", "unnormalized-he"], "--init"),
        (["resnet", "--stages", "40"], "--stages"),
        (
            ["resnet", "--blocks", "100000", "--dim", "5000", "--device", "cpu", "--no-stream"],
            "--blocks/--stages/--dim/--width/--samples",
        ),
        (
            ["resnet", "--blocks", "100000", "--dim", "5000", "--device", "cpu", "--samples", "100000"],
            "--blocks/--stages/--dim/--width/--samples",
        ),
        (["mlp", "--precision", "tf32", "--device", "cpu"], "--precision"),
        (["mlp", "--precision", "tf32", "--dtype", "float64"], "--precision"),
        (["resnet", "--precision", "fp16"], "--precision"),
        (["mlp", "--graphs", "--device", "cpu"], "--graphs"),
        (["resnet", "--graphs", "--device", "cpu", "--blocks", "2"], "--graphs"),
        (["resnet", "--stages", "16", "--device", "cpu"], "--blocks/--stages/--dim/--width/--samples"),
        (["resnet", "--output", "/nonexistent-dir/x.json"], "--output"),
        (["theory", "--n", "1"], "--n"),
        (["theory", "--blocks", "0"], "--blocks"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, args, option):
    code, out, err = run_main(capsys, args)
    assert code == 2
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("sigprop: error:") and option in lines[0]
    assert "Traceback" not in err


def test_bare_command_shows_help(capsys):
    code, out, err = run_main(capsys, [])
    assert code == 0 and "mlp" in out and err == ""


def test_cuda_unavailable_is_refused(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    code, _, err = run_main(capsys, ["mlp", *SMALL[:-2], "--device", "cuda"])
    assert code == 2 and "--device" in err and "CUDA is not available" in err


def test_output_written_whole(tmp_path, capsys):
    target = tmp_path / "r.json"
    code, out, _ = run_main(
        capsys, ["mlp", *SMALL, "--init", "proposed", "--format", "json", "--output", str(target)]
    )
    assert code == 0 and out == ""
    assert json.loads(target.read_text())["schema"] == "sigprop.result.v1"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left behind
    table = tmp_path / "t.txt"
    assert main(["mlp", *SMALL, "--init", "he", "--output", str(table)]) == 0
    assert "fwd mean±std" in table.read_text()


def test_theory_json(capsys):
    code, out, _ = run_main(
        capsys, ["theory", "--n", "2", "--n", "1000000", "--blocks", "40", "--format", "json"]
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "sigprop.theory.v1"
    assert [r["n"] for r in doc["kn"]] == [2, 1000000]
    for r in doc["kn"]:
        assert r["closed_form"] == pytest.approx(1.0) and r["quadrature"] == pytest.approx(1.0)
    assert doc["resnet"][0]["blocks"] == 40
    assert doc["resnet"][0]["lower"] <= doc["resnet"][0]["ratio"] <= doc["resnet"][0]["upper"]
    assert doc["resnet"][0]["inside"] is True


def test_inits_lists_registry():
    res = runner.invoke(app, ["inits"])
    assert res.exit_code == 0
    for name in inits.names():
        assert name in res.output


def test_version_and_short_help(capsys):
    code, out, _ = run_main(capsys, ["--version"])
    assert code == 0 and out.startswith("sigprop ")
    code, out, _ = run_main(capsys, ["mlp", "-h"])
    assert code == 0 and "--depth" in out


def test_help_and_inits_do_not_import_torch():
    code = (
        "import sys; from sigprop.cli import main; "
        "main(['--help']); main(['inits']); main(['theory', '--n', '5', '--blocks', '3']); "
        "print('TORCH', 'torch' in sys.modules, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "TORCH False" in out.stderr


def test_a_probe_of_sigprops_own_nets_loads_only_what_it_runs():
    """In a fresh interpreter, ``sigprop mlp`` loads neither the model engine (its traced-op
    maps) nor scipy.special: 0.2 s of import that 0.13.0 added to every run (``from sigprop
    import hessian`` loaded the whole API, the API imported ``init_``, the driver the model
    engine).  The core is loaded with the collector paused and frozen after (cli/common.py
    ``core``: 0.19 s of collections over torch's objects), once: the collector is on after, and
    a second command freezes nothing more (frozen objects that die leave the count).  Issue 41:
    a default run's wall time no longer than 0.10.1's."""
    code = (
        "import gc, sys; from sigprop.cli import main, common\n"
        "main(['mlp', '--format', 'json', '--depth', '2', '--samples', '4'])\n"
        "frozen = gc.get_freeze_count()\n"
        "main(['mlp', '--format', 'json', '--depth', '2', '--samples', '4']); common.core()\n"
        "print('LOADED', sorted(m for m in ('sigprop.model', 'scipy.special') if m in sys.modules), "
        "gc.isenabled(), frozen > 10000, gc.get_freeze_count() <= frozen, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "LOADED [] True True True" in out.stderr, out.stderr[-2000:]


def test_installed_entry_point():
    beside = os.path.join(os.path.dirname(sys.executable), "sigprop")
    exe = beside if os.path.exists(beside) else shutil.which("sigprop")
    if exe is None:
        pytest.skip("sigprop is not installed as a console script")
    out = subprocess.run(
        [exe, "mlp", *SMALL, "--init", "proposed", "--format", "json", "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["passed"] is True
    bad = subprocess.run([exe, "mlp", "--width", "9:1"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--width" in bad.stderr


def test_api_matches_cli(capsys):
    import sigprop

    r = sigprop.probe_mlp(depth=4, input_dim=40, width="30:50", samples=64, inits=["proposed"], device="cpu")
    code, out, _ = run_main(capsys, ["mlp", *SMALL, "--init", "proposed", "--format", "json"])
    doc = json.loads(out)
    assert r.runs[0].layers[0].forward.mean == doc["runs"][0]["layers"][0]["forward"]["mean"]


RSMALL = ["--blocks", "6", "--dim", "40", "--width", "20:30", "--samples", "64", "--device", "cpu"]


def test_resnet_json_contract(capsys):
    code, out, err = run_main(
        capsys,
        [
            "resnet",
            *RSMALL,
            "--stages",
            "2",
            "--block-depth",
            "2",
            "--init",
            "proposed",
            "--init",
            "skipinit",
            "--format",
            "json",
        ],
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "sigprop.result.v1" and doc["command"] == "resnet"
    cfg = doc["config"]
    assert cfg["blocks"] == 6 and cfg["stages"] == 2 and cfg["block_depth"] == 2 and cfg["norm"] == "wn"
    assert cfg["stage_dims"] == [40, 80] and len(cfg["hidden_widths"]) == 12
    assert all(len(h) == 2 and all(20 <= w <= 30 for w in h) for h in cfg["hidden_widths"])
    for run in doc["runs"]:
        assert len(run["layers"]) == 13
        assert [l["stage"] for l in run["layers"]] == [0] + [1] * 6 + [2] * 6
        assert [l["width"] for l in run["layers"]] == [40] * 7 + [80] * 6
        assert run["layers"][0]["branch"] is None
        assert all(set(l["branch"]) >= {"mean", "rms", "predicted"} for l in run["layers"][1:])
        assert [s["first"] for s in run["stages"]] == [0, 6] and [s["last"] for s in run["stages"]] == [6, 12]
        assert [c["verdict"] for c in run["checks"]] == ["preserved"] * 4 + ["theory"] * 4
        assert run["gate"] == "preserved" and run["passed"] == run["preserved"]
        assert "branch" in run["agreement"]
    skip = doc["runs"][1]
    assert all(l["forward"]["rms"] == pytest.approx(1.0, abs=1e-5) for l in skip["layers"][:7])


def test_resnet_bn_json_and_csv(capsys):
    code, out, err = run_main(
        capsys,
        [
            "resnet",
            "--norm",
            "bn",
            "--blocks",
            "5",
            "--dim",
            "30",
            "--samples",
            "50",
            "--device",
            "cpu",
            "--format",
            "json",
        ],
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["config"]["norm"] == "bn" and doc["config"]["width"] is None
    run = doc["runs"][0]
    assert run["init"] == "he" and len(run["layers"]) == 7
    for l in run["layers"]:
        assert set(l["bn"]) == {"skip_variance", "moving_variance", "moving_squared_mean"}
        assert l["bn"]["skip_variance"]["predicted"] == (1.0 if l["index"] == 0 else l["index"])
    code, out, _ = run_main(
        capsys,
        [
            "resnet",
            "--norm",
            "bn",
            "--blocks",
            "5",
            "--dim",
            "30",
            "--samples",
            "50",
            "--device",
            "cpu",
            "--format",
            "csv",
        ],
    )
    lines = out.strip().splitlines()
    assert (
        lines[0].startswith("init,index,stage,width,forward_mean")
        and "bn_moving_squared_mean_predicted" in lines[0]
    )
    assert len(lines) == 1 + 7


def test_resnet_table_shows_stages_and_band():
    res = runner.invoke(app, ["resnet", *RSMALL, "--stages", "2", "--init", "proposed"])
    assert res.exit_code == 0, res.output
    assert "stage 2 (h^6..h^12, 6 blocks, projection 40->80)" in res.output
    assert "[1.414, 1.649]" in res.output and "branch" in res.output
    res = runner.invoke(
        app, ["resnet", "--norm", "bn", "--blocks", "4", "--dim", "30", "--samples", "40", "--device", "cpu"]
    )
    assert res.exit_code == 0, res.output
    assert "moving mean²" in res.output and "l(1-1/π)" in res.output


def test_resnet_norm_none_runs_unnormalized_he(capsys):
    code, out, _ = run_main(capsys, ["resnet", *RSMALL, "--norm", "none", "--format", "json"])
    assert code == 0
    doc = json.loads(out)
    assert [r["init"] for r in doc["runs"]] == ["unnormalized-he"]
    # 3^{b/2}: the skip-path variance of the unnormalized He ResNet grows exponentially
    assert doc["runs"][0]["layers"][-1]["forward"]["predicted"] == pytest.approx(3.0**3, rel=1e-12)


def test_resnet_check_exit_codes(capsys):
    args = [
        "resnet",
        "--blocks",
        "40",
        "--dim",
        "200",
        "--width",
        "100",
        "--samples",
        "200",
        "--device",
        "cpu",
        "--check",
    ]
    code, _, err = run_main(capsys, [*args, "--init", "proposed"])
    assert code == 0, err
    code, _, err = run_main(capsys, [*args, "--init", "proposed", "--init", "he"])
    assert code == 1
    assert (
        "check failed (signal preserved): he: typical stage 1 forward" in err
        and "check failed (signal preserved): proposed" not in err
    )


def test_api_resnet_matches_cli(capsys):
    import sigprop

    r = sigprop.probe_resnet(blocks=6, dim=40, width="20:30", samples=64, inits=["he"], device="cpu")
    code, out, _ = run_main(capsys, ["resnet", *RSMALL, "--init", "he", "--format", "json"])
    doc = json.loads(out)
    assert r.runs[0].layers[-1].forward.mean == doc["runs"][0]["layers"][-1]["forward"]["mean"]


def test_mlp_stream_flag_is_recorded(capsys):
    code, out, _ = run_main(capsys, ["mlp", *SMALL, "--init", "proposed", "--stream", "--format", "json"])
    assert code == 0
    doc = json.loads(out)
    assert doc["environment"]["stream"] is True and doc["config"]["stream"] is True
    code, out, _ = run_main(capsys, ["mlp", *SMALL, "--init", "proposed", "--format", "json"])
    assert json.loads(out)["environment"]["stream"] is False  # small nets store their weights


def test_every_cli_option_is_in_docs_cli_md():
    """docs/cli.md names every option of every command in that command's section."""
    import re
    from pathlib import Path

    import typer

    from sigprop.cli import build

    app = build()

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    sections = dict(re.findall(r"^## `sigprop (\w+)`\n(.*?)(?=^## |\Z)", doc, re.M | re.S))
    group = typer.main.get_command(app)
    head = doc.split("\n## ", 1)[0]
    for param in group.params:
        for opt in param.opts:
            if opt.startswith("--") and opt != "--help":
                assert opt in head, f"root option {opt} missing from docs/cli.md"
    missing = []
    for name, cmd in group.commands.items():
        assert name in sections, f"no section for sigprop {name} in docs/cli.md"
        for param in cmd.params:
            if param.name == "help":
                continue
            names = [
                o for o in list(param.opts) + list(getattr(param, "secondary_opts", [])) if o.startswith("--")
            ]
            names = names or [(param.metavar or param.name).upper()]
            for opt in names:
                if opt not in sections[name]:
                    missing.append(f"{name} {opt}")
    assert not missing, f"options missing from docs/cli.md: {missing}"


def test_cnn_command_runs_and_says_what_it_can_test(capsys):
    """sigprop cnn: proposed beside delta-orthogonal, the lossless reference, both verdicts (the
    finite-width band of conv nets, issue 27), JSON with the energy-map prediction per layer."""
    import json

    from sigprop.cli import main

    args = [
        "cnn",
        "--depth",
        "12",
        "--channels",
        "64",
        "--image",
        "3x16x16",
        "--samples",
        "16",
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "delta-orthogonal" in out and "agrees with finite-width theory" in out and "units" in out
    assert main(args + ["--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (
        doc["command"] == "cnn"
        and doc["config"]["image"] == "3x16x16"
        and doc["config"]["units"][0] == 3 * 16 * 16
    )
    delta = doc["runs"][1]
    assert delta["init"] == "delta-orthogonal" and delta["layers"][-1]["forward"][
        "predicted"
    ] == pytest.approx(0.25)
    assert (
        delta["layers"][0]["forward"]["agreement"]["agrees"] is True and delta["agrees_with_theory"] is True
    )
    assert main(["cnn", "--depth", "3", "--init", "stage-hanin", "--device", "cpu"]) == 2  # a ResNet scheme


def test_wrn_command_reports_every_state_and_stage(capsys, tmp_path):
    """sigprop wrn: conv1 and every block's output with the energy-map prediction, a stage
    check per group, JSON that sigprop rerun reproduces; presets and bad input refused in one line."""
    import json

    from sigprop.cli import main

    args = [
        "wrn",
        "--blocks",
        "2",
        "--image",
        "3x8x8",
        "--samples",
        "6",
        "--device",
        "cpu",
        "--init",
        "proposed",
        "--init",
        "he",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    # 16 channels, 2 blocks a group: the bands are wider than a factor of two a layer moves them
    # (issue 37, item 3)
    assert "units" in out and "stage 3 (h^5..h^7, 2 blocks" in out
    assert "not testable against finite-width theory" in out and "not a test: the band" in out
    path = tmp_path / "wrn.json"
    assert main(args + ["--format", "json", "--output", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert (
        doc["command"] == "wrn"
        and doc["config"]["blocks"] == 2
        and doc["config"]["units"] == [192, 1024, 1024, 1024, 512, 512, 256, 256]
    )
    run = doc["runs"][0]
    assert (
        len(run["layers"]) == 8
        and len(run["stages"]) == 3
        and run["layers"][2]["branch"]["predicted"] is not None
    )
    capsys.readouterr()
    assert main(["rerun", str(path), "--format", "json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert [r["layers"][-1]["forward"]["log10_mean"] for r in again["runs"]] == [
        r["layers"][-1]["forward"]["log10_mean"] for r in doc["runs"]
    ]
    for bad, field in (
        (["--preset", "resnet-110", "--blocks", "3"], "--blocks"),
        (["--norm", "bn", "--init", "proposed"], "He init"),
        (["--preset", "resnet-7"], "--preset"),
        (["--init", "delta"], "--init"),
        (["--widen", "0"], "--widen"),
    ):
        assert main(["wrn", "--device", "cpu"] + bad) == 2, bad
        err = capsys.readouterr().err
        assert field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_hessian_command(capsys, tmp_path):
    """sigprop hessian NET: the net's own options, the curvature per init and draw, JSON
    (sigprop.hessian.v1), the user's data, one-line refusals."""
    import json

    import numpy as np

    from sigprop.cli import main

    args = [
        "hessian",
        "mlp",
        "--depth",
        "3",
        "--width",
        "8",
        "--input-dim",
        "6",
        "--samples",
        "16",
        "--seeds",
        "2",
        "--device",
        "cpu",
        "--init",
        "proposed",
        "--init",
        "datadep",
        "--top",
        "2",
        "--trace",
        "3",
    ]
    assert main(args + ["--plot", str(tmp_path / "h.png")]) == 0
    out = capsys.readouterr().out
    assert (
        "log10 spectral norm" in out
        and "lowest to highest curvature" in out
        and (tmp_path / "h.png").stat().st_size > 0
    )
    assert main(args + ["--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (
        doc["schema"] == "sigprop.hessian.v1"
        and doc["command"] == "mlp"
        and [r["init"] for r in doc["runs"]] == ["proposed", "datadep"]
    )
    d = doc["runs"][0]["draws"][0]
    assert d["status"] in ("converged", "not converged") and len(d["top"]) == 2 and d["trace_se"] is not None
    assert d["parameters"] == 3 * (8 + 8) + 6 * 8 + 8 * 8 * 2 + (
        10 + 8 * 10
    )  # g, b, v per layer; the paper's plain head: b, W
    assert doc["config"]["head"] == "pytorch"
    assert main(args[:-4] + ["--head", "init", "--format", "json"]) == 0  # the init's own WN head: g, b, v
    doc = json.loads(capsys.readouterr().out)
    assert (
        doc["config"]["head"] == "init" and doc["runs"][0]["draws"][0]["parameters"] == d["parameters"] + 10
    )
    assert main(args[:-4] + ["--batch-size", "5", "--format", "json"]) == 0  # minibatches of 5, 5, 5, 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["batch_size"] == 5 and all(
        dr["status"] != "diverged" for r in doc["runs"] for dr in r["draws"]
    )
    data = tmp_path / "d.npz"
    np.savez(
        data, x=np.random.default_rng(0).standard_normal((12, 6)).astype(np.float32), y=np.arange(12) % 10
    )
    assert (
        main(
            [
                "hessian",
                "mlp",
                "--depth",
                "2",
                "--width",
                "8",
                "--input-dim",
                "6",
                "--seeds",
                "1",
                "--device",
                "cpu",
                "--init",
                "proposed",
                "--data",
                str(data),
                "--format",
                "json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["config"]["data"] == str(data)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((12, 5)), y=np.zeros(12, dtype=int))
    for argv, field in (
        (["hessian", "mlp", "--input-dim", "6", "--data", str(bad)], "--data"),
        (["hessian", "mlp", "--format", "csv"], "--format"),
        (["hessian", "resnet", "--tol", "2"], "--tol"),
        (["hessian", "mlp", "--head", "wn"], "--head"),
        (["hessian", "mlp", "--batch-size", "0"], "--batch-size"),
    ):
        assert main(argv + ["--device", "cpu"]) == 2, argv
        err = capsys.readouterr().err
        assert field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_command_builds_only_its_family(capsys, monkeypatch):
    """``sigprop mlp`` builds the probes' commands alone -- not ``hessian``'s, ``spectrum``'s or
    the tools' (sweep, check, ...), whose registration 0.16 ran for every run -- while help, an
    unknown name and an option first build every family (the did-you-mean still sees them all)."""
    import importlib

    built = []
    for family in ("probe", "curvature", "spectrum", "tools"):
        module = importlib.import_module(f"sigprop.cli.{family}")
        monkeypatch.setattr(
            module, "register", lambda app, f=family, r=module.register: (built.append(f), r(app))
        )
    assert main(["mlp", *SMALL, "--init", "he"]) == 0 and built == ["probe"]
    built.clear()
    assert main(["hessian", "mlp", "-h"]) == 0 and built == ["curvature"]
    built.clear()
    assert main(["inits"]) == 0 and built == ["tools"]
    built.clear()
    assert main(["-h"]) == 0 and built == ["probe", "curvature", "spectrum", "tools"]
    out = capsys.readouterr().out
    assert all(name in out for name in ("mlp", "hessian", "spectrum", "sweep", "check"))
    built.clear()
    assert main(["hesian", "mlp"]) == 2 and len(built) == 4
    assert "Did you mean 'hessian'?" in capsys.readouterr().err
