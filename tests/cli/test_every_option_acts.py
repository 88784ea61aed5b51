"""Every option a command's help shows either acts or is refused in one line (issue 37, item 11).

0.10.1's help listed what a kind then refused (``module --help``: --stream, --correlation, ...) or
accepted and ignored (``--sites`` under ``spectrum module``, ``--precision tf32`` under
``module``).  Here every visible option of every probe, ``hessian`` and ``spectrum`` command is
run once on a tiny net -- with the options that enable it (``--pairs`` needs ``--correlation``) --
and its outcome compared with the same run without it: the exit code, stdout (the JSON with its
timings taken out) or the files written must differ, or the run must be refused in one line
(exit 2).  Options a kind refuses are hidden from its help (``Kind.refuses``) and refused with
the kind's reason."""

from __future__ import annotations

import json

import pytest
import typer
from typer.core import TyperOption

from sigprop import environment
from sigprop.cli import build, main

BASE = {
    "mlp": ["mlp", "--depth", "3", "--width", "8", "--input-dim", "8"],
    "resnet": ["resnet", "--blocks", "1", "--dim", "8", "--width", "8"],
    "cnn": ["cnn", "--depth", "3", "--channels", "4", "--image", "3x8x8"],
    "wrn": ["wrn", "--blocks", "1", "--image", "3x8x8"],
    "module": ["module", "{nets}:net", "--input-shape", "8"],
}
#: per command family: what every run of it takes (small), and the format its stdout is read in
FAMILY = {
    "probe": ["--samples", "8", "--format", "json", "--device", "cpu"],
    "hessian": ["--samples", "16", "--seeds", "1", "--iters", "3", "--format", "json", "--device", "cpu"],
    "spectrum": ["--samples", "2", "--seeds", "1", "--format", "json", "--device", "cpu"],
}
#: per option: (the options that enable it, the option with a value unlike the base run's)
VALUES = {
    "--depth": ([], ["--depth", "4"]),
    "--input-dim": ([], ["--input-dim", "6"]),
    "--width": ([], ["--width", "6"]),
    "--blocks": ([], ["--blocks", "2"]),
    "--stages": ([], ["--stages", "2"]),
    "--dim": ([], ["--dim", "6"]),
    "--block-depth": ([], ["--block-depth", "3"]),
    "--norm": ([], ["--norm", "none"]),
    "--channels": ([], ["--channels", "6"]),
    "--image": ([], ["--image", "3x10x10"]),
    "--strided": ([], ["--strided", "1"]),
    "--widen": ([], ["--widen", "2"]),
    "--bottleneck": ([], ["--bottleneck"]),
    "--preset": ([], ["--preset", "resnet-56"]),
    "--arg": ([], ["--arg", "width=6"]),
    "--input-shape": ([], ["--input-shape", "3,8"]),
    "--sites": ([], ["--sites", "leaves"]),
    "--vocab": ([], ["--vocab", "10"]),
    # beside TARGET: refused in one line ("give TARGET or --config, not both"); its runs are
    # tests/kinds/test_module_config.py's
    "--config": ([], ["--config", "{nets}"]),
    "--data": ([], ["--data", "{data}"]),
    "--batch-size": ([], ["--batch-size", "1"]),
    "--samples": ([], ["--samples", "18"]),
    "--seed": ([], ["--seed", "1"]),
    "--seeds": ([], ["--seeds", "2"]),
    "--device": ([], ["--device", "cuda"]),
    "--dtype": ([], ["--dtype", "float64"]),
    "--format": ([], ["--format", "table"]),
    "--output": ([], ["--output", "{tmp}/out.json"]),
    # a tiny net's theory bands are no test: the theory gate fails, and --check says so in its exit
    # (a traced model's is a test it passes since 0.15.0: CHECK_MODULE)
    "--check": (["--gate", "theory"], ["--check"]),
    "--gate": ([], ["--gate", "theory"]),
    "--band": ([], ["--band", "0.999:1.001"]),
    "--stream": ([], ["--stream"]),
    "--precision": ([], ["--precision", "tf32"]),
    "--graphs": ([], ["--graphs"]),
    "--fuse": ([], ["--fuse"]),
    # one thread more than the run's default (OMP_NUM_THREADS, or half the cores): recorded, and used
    "--threads": ([], ["--threads", str(environment.probe_threads()[0] + 1)]),
    "--plot": ([], ["--plot", "{tmp}/fig.png"]),
    "--correlation": ([], ["--correlation", "0.5"]),
    "--pairs": (["--correlation", "0.5"], ["--pairs", "16"]),
    "--max-correlation": ([], ["--max-correlation", "0.5"]),
    # float tokens [T, d] = [3, 8]: the Linear layers' outputs are token sequences
    "--max-token-cosine": (["--input-shape", "3,8"], ["--max-token-cosine", "0.5"]),
    "--observe": ([], ["--observe", "nosuch"]),
    "--iters": ([], ["--iters", "4"]),
    "--tol": (["--iters", "50"], ["--tol", "0.5"]),
    "--top": ([], ["--top", "1"]),
    "--trace": ([], ["--trace", "1"]),
    "--density": ([], ["--density", "--steps", "3"]),
    "--probes": (["--density", "--steps", "3"], ["--probes", "2"]),
    "--steps": (["--density", "--steps", "3"], ["--steps", "4"]),
    "--per-layer": ([], ["--per-layer"]),
    "--head": ([], ["--head", "init"]),
    "--depths": ([], ["--depths"]),
    "--at": ([], ["--at", "1"]),
    "--path": ([], ["--path", "lanczos", "--steps", "3"]),
}
#: the spectrum's quadrature options act on its lanczos path
SPECTRUM = {
    "--probes": (["--path", "lanczos", "--steps", "3"], ["--probes", "2"]),
    "--steps": (["--path", "lanczos", "--steps", "3"], ["--steps", "4"]),
}
#: the init a run of each command tries beside its default
INIT = {"mlp": "he", "resnet": "he", "cnn": "he", "wrn": "he", "module": "proposed"}


def _visible() -> list[tuple[str, str, str]]:
    """(family, kind, option) of every option every probe, hessian and spectrum command shows."""
    app = typer.main.get_command(build())
    out = []
    for family, group in (
        ("probe", app),
        ("hessian", app.commands["hessian"]),
        ("spectrum", app.commands["spectrum"]),
    ):
        for kind in BASE:
            cmd = group.commands.get(kind)
            if cmd is None:
                continue
            for p in cmd.params:
                if isinstance(p, TyperOption) and not p.hidden and p.opts[0] != "--help":
                    out.append((family, kind, p.opts[0]))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import numpy as np

    tmp = tmp_path_factory.mktemp("options")
    (tmp / "nets.py").write_text(
        "import torch.nn as nn\n"
        "def net(width=8):\n"
        "    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 8), nn.ReLU())\n"
    )
    rng = np.random.default_rng(0)
    np.savez(tmp / "data.npz", x=rng.standard_normal((32, 8)), y=rng.integers(0, 10, 32))
    return tmp


_BASELINES: dict[tuple, tuple] = {}


def _run(argv: list[str], capsys) -> tuple[int, object, list[str]]:
    """Exit code, what the run measured (its JSON without the config, which echoes every option
    given, acted on or not, and without the timings) or its stdout, and its stderr lines."""
    code = main(argv)
    cap = capsys.readouterr()
    out = cap.out
    try:
        doc = json.loads(out)
        doc.pop("config", None)
        for run in doc.get("runs", []):
            for d in run.get("draws", []):
                d.pop("seconds", None)
        out = doc
    except ValueError:
        pass
    return code, out, cap.err.strip().splitlines()


def _baseline(argv: list[str], capsys) -> tuple:
    key = tuple(a for a in argv if "pytest-" not in a)  # the same run in another worker's tmp dir
    if key not in _BASELINES:
        _BASELINES[key] = _run(argv, capsys)
    return _BASELINES[key]


#: ``--check`` on a model: a band no ratio meets fails the gate (its theory band, a test since
#: 0.15.0, the tiny net passes)
CHECK_MODULE = (["--band", "0.999:1.001"], ["--check"])

#: options that take several values (repeatable): never merged
REPEATABLE = {"--init", "--arg"}


def _merged(args: list[str]) -> list[str]:
    """The arguments with an option given again replacing its earlier value: sigprop refuses an
    option that takes one value given twice (0.14.1; click kept the last)."""
    items, i = [], 0
    while i < len(args):
        takes = args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--")
        items.append(args[i : i + (2 if takes else 1)])
        i += len(items[-1])
    out, seen = [], set()
    for item in reversed(items):
        if item[0].startswith("--") and item[0] not in REPEATABLE:
            if item[0] in seen:
                continue
            seen.add(item[0])
        out = item + out
    return out


@pytest.mark.parametrize("family, kind, option", _visible())
def test_every_option_in_the_help_acts_or_is_refused(family, kind, option, files, capsys, tmp_path):
    if option == "--init":
        enable, given = [], ["--init", INIT[kind]]
    elif family == "spectrum" and option in SPECTRUM:
        enable, given = SPECTRUM[option]
    elif kind == "module" and option == "--check":
        enable, given = CHECK_MODULE
    else:
        assert option in VALUES, f"{option} of {family} {kind}: give it a value here"
        enable, given = VALUES[option]
    subs = {"{nets}": str(files / "nets.py"), "{data}": str(files / "data.npz"), "{tmp}": str(tmp_path)}

    def fill(args):
        out = []
        for a in args:
            for k, v in subs.items():
                a = a.replace(k, v)
            out.append(a)
        return out

    prefix = [] if family == "probe" else [family]
    base = _merged(fill(prefix + BASE[kind] + FAMILY[family] + enable))
    code0, out0, err0 = _baseline(base, capsys)
    assert code0 in (0, 1), (base, err0)
    code, out, err = _run(_merged(base + fill(given)), capsys)
    if code == 2:  # refused: one line naming the option
        assert len(err) == 1 and err[0].startswith("sigprop: error:") and "internal error" not in err[0], err
        return
    assert code in (0, 1), (given, err)
    wrote = [p.name for p in tmp_path.iterdir()]
    assert (code, out) != (code0, out0) or wrote, f"{family} {kind} {option}: accepted and ignored"
    assert "sigprop: warning" not in " ".join(err)


def test_what_a_kind_refuses_is_hidden_and_refused_with_its_reason(files, capsys):
    """``sigprop module --stream``: not in the help, refused naming the option and why."""
    assert ("probe", "module", "--stream") not in _visible()
    assert ("spectrum", "module", "--sites") not in _visible()
    assert ("hessian", "module", "--head") not in _visible()
    argv = ["module", f"{files / 'nets.py'}:net", "--input-shape", "8", "--stream"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "sigprop: error: --stream: sigprop module does not take it: a model keeps its own weights: "
        "nothing to stream"
    )
