"""The width check's optimizers are one registry (sigprop/width/optimizers.py; issue 68, item 6):
an optimizer registered once is validated, trained with, read by the theory's column of its
family, estimated and named -- 0.18 named SGD and Adam in five places, and a third name added to
the theory's tuple passed validation and trained with Adam."""

from __future__ import annotations

import pytest
import torch

import sigprop
from sigprop.errors import SigpropError
from sigprop.width import optimizers

FAST = dict(widths=[32, 64, 128], depth=3, input_dim=8, steps=1, seeds=1, batch_size=16, lr=0.01)


@pytest.fixture
def adamw():
    built = []

    def make(groups):
        opt = torch.optim.AdamW(groups, weight_decay=0.5)
        built.append(opt)
        return opt

    optimizers.register("adamw", optimizers.Optimizer("AdamW", "adam", make, 3))
    yield built
    optimizers.OPTIMIZERS.remove("adamw")


def test_a_registered_optimizer_is_the_one_that_trains(adamw):
    """Registered once: accepted, built for every point (AdamW, not Adam: its weight decay moves
    the measured slopes away from Adam's), its exponents Adam's column (the predicted exponents
    equal Adam's), its name in the verdict's words."""
    r = sigprop.width_check("mlp", params=["mup"], optimizer="adamw", **FAST)
    a = sigprop.width_check("mlp", params=["mup"], optimizer="adam", **FAST)
    assert adamw and all(isinstance(o, torch.optim.AdamW) for o in adamw)
    assert "AdamW" in r.runs[0].stable_words
    ours, theirs = r.runs[0].slopes, a.runs[0].slopes
    assert [(s.init, s.low, s.high) for s in ours] == [(s.init, s.low, s.high) for s in theirs]
    assert [s.delta for s in ours if s.step] != [s.delta for s in theirs if s.step]


def test_an_optimizer_without_a_theory_column_is_refused():
    with pytest.raises(ValueError, match="no column in the theory"):
        optimizers.register("lion", optimizers.Optimizer("Lion", "lion", lambda groups: None, 1))
    assert "lion" not in optimizers.OPTIMIZERS


def test_an_unknown_optimizer_names_the_registered_ones():
    with pytest.raises(SigpropError, match="choose from sgd, adam, or the model's own") as err:
        sigprop.width_check("mlp", params=["mup"], optimizer="adagrad", **FAST)
    assert err.value.field == "optimizer"
