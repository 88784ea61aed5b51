"""What a new user and an external check hit in 0.14.0 (issue 47): each case ends in one line or is
measured with a note.  Every test here failed on 0.14.0 (the item it covers is named)."""

import json
import logging
import os
import sys
from pathlib import Path

import pytest
import torch

from sigprop.cli import main

MODELS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


def cnn():  # 8 x 8 maps flattened into a Linear that expects 16 x 16: a wrong --input-shape 3,8,8
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16 * 16, 10))


class Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        return self.l(x).sum()


class BatchMean(Scalar):
    def forward(self, x):
        return self.l(x).mean(0, keepdim=True)


class Buffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w


def scalar():
    return Scalar()


def batch_mean():
    return BatchMean()


def identity():
    return nn.Identity()


def buffers():
    return Buffers()


def mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def f64():
    return mlp().double()


def f16():
    return mlp().half()


def bn_eval():
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).eval()


class InPlace(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.a, self.b, self.how = nn.Linear(4, 8), nn.Linear(8, 3), how

    def forward(self, x):
        h = self.a(x)
        h = torch.relu_(h) if self.how == "function" else h.relu_() if self.how == "method" else torch.relu(h)
        return self.b(h)


def relu_function():
    return InPlace("function")


def relu_method():
    return InPlace("method")


def relu_out_of_place():
    return InPlace("none")


class Dict(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        y = self.l(x)
        return {"y": y, "aux": 2 * y}


def dict_output():
    return Dict()
"""


@pytest.fixture
def models(tmp_path, monkeypatch):
    (tmp_path / "nets.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _one_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sigprop: error: "), (code, err)
    return lines[0]


# 1. a wrong --input-shape: sigprop's line only, not torch's 70-line log of the failed trace
@pytest.mark.parametrize("command", [["module"], ["spectrum", "module"], ["hessian", "module"]])
def test_a_wrong_input_shape_is_one_line_on_stderr(command, models, capfd, caplog):
    """torch's fake-tensor shape propagation logged its traceback at ERROR level through torch's
    own handlers, which hold the stderr of when torch was imported (capfd reads the file
    descriptor; under pytest the records also reach caplog, the handlers' stream may not)."""
    caplog.set_level(logging.DEBUG)
    code = main([*command, "nets.py:cnn", "--input-shape", "3,8,8", "--samples", "4", "--seeds", "1"])
    assert not [
        r.getMessage() for r in caplog.records if r.name.startswith("torch") and r.levelno >= logging.WARNING
    ]
    out, err = capfd.readouterr()
    line = _one_line(code, err)
    assert "--input-shape" in line and "mat1 and mat2 shapes cannot be multiplied" in line


def test_torch_loggers_are_silenced_around_a_trace_and_set_back():
    from sigprop.model import trace

    logging.getLogger("torch._subclasses.fake_tensor")  # exists once torch has logged through it
    before = {
        n: logging.getLogger(n).level for n in logging.Logger.manager.loggerDict if n.startswith("torch")
    }
    with trace.quiet():
        assert not logging.getLogger("torch._subclasses.fake_tensor").isEnabledFor(logging.CRITICAL)
    after = {n: logging.getLogger(n).level for n in before}
    assert after == before
    # and enabled again: the loggers' cache (written inside) cleared on the way out
    assert logging.getLogger("torch._subclasses.fake_tensor").isEnabledFor(logging.CRITICAL)


# 2. output paths checked before any work
UNDER_A_FILE = "afile/out"


@pytest.mark.parametrize(
    "args, option",
    [
        (["mlp", "--depth", "2", "--width", "4", "--samples", "4", "--output", "{p}.json"], "--output"),
        (["mlp", "--depth", "2", "--width", "4", "--samples", "4", "--plot", "{p}.png"], "--plot"),
        (["hessian", "mlp", "--depth", "2", "--width", "4", "--samples", "4", "--output", "{p}"], "--output"),
        (["hessian", "mlp", "--depth", "2", "--width", "4", "--samples", "4", "--plot", "{p}.png"], "--plot"),
        (["spectrum", "mlp", "--depth", "2", "--width", "4", "--output", "{p}"], "--output"),
        (["spectrum", "mlp", "--depth", "2", "--width", "4", "--plot", "{p}.png"], "--plot"),
        (["theory", "--output", "{p}"], "--output"),
        (["check", "--output", "{p}"], "--output"),
        (["check", "--junit", "{p}.xml"], "--junit"),
        (["sweep", "mlp", "--depth", "2", "--width", "4", "--out", "{p}.jsonl"], "--out"),
        (["plot", "rows.jsonl", "--out", "{p}.png"], "--out"),
        (["rerun", "result.json", "--output", "{p}"], "--output"),
    ],
)
@pytest.mark.parametrize("where", ["under a file", "a directory that holds no files"])
def test_an_unwritable_output_is_refused_before_the_run(args, option, where, tmp_path, monkeypatch, capsys):
    """A path under a regular file, and one in /proc (a directory no file can be made in, even by
    root: a read-only directory is writable to root, as CI runs), each end in one line naming
    the option before anything runs -- no banner -- where 0.14.0 said ``internal error:
    OSError`` after the whole run."""
    if where != "under a file" and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "sigprop.toml").write_text(
        '[checks.a]\ncommand = "mlp"\ndepth = 2\nwidth = "4"\nsamples = 4\n'
    )
    (tmp_path / "rows.jsonl").write_text(
        json.dumps({"schema": "sigprop.sweep.v1", "config": {"command": "mlp", "depth": 2, "width": 4}})
        + "\n"
    )
    assert main("mlp --depth 2 --width 4 --samples 4 --format json --output result.json".split()) == 0
    capsys.readouterr()
    path = UNDER_A_FILE if where == "under a file" else "/proc/sigprop-out"
    code = main([a.replace("{p}", path) for a in args])
    out, err = capsys.readouterr()
    line = _one_line(code, err)
    assert line.startswith(f"sigprop: error: {option}: ") and "internal error" not in err
    assert out == ""


@pytest.mark.parametrize(
    "args, option",
    [
        (["mlp", "--depth", "2", "--width", "4", "--samples", "4", "--output", "pipe"], "--output"),
        (["check", "--junit", "pipe"], "--junit"),
        (["sweep", "mlp", "--depth", "2", "--width", "4", "--out", "pipe"], "--out"),
    ],
)
def test_a_named_pipe_is_refused_and_left_a_pipe(args, option, tmp_path, monkeypatch, capsys):
    """One behaviour for every output option (docs/cli.md): a named pipe is not a file sigprop
    writes whole; 0.14.0 replaced it by a regular file for --output and --junit."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo("pipe")
    (tmp_path / "sigprop.toml").write_text(
        '[checks.a]\ncommand = "mlp"\ndepth = 2\nwidth = "4"\nsamples = 4\n'
    )
    code = main(args)
    line = _one_line(code, capsys.readouterr().err)
    assert option in line and "not a regular file" in line
    assert Path("pipe").is_fifo()


def test_a_sweep_file_with_foreign_lines_is_refused_before_the_run(tmp_path, capsys):
    out = tmp_path / "notes.jsonl"
    out.write_text("my notes\n")
    code = main(["sweep", "mlp", "--depth", "2", "--width", "4", "--samples", "2", "--out", str(out)])
    line = _one_line(code, capsys.readouterr().err)
    assert "--out" in line and ":1: not a JSON line" in line
    assert out.read_text() == "my notes\n"


# 3. odd models end in one line, or are measured with a note
@pytest.mark.parametrize("command", [["module"], ["spectrum", "module"], ["hessian", "module"]])
@pytest.mark.parametrize(
    "target, words", [("scalar", "is a scalar"), ("batch_mean", "1 row(s) for 2 samples")]
)
def test_an_output_that_is_not_one_row_per_sample_is_one_line(command, target, words, models, capsys):
    code = main([*command, f"nets.py:{target}", "--input-shape", "4", "--samples", "4", "--seeds", "1"])
    line = _one_line(code, capsys.readouterr().err)
    assert words in line and "internal error" not in line


@pytest.mark.parametrize("target", ["identity", "buffers"])
def test_the_curvature_of_a_model_without_parameters_is_refused(target, models, capsys):
    code = main(["hessian", "module", f"nets.py:{target}", "--input-shape", "4", "--samples", "4"])
    line = _one_line(code, capsys.readouterr().err)
    assert "has no parameters" in line


@pytest.mark.parametrize("target, dtype", [("f64", "float64"), ("f16", "float16")])
def test_a_model_of_another_dtype_is_said_to_be_cast(target, dtype, models, capsys):
    """Probed in float32 (--dtype) with identical numbers to the float32 model, without a word in
    0.14.0; the run now says what was cast (and the numbers are still the float32 model's)."""
    argv = ["--input-shape", "4", "--samples", "8", "--format", "json"]
    assert main(["module", f"nets.py:{target}", *argv]) == 0
    cast = json.loads(capsys.readouterr().out)
    assert main(["module", "nets.py:mlp", *argv]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert (
        f"the model's {dtype} weights are cast to float32 for the probe (--dtype float32)"
        in cast["config"]["init_notes"]
    )
    assert not plain["config"]["init_notes"]
    if dtype == "float64":  # float64 -> float32 is exact for the float32-drawn weights
        assert cast["runs"][0]["layers"] == plain["runs"][0]["layers"]


def test_a_model_in_eval_mode_is_said_to_run_in_training_mode(models, capsys):
    assert main(["module", "nets.py:bn_eval", "--input-shape", "4", "--samples", "8"]) == 0
    out = capsys.readouterr().out
    assert "the model came in eval mode: its 1 batch/instance norm(s) ('1') run in training mode here" in out


def test_data_labels_beyond_the_models_outputs_are_refused(models, capsys):
    torch.save({"x": torch.randn(8, 4), "y": torch.arange(8)}, models / "d.pt")
    code = main(["module", "nets.py:mlp", "--input-shape", "4", "--data", "d.pt", "--samples", "8"])
    line = _one_line(code, capsys.readouterr().err)
    assert "--data" in line and "y holds label 7, and the model has 3 output(s)" in line
    torch.save({"x": torch.randn(8, 4), "y": torch.arange(8) % 3}, models / "ok.pt")
    assert main(["module", "nets.py:mlp", "--input-shape", "4", "--data", "ok.pt", "--samples", "8"]) == 0


# 4. sizes the estimate missed
@pytest.fixture
def eight_gib(monkeypatch):
    """Every device (and the host) with 8 GiB free: the refusals below on any machine."""
    from sigprop.kernels import device

    monkeypatch.setattr(device, "available_bytes", lambda dev: 8 * 2**30)


@pytest.mark.parametrize("kind", ["mlp", "resnet", "cnn", "wrn"])
def test_a_spectrum_of_too_many_samples_is_refused_before_it_draws(kind, eight_gib, capsys):
    code = main(["spectrum", kind, "--samples", "100000000", "--seeds", "1"])
    line = _one_line(code, capsys.readouterr().err)
    assert line.startswith("sigprop: error: --samples: this run needs about")


def test_the_lanczos_path_keeps_each_samples_quadrature_in_its_estimate(eight_gib, capsys):
    """10^7 samples of 8 inputs fit (0.3 GiB); their quadratures (10 probes x 8 nodes and weights
    each) do not: 0.14.0 kept every sample's operator, its forward graph, alive at once."""
    argv = ["spectrum", "mlp", "--depth", "2", "--width", "8", "--input-dim", "8", "--path", "lanczos"]
    code = main([*argv, "--samples", "10000000", "--seeds", "1"])
    line = _one_line(code, capsys.readouterr().err)
    assert "--samples" in line and "the Lanczos path keeps each one's quadrature" in line


# 6. options silently ignored or misread
@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["hessian", "mlp", "--probes", "3"],
            "--probes: sets what --density measures: it takes --density too",
        ),
        (["hessian", "mlp", "--steps", "8"], "--steps: sets what --density measures: it takes --density too"),
        (["spectrum", "mlp", "--at", "2,2"], "--at: depth 2 given twice"),
        (["mlp", "--threads", "100000"], "--threads: 100000 threads on the"),
        (["mlp", "--depth", "3", "--depth", "4"], "--depth: given twice"),
        (["hessian", "mlp", "--samples", "3", "--samples=4"], "--samples: given twice"),
        (["mlp", "--plot", "a.png", "--plot", "b.png"], "--plot: given twice"),
        (["module", "nets.py:mlp", "--input-shape", "32x"], "--input-shape: expected sizes like"),
        (["module", "nets.py:mlp", "--input-shape", "3,,4"], "--input-shape: expected sizes like"),
    ],
)
def test_options_that_were_ignored_or_misread_are_refused(args, words, models, capsys):
    line = _one_line(main(args), capsys.readouterr().err)
    assert words in line


def test_options_that_take_several_values_may_repeat(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    args = [
        "sweep",
        "mlp",
        "--depth",
        "2",
        "--depth",
        "3",
        "--width",
        "4",
        "--samples",
        "2",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    assert len(out.read_text().splitlines()) == 4  # 2 depths x he, proposed


def test_the_spectrum_against_depth_is_in_the_table(capsys):
    argv = ["spectrum", "mlp", "--depth", "4", "--width", "16", "--input-dim", "16", "--samples", "2"]
    assert main([*argv, "--seeds", "1", "--init", "proposed", "--at", "2,4"]) == 0
    out = capsys.readouterr().out
    assert "against depth" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("proposed", "4 "))]
    assert any(r[:2] == ["proposed", "2"] for r in rows) and any(r[0] == "4" for r in rows)


@pytest.mark.parametrize(
    "kind, absent, present",
    [
        (
            "mlp",
            ["--blocks", "--arg", "--input-shape", "--sites", "--vocab"],
            ["--depth", "--width", "--input-dim"],
        ),
        ("resnet", ["--depth", "--arg", "--input-dim"], ["--blocks", "--width"]),
        ("module", ["--depth", "--blocks", "--width", "--input-dim"], ["--arg", "--input-shape", "--sites"]),
    ],
)
def test_each_sweep_kind_lists_what_it_sweeps(kind, absent, present, capsys):
    import re

    assert main(["sweep", kind, "--help"]) == 0
    listed = set(re.findall(r"(--[a-z][a-z-]*)", capsys.readouterr().out))
    assert not set(absent) & listed and set(present) <= listed


# 7. the module figure draws the theory that holds
def test_the_module_figure_draws_the_rms_prediction_not_the_typical_one(models):
    pytest.importorskip("matplotlib")
    import sigprop
    from sigprop import plot

    r = sigprop.probe_module(target="nets.py:mlp", input_shape=(4,), inits=["as-is", "proposed"], samples=16)
    fig = plot.build_probe_figure(r)
    fwd = fig.axes[0]
    assert not [l for l in fwd.get_lines() if l.get_linestyle() == "--" and len(l.get_xdata())]
    for run in r.runs:
        line = [l for l in fwd.get_lines() if l.get_label() == run.init][0]
        dotted = [
            l for l in fwd.get_lines() if l.get_linestyle() == ":" and l.get_color() == line.get_color()
        ]
        assert dotted and list(dotted[0].get_ydata()) == pytest.approx(
            [10**layer.forward.log10_predicted for layer in run.layers]
        )
    legend = fig.axes[1].get_legend()
    theory = [h for h, t in zip(legend.legend_handles, legend.get_texts()) if "theory" in t.get_text()]
    assert len(theory) == 1 and theory[0].get_color() == "0.3"  # one entry, in no init's colour


# 8. words
def test_a_verdict_of_a_passing_and_a_failing_gate_names_the_failing_one_first(capsys):
    """The README's datadep: its forward ratio in the band, its backward 30x outside."""
    assert main(["mlp", "--init", "datadep", "--samples", "200"]) == 0
    out = capsys.readouterr().out
    line = [line for line in out.splitlines() if "signal NOT preserved:" in line][0]
    assert line.index("✗ typical backward ratio") < line.index("✓ typical forward ratio")
    why = [line for line in out.splitlines() if line.strip().startswith("why (backward ratio")][0]
    assert "above the band's top: the signal grows backward" in why


@pytest.mark.parametrize(
    "value, words",
    [("1e8", "got '1e8' (write it out: 100000000)"), ("3,4", "use sigprop sweep"), ("x", "got 'x'")],
)
def test_a_number_that_is_not_one_integer_says_what_to_give(value, words, capsys):
    line = _one_line(main(["mlp", "--depth", value]), capsys.readouterr().err)
    assert words in line and ("sweep" in line) == ("," in value)


def test_a_directory_is_called_a_directory(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    line = _one_line(main(["plot", str(tmp_path), "--out", str(tmp_path / "f.png")]), capsys.readouterr().err)
    assert "is a directory, not a file" in line
    args = ["module", "torch.nn:Identity", "--input-shape", "4", "--data", str(tmp_path)]
    line = _one_line(main(args), capsys.readouterr().err)
    assert "--data" in line and "is a directory, not a file" in line


def test_float_labels_are_refused_without_a_made_up_bound(models, capsys):
    torch.save({"x": torch.randn(8, 4), "y": torch.rand(8)}, models / "f.pt")
    line = _one_line(
        main(["module", "nets.py:mlp", "--input-shape", "4", "--data", "f.pt"]), capsys.readouterr().err
    )
    assert "integer labels (class indices), got dtype float32" in line and "4611686018427387904" not in line


def test_a_dict_output_is_called_a_dict(models, capsys):
    assert main(["module", "nets.py:dict_output", "--input-shape", "4", "--samples", "4"]) == 0
    assert "the output read is 'y' of the model's dict" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["relu_function", "relu_method"])
def test_an_in_place_relu_is_mapped_as_relu(target, models, capsys):
    argv = ["--input-shape", "4", "--samples", "16", "--format", "json"]
    assert main(["module", f"nets.py:{target}", *argv]) == 0
    got = json.loads(capsys.readouterr().out)["runs"][0]["layers"]
    assert main(["module", "nets.py:relu_out_of_place", *argv]) == 0
    want = json.loads(capsys.readouterr().out)["runs"][0]["layers"]
    assert got[-1]["forward"]["predicted"] is not None
    assert [l["forward"]["predicted"] for l in got] == [l["forward"]["predicted"] for l in want]
    assert [l["backward"]["predicted"] for l in got] == [l["backward"]["predicted"] for l in want]


def test_the_installed_entry_point_says_a_wrong_shape_in_one_line(models):
    """The console script in a process of its own: nothing but sigprop's line on stderr."""
    import subprocess

    exe = Path(sys.executable).with_name("sigprop")
    if not exe.exists():
        pytest.skip("the sigprop console script is not installed beside this python")
    p = subprocess.run(
        [str(exe), "module", "nets.py:cnn", "--input-shape", "3,8,8", "--samples", "4"],
        capture_output=True,
        text=True,
        cwd=models,
        timeout=120,
    )
    _one_line(p.returncode, p.stderr)


# 5. an estimate before the first product; a compile timed apart
def test_an_estimate_times_a_compile_apart_from_the_steps(monkeypatch, capsys):
    """A step that compiles (--fuse) was 0.14.0's time of every step: "about 5 min ... at 1.7 s
    each" for a run of 25 s.  The median of three steps after the first times a step; the
    compile is the setup the line names."""
    from sigprop.cli import output

    times = iter([0.0, 1.0, 61.0, 61.1, 61.2, 61.3])
    monkeypatch.setattr(output.time, "monotonic", lambda: next(times))
    monkeypatch.setattr(output.sys.stderr, "isatty", lambda: False)
    prog = output._Progress("probing", "layer steps")
    prog.start()
    for done in range(1, 6):
        prog(done, 1000, "proposed: forward")
    lines = [line for line in capsys.readouterr().err.splitlines() if "in all" in line]
    assert len(lines) == 1, lines
    assert (
        "for at most 1,000 layer steps at 0.1 s each, after 61 s of setup, compiles and warm-up" in lines[0]
    )
    assert "about 3 min in all" in lines[0]


def test_the_curvature_says_its_estimate_before_the_first_product(capsys, monkeypatch):
    from sigprop.cli import output

    monkeypatch.setattr(output, "LONG_RUN", 0.0)
    argv = ["hessian", "mlp", "--depth", "3", "--width", "8", "--input-dim", "8", "--samples", "16"]
    assert main([*argv, "--seeds", "2", "--iters", "5", "--init", "proposed"]) == 0
    err = capsys.readouterr().err.splitlines()
    said = [i for i, line in enumerate(err) if "in all, for at most" in line]
    assert len(said) == 2
    first, refined = err[said[0]], err[said[1]]
    assert "at about" in first and "(rough, from the gradient's time; refined after the first 4)" in first
    assert refined.startswith("sigprop: hessian: refined: about")


def test_the_curvature_of_an_image_net_takes_fewer_samples_by_default(capsys):
    from sigprop import kinds, specs

    assert {k: kinds.KINDS[k].curvature_samples for k in ("mlp", "resnet", "cnn", "wrn", "module")} == {
        "mlp": 512,
        "resnet": 512,
        "cnn": 64,
        "wrn": 64,
        "module": 64,
    }
    assert (specs.HessianSpec.probes, specs.HessianSpec.steps) == (4, 20)
    argv = ["hessian", "wrn", "--blocks", "1", "--image", "3x4x4", "--seeds", "1", "--iters", "2"]
    assert main([*argv, "--init", "proposed", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["samples"] == 64
