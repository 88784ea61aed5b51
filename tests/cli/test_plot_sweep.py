"""Plots (files written, non-trivial, axes read back), sweeps (resume without recomputing),
the Python API against the CLI, and the small commands (env, cite, colour)."""

import json
import os
import re
import subprocess
import sys

import pytest
import walks

import sigprop
from sigprop import api, inits, kinds, specs
from sigprop.cli import main

mpl = pytest.importorskip("matplotlib")  # the plot extra; CI installs it with [test]

SMALL = ["--samples", "60", "--device", "cpu"]


def run(capsys, args):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("ext, magic", [("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_mlp_plot_is_written_in_each_format(capsys, tmp_path, ext, magic):
    path = tmp_path / f"fig.{ext}"
    code, _, err = run(
        capsys,
        [
            "mlp",
            "--depth",
            "8",
            "--width",
            "48",
            "--plot",
            str(path),
            "--output",
            str(tmp_path / "o.txt"),
            *SMALL,
        ],
    )
    assert code == 0, err
    data = path.read_bytes()
    assert data.startswith(magic) and len(data) > 10_000
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temp file left
    if ext == "png":
        img = mpl.image.imread(path)
        assert img.shape[0] > 400 and img.shape[1] > 1000 and img.std() > 0.05  # not blank


def test_figure_axes_read_back_mlp():
    from sigprop import plot

    r = api.probe_mlp(
        depth=12, width=48, input_dim=48, samples=60, inits=["he", "proposed"], device="cpu", seeds=2
    )
    fig = plot.build_probe_figure(r)
    fwd, bwd, zfwd, zbwd = fig.axes  # he spans decades: a linear zoom row for proposed
    assert fwd.get_title().startswith("forward") and bwd.get_title().startswith("backward")
    assert "zoom" in zfwd.get_title() and zfwd.get_yscale() == "linear"
    assert [l.get_label() for l in zfwd.get_lines() if not l.get_label().startswith("_")] == ["proposed"]
    assert "h^l" in fwd.get_ylabel() and "a^l" in bwd.get_ylabel() and "layer" in fwd.get_xlabel()
    assert fwd.get_yscale() == "log"  # he spans decades
    labels = [t.get_text() for t in bwd.get_legend().get_texts()]
    assert labels[0] == "he" and "proposed" in labels and any("theory" in l for l in labels)
    # one solid line (own marker) per init + dashed typical theory; the line holds the typical ratio
    he_line = [l for l in fwd.get_lines() if l.get_label() == "he"][0]
    prop_line = [l for l in fwd.get_lines() if l.get_label() == "proposed"][0]
    assert he_line.get_marker() != prop_line.get_marker()
    assert list(he_line.get_xdata()) == list(range(1, 13))
    assert he_line.get_ydata()[-1] == pytest.approx(10 ** r.run("he").layers[-1].forward.log10_mean)
    dashed = [
        l for l in fwd.get_lines() if l.get_linestyle() == "--" and l.get_color() == he_line.get_color()
    ][0]
    assert dashed.get_ydata()[-1] == pytest.approx(
        10 ** r.run("he").layers[-1].forward.log10_predicted_typical
    )
    assert len(fwd.collections) == 4  # sample band and draw band per init (seeds = 2)
    mpl.pyplot.close(fig)


def test_figure_axes_read_back_resnet_band():
    from sigprop import plot, theory

    r = api.probe_resnet(blocks=6, dim=32, width=16, samples=40, inits=["proposed"], device="cpu")
    fig = plot.build_probe_figure(r)
    for ax, at in zip(fig.axes[:2], (6, 0)):  # forward: at h^B; backward: at h^0 -- where the band applies
        bars = [l for l in ax.get_lines() if l.get_linewidth() == 5]
        assert len(bars) == 1 and list(bars[0].get_xdata()) == [at, at]
        assert list(bars[0].get_ydata()) == pytest.approx(
            [theory.RESNET_LOWER, theory.RESNET_UPPER], rel=1e-12
        )
        # issue 27: 0.7.0 drew the band across every block, where it bounds nothing
        assert not any(
            len(set(l.get_xdata())) > 1
            and min(l.get_ydata()) == pytest.approx(theory.RESNET_LOWER)
            and max(l.get_ydata()) == pytest.approx(theory.RESNET_LOWER)
            for l in ax.get_lines()
        )
    assert "h^b" in fig.axes[0].get_ylabel() and fig.axes[0].get_yscale() == "linear"  # in band: readable
    mpl.pyplot.close(fig)


def test_the_correlation_row_marks_each_init_as_the_rows_above():
    """Issue 27: 0.7.0's correlation row gave the second init's marker to the second input cosine."""
    from sigprop import plot

    r = api.probe_mlp(
        depth=4,
        width=16,
        input_dim=16,
        samples=20,
        inits=["proposed", "he"],
        correlations=(0.0, 0.5),
        device="cpu",
    )
    fig = plot.build_probe_figure(r)
    markers = {
        l.get_label(): l.get_marker() for l in fig.axes[0].get_lines() if l.get_label() in ("proposed", "he")
    }
    for ax in fig.axes[-2:]:
        for line in ax.get_lines():
            label = line.get_label()
            if "c0 =" in label:
                assert line.get_marker() == markers[label.split(",")[0]] and line.get_linestyle() != "--"
    mpl.pyplot.close(fig)


def test_multi_stage_figure_draws_each_stage_against_its_own_band():
    """Stages > 1: each stage's curve restarts at 1 at its first state, the band is drawn per
    stage (with the projection's hull), and the stage boundaries are marked."""
    from sigprop import plot

    r = api.probe_resnet(blocks=3, stages=2, dim=16, width=16, samples=20, inits=["proposed"], device="cpu")
    fig = plot.build_probe_figure(r)
    ax = fig.axes[0]
    stages = r.run("proposed").stages
    lines = [
        l
        for l in ax.get_lines()
        if l.get_color() != "0.3" and l.get_linestyle() == "-" and len(l.get_xdata()) > 2
    ]
    assert [list(l.get_xdata())[0] for l in lines[:2]] == [stages[0].first, stages[1].first]
    assert all(l.get_ydata()[0] == pytest.approx(1.0) for l in lines[:2])
    bars = [l for l in ax.get_lines() if l.get_linewidth() == 5]
    assert [l.get_xdata()[0] for l in bars] == [st.last for st in stages]
    assert [tuple(l.get_ydata()) for l in bars] == [pytest.approx(st.forward_band) for st in stages]
    assert any(l.get_linestyle() == "-." for l in ax.get_lines())  # the boundary between the stages
    mpl.pyplot.close(fig)


def test_plot_target_is_checked_before_running(capsys, tmp_path):
    code, out, err = run(capsys, ["mlp", "--plot", str(tmp_path / "fig.jpg"), *SMALL])
    assert code == 2 and "--plot" in err and ".png" in err and out == ""
    code, _, err = run(capsys, ["resnet", "--plot", str(tmp_path / "no" / "fig.png"), *SMALL])
    assert code == 2 and "--plot" in err


def test_missing_matplotlib_is_a_clear_message(monkeypatch, tmp_path):
    from sigprop import plot
    from sigprop.errors import SigpropError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(SigpropError) as err:
        plot.check_target(tmp_path / "f.png")
    assert "pip install 'sigprop[plot]'" in str(err.value) and err.value.field == "plot"


def test_sweep_appends_resumes_and_plots(capsys, tmp_path, monkeypatch):
    out = tmp_path / "r.jsonl"
    args = [
        "sweep",
        "mlp",
        "--depth",
        "3,6",
        "--width",
        "16,32",
        "--init",
        "proposed,he",
        "--seeds",
        "2",
        "--out",
        str(out),
        *SMALL,
    ]
    code, _, err = run(capsys, args)
    assert code == 0, err
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(rows) == 8 and all(r["schema"] == "sigprop.sweep.v1" for r in rows)
    he = [r for r in rows if r["init"] == "he" and r["config"]["depth"] == 6 and r["config"]["width"] == 32][
        0
    ]
    fwd = he["end_to_end"]["forward"]
    assert fwd["log10_predicted"] == pytest.approx(-3 * 0.30103, abs=1e-4)  # (1/2)^{6/2}
    assert abs(fwd["log10_mean"] - fwd["log10_predicted"]) < 0.3 and he["config"]["seeds"] == 2

    calls = []
    real = api.probe
    monkeypatch.setattr(api, "probe", lambda *a, **k: calls.append(a) or real(*a, **k))
    code, _, err = run(capsys, args)  # everything is there: nothing recomputed
    assert code == 0 and calls == [] and "0 to run" in err
    code, _, err = run(capsys, [*args[:3], "3,6,9", *args[4:]])  # one more depth: 4 new points
    assert code == 0 and len(calls) == 4
    assert len(out.read_text().splitlines()) == 12

    fig = tmp_path / "sweep.png"
    code, _, err = run(capsys, ["plot", str(out), "--x", "depth", "--out", str(fig)])
    assert code == 0, err
    assert fig.stat().st_size > 10_000
    code, _, err = run(capsys, ["plot", str(out), "--x", "blocks", "--out", str(fig)])
    assert code == 2 and "--x" in err


def test_sweep_figure_axes():
    from sigprop import plot

    rows = []
    for d in (2, 4):
        r = api.probe_mlp(depth=d, width=16, input_dim=16, samples=30, inits=["he"], device="cpu")
        from sigprop import sweeps as sweep

        point = walks.grid(kinds.KINDS["mlp"], [d], [16], ["he"], specs.ProbeSpec(samples=30, device="cpu"))[
            0
        ]
        rows.append(sweep.row(point, r, 0.0))
    fig = plot.build_sweep_figure(rows, "depth")
    ax = fig.axes[0]
    line = [l for l in ax.get_lines() if l.get_label().startswith("he")][0]
    assert [int(v) for v in line.get_xdata()] == [2, 4] and ax.get_xlabel() == "depth"
    assert ax.get_xscale() == "linear" and "log10" in ax.get_ylabel()  # linear depth, log10 of the ratio
    assert list(line.get_ydata()) == [r["end_to_end"]["forward"]["log10_mean"] for r in rows]
    # the typical theory line is drawn in the init's colour, dashed
    theory = [l for l in ax.get_lines() if l.get_linestyle() == "--" and l.get_color() == line.get_color()]
    assert theory and list(theory[0].get_ydata()) == [
        r["end_to_end"]["forward"]["log10_predicted_typical"] for r in rows
    ]
    mpl.pyplot.close(fig)


def test_sweep_rows_with_other_samples_are_separate_lines_in_numeric_order():
    """Rows that differ in --samples are never merged into one line, and the legend is ordered
    by number (10, 20, 100), not as strings (10, 100, 20)."""
    from sigprop import plot
    from sigprop import sweeps as sweep

    rows = []
    for samples in (100, 20, 10):
        for d in (2, 3):
            point = walks.grid(
                kinds.KINDS["mlp"], [d], [16], ["he"], specs.ProbeSpec(samples=samples, device="cpu")
            )[0]
            r = api.probe_mlp(depth=d, width=16, input_dim=16, samples=samples, inits=["he"], device="cpu")
            rows.append(sweep.row(point, r, 0.0))
    fig = plot.build_sweep_figure(rows, "depth")
    labels = [l.get_label() for l in fig.axes[0].get_lines() if l.get_label().startswith("he")]
    assert labels == ["he, samples 10", "he, samples 20", "he, samples 100"]
    mpl.pyplot.close(fig)


@pytest.mark.parametrize(
    "args, option",
    [
        (["sweep", "mlp", "--depth", "10,x", "--out", "r.jsonl"], "--depth"),
        (["sweep", "mlp", "--depth", "10,10", "--out", "r.jsonl"], "--depth"),
        (["sweep", "resnet", "--blocks", "0", "--out", "r.jsonl"], "--blocks"),
        (["sweep", "mlp", "--width", "", "--out", "r.jsonl"], "--width"),
        (["sweep", "mlp", "--init", "proposed,stage-hanin", "--out", "r.jsonl"], "--init"),
        (["sweep", "mlp", "--out", "/nonexistent-dir/r.jsonl"], "--out"),
        (["plot", "missing.jsonl", "--out", "f.png"], "RESULTS"),
    ],
)
def test_sweep_and_plot_bad_input(capsys, tmp_path, monkeypatch, args, option):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, args)
    assert code == 2 and option in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.jsonl").exists()


def test_api_and_cli_give_the_same_numbers(capsys):
    r = sigprop.probe_mlp(
        depth=5, width=32, input_dim=20, samples=50, seed=3, inits=["proposed"], device="cpu"
    )
    assert r.layers[0].forward.mean == r.run("proposed").layers[0].forward.mean
    code, out, _ = run(
        capsys,
        [
            "mlp",
            "--depth",
            "5",
            "--width",
            "32",
            "--input-dim",
            "20",
            "--samples",
            "50",
            "--seed",
            "3",
            "--init",
            "proposed",
            "--device",
            "cpu",
            "--format",
            "json",
        ],
    )
    doc = json.loads(out)
    assert [l["forward"]["mean"] for l in doc["runs"][0]["layers"]] == [l.forward.mean for l in r.layers]
    assert [l["backward"]["mean"] for l in doc["runs"][0]["layers"]] == [l.backward.mean for l in r.layers]
    two = sigprop.probe_resnet(blocks=3, dim=16, width=8, samples=20, inits=["proposed", "he"], device="cpu")
    with pytest.raises(AttributeError, match="run\\(name\\)"):
        two.layers


def test_env_and_version(capsys):
    code, out, _ = run(capsys, ["env"])
    assert code == 0
    assert re.search(r"^torch\s+\d", out, re.M) and "threads" in out and "--device auto" in out
    code, out, _ = run(capsys, ["--version"])
    assert code == 0 and out.strip() == f"sigprop {sigprop.__version__}"


def test_cite(capsys):
    code, out, _ = run(capsys, ["cite"])
    keys = re.findall(r"@inproceedings\{(\w+),", out)
    assert code == 0 and len(keys) == len(set(keys)) >= 6
    code, out, _ = run(capsys, ["cite", "--init", "skipinit"])
    keys = re.findall(r"@inproceedings\{(\w+),", out)
    assert "de2020batch" in keys and "arpit2019initialize" in keys and "hanin2018start" not in keys
    assert set(k for s in inits.INITS.values() for k in s.cites) <= set(
        re.findall(r"\{(\w+),", run(capsys, ["cite"])[1])
    )


COLOUR = re.compile(r"\x1b\[(?:[0-9]+;)*(?:3[0-8]|9[0-7])(?:;[0-9]+)*m")


def test_no_colour_when_piped_or_with_no_color():
    cmd = [sys.executable, "-m", "sigprop", "mlp", "--depth", "3", *SMALL]
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    piped = subprocess.run(cmd, capture_output=True, text=True, env=env)
    forced = subprocess.run(cmd, capture_output=True, text=True, env={**env, "FORCE_COLOR": "1"})
    nocolor = subprocess.run(
        cmd, capture_output=True, text=True, env={**env, "FORCE_COLOR": "1", "NO_COLOR": "1"}
    )
    assert piped.returncode == forced.returncode == nocolor.returncode == 0
    assert "\x1b[" not in piped.stdout
    assert COLOUR.search(forced.stdout)  # the test can fail: colour does appear when forced
    assert not COLOUR.search(nocolor.stdout)


def test_written_files_get_the_usual_permissions(capsys, tmp_path):
    out, fig = tmp_path / "r.json", tmp_path / "f.png"
    code, _, _ = run(
        capsys, ["mlp", "--depth", "3", "--format", "json", "--output", str(out), "--plot", str(fig), *SMALL]
    )
    mask = os.umask(0)
    os.umask(mask)
    assert code == 0
    for p in (out, fig):
        assert (p.stat().st_mode & 0o777) == (0o666 & ~mask)


def test_sweep_curvature_resumes_and_plots(tmp_path, capsys):
    """sweep --curvature (issue 19): one line per point with the log10 spectral norm over the
    draws, resumed by its key; plot --direction curvature draws it, the other directions refuse."""
    import json

    from sigprop.cli import main

    out = tmp_path / "c.jsonl"
    args = [
        "sweep",
        "mlp",
        "--curvature",
        "--out",
        str(out),
        "--depth",
        "2,3",
        "--width",
        "8",
        "--init",
        "proposed,datadep",
        "--samples",
        "16",
        "--seeds",
        "2",
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    assert "--curvature is deprecated since 0.17.0, removed in 0.19.0" in capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["curvature"]["log10_spectral_norm_mean"] is not None for r in rows)
    assert all(
        len(r["curvature"]["draws"]) == 2
        and r["config"]["curvature"] == {"iters": 100, "tol": 1e-3, "head": "pytorch"}
        for r in rows
    )
    assert main(args) == 0 and len(out.read_text().splitlines()) == 4  # resumed: nothing ran again
    assert main(["plot", str(out), "--direction", "curvature", "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 0
    assert main(["plot", str(out), "--out", str(tmp_path / "f.png")]) == 2
    assert "--direction" in capsys.readouterr().err
