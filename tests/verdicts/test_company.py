"""An init's record is the same run alone and run after other inits (issue 48, item 2): on a
copied-layer encoder 0.14.0 gave ``proposed`` a zero-width band ("2.49 outside [2.58, 2.58]")
after ``as-is`` -- the spread was computed once, from the first init's trace, whose copied layers
are not mapped -- and "[2.1, 3.15] = agrees" alone."""

import pytest
import torch.nn as nn

import sigprop


def copied_encoder():
    """``nn.TransformerEncoder`` as PyTorch builds it: its layers deep copies of one (as-is: the
    maps stop at the first copy; proposed re-draws each layer)."""
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)


CASES = {
    "mlp": (sigprop.probe_mlp, dict(depth=3, width=8, input_dim=8), ["he", "proposed"]),
    "resnet": (sigprop.probe_resnet, dict(blocks=2, dim=8, width=8), ["he", "proposed"]),
    "cnn": (sigprop.probe_cnn, dict(depth=3, channels=4, image="3x8x8"), ["delta-orthogonal", "proposed"]),
    "wrn": (sigprop.probe_wrn, dict(blocks=1, image="3x8x8"), ["he", "proposed"]),
    "module": (sigprop.probe_module, dict(model=copied_encoder, input_shape=(6, 16)), ["as-is", "proposed"]),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_an_inits_record_does_not_depend_on_the_inits_before_it(kind):
    probe, config, (first, second) = CASES[kind]
    together = probe(**config, inits=[first, second], samples=8, device="cpu", gate="theory")
    alone = probe(**config, inits=[second], samples=8, device="cpu", gate="theory")
    assert together.run(second).to_dict() == alone.run(second).to_dict()
    # what the run says of this init alone is said in company too
    for key in ("theory_notes", "init_notes", "site_notes"):
        assert set(alone.config.get(key) or ()) <= set(together.config.get(key) or ())


def test_a_copied_encoders_proposed_band_has_its_width_in_company():
    probe, config, inits = CASES["module"]
    r = probe(**config, inits=inits, samples=8, device="cpu", gate="theory")
    last = r.run("proposed").layers[-1].forward
    assert last.predicted is not None and last.log10_high - last.log10_low > 0.01
