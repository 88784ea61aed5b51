"""The preservation verdict on token models and normalised outputs (issue 67, item 1): read across
the layers, from the first layer site to the last -- the stream's growth, the gradient, the tokens
kept apart -- not from an embedding's scale to a final norm's (GPT-2 at its own init read "signal
NOT preserved: 49.6 at ln_f" while nothing was lost on the way).  Known-good models read
preserved, known-bad ones not (benchmarks/transformer_zoo.py; the rates over 16 draws are
docs/reliability.md §7's); the measurement is checked against plain forward hooks on the same
instance and inputs."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import sigprop

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("transformer_zoo", ROOT / "benchmarks" / "transformer_zoo.py")
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)


def _probe(make, name="tokens", inits="as-is", samples=16, **kw):
    return sigprop.probe_module(model=make, inits=inits, samples=samples, seed=0, **zoo.inputs(name), **kw)


def _checks(run):
    return {c.name.split(" (")[0].split(",")[0]: c for c in run.verdict_checks("preserved")}


def test_gpt2_at_its_own_init_is_preserved_and_its_ends_are_named():
    pytest.importorskip("transformers")
    r = _probe(lambda: zoo.gpt2(layers=4))
    run = r.runs[0]
    assert run.preserved, [(c.name, c.passed) for c in run.checks]
    assert r.config["layer_sites"] == ["m.h.0", "m.h.3"]
    end_to_end = run.layers[-1].forward.rms  # ln_f over the embedding: the scales the model chose
    assert end_to_end > 20
    checks = _checks(run)
    assert set(checks) == {
        "forward ratio across the layers",
        "backward ratio across the layers",
        "tokens kept apart across the layers",
    }
    fwd = checks["forward ratio across the layers"]
    assert "m.wte to m.h.0 x" in fwd.note and "m.h.3 to m.ln_f x" in fwd.note, fwd.note


@pytest.mark.parametrize("make, failing", [
    (lambda: zoo.no_norm_he(layers=12), "forward ratio across the layers"),
    (lambda: zoo.no_skip_attention(layers=12), "tokens kept apart across the layers"),
])  # fmt: skip
def test_known_bad_transformers_are_not_preserved(make, failing):
    run = _probe(make).runs[0]
    checks = _checks(run)
    assert not run.preserved and not checks[failing].passed, [(n, c.passed) for n, c in checks.items()]
    words = "compounds across the layers" if "ratio" in failing else "rank collapse"
    assert words in checks[failing].note


def test_a_nanogpt_decoder_is_preserved_and_reads_the_same_beside_another_init():
    alone = _probe(lambda: zoo.nanogpt(layers=4)).runs[0]
    beside = next(
        r
        for r in _probe(lambda: zoo.nanogpt(layers=4), inits=["as-is", "proposed"]).runs
        if r.init == "as-is"
    )
    assert alone.preserved
    keep = lambda run: json.dumps([c.to_dict() for c in run.checks])
    assert keep(alone) == keep(beside)


def test_the_band_widens_with_the_layers():
    run = _probe(lambda: zoo.nanogpt(layers=16)).runs[0]
    fwd = _checks(run)["forward ratio across the layers"]
    assert 10**fwd.log10_low == pytest.approx(1 / 16) and 10**fwd.log10_high == pytest.approx(16)


def test_a_model_of_float_inputs_without_a_final_norm_keeps_the_end_to_end_verdict():
    make = lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    r = sigprop.probe_module(model=make, input_shape=(8,), inits="as-is", samples=16)
    names = [c.name for c in r.runs[0].verdict_checks("preserved")]
    assert (
        names == ["forward ratio at site 4", "backward ratio at site 1"] and r.config["layer_sites"] is None
    )


def test_the_ratios_across_the_layers_equal_plain_hooks_on_the_same_instance():
    """An independent measurement: forward hooks on the same model and ids, per sample
    rms(h at the last layer) / rms(h at the first) and 1 - the tokens' mean cosine."""
    torch.manual_seed(0)
    model = zoo.nanogpt(layers=4)
    ids = torch.randint(0, zoo.VOCAB, (16, zoo.T))
    r = sigprop.probe_module(model=model, inputs=ids, inits="as-is", samples=16)  # its final norm: the rule
    checks = _checks(r.runs[0])
    got = {}
    hooks = [model.layers[k].register_forward_hook(lambda m, i, o, k=k: got.__setitem__(k, o.detach()))
             for k in (0, 3)]  # fmt: skip
    with torch.no_grad():
        model.eval()
        model(ids)
    for h in hooks:
        h.remove()
    rms = {k: got[k].double().pow(2).mean(dim=(1, 2)).sqrt() for k in got}
    typical = float(torch.log(rms[3] / rms[0]).mean().exp())
    assert 10 ** checks["forward ratio across the layers"].log10_measured == pytest.approx(typical, rel=1e-5)

    def apart(h):
        u = torch.nn.functional.normalize(h.double(), dim=-1)
        s = u.sum(1)
        T = h.shape[1]
        return float((1 - (s.pow(2).sum(-1) - T) / (T * (T - 1))).mean())

    ratio = apart(got[3]) / apart(got[0])
    assert 10 ** checks["tokens kept apart across the layers"].log10_measured == pytest.approx(
        ratio, rel=1e-5
    )
    assert math.isfinite(np.log(ratio))
