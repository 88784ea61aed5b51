"""A plan as a graph of the nodes a traced model gives (sigprop/plans/graphs.py: issue 51's "a plan
step is a node with its maps"), folded by the one graph fold (sigprop/maps/), against the plan
fold as its oracle: the pair kernels of the dense nets, and every forward and backward ratio of
sigprop's own nets -- MLPs of random
widths, ResNets of one and two stages with projections, strided CNNs, WRNs with WN, plain and
batch-normed convs -- for every init each takes, at the init's variance and at half and twice it
(the ``theory`` verdict's alternatives).  The tolerance, 1e-12 in ln: the graph's ReLU moments
come from a Gauss-Legendre quadrature (``theory.activation_moments``) where the plan fold halves
exactly -- measured at most 1.6e-13 over these nets' <= 12 layers."""

from __future__ import annotations

import math

import pytest

from sigprop import inits, kinds, plans, specs
from sigprop.inits import LayerRole
from sigprop.kinds.cnn import CNNSpec
from sigprop.kinds.mlp import MLPSpec
from sigprop.kinds.resnet import ResNetSpec
from sigprop.kinds.wrn import WRNSpec
from sigprop.plans import graphs

NETS = {
    "mlp": (
        MLPSpec(depth=6, input_dim=40, width=specs.WidthSpec(30, 50)),
        ("proposed", "he", "pytorch-he", "datadep"),
    ),
    "resnet": (
        ResNetSpec(blocks=4, stages=2, dim=24, width=specs.WidthSpec(20, 30), block_depth=2),
        ("proposed", "he", "unnormalized-he", "stage-hanin", "skipinit", "skipinit-sqrt"),
    ),
    "cnn": (CNNSpec(depth=5, channels=6, image=(3, 9, 7), strided=2), ("proposed", "he", "pytorch")),
    "wrn": (WRNSpec(blocks=4, image=(3, 8, 8)), ("proposed", "he", "stage-hanin")),
    "wrn-plain": (WRNSpec(blocks=4, image=(3, 8, 8), norm="none", inits=("he",)), ("he",)),
    "wrn-bn": (WRNSpec(blocks=4, image=(3, 8, 8), norm="bn", inits=("he",)), ("he",)),
}
CASES = [(net, init) for net, (_, names) in NETS.items() for init in names]
KIND = {"mlp": "mlp", "resnet": "resnet", "cnn": "cnn", "wrn": "wrn", "wrn-plain": "wrn", "wrn-bn": "wrn"}


def _steps(net: str):
    return kinds.get(KIND[net]).plan(NETS[net][0], 0).steps


@pytest.mark.parametrize("net,init", CASES)
@pytest.mark.parametrize("weight_factor", [1.0, 0.5, 2.0])
def test_the_graph_fold_of_a_plan_equals_the_plan_fold(net, init, weight_factor):
    steps, scheme = _steps(net), inits.get(init)
    p = plans.predict(steps, scheme, weight_factor=weight_factor)
    fwd, bwd = graphs.graph_prediction(steps, scheme, weight_factor)
    assert len(fwd) == len(p.ln_forward) > 2
    assert fwd == pytest.approx(p.ln_forward, abs=1e-12, rel=0)
    if p.ln_backward is None:  # a calibrated layer (datadep), a batch norm: the plan derives none
        assert scheme.standardizes == (bwd is None)
    else:
        assert bwd == pytest.approx(p.ln_backward, abs=1e-12, rel=0)


DENSE = [(net, init) for net, init in CASES if net in ("mlp", "resnet") and init != "datadep"]


@pytest.mark.parametrize("net,init", DENSE)
@pytest.mark.parametrize("c0", [0.0, 0.3, 0.9])
def test_the_graph_folds_the_pair_kernels_of_a_dense_plan(net, init, c0):
    """The graph's shared moment is the plan fold's pair kernel in a dense net: the cosine of two
    inputs' states at every Record (``plans.predict_correlation``, the arc-cosine law) equals the
    graph fold's k/q (its ReLU's two-input quadrature) -- measured within 4e-14."""
    steps, scheme = _steps(net), inits.get(init)
    assert graphs.graph_correlation(steps, scheme, c0) == pytest.approx(
        plans.predict_correlation(steps, scheme, c0, 64), abs=1e-12, rel=0
    )


def test_the_graph_has_no_pair_kernel_of_a_conv_or_a_batch_standardised_layer():
    for net, init in [("cnn", "he"), ("wrn-bn", "he"), ("mlp", "datadep")]:
        with pytest.raises(plans.NotDerived, match="pair kernel"):
            graphs.graph_correlation(_steps(net), inits.get(init), 0.3)


def test_the_comparison_can_fail():
    """The same plan's graph at twice the weight variance is not its plan fold at the init's."""
    steps, scheme = _steps("resnet"), inits.get("proposed")
    fwd, _ = graphs.graph_prediction(steps, scheme, 2.0)
    assert max(abs(a - b) for a, b in zip(fwd, plans.predict(steps, scheme).ln_forward)) > 0.3
    near = graphs.graph_correlation(steps, scheme, 0.31)  # inputs a hundredth of cosine apart
    assert max(abs(a - b) for a, b in zip(near, plans.predict_correlation(steps, scheme, 0.3, 64))) > 1e-3


def test_a_plan_step_is_a_node_with_its_maps():
    """The nodes: a weight layer is ``dense`` at the init's row moment (||W||^2/c_out) with its
    bias variance and, for a conv, one window per spatial axis; its ReLU an ``act``; a block
    its branch ``scale``d by alpha^2 and ``add``ed to its skip (a projection's own ``dense``)."""
    scheme = inits.get("he")
    g = graphs.as_graph(_steps("resnet"), scheme)
    ops = [nd.op for nd in g.nodes]
    assert ops[0] == "input" and ops[-1] == "output"
    assert {"dense", "act", "scale", "add"} == set(ops[1:-1])
    dense = next(nd for nd in g.nodes if nd.op == "dense")
    assert dense.forward == pytest.approx(scheme.moments(LayerRole(24, dense.width)).row_sq)
    steps = _steps("cnn")
    st = next(s for s in steps if isinstance(s, plans.Conv))
    conv = next(nd for nd in graphs.as_graph(steps, scheme).nodes if nd.op == "dense")
    assert [a.shape for a in conv.mats] == list(zip(st.out_hw(), st.in_hw()))
    rows = conv.mats[0].sum(axis=1)  # k taps of 1/k inside the map, fewer at a zero-padded border
    assert rows.max() == pytest.approx(1.0) and rows.min() < 1.0


def test_a_conv_on_its_centre_tap_is_not_a_window_of_the_graph():
    with pytest.raises(plans.NotDerived, match="centre"):
        graphs.as_graph(_steps("cnn"), inits.get("delta-orthogonal"))


def test_the_graph_fold_of_a_deep_plan_underflows_where_the_plan_fold_carries_ln():
    """Why the engine keeps the plan fold (docs/architecture.md, "Two folds, one set of layer
    maps"): the WN MLP with He's g = 1 halves its power a layer; at depth 1200 the plan fold,
    carrying the energy's ln, predicts the forward RMS ratio 2^-600 = 10^-180.6, while the same
    plan's graph folds a per-element q that underflows to 0 past 2^-1074: no ratio there."""
    depth = 1200
    steps = []
    for _ in range(depth):
        steps += [plans.Linear(LayerRole(100, 100), relu=True), plans.Record(pre_activation=True)]
    scheme = inits.get("he")
    ln = plans.predict(tuple(steps), scheme).ln_forward
    assert ln[-1] == pytest.approx(-depth / 2 * math.log(2), rel=1e-12)
    fwd, _ = graphs.graph_prediction(tuple(steps), scheme)
    assert fwd[999] == pytest.approx(ln[999], abs=1e-9) and fwd[-1] is None
