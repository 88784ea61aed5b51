"""The fused step (``--fuse``, sigprop/kernels/fused.py; issue 41): a dense or conv layer's ReLU,
packed mask and log-space normalisation compiled by torch.compile (Inductor's C++ here, Triton on
a GPU), against the eager step on the same weights.

The bound: the compiled row norm may sum in another order, so each layer's ln-norm may differ
from eager by the float32 rounding of a sum of n squares, at most about n u relative (u = 2^-24;
measured: a few u), and the unit rows by about u -- which the next matmul carries into the next
layer's ln-norm.  Over L layers of width <= n the end-to-end ln ratio may so differ by at most
2 L n u; the masks (the signs of the pre-activations) are the same unless a pre-activation lies
within a rounding of zero."""

import math

import pytest
import torch

import sigprop
from sigprop import specs
from sigprop.cli import main

U = 2.0**-24


def _ln_ratios(result) -> list[tuple[float, float]]:
    """Per layer the forward and backward mean ln ratio over samples."""
    ln10 = math.log(10)
    return [(r.forward.log10_mean * ln10, r.backward.log10_mean * ln10) for r in result.runs[0].layers]


CASES = [
    # kind, options, depth L, widest n: dense with drawn widths (one compile for widths that are
    # multiples of 8, one for those that are not), with biases (pytorch), conv, residual blocks
    ("mlp", dict(depth=8, width="150:250", input_dim=64, inits="proposed"), 8, 250),
    ("mlp", dict(depth=5, width="40", input_dim=24, inits="pytorch"), 5, 40),
    ("cnn", dict(depth=4, channels=8, image="3x8x8", inits="he"), 4, 8 * 64),
    ("resnet", dict(blocks=3, dim=24, width="20", inits="proposed"), 8, 24),
    # a projection block (two stages) and a zero branch (alpha = 0: the skip alone, both ways);
    # two ReLU layers per branch (the branch's inner mask)
    ("resnet", dict(blocks=2, stages=2, dim=12, width="16", inits="skipinit"), 10, 24),
    ("resnet", dict(blocks=2, dim=16, width="12", block_depth=2, inits="he"), 8, 16),
]


@pytest.mark.parametrize("kind, options, L, n", CASES, ids=[c[0] + "-" + c[1]["inits"] for c in CASES])
def test_the_fused_step_equals_the_eager_one_within_its_rounding(kind, options, L, n):
    spec = sigprop.spec(kind, **options)
    probe = specs.ProbeSpec(samples=32, device="cpu", threads=1)
    eager = sigprop.probe(spec, probe)
    fused = sigprop.probe(spec, specs.ProbeSpec(samples=32, device="cpu", threads=1, fuse=True))
    assert fused.config["fuse"] is True and eager.config["fuse"] is False
    bound = 2 * L * n * U
    for (ef, eb), (ff, fb) in zip(_ln_ratios(eager), _ln_ratios(fused)):
        assert abs(ef - ff) <= bound and abs(eb - fb) <= bound, (ef, ff, eb, fb, bound)


def test_drawn_widths_do_not_recompile_per_layer():
    """A net of 24 layers of widths drawn from 150..250, then another of other widths: each
    compiled function is compiled for few variants (widths that are multiples of 8 or not; a
    backward with or without the mask below), never once per width."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    run = lambda seed: sigprop.probe(
        sigprop.spec("mlp", depth=24, width="150:250", input_dim=64, inits="he"),
        specs.ProbeSpec(samples=16, seed=seed, device="cpu", threads=1, fuse=True),
    )
    torch._dynamo.reset()
    counters.clear()
    run(0)
    first = counters["stats"]["unique_graphs"]
    run(1)
    assert counters["stats"]["unique_graphs"] == first  # 24 new widths, nothing compiled
    assert 2 <= first <= 6, first  # activate: 2 variants; backward: up to 4


def test_a_model_refuses_fuse_in_one_line(tmp_path, capsys):
    nets = tmp_path / "nets.py"
    nets.write_text(
        "import torch.nn as nn\n\ndef net():\n    return nn.Sequential(nn.Linear(8, 8), nn.ReLU())\n"
    )
    code = main(["module", f"{nets}:net", "--input-shape", "8", "--device", "cpu", "--fuse"])
    err = capsys.readouterr().err
    assert code == 2 and "--fuse" in err and err.count("\n") == 1, err


def test_fuse_on_the_command_line_is_recorded(capsys):
    import json

    code = main(
        [
            "mlp",
            "--depth",
            "3",
            "--width",
            "16",
            "--input-dim",
            "16",
            "--samples",
            "8",
            "--device",
            "cpu",
            "--init",
            "he",
            "--fuse",
            "--format",
            "json",
        ]
    )
    assert code == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["config"]["fuse"] is True
    # said before the compile, which prints nothing for a while (issue 66, item 6: 200 s of banner)
    lines = err.splitlines()
    banner = next(i for i, t in enumerate(lines) if t.startswith("sigprop mlp: device cpu"))
    assert (
        lines[banner + 1].startswith("sigprop: --fuse: torch.compile compiles")
        and "C++ on a CPU" in lines[banner + 1]
    )


def test_a_replayed_fused_step_equals_the_eager_fused_one(monkeypatch):
    """CPU proxy of CUDA graphs over compiled kernels: the replay runner's static buffers (inputs
    copied in, outputs copied out; ``replay.Emulated``) around the fused steps give the eager
    fused walk's ln ratios (within the fused bound: a buffer's offset may pick another compiled
    variant), with every step replayed."""
    import walks

    from sigprop import inits
    from sigprop.kernels import replay, sampling
    from sigprop.kinds import mlp as mlp_kind

    widths = [16, 24, 24, 24, 24, 12]
    x, e = sampling.probe_inputs(5, 6, widths[0], widths[-1], torch.device("cpu"), torch.float32)
    args = (mlp_kind.steps(widths), inits.get("he"), x, e, 5, [0, 3])
    eager = walks.walk(*args, fuse=True)
    runner = replay.Emulated()
    monkeypatch.setattr(replay, "MIN_LATER", 0)  # four layers of one shape: capture at the second
    replayed = walks.walk(*args, runner=runner, fuse=True)
    assert runner.status == "on" and runner.steps
    bound = 2 * len(widths) * max(widths) * U
    for key in ("fwd", "bwd"):
        assert torch.allclose(eager.observed[key], replayed.observed[key], rtol=0, atol=bound), key
