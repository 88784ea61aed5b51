"""Correlation propagation measured beside its infinite-width prediction (docs/theory.md §10):
every derivation checked against the probe at width ~1000, the agreement marks, the
``--max-correlation`` gate and the records."""

import json

import pytest

from sigprop import api, inits, plans, specs, stats, theory
from sigprop.cli import main
from sigprop.kinds import mlp
from sigprop.kinds.mlp import MLPSpec
from sigprop.kinds.resnet import ResNetSpec


def _run(capsys, args):
    """The CLI as a user runs it (errors mapped to flags, exit codes): (code, stdout, stderr)."""
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


#: at width ~1000 one draw's mean over 128 pairs sits within ~0.012 of the infinite-width cosine
#: for the MLP and the BN net, and within ~0.03 for the He ResNet, whose blocks all carry equal
#: weight so that their draws' deviations add up (measured over 3 seeds, docs/theory.md §10); the
#: mean over 4 draws halves that, and the tolerance is 0.03.  A wrong map (a missing bias, a
#: skipped centring, the other ReLU map) moves the cosine by 0.05-0.3 within a few layers
TOL = 0.03
PROBE = dict(samples=4, seeds=4, device="cpu", pairs=128, correlations=(0.0, 0.6))


def _worst(result):
    worst = 0.0
    for run in result.runs:
        for rec in run.layers:
            for c in rec.correlation:
                assert c.predicted is not None, (run.init, rec.index)
                worst = max(worst, abs(c.mean - c.predicted))
    return worst


@pytest.mark.parametrize("name", ["proposed", "pytorch", "datadep"])
def test_mlp_cosines_follow_their_maps_at_width_1000(name):
    r = api.probe(
        MLPSpec(depth=15, input_dim=1000, width=specs.WidthSpec(1000, 1000), inits=(name,)),
        specs.ProbeSpec(**PROBE),
    )
    assert _worst(r) < TOL


@pytest.mark.parametrize("name", ["proposed", "he", "datadep"])
def test_resnet_cosines_follow_the_block_recursion_with_stages_and_block_depth(name):
    spec = ResNetSpec(
        blocks=4, stages=2, dim=600, width=specs.WidthSpec(1000, 1000), block_depth=2, inits=(name,)
    )
    assert _worst(api.probe(spec, specs.ProbeSpec(**PROBE))) < TOL


def test_bn_resnet_cosines_follow_the_batch_centred_recursion():
    r = api.probe(ResNetSpec(blocks=10, dim=1000, norm="bn", inits=("he",)), specs.ProbeSpec(**PROBE))
    assert _worst(r) < TOL
    # batch centring keeps unrelated inputs apart: the cosine settles near 1/pi, it does not go to 1
    assert r.runs[0].correlations[0].end_mean < 0.4


def test_proposed_mlp_collapses_and_proposed_resnet_does_not():
    """The issue's numbers: the proposed MLP from c0 = 0 reaches ~0.95 at layer 20 and ~0.99 at 50;
    the proposed ResNet stays near 0.25 at block 40 (width 256 here; the theory's values are
    0.948, 0.988 and 0.25)."""
    p = specs.ProbeSpec(samples=4, device="cpu", correlations=(0.0,))
    mlp_run = api.probe(MLPSpec(depth=50, input_dim=256, width=specs.WidthSpec(256, 256)), p).runs[0]
    res = api.probe(
        ResNetSpec(blocks=40, dim=256, width=specs.WidthSpec(256, 256), inits=("proposed",)), p
    ).runs[0]
    assert (
        0.90 < mlp_run.layers[19].correlation[0].mean < 0.99 and mlp_run.layers[49].correlation[0].mean > 0.97
    )
    assert 0.15 < res.layers[40].correlation[0].mean < 0.35
    assert all(c.agrees for r in (mlp_run, res) for rec in r.layers for c in rec.correlation)


def test_a_wrong_map_is_marked():
    """The marks can fail: the pytorch init's biases push the cosine to 1 within a few layers;
    measured against the zero-bias map it disagrees."""
    r = api.probe(
        MLPSpec(depth=8, input_dim=500, width=specs.WidthSpec(500, 500), inits=("pytorch",)),
        specs.ProbeSpec(samples=4, device="cpu", correlations=(0.0,)),
    ).runs[0]
    zero_bias = plans.predict_correlation(mlp.steps([500] * 9), inits.get("he"), 0.0, 512)
    collapse = theory.correlation_collapse_sd([500] * 8)
    marks = [
        stats.cosine_agrees(rec.correlation[0].mean, rec.correlation[0].std, p, k)
        for rec, p, k in zip(r.layers, zero_bias, collapse)
    ]
    assert marks[-4:] == [False] * 4, (
        marks
    )  # the biases take over from layer ~4: the wrong map is refused from there
    assert all(rec.correlation[0].agrees for rec in r.layers)  # the right one (with biases) is not


def test_max_correlation_gates_the_check(capsys):
    mlp = [
        "mlp",
        "--depth",
        "50",
        "--width",
        "64",
        "--input-dim",
        "64",
        "--samples",
        "8",
        "--init",
        "proposed",
        "--max-correlation",
        "0.9",
        "--device",
        "cpu",
    ]
    code, _, err = _run(capsys, mlp + ["--check"])
    assert code == 1 and "check failed (inputs kept apart (--max-correlation))" in err, err
    code, out, _ = _run(
        capsys,
        [
            "resnet",
            "--blocks",
            "50",
            "--dim",
            "64",
            "--width",
            "64",
            "--samples",
            "8",
            "--init",
            "proposed",
            "--max-correlation",
            "0.9",
            "--check",
            "--device",
            "cpu",
        ],
    )
    assert code == 0, out
    # without --check the bound is reported, the exit stays 0
    code, out, _ = _run(capsys, mlp)
    assert code == 0 and "inputs of cosine 0 end at cosine" in out


def test_records_json_and_csv(capsys):
    args = [
        "mlp",
        "--depth",
        "4",
        "--width",
        "16",
        "--input-dim",
        "16",
        "--samples",
        "8",
        "--device",
        "cpu",
        "--pairs",
        "16",
        "--correlation",
        "0,-0.5",
        "--correlation",
        "0.25",
    ]
    doc = json.loads(_run(capsys, args + ["--format", "json"])[1])
    assert doc["config"]["correlations"] == [0.0, -0.5, 0.25] and doc["config"]["pairs"] == 16
    layer = doc["runs"][0]["layers"][0]["correlation"]
    assert [c["c0"] for c in layer] == [0.0, -0.5, 0.25] and set(layer[0]) == {
        "c0",
        "mean",
        "std",
        "predicted",
        "agrees",
    }
    # zero-bias ReLU layers from c0 = 0: 1 - c falls below 1/e at layer 4 (docs/theory.md §10)
    assert doc["runs"][0]["correlation"][0]["predicted_depth_scale"] == 4
    csv = _run(capsys, args + ["--format", "csv"])[1].splitlines()
    assert (
        "cos_-0.5_mean" in csv[0].split(",") and len(csv) == 1 + 4 * 3
    )  # a header, 4 layers x 3 default inits


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--correlation", "x"], "--correlation"),
        (["--correlation", "1.5"], "--correlation"),
        (["--correlation", "0,0"], "--correlation"),
        (["--correlation", "nan"], "--correlation"),
        (["--max-correlation", "2"], "--max-correlation"),
        (["--pairs", "0"], "--pairs"),
    ],
)
def test_bad_correlation_options_are_one_line(capsys, args, flag):
    code, out, err = _run(
        capsys, ["mlp", "--depth", "2", "--width", "8", "--samples", "4", "--device", "cpu", *args]
    )
    assert (
        code == 2
        and not out
        and flag in err
        and "Traceback" not in err
        and len(err.strip().splitlines()) == 1
    ), err


def test_input_dim_one_cannot_hold_a_cosine(capsys):
    code, out, err = _run(
        capsys,
        [
            "mlp",
            "--depth",
            "2",
            "--width",
            "8",
            "--input-dim",
            "1",
            "--samples",
            "4",
            "--device",
            "cpu",
            "--correlation",
            "0.5",
        ],
    )
    assert code == 2 and not out and "--correlation" in err and len(err.strip().splitlines()) == 1, err
