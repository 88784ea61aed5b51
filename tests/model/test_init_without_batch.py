"""``sigprop.init_`` without a batch (issue 48, item 4): on a model torch.fx cannot trace, 0.14.0
guessed the roles of 18 of 36 weights of an encoder with no word.  Now it exports the graph on
inputs drawn for ``input_shape=`` (token ids with ``vocab=``), as the CLI does on the probe's,
and where no graph can be read it warns, naming every layer whose role it could not read.  Those
layers keep the model's own weights (issue 66, item 4: 0.18.0 drew them as ReLU layers, an
out-projection at 2B times its branch's variance: token cosine 0.61 at the last layer)."""

import warnings

import pytest
import torch
import torch.nn as nn

import sigprop
from sigprop.errors import RolesGuessed, SigpropError

D, T = 32, 8


def encoder() -> nn.Module:  # nn.TransformerEncoder: torch.fx cannot trace its fast-path checks
    layer = nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


class Wrapper(nn.Module):
    """A user's wrapper of token ids around an encoder: no ``dummy_inputs`` of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, D)
        self.enc = encoder()

    def forward(self, ids):
        return self.enc(self.emb(ids))


def guessed(records) -> list[str]:
    return [r.name for r in records if r.note.startswith("role not read")]


def test_without_an_input_every_unread_layer_is_named_and_kept():
    model = encoder()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.warns(RolesGuessed) as got:
        records = sigprop.init_(model, "proposed")
    names = guessed(records)
    assert names, "the encoder's roles were read without an input: the test's premise is gone"
    message = str(got[0].message)
    assert all(n in message for n in names) and "input_shape=" in message
    assert f"{len(names)} of {len(names) + sum(r.set for r in records)} weight layers" in message
    assert "kept as the model drew them" in message
    after = dict(model.named_parameters())
    for name in names:  # the model's own draw, bit for bit: no guessed gain
        assert not next(r for r in records if r.name == name).set
        for leaf in ("weight", "bias"):
            assert torch.equal(after[f"{name}.{leaf}"], before[f"{name}.{leaf}"]), name
    assert "layers.1.self_attn.out_proj" in names and "layers.1.linear2" in names
    drawn = [r.name for r in records if r.set]
    assert drawn and not any(torch.equal(after[f"{n}.in_proj_weight"], before[f"{n}.in_proj_weight"])
                             for n in drawn if f"{n}.in_proj_weight" in after)  # fmt: skip
    notes = sigprop.model.init.init_notes("proposed", records)
    assert any("kept as the model drew them" in n and "layers.1.linear2" in n for n in notes), notes


def test_input_shape_reads_the_roles_the_cli_reads():
    """The roles read on drawn inputs equal those read on the probe's batch (the CLI's path)."""
    model = encoder()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RolesGuessed)
        records = sigprop.init_(model, "proposed", input_shape=(T, D))
        on_batch = sigprop.init_(encoder(), "proposed", batch=torch.randn(4, T, D))
    assert not guessed(records)
    assert [(r.name, r.role, r.blocks_in_stage) for r in records] == [
        (r.name, r.role, r.blocks_in_stage) for r in on_batch
    ]
    assert {r.name: r.role for r in records}["layers.1.self_attn.out_proj"] == "block_last"


def test_token_ids_with_vocab():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RolesGuessed)
        records = sigprop.init_(Wrapper(), "proposed", input_shape=(T,), vocab=100)
    assert not guessed(records)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"vocab": 100}, "input_shape"),
        ({"input_shape": (0, D)}, "input_shape"),
        ({"input_shape": "8"}, "input_shape"),
    ],
)
def test_bad_inputs_are_refused(kw, field):
    with pytest.raises(SigpropError) as e:
        sigprop.init_(encoder(), "proposed", **kw)
    assert e.value.field == field


def test_a_model_fx_traces_needs_no_input():
    model = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RolesGuessed)
        records = sigprop.init_(model, "proposed")
    assert [r.role for r in records if r.set] == ["relu", "linear"]
