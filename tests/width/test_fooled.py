"""Width verdicts a model cannot fool (issue 66, item 3): a readout written as ``h @ W``, attention
written by hand, a model's own optimizer, coordinates that shrink, a run where nothing moves, the
theory verdict's words, and a parametrization's name."""

from __future__ import annotations

import json

import pytest
import torch
from width_nets import BareReadout, Decoder, MuMLP, mu_adam

import sigprop
from sigprop.errors import SigpropError
from sigprop.width import attention

FAST = dict(widths=[32, 64, 128, 256], input_shape=(6,), steps=2, seeds=2, batch_size=8)


def _run(result, param):
    return next(r for r in result.runs if r.param == param)


def test_a_readout_written_as_a_product_is_the_readout():
    """W of shape (width, 4) used as ``h @ W`` was read as a vector (mup's rule for a tensor of the
    model's own): μP's readout scaling never applied, the output no site.  Now the last product
    before the output names it the readout (its fan-in the growing dimension) and says so."""
    r = sigprop.width_check(lambda width: BareReadout(width, classes=128), params=["sp", "mup"], **FAST)
    assert any("'W', a matrix of the model's own" in n and "read as the readout" in n for n in r.notes), (
        r.notes
    )
    mup, sp = _run(r, "mup"), _run(r, "sp")
    out = {s.step: s for s in mup.slopes if s.role == "output"}
    # μP's readout drawn (n/n0)^-1/2 times SP's, from the same draws: the slopes differ by -1/2
    sp_out = next(s.l1 for s in sp.slopes if s.role == "output" and s.step == 0)
    assert out[0].l1 - sp_out == pytest.approx(-0.5, abs=0.01), (out[0].l1, sp_out)
    assert mup.width_stable and mup.theory == "agrees", (mup.stable_words, mup.theory_words)
    assert not sp.width_stable and "output site (model) updates grow" in sp.stable_words, sp.stable_words


def test_the_model_s_output_is_always_a_site():
    """A multiplier after the readout made the output no site: a readout multiplier applied twice
    (here (16/n)^1 on top of μP's) shrinks the logits' change ∝ width^-1 and read width-stable."""
    r = sigprop.width_check(lambda width: BareReadout(width, power=1.0), params=["mup"], **FAST)
    run = r.runs[0]
    assert "(output)" not in {s.site for s in run.slopes}  # the root module returns the output: its site
    assert not run.width_stable and "output site (model)" in run.stable_words, run.stable_words
    assert "shrink ∝ width^-1." in run.stable_words, run.stable_words
    assert "vanishing as the width grows" in run.stable_words


def test_a_multiplier_outside_the_readout_module_is_the_output_site():
    from width_nets import TinyLM

    r = sigprop.width_check(
        lambda width: TinyLM(width, scale_logits=True),
        widths=[32, 64, 128],
        input_shape=(6,),
        vocab=11,
        params=["mup"],
        steps=1,
        seeds=2,
        batch_size=4,
    )
    sites = {s.site: s.role for s in r.runs[0].slopes}
    assert sites.get("(output)") == "output" and sites.get("out") == "output", sites


def test_hand_written_attention_is_rescaled_as_sdpa_is():
    """nanoGPT's form and an einsum form under μP train to the values of the same decoder written
    with F.scaled_dot_product_attention (one attention call rescaled each, said in the notes);
    without the rescaling they would not (the check can fail)."""
    kw = dict(
        widths=[32, 64, 128], input_shape=(8,), vocab=11, params=["mup"], steps=2, seeds=2, batch_size=4
    )
    runs = {
        f: sigprop.width_check(lambda width, f=f: Decoder(width, form=f), **kw)
        for f in ("sdpa", "nanogpt", "einsum")
    }
    ref = {s.site: s.l1_values + s.delta_values for s in runs["sdpa"].runs[0].slopes}
    for form in ("nanogpt", "einsum"):
        r = runs[form]
        assert r.config["attention_written"] == 1 and r.config["attention_calls"] == 0
        assert any("1 call(s) rescaled" in n and "1 written out" in n for n in r.notes), r.notes
        got = {s.site: s.l1_values + s.delta_values for s in r.runs[0].slopes}
        # float32: the fused kernel and the written-out one sum in other orders (~1e-7 a step); two
        # Adam steps divide each gradient by its own size, so a coordinate near zero moves by up to
        # lr: 1e-3 relative bounds what three widths' means show (measured 7e-5)
        for site, values in got.items():
            assert values == pytest.approx(ref[site], rel=1e-3, abs=1e-7), (form, site)
    assert runs["sdpa"].config["attention_calls"] == 1


def test_without_the_rescaling_hand_written_attention_differs(monkeypatch):
    kw = dict(
        widths=[32, 64, 128], input_shape=(8,), vocab=11, params=["mup"], steps=2, seeds=2, batch_size=4
    )
    ref = sigprop.width_check(lambda width: Decoder(width, form="sdpa"), **kw)
    monkeypatch.setattr(attention, "_PRODUCTS", ())
    r = sigprop.width_check(lambda width: Decoder(width, form="nanogpt"), **kw)
    assert r.config["attention_written"] == 0
    assert any(
        "1 softmax call(s) whose input is no product" in n and "not rescaled under μP" in n for n in r.notes
    )
    a = {s.site: s.l1_values for s in ref.runs[0].slopes}
    b = {s.site: s.l1_values for s in r.runs[0].slopes}
    assert max(abs(x / y - 1) for k in b for x, y in zip(a[k], b[k])) > 1e-2


def test_the_model_brings_its_own_optimizer():
    """A model built for μP's Adam read ✗ under as-is (torch's Adam); with its own optimizer it
    reads width-stable, and the words name it."""
    kw = dict(FAST, params=["as-is"])
    plain = sigprop.width_check(MuMLP, **kw)
    own = sigprop.width_check(MuMLP, optimizer=mu_adam.__module__ + ":mu_adam", **kw)
    assert not plain.runs[0].width_stable and "as-is with Adam" in plain.runs[0].stable_words
    assert own.runs[0].width_stable and "as-is with its own optimizer mu_adam" in own.runs[0].stable_words
    for options, words in (
        (dict(optimizer="width_nets:mu_adam", params=["mup"]), "give --param as-is"),
        (dict(optimizer="width_nets:nope", params=["as-is"]), "has no 'nope'"),
        (dict(optimizer="adamw", params=["as-is"]), "unknown optimizer 'adamw'"),
        (dict(optimizer="width_nets:not_an_optimizer", params=["as-is"]), "not an optimizer"),
    ):
        with pytest.raises(SigpropError) as e:
            sigprop.width_check(MuMLP, **{**kw, **options})
        assert e.value.field == "optimizer" and words in e.value.message, e.value.message


def test_nothing_moved_is_said_and_is_no_pass():
    """One class under cross-entropy: the loss is 0, nothing trains; it printed ✗ on a slope of
    noise.  Now: nothing moved, no verdict on the width, and --check fails."""
    r = sigprop.width_check("mlp", widths=[32, 64, 128], depth=3, input_dim=6, classes=1, steps=2, seeds=2,
                            batch_size=8)  # fmt: skip
    for run in r.runs:
        assert not run.width_stable and "nothing moved" in run.stable_words
    assert not r.passed


def test_a_slope_is_gated_beyond_its_standard_error():
    from sigprop.results.width import SiteSlope
    from sigprop.width.check import _drift
    from sigprop.width.spec import WidthSpec

    spec = WidthSpec(steps=1)
    noisy = SiteSlope("h", "hidden", 1, 0.0, 0.0, 0.26, 1.02, None, None, None, [1.0] * 3, [1.0] * 3)
    assert _drift(spec, [noisy]) is None
    sure = SiteSlope("h", "hidden", 1, 0.0, 0.0, 0.40, 0.05, None, None, None, [1.0] * 3, [1.0] * 3)
    assert _drift(spec, [sure])[1:] == ("updates", 0.40, 0.05, 0.25)
    shrink = SiteSlope("h", "hidden", 1, 0.0, 0.0, -0.40, 0.05, None, None, None, [1.0] * 3, [1.0] * 3)
    assert _drift(spec, [shrink])[1:] == ("updates", -0.40, 0.05, -0.25)
    readout = SiteSlope("y", "output", 1, 0.0, 0.0, -0.45, 0.05, None, None, None, [1.0] * 3, [1.0] * 3)
    assert _drift(spec, [readout]) is None  # μP's readout on a finite grid: down to -1/2 (docs §17)


def test_the_theory_words_say_what_was_compared_and_as_is_is_named():
    """μP read "✗ ... activations grow ... from step 3" beside "all 16 slopes compared agree": the
    theory words now say which slopes it compared; as-is printed "width_params.as-is"."""
    from sigprop.cli import main

    r = sigprop.width_check("mlp", widths=[32, 64, 128], depth=3, input_dim=6, steps=2, seeds=2, batch_size=8)
    words = _run(r, "mup").theory_words
    assert (
        "3 activation(s) at step 0, 6 update(s) of steps 1-2; the activations after step 0 have no prediction"
        in words
    )
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "width",
                "mlp",
                "--widths",
                "32,64,128",
                "--depth",
                "3",
                "--input-dim",
                "6",
                "--steps",
                "1",
                "--seeds",
                "2",
                "--batch-size",
                "8",
                "--param",
                "as-is",
                "--format",
                "json",
            ]
        )
    doc = json.loads(out.getvalue())
    assert code in (0, 1) and doc["runs"][0]["param"] == "as-is"
    assert doc["runs"][0]["stable_verdict"].startswith("as-is with Adam"), doc["runs"][0]["stable_verdict"]
    assert "width_params" not in json.dumps(doc)


class _Scaled(torch.nn.Module):
    """A Linear readout times (32 / width): 1 at the base width, where its output equals the
    readout's -- the output's own site must be there at every width all the same."""

    def __init__(self, width: int):
        super().__init__()
        self.a, self.c = torch.nn.Linear(6, width), torch.nn.Linear(width, 4)
        self.width = width

    def forward(self, x):
        return self.c(torch.relu(self.a(x))) * (32 / self.width)


def test_the_output_site_is_the_same_at_every_width():
    r = sigprop.width_check(_Scaled, params=["mup"], **FAST)
    run = r.runs[0]
    sites = {s.site for s in run.slopes}
    assert "(output)" in sites and "c" in sites
    out = next(s for s in run.slopes if s.site == "(output)" and s.step == 1)
    assert out.delta == pytest.approx(-1.0, abs=0.25) and not run.width_stable  # the multiplier's n^-1
