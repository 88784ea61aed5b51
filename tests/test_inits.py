"""sigprop/inits.py: the init registry (torch-free) -- which inits a net may take, from what it
provides; the gains of Arpit et al. 2019 (eq. 6, footnote 3); the norm variants of a residual net."""

import math
import subprocess
import sys

import pytest

from sigprop import inits, kinds
from sigprop.errors import SigpropError
from sigprop.inits import LayerRole


def test_an_init_is_defined_by_what_the_net_provides():
    plain = set(inits.names(frozenset()))
    blocks = set(inits.names({inits.BLOCKS}))
    taps = set(inits.names({inits.TAPS}))
    assert plain <= blocks and plain <= taps
    assert {"skipinit", "skipinit-sqrt", "stage-hanin"} <= blocks - plain  # need residual blocks
    assert "delta-orthogonal" in taps - plain  # needs a kernel's taps
    for kind in kinds.KINDS.values():
        assert inits.names(kind.provides) == [
            n for n in inits.INITS if inits.INITS[n].defined_for(kind.provides)
        ]


def test_get_names_the_net_and_suggests():
    with pytest.raises(SigpropError) as err:
        inits.get("skipinit", frozenset(), "the MLP")
    assert err.value.field == "init" and "not defined for the MLP" in str(err.value)
    with pytest.raises(SigpropError, match="did you mean 'proposed'"):
        inits.get("propsed")
    with pytest.raises(SigpropError, match="--init he --init proposed"):
        inits.get("he,proposed")


def test_the_proposed_gains():
    """g^2 = 2 n_in / n_out for a ReLU layer (Arpit et al. 2019, eq. 3); a block's last layer
    n_in / (B n_out) (eq. 6); a conv counts c k^2 on both sides (footnote 3)."""
    assert inits.proposed_gain_sq(LayerRole(200, 100)) == pytest.approx(4.0)
    assert inits.proposed_gain_sq(LayerRole(200, 500, "block_last", 40)) == pytest.approx(200 / (40 * 500))
    assert inits.proposed_gain_sq(LayerRole(16 * 9, 32, taps=9)) == pytest.approx(2 * 16 / 32)
    assert inits.pytorch_linear_bound(400) == pytest.approx(1 / math.sqrt(400))


def test_norm_variants_of_a_residual_net():
    provides = kinds.KINDS["resnet"].provides
    assert inits.resolve_norm("he", "none", provides, "ResNets", "the BN ResNet") == "unnormalized-he"
    assert inits.resolve_norm("proposed", "wn", provides, "ResNets", "the BN ResNet") == "proposed"
    with pytest.raises(SigpropError) as err:
        inits.resolve_norm("proposed", "bn", provides, "ResNets", "the BN ResNet")
    assert err.value.field == "init"


def test_every_scheme_says_where_it_comes_from_and_what_its_theory_is():
    for s in inits.INITS.values():
        assert s.description and s.paper
        # a closed form, standardised layers, or a model's own weights (its theory reads them)
        assert s.moments is not None or s.standardizes or inits.MODEL in s.needs, s.name


def test_the_registry_imports_no_torch():
    code = "import sigprop.inits, sigprop.kinds, sigprop.plans, sys; print('torch' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )
