"""Fuzzing the CLI (issue 6): hypothesis builds argument lists for every command from valid,
invalid and extreme values (huge sizes, reversed ranges, negative numbers, unicode, missing
values, unknown options).  Whatever it builds: exit 0, 1 or 2; never a traceback; a non-zero
exit says why on stderr; a refused run (exit 2) leaves no output file, and no run leaves a temp
file.  Compute stays small: valid sizes are small, extreme ones are refused by the memory
estimate before anything is allocated."""

import contextlib
import io
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sigprop.cli import main

EXAMPLES = int(os.environ.get("SIGPROP_FUZZ_EXAMPLES", "150"))

GARBAGE = st.sampled_from(
    ["", "-1", "0", "x", "1e3", "٣", "∞", "nan", "--", "-", "10**9", " 7", "7 ", "None", "1:2:3"]
) | st.text(max_size=6)
SMALL_INT = st.sampled_from(["1", "2", "3", "7"])
HUGE = st.sampled_from(["1000000000", "99999999999999999999"])
INT = SMALL_INT | HUGE | GARBAGE
WIDTH = (
    st.sampled_from(["8", "4:16", "16:4", "0", "0:3", "a:b", "1:", ":", "3:3", "1000000000", "5:1000000000"])
    | GARBAGE
)
INITS_MLP = st.sampled_from(
    [
        "proposed",
        "he",
        "datadep",
        "pytorch",
        "stage-hanin",
        "PROPOSED",
        "nope",
        "",
        "he,proposed",
        "skipinit",
        "propsed",
    ]
)
INITS_RES = st.sampled_from(
    ["proposed", "he", "skipinit", "skipinit-sqrt", "stage-hanin", "unnormalized-he", "datadep", "nope"]
)
COMMON = {
    "--samples": SMALL_INT | HUGE | GARBAGE,
    "--seed": st.sampled_from(["0", "5", "-1", "x", "18446744073709551617"]),
    "--seeds": st.sampled_from(["1", "2", "0", "-3", "y"]),
    "--device": st.sampled_from(["cpu", "auto", "cuda", "cuda:7", "tpu", "", "CPU"]),
    "--dtype": st.sampled_from(["float32", "float64", "float16", "bfloat16", "int8", ""]),
    "--format": st.sampled_from(["table", "json", "csv", "xml", ""]),
    "--precision": st.sampled_from(["fp32", "tf32", "fp16", ""]),
    "--gate": st.sampled_from(["preserved", "theory", "both", ""]),
    "--band": st.sampled_from(
        ["0.5:2", "0.1:10", "2:3", "0.1:0.5", "0:1", "1", "a:b", "inf:inf", "-1:2", ""]
    ),
    "--threads": st.sampled_from(["1", "2", "0", "-1", "x"]),
    "--correlation": st.sampled_from(
        ["0", "0.5", "-0.9", "1", "-1", "0,0.5", "0,0", "1.5", "x", "nan", "", "0.5,"]
    ),
    "--pairs": st.sampled_from(["1", "4", "0", "-2", "x"]),
    "--max-correlation": st.sampled_from(["0.9", "0", "-1", "2", "x", "nan"]),
}
FLAGS = st.sampled_from(
    ["--check", "--stream", "--no-stream", "--graphs", "--no-graphs", "--help", "--bogus", "-x"]
)

COMMANDS = {
    "mlp": {
        "--depth": INT | st.sampled_from(["10,20", "3,4"]),
        "--input-dim": INT,
        "--width": WIDTH,
        "--init": INITS_MLP,
        **COMMON,
    },
    "resnet": {
        "--blocks": INT,
        "--stages": st.sampled_from(["1", "2", "17", "0", "40"]) | GARBAGE,
        "--dim": INT,
        "--width": WIDTH,
        "--block-depth": INT,
        "--norm": st.sampled_from(["wn", "bn", "none", "ln", ""]),
        "--init": INITS_RES,
        **COMMON,
    },
    "cnn": {
        "--depth": st.sampled_from(["1", "3", "0", "x", "1000000000"]),
        "--channels": st.sampled_from(["2", "4", "0", "-1", "y"]),
        "--image": st.sampled_from(["1x4x4", "3x8x8", "3x8", "0x4x4", "axbxc", "3x1x1", ""]),
        "--strided": st.sampled_from(["0", "1", "2", "5", "-1"]),
        "--init": st.sampled_from(
            ["proposed", "delta-orthogonal", "he", "pytorch", "datadep", "nope", "proposed,he"]
        ),
        **COMMON,
    },
    "module": {
        "--arg": st.sampled_from(["depth=2", "depth=0", "width=3", "depth", "=1", "x=(", "pretrained=True"]),
        "--input-shape": st.sampled_from(["4", "3", "0", "4,4", "a", "", "-1"]),
        "--sites": st.sampled_from(["auto", "leaves", "0,1", "1.*", "nope", ""]),
        "--init": st.sampled_from(["as-is", "proposed", "he", "datadep", "skipinit", "nope"]),
        **COMMON,
    },
    "wrn": {
        "--blocks": st.sampled_from(["1", "2", "0", "x", "1000000000"]),
        "--widen": st.sampled_from(["1", "2", "0", "y"]),
        "--image": st.sampled_from(["3x8x8", "3x4x4", "0x4x4", "3x8", ""]),
        "--bottleneck": st.just(""),
        "--basic": st.just(""),
        "--preset": st.sampled_from(["resnet-56", "wrn-40-10", "resnet-7", ""]),
        "--norm": st.sampled_from(["wn", "bn", "none", "x"]),
        "--init": st.sampled_from(["proposed", "he", "skipinit", "datadep", "delta-orthogonal", "nope"]),
        **COMMON,
    },
    "hessian": {
        "--samples": st.sampled_from(["4", "0", "x"]),
        "--seeds": st.sampled_from(["1", "0"]),
        "--iters": st.sampled_from(["2", "0"]),
        "--tol": st.sampled_from(["0.1", "0", "2", "x"]),
        "--top": st.sampled_from(["0", "2", "-1"]),
        "--trace": st.sampled_from(["0", "1", "2"]),
        "--data": st.sampled_from(["FILE", "missing.npz"]),
        "--depth": st.sampled_from(["2", "0"]),
        "--width": st.sampled_from(["4", "0"]),
        "--blocks": st.sampled_from(["1", "0"]),
        "--format": st.sampled_from(["table", "json", "csv"]),
        "--init": st.sampled_from(["proposed", "he", "datadep", "nope"]),
        "--density": st.just(""),
        "--probes": st.sampled_from(["1", "0", "x"]),
        "--steps": st.sampled_from(["2", "1", "1000000"]),
        "--per-layer": st.just(""),
    },
    "spectrum": {
        "--samples": st.sampled_from(["2", "0", "x"]),
        "--seeds": st.sampled_from(["1", "0"]),
        "--depth": st.sampled_from(["2", "0"]),
        "--width": st.sampled_from(["4", "0", "1000000000"]),
        "--blocks": st.sampled_from(["1", "0"]),
        "--format": st.sampled_from(["table", "json", "csv"]),
        "--init": st.sampled_from(["proposed", "he", "datadep", "nope"]),
        "--depths": st.just(""),
        "--path": st.sampled_from(["auto", "exact", "lanczos", "x"]),
        "--probes": st.sampled_from(["1", "0"]),
        "--steps": st.sampled_from(["2", "1"]),
        "--top": st.sampled_from(["1", "0", "-1", "100000"]),
        "--batch-size": st.sampled_from(["1", "0"]),
        "--at": st.sampled_from(["1", "1,2", "0", "x", "99"]),
        "--plot": st.sampled_from(["fig.png", "fig.xyz"]),
    },
    "width": {
        "--widths": st.sampled_from(["8,16,32", "8", "8,8", "0,8", "x", ""]),
        "--depth": st.sampled_from(["3", "1", "x"]),
        "--arg": st.sampled_from(["width=8,16,32", "width=8", "depth=2", "width=a,b", "x=("]),
        "--input-shape": st.sampled_from(["4", "0", "a", ""]),
        "--param": st.sampled_from(["sp", "mup", "ntk", "as-is", "xp"]),
        "--optimizer": st.sampled_from(["sgd", "adam", "lbfgs"]),
        "--lr": st.sampled_from(["0.01", "0", "-1", "1e30", "x", "nan"]),
        "--steps": st.sampled_from(["1", "0", "x"]),
        "--seeds": st.sampled_from(["1", "2", "0"]),
        "--base-width": st.sampled_from(["8", "0"]),
        "--max-width-slope": st.sampled_from(["0.25", "0", "-1", "inf"]),
        "--loss": st.sampled_from(["xent", "mse", "l1"]),
        "--device": st.sampled_from(["cpu", "tpu", "auto"]),
        "--format": st.sampled_from(["table", "json", "csv"]),
        "--plot": st.sampled_from(["fig.png", "fig.xyz"]),
    },
    "theory": {
        "--n": st.sampled_from(["2", "1", "1000000000000", "0", "x"]),
        "--blocks": INT,
        "--format": st.sampled_from(["table", "json", "csv"]),
    },
    "inits": {},
    "cite": {"--init": INITS_RES | INITS_MLP},
    "sweep": {
        "--depth": st.sampled_from(["2,3", "3", "2,2", "0", "x,y", "", "1000000000"]),
        "--blocks": st.sampled_from(["2", "2,3", "-1", ""]),
        "--width": st.sampled_from(["8", "8,16", "0", "a", "1000000000"]),
        "--init": st.sampled_from(
            ["proposed", "proposed,he", "nope", "", "proposed,proposed", "he", "skipinit"]
        ),
        "--input-dim": st.sampled_from(["8", "0"]),
        "--samples": SMALL_INT | GARBAGE,
        "--seeds": st.sampled_from(["1", "0"]),
        "--device": st.sampled_from(["cpu", "tpu"]),
        "--correlation": st.sampled_from(["0", "0,0.5", "2", "x"]),
        "--pairs": st.sampled_from(["2", "0"]),
    },
    "plot": {
        "--x": st.sampled_from(["depth", "width", "blocks", "time", ""]),
        "--direction": st.sampled_from(["forward", "backward", "up", "correlation"]),
    },
    "check": {"--format": st.sampled_from(["text", "json", "yaml"])},
    "rerun": {"--format": st.sampled_from(["table", "json", "csv", "pdf"])},
}
CHECK_TOML = st.sampled_from(
    [
        '[checks.a]\ncommand = "mlp"\ndepth = 3\nwidth = 8\nsamples = 4\ndevice = "cpu"\ngraphs = true\n',
        '[checks.a]\ncommand = "mlp"\ndepth = 3\nwidth = 8\nsamples = 4\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "mlp"\ndepth = 30\nwidth = 8\nsamples = 4\ninit = "he"\nexpect = '
        '"fail"\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "resnet"\nblocks = 3\ndim = 8\nwidth = 4\nsamples = 4\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "mlp"\ndepth = 1000000000\nwidth = 100000\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "mlp"\ndepth = -3\n',
        '[checks.a]\ncommand = "mlp"\ndepth = 3\nwidth = 8\nsamples = 4\ninit = "skipinit"\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "mlp"\ndepth = 3\nwidth = 8\nsamples = 4\ngate = "theory"\nband = [0.5, '
        '2]\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "mlp"\ndepth = 3\nwidth = 8\nsamples = 4\ngate = "both"\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "mlp"\ndepth = 3\nwidth = 8\nsamples = 4\nband = [2, 3]\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "mlp"\ndepth = 3\nwidth = 8\nsamples = 4\nmax_correlation = 0.5\npairs = '
        '4\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "resnet"\nblocks = 3\ndim = 8\nwidth = 4\nsamples = 4\ncorrelation = [0, '
        '2]\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "mlp"\ndepth = 3\nwidth = 8\nsamples = 4\ncorrelation = "x"\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "cnn"\ndepth = 3\nchannels = 4\nimage = "3x8x8"\nsamples = 4\ndevice = '
        '"cpu"\n',
        '[checks.a]\ncommand = "cnn"\ndepth = 3\nchannels = 4\nimage = "3x8"\nsamples = 4\n',
        '[checks.a]\ncommand = "wrn"\nblocks = 1\nimage = "3x8x8"\nsamples = 4\ndevice = "cpu"\n',
        '[checks.a]\ncommand = "wrn"\npreset = "resnet-56"\nblocks = 2\n',
        '[checks.a]\ncommand = "resnet"\nblocks = 3\ndim = 8\nwidth = 4\nsamples = 4\ninit = '
        '"skipinit"\ndevice = "cpu"\n',
        # a sweep file of both kinds (sigprop plot must refuse it in one line)
        '{"schema": "sigprop.sweep.v1", "config": {"command": "mlp", "depth": 2, "width": 8}, "init": "he", '
        '"end_to_end": {}}\n'
        '{"schema": "sigprop.sweep.v1", "config": {"command": "resnet", "blocks": 2, "width": 8}, "init": '
        '"he", "end_to_end": {}}\n',
        "[checks.a]\ncommand = mlp\n",
        "[checks]\na = 3\n",
        "",
        "\x00\xff",
    ]
)


@st.composite
def argv(draw):
    cmd = draw(st.sampled_from(sorted(COMMANDS)))
    vocab = COMMANDS[cmd]
    args = [cmd]
    if cmd == "sweep":
        args.append(draw(st.sampled_from(["mlp", "resnet", "cnn", "wrn", ""])))
    if cmd == "module":  # a model file _prepare writes, or a target that is not one
        args.append(
            draw(st.sampled_from(["net.py:mlp", "net.py:mlp", "net.py:nope", "nope:x", "net.py", ""]))
        )
        args += ["--input-shape", "4", "--samples", "4"]
    if cmd == "wrn":
        # small maps unless the draw sets --image again (the last one counts): the default net is
        # 4 inits x 100 samples
        args += ["--image", "3x8x8"]
    if cmd in ("hessian", "spectrum"):  # a net and small defaults (later draws may override them)
        args += [
            draw(st.sampled_from(["mlp", "resnet", "cnn", "wrn", "module", "", "nope"])),
            "--samples",
            "4" if cmd == "hessian" else "2",
            "--seeds",
            "1",
        ]
        if cmd == "hessian":
            args += ["--iters", "3"]
        if args[1] in ("cnn", "wrn"):
            args += ["--image", "3x4x4"] + (
                ["--channels", "2", "--depth", "2"] if args[1] == "cnn" else ["--blocks", "1"]
            )
        elif args[1] == "module":  # the model file _prepare writes
            args += [draw(st.sampled_from(["net.py:mlp", "net.py:nope"])), "--input-shape", "4"]
        elif args[1] in ("mlp", "resnet"):
            args += ["--width", "4"] + (
                ["--depth", "2", "--input-dim", "4"] if args[1] == "mlp" else ["--blocks", "1", "--dim", "4"]
            )
    if cmd == "width":  # a net, small and fast unless a draw says otherwise
        which = draw(st.sampled_from(["mlp", "module", "", "resnet"]))
        args += [which, "--steps", "1", "--batch-size", "4"]
        if which == "mlp":
            args += ["--widths", "8,16,32", "--depth", "3", "--input-dim", "4"]
        elif which == "module":
            args += [draw(st.sampled_from(["net.py:wide", "net.py:mlp"])), "--arg", "width=8,16,32"]
            args += ["--input-shape", "4"]
    if cmd in ("plot", "rerun", "check"):
        args.append(draw(st.sampled_from(["FILE", "missing.txt", "", "∂"])))
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.integers(0, 9))
        if kind < 7 and vocab:
            opt = draw(st.sampled_from(sorted(vocab)))
            args.append(opt)
            if draw(st.integers(0, 12)) > 0:  # sometimes the value is missing
                args.append(draw(vocab[opt]))
        elif kind < 9:
            args.append(draw(FLAGS))
        else:
            args.append(draw(GARBAGE))
    outputs = {"--output": "out.txt", "--plot": "fig.png", "--junit": "j.xml", "--out": "r.jsonl"}
    for opt, name in outputs.items():
        applies = (
            (opt == "--output" and cmd in ("mlp", "resnet", "theory", "check", "rerun"))
            or (opt == "--plot" and cmd in ("mlp", "resnet"))
            or (opt == "--junit" and cmd == "check")
            or (opt == "--out" and cmd in ("sweep", "plot"))
        )
        if applies and draw(st.booleans()):
            args += [opt, draw(st.sampled_from([name, "nodir/" + name, "."]))]
    return args, draw(CHECK_TOML)


def _prepare(tmp: Path, toml: str) -> None:
    (tmp / "FILE").write_text(toml, encoding="utf-8", errors="surrogateescape")
    (tmp / "net.py").write_text(
        "import torch.nn as nn\n"
        "def mlp(depth=3, width=4):\n"
        "    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(4, 4), nn.ReLU())])\n"
        "def wide(width=4):\n"
        "    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 3))\n"
    )


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv())
def test_cli_never_crashes(case):
    args, toml = case
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        _prepare(tmp, toml)
        before = set(os.listdir(tmp))
        cwd = os.getcwd()
        out, err = io.StringIO(), io.StringIO()
        os.chdir(tmp)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(args))
        finally:
            os.chdir(cwd)
        after = set(os.listdir(tmp)) - before
        stderr = err.getvalue()
        event(f"{args[0]}: exit {code}")
        assert code in (0, 1, 2), (args, code, stderr)
        assert "Traceback" not in stderr and "internal error" not in stderr, (args, stderr)
        if code != 0:
            last = [l for l in stderr.splitlines() if l.strip()]
            assert last and last[-1].startswith("sigprop"), (args, stderr)
        assert not [f for f in after if f.startswith(".")], (args, after)  # no temp file left
        if code == 2:
            # refused: nothing written (a sweep's file only ever holds whole lines)
            assert not (after & {"out.txt", "fig.png", "j.xml"}), (args, after)


def test_fuzz_examples_cover_every_command():
    """The fuzzer's vocabulary covers every command the app has (read from the app itself, so a
    new command without fuzz cases fails here); ``env`` takes no options."""
    import typer

    from sigprop.cli import build

    app = build()

    commands = set(typer.main.get_command(app).commands)
    assert set(COMMANDS) | {"env"} == commands, commands ^ (set(COMMANDS) | {"env"})


@settings(max_examples=min(EXAMPLES, 60), deadline=None)
@given(
    st.lists(st.sampled_from(["2", "3", "5", "2,3", "3,5"]), min_size=1, max_size=3),
    st.lists(st.sampled_from(["8", "16", "8,16"]), min_size=1, max_size=2),
    st.lists(
        st.sampled_from(["proposed", "he", "pytorch", "proposed,he", "he,pytorch"]), min_size=1, max_size=3
    ),
)
def test_sweep_runs_every_value_of_repeated_and_comma_separated_options(depths, widths, names):
    """``--init a --init b`` and ``--init a,b`` mean the same: every value is planned (the
    repeated option used to keep only the last).  A value given twice is refused in one line.
    The run itself is stopped before any compute by a device that does not exist."""
    args = ["sweep", "mlp", "--out", "r.jsonl", "--device", "cuda:63", "--samples", "2"]
    for flag, values in (("--depth", depths), ("--width", widths), ("--init", names)):
        for v in values:
            args += [flag, v]
    flat = lambda vs: [x for v in vs for x in v.split(",")]
    with tempfile.TemporaryDirectory() as d:
        cwd = os.getcwd()
        os.chdir(d)
        err = io.StringIO()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                code = main(args)
        finally:
            os.chdir(cwd)
    stderr = err.getvalue()
    d, w, n = flat(depths), flat(widths), flat(names)
    if len(set(d)) < len(d) or len(set(w)) < len(w) or len(set(n)) < len(n):
        assert code == 2 and ("repeated" in stderr or "twice" in stderr), stderr
    else:
        assert f"sigprop sweep: {len(d) * len(w) * len(n)} configuration(s)" in stderr, stderr
        assert code == 2 and "cuda:63" in stderr
