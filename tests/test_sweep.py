"""sigprop/sweep.py: the grid from a kind's declaration, its resume keys (unchanged from 0.7, so a
sweep file written then resumes now), and the rows read back for ``sigprop plot``."""

import json
from pathlib import Path

import pytest
import walks

from sigprop import kinds, specs
from sigprop import sweeps as sweep
from sigprop.errors import SigpropError

PROBE = specs.ProbeSpec(samples=30, device="cpu")


def test_parse_ints_and_inits():
    assert sweep.parse_ints("10, 20,50", "depth") == [10, 20, 50]
    for bad in ("10,10", "0,3", "a"):
        with pytest.raises(SigpropError) as err:
            sweep.parse_ints(bad, "depth")
        assert err.value.field == "depth"
    assert sweep.parse_inits("proposed,he", kinds.KINDS["mlp"]) == ["proposed", "he"]
    with pytest.raises(SigpropError, match="not defined"):
        sweep.parse_inits("skipinit", kinds.KINDS["mlp"])


@pytest.mark.parametrize(
    "kind, extra",
    [
        ("mlp", {"input_dim": 64}),
        ("resnet", {"dim": 64}),
        ("cnn", {"image": "3x32x32"}),
        ("wrn", {"image": "3x32x32"}),
    ],
)
def test_resume_keys_are_0_7s(kind, extra):
    k = kinds.KINDS[kind]
    point = walks.grid(k, [3], [64 if kind != "wrn" else 1], ["proposed"], PROBE)[0]
    size = "depth" if kind in ("mlp", "cnn") else "blocks"
    width = 64 if kind != "wrn" else 1
    if kind != "mlp":
        extra = {k2: (v if k2 != "dim" else width) for k2, v in extra.items()}
    want = {
        "command": kind,
        size: 3,
        "width": width,
        "init": "proposed",
        "samples": 30,
        "seeds": 1,
        "seed": 0,
        "dtype": "float32",
        **extra,
    }
    assert json.loads(point.key) == want


def test_rows_read_back_refuse_a_mixed_file(tmp_path):
    path = tmp_path / "s.jsonl"
    rows = [{"schema": sweep.SWEEP_SCHEMA, "config": {"command": c, "depth": 3}} for c in ("mlp", "resnet")]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    with pytest.raises(SigpropError, match="3: not a JSON line"):
        sweep.done_keys(path)  # refused before a sweep appends to it (issue 47)
    with pytest.raises(SigpropError, match="3: not a JSON line"):
        sweep.read_rows(path)  # and named when plotting
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SigpropError, match="mixes sweeps"):
        sweep.read_rows(path)


def test_the_api_runs_and_resumes_a_sweep_on_any_executor(tmp_path):
    """The loop is the library's (``sigprop.sweep``): an executor decides where and in which order the
    points run, every line is written here as its result arrives, and a second call resumes."""
    import sigprop

    out, plans = tmp_path / "s.jsonl", []
    backwards = lambda fn, items: (fn(p) for p in reversed(items))
    probe = specs.ProbeSpec(samples=8, device="cpu")
    run = lambda depths, executor="local", **kw: sigprop.sweep(
        "mlp",
        out,
        depth=depths,
        executor=executor,
        width=[8],
        init=["he"],
        probe_spec=probe,
        on_plan=lambda *a: plans.append(a),
        **kw,
    )
    assert [r["config"]["depth"] for r in run([2, 3], executor=backwards)] == [3, 2]
    assert [r["config"]["depth"] for r in run([2, 3, 4])] == [4]
    assert plans == [(2, 2), (3, 1)]
    assert [json.loads(line)["config"]["depth"] for line in out.read_text().splitlines()] == [3, 2, 4]


def test_run_sweep_is_deprecated_and_still_runs(tmp_path):
    """0.12's ``run_sweep`` warns (removed in 0.19.0) and writes what ``sweep`` writes."""
    import sigprop

    probe = specs.ProbeSpec(samples=8, device="cpu")
    with pytest.warns(DeprecationWarning, match="run_sweep is deprecated since 0.17.0 .* removed in 0.19.0"):
        old = sigprop.run_sweep(
            "mlp", tmp_path / "a.jsonl", {"depth": [2]}, width=[8], init=["he"], probe_spec=probe
        )
    new = sigprop.sweep("mlp", tmp_path / "b.jsonl", depth=[2], width=[8], init=["he"], probe_spec=probe)
    assert old[0]["config"] == new[0]["config"] and old[0]["end_to_end"] == new[0]["end_to_end"]


NETS = Path(__file__).parent / "cluster" / "nets.py"


def test_a_kind_takes_its_own_sweep_options_only():
    mlp, model = kinds.get("mlp"), kinds.get("module")
    with pytest.raises(
        SigpropError, match="does not apply to sweep mlp; it takes --depth, --width, --input-dim"
    ):
        sweep.configure(mlp, {"depth": [3], "arg": ["depth=3"]})
    takes = "it takes TARGET, --config, --arg, --input-shape, --sites, --vocab"
    with pytest.raises(SigpropError, match=takes) as err:
        sweep.configure(model, {"target": f"{NETS}:make", "input_shape": ["3,8,8"], "depth": [3]})
    assert err.value.field == "depth"
    with pytest.raises(SigpropError, match="give the model") as err:
        sweep.configure(model, {"input_shape": ["3,8,8"]})
    with pytest.raises(SigpropError, match="no file") as err:
        sweep.configure(model, {"target": "nowhere.py:make", "input_shape": ["3,8,8"]})
    assert err.value.field == "target"  # before any point runs
    with pytest.raises(SigpropError, match="unknown measurement .*; choose from probe, hessian, spectrum"):
        sweep.configure(mlp, {}, measure="curvature")


def test_a_models_grid_is_arg_values_x_input_shapes_x_inits():
    """Every combination of the --arg comma lists, each --input-shape, each init; the key keeps
    TARGET as given, the spec holds the file's absolute path (a worker may run elsewhere)."""
    target = f"{NETS.relative_to(Path.cwd()) if NETS.is_relative_to(Path.cwd()) else NETS}:make"
    points = sweep.configure(
        kinds.get("module"),
        {"target": target, "arg": ["depth=1,2", "width=8,16"], "input_shape": ["3,8,8", "3,8,8;4"]},
        init="as-is,proposed",
    )
    assert len(points) == 2 * 2 * 2 * 2
    first = points[0]
    assert first.config["target"] == target and first.config["args"] == ["depth=1", "width=8"]
    assert first.config["input_shape"] == "3,8,8" and first.config["samples"] == 64
    assert first.spec.target.startswith("/") and first.spec.inits == ("as-is",)
    assert first.label() == "module depth=1 width=8 input shape 3,8,8 as-is"
    assert points[-1].config["input_shape"] == "3,8,8;4" and points[-1].init == "proposed"
    assert len({p.key for p in points}) == len(points)


def test_a_failed_point_is_a_line_the_sweep_goes_on_and_exits_1(tmp_path, capsys):
    """Serially as on a cluster: the point whose model raises is one failure line, the others are
    measured, the exit is 1 and the line says why; a rerun measures only the failed point."""
    from sigprop.cli import main

    out = tmp_path / "f.jsonl"
    args = ["sweep", "module", f"{NETS}:make", "--arg", "fail=False,True", "--input-shape", "3,8,8"]
    args += ["--device", "cpu", "--samples", "16", "--out", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "sweep [2/2] module fail=True input shape 3,8,8 as-is: FAILED: SigpropError: " in err
    assert "1 point(s) failed" in err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["schema"] for r in rows] == [sweep.SWEEP_SCHEMA, sweep.FAILED_SCHEMA]
    assert "asked to fail" in rows[1]["error"] and rows[1]["refused"]
    assert main(args) == 2  # only the failed point again, refused again: bad input
    assert "1 already in" in capsys.readouterr().err


def test_measure_hessian_and_spectrum_write_their_lines(tmp_path):
    import sigprop

    probe = specs.ProbeSpec(samples=8, device="cpu")
    h = sigprop.sweep(
        "mlp", tmp_path / "h.jsonl", depth=[2], width=[8], init="he", probe_spec=probe, measure="hessian"
    )
    s = sigprop.sweep(
        "mlp", tmp_path / "s.jsonl", depth=[2], width=[8], init="he", probe_spec=probe, measure="spectrum"
    )
    assert set(h[0]["curvature"]) >= {"log10_spectral_norm_mean", "draws"} and "end_to_end" not in h[0]
    assert h[0]["config"]["curvature"]["head"] == "pytorch"
    assert s[0]["spectrum"]["predicted_mean"] is not None and s[0]["config"]["spectrum"] == {"path": "auto"}
    assert s[0]["environment"]["host"]


def test_a_models_sweep_plots_against_an_arg(tmp_path, capsys):
    """``sigprop plot`` reads a model's --arg items as axes (``--x depth``), one line per init and
    other arg value; a spectrum sweep is refused in one line."""
    pytest.importorskip("matplotlib")
    from sigprop.cli import main

    out = tmp_path / "m.jsonl"
    args = ["sweep", "module", f"{NETS}:make", "--arg", "depth=1,2,3", "--arg", "width=8,16"]
    assert (
        main([*args, "--input-shape", "3,8,8", "--device", "cpu", "--samples", "16", "--out", str(out)]) == 0
    )
    rows, axes = sweep.plot_rows(sweep.read_rows(out))
    assert axes == ["depth", "width"] and [r["config"]["depth"] for r in rows] == [1, 1, 2, 2, 3, 3]
    assert "args" in json.loads(out.read_text().splitlines()[0])["config"]  # the file is unchanged
    from sigprop import plot

    fig = plot.build_sweep_figure(rows, "depth", others=axes)
    lines = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("as-is")]
    assert sorted(line.get_label() for line in lines) == ["as-is, width 16", "as-is, width 8"]
    assert list(lines[0].get_xdata()) == [1, 2, 3]
    assert main(["plot", str(out), "--x", "blocks", "--out", str(tmp_path / "m.png")]) == 2
    assert "choose from depth, width" in capsys.readouterr().err
    spectrum = tmp_path / "s.jsonl"
    probe = specs.ProbeSpec(samples=4, device="cpu")
    sweep_args = dict(depth=[2], width=[8], init="he", probe_spec=probe, measure="spectrum")
    import sigprop

    sigprop.sweep("mlp", spectrum, **sweep_args)
    assert main(["plot", str(spectrum), "--out", str(tmp_path / "s.png")]) == 2
    assert "--measure spectrum sweep is not drawn yet" in capsys.readouterr().err
