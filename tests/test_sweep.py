"""sigprop/sweep.py: the grid from a kind's declaration, its resume keys (unchanged from 0.7, so a
sweep file written then resumes now), and the rows read back for ``sigprop plot``."""

import json

import pytest

from sigprop import kinds, specs, sweep
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
    point = sweep.grid(k, [3], [64 if kind != "wrn" else 1], ["proposed"], PROBE)[0]
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
    assert len(sweep.done_keys(path)) == 2  # an interrupted line is skipped when resuming
    with pytest.raises(SigpropError, match="3: not a JSON line"):
        sweep.read_rows(path)  # and named when plotting
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SigpropError, match="mixes sweeps"):
        sweep.read_rows(path)


def test_the_api_runs_and_resumes_a_sweep_on_any_executor(tmp_path):
    """The loop is the library's (``sigprop.run_sweep``): an executor decides where and in which order the
    points run, every line is written here as its result arrives, and a second call resumes."""
    import sigprop

    out, plans = tmp_path / "s.jsonl", []
    backwards = lambda fn, items: (fn(p) for p in reversed(items))
    probe = specs.ProbeSpec(samples=8, device="cpu")
    run = lambda depths, **kw: sigprop.run_sweep(
        "mlp",
        out,
        {"depth": depths},
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
