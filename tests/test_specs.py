"""sigprop/specs.py: the probe, gate and curvature specs and the pieces every kind's spec shares --
each refuses bad input naming its field, and nothing random is left to the walker."""

import pytest

from sigprop import specs
from sigprop.errors import SigpropError


@pytest.mark.parametrize(
    "text, field_words",
    [
        ("0", "widths must be >= 1"),
        ("9:3", "reversed"),
        ("a", "expected an integer"),
        ("1:2:3", "expected an integer"),
        ("1e13", "expected an integer"),
    ],
)
def test_width_spec_refuses_naming_its_field(text, field_words):
    with pytest.raises(SigpropError) as err:
        specs.WidthSpec.parse(text, field="hidden")
    assert err.value.field == "hidden" and field_words in str(err.value)


def test_width_spec_draws_from_the_seed_alone():
    w = specs.WidthSpec.parse("150:250")
    assert w.draw(20, seed=3) == w.draw(20, seed=3) != w.draw(20, seed=4)
    assert all(150 <= v <= 250 for v in w.draw(1000, seed=0))
    assert str(w) == "150:250" and str(specs.WidthSpec.parse(" 64 ")) == "64"


def test_derived_seeds_are_independent_streams_of_one_seed():
    a = [specs.derive_seed(7, k) for k in range(7)]
    assert len(set(a)) == 7 and all(0 <= v < 2**63 for v in a)
    assert specs.derive_seed(7, specs.STREAM_WEIGHTS, 3) == specs.derive_seed(7, specs.STREAM_WEIGHTS, 3)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"samples": 0}, "samples"),
        ({"seed": -1}, "seed"),
        ({"device": "tpu"}, "device"),
        ({"dtype": "float16"}, "dtype"),
        ({"precision": "tf32", "dtype": "float64"}, "precision"),
        ({"correlations": (0.2, 0.2)}, "correlation"),
        ({"correlations": (2.0,)}, "correlation"),
        ({"pairs": 0}, "pairs"),
        ({"threads": 0}, "threads"),
        ({"batch": 0}, "batch"),
    ],
)
def test_probe_spec_refuses_naming_the_field(kw, field):
    with pytest.raises(SigpropError) as err:
        specs.ProbeSpec(**kw)
    assert err.value.field == field


def test_probe_spec_takes_one_name_or_cosine_alone():
    p = specs.ProbeSpec(correlations=0.5, observe="x")
    assert p.correlations == (0.5,) and p.observe == ("x",)
    with pytest.raises(SigpropError, match="twice"):
        specs.ProbeSpec(observe=("x", "x"))


def test_gate_spec_band_must_hold_1_and_the_correlation_bound_adds_c0_0():
    with pytest.raises(SigpropError) as err:
        specs.GateSpec(band=(2.0, 3.0))
    assert err.value.field == "band"
    assert specs.parse_band("0.5:2") == (0.5, 2.0)
    with pytest.raises(SigpropError):
        specs.parse_band("0.5")
    gate = specs.GateSpec(max_correlation=0.9)
    assert gate.probe(specs.ProbeSpec(correlations=(0.6,))).correlations == (0.0, 0.6)
    assert gate.to_dict() == {"gate": "preserved", "band": None, "max_correlation": 0.9}


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"tol": 0.0}, "tol"),
        ({"top": -1}, "top"),
        ({"trace": -1}, "trace"),
        ({"head": "mine"}, "head"),
        ({"batch_size": 0}, "batch_size"),
        ({"iters": 0}, "iters"),
    ],
)
def test_hessian_spec_refuses_naming_the_field(kw, field):
    with pytest.raises(SigpropError) as err:
        specs.HessianSpec(**kw)
    assert err.value.field == field


def test_images_parse_as_c_h_w():
    assert specs.parse_image("3x32x32") == specs.image((3, 32, 32)) == (3, 32, 32)
    assert specs.image_text((3, 8, 6)) == "3x8x6"
    for bad in ("3x32", "3x0x4", "axbxc"):
        with pytest.raises(SigpropError) as err:
            specs.parse_image(bad)
        assert err.value.field == "image"
