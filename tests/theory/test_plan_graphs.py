"""A plan as a graph of the nodes a traced model gives (sigprop/plans/graphs.py: issue 51's "a plan
step is a node with its maps"), folded by the one graph fold (sigprop/maps/), against the plan
fold as its oracle: the pair kernels of the dense nets, and every forward and backward ratio of
sigprop's own nets -- MLPs of random
widths, ResNets of one and two stages with projections, strided CNNs, WRNs with WN, plain and
batch-normed convs -- for every init each takes, at the init's variance and at half and twice it
(the ``theory`` verdict's alternatives).  The tolerance, 1e-13 in ln: both folds are exact (the
graph's ReLU reads its closed forms, ``theory.relu_shared_moments``; until 0.17 a Gauss-Legendre
quadrature, 1.6e-13 off), so they differ by rounding alone -- a few ulps of ln ratios of order 10
per step over these nets' <= 12 layers (at most 12 x 2.2e-16 x 10 ~ 3e-14; measured 8.9e-16)."""

from __future__ import annotations

import math

import numpy as np
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
    assert fwd == pytest.approx(p.ln_forward, abs=1e-13, rel=0)
    if p.ln_backward is None:  # a calibrated layer (datadep), a batch norm: neither derives one
        assert bwd is None
    else:
        assert bwd == pytest.approx(p.ln_backward, abs=1e-13, rel=0)


DENSE = [(net, init) for net, init in CASES if net in ("mlp", "resnet") and init != "datadep"]


def _shared_moment_cosines(steps, scheme, c0: float) -> list[float]:
    """The cosine of two inputs' states at every Record read off the general maps' shared moment
    (``maps.graph.fold_ln`` at k_in = c0 q_in: a node's shared moment over its second moment) --
    a pair kernel only in a dense net without a batch-standardised layer (a conv's shared moment
    is two positions' of one sample; the maps' batch is of independent samples, not pairs)."""
    from sigprop.maps.graph import fold_ln

    g = graphs.as_graph(steps, scheme)
    cosine = fold_ln(g.nodes, 1.0, c0).cosine
    return [math.nan if cosine[i] is None else cosine[i] for i in g.forward]


@pytest.mark.parametrize("net,init", DENSE)
@pytest.mark.parametrize("c0", [-0.5, 0.0, 0.3, 0.9])
def test_the_graph_folds_the_pair_kernels_of_a_dense_plan(net, init, c0):
    """The graph's shared moment is the plan fold's pair kernel in a dense net: the cosine of two
    inputs' states at every Record (``plans.predict_correlation``, the arc-cosine law) equals the
    graph fold's k/q (its ReLU's closed form, ``theory.relu_shared_moments``) -- cosines, so
    rounding alone: measured within 6.7e-16 (inputs anti-correlated too)."""
    steps, scheme = _steps(net), inits.get(init)
    assert _shared_moment_cosines(steps, scheme, c0) == pytest.approx(
        plans.predict_correlation(steps, scheme, c0, 64), abs=1e-13, rel=0
    )


@pytest.mark.parametrize("q", [0.3, 1.0, 7.0])
@pytest.mark.parametrize("c", [0.0, 0.4, 0.95])
def test_the_relu_closed_forms_are_the_quadrature(q, c):
    """The closed forms a plan's ReLU reads (``theory.relu_shared_moments``: the arc-cosine
    kernels of degrees 1 and 0) against the quadrature any activation reads
    (``theory.shared_moments``, 2 x 128 Gauss-Legendre nodes per side of the kink, ~1e-15
    relative for a ReLU) at mean 0: every moment, and the derivative's cross moment."""
    from sigprop import theory
    from sigprop.maps import layers

    closed = theory.relu_shared_moments(q, c * q)
    quad = theory.shared_moments(*layers.pair(layers.relu), 0.0, q, c * q)
    assert tuple(closed) == pytest.approx(tuple(quad), rel=1e-12, abs=1e-15)
    assert closed.derivative_cross == pytest.approx(quad.derivative_cross, rel=1e-12)


def test_the_relu_closed_forms_hold_for_anticorrelated_inputs():
    """At a negative cosine (which the quadrature's shared offset cannot draw), the closed forms
    against a Monte Carlo of 2e6 pairs: E[y(a) y(b)] and P(a > 0, b > 0), within 5 standard
    errors of the sample means."""
    import numpy as np

    from sigprop import theory

    q, c, n = 2.0, -0.6, 2_000_000
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, n))
    a = math.sqrt(q) * z[0]
    b = math.sqrt(q) * (c * z[0] + math.sqrt(1 - c * c) * z[1])
    y = np.maximum(a, 0) * np.maximum(b, 0)
    both = (a > 0) & (b > 0)
    got = theory.relu_shared_moments(q, c * q)
    assert abs(got[2] - y.mean()) < 5 * y.std() / math.sqrt(n)
    assert abs(got.derivative_cross - both.mean()) < 5 * both.std() / math.sqrt(n)


def test_the_comparison_can_fail():
    """The same plan's graph at twice the weight variance is not its plan fold at the init's."""
    steps, scheme = _steps("resnet"), inits.get("proposed")
    fwd, _ = graphs.graph_prediction(steps, scheme, 2.0)
    assert max(abs(a - b) for a, b in zip(fwd, plans.predict(steps, scheme).ln_forward)) > 0.3
    near = graphs.graph_pair_kernels(steps, scheme, 0.31, 64)  # inputs a hundredth of cosine apart
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


@pytest.mark.parametrize("weight_factor", [1.0, 0.5])
def test_a_conv_on_its_centre_tap_is_the_centre_window_of_the_graph(weight_factor):
    """Delta-orthogonal rows sit on the centre tap: the graph's window reads that tap alone (one
    1 per output row, none at a stride's skipped inputs), and its fold is the plan fold's."""
    steps, scheme = _steps("cnn"), inits.get("delta-orthogonal")
    conv = next(nd for nd in graphs.as_graph(steps, scheme).nodes if nd.op == "dense")
    assert all((m.sum(axis=1) == 1.0).all() and set(np.unique(m)) == {0.0, 1.0} for m in conv.mats)
    p = plans.predict(steps, scheme, weight_factor=weight_factor)
    fwd, bwd = graphs.graph_prediction(steps, scheme, weight_factor)
    assert fwd == pytest.approx(p.ln_forward, abs=1e-13, rel=0)
    assert bwd == pytest.approx(p.ln_backward, abs=1e-13, rel=0)
    assert p.ln_forward[-1] != pytest.approx(graphs.graph_prediction(steps, inits.get("he"))[0][-1], abs=0.01)


MORE = {  # MLPs whose layers widen (n_out/n_in > 1) and narrow, at orthogonal and Gaussian rows
    "mlp-wide": MLPSpec(depth=5, input_dim=20, width=specs.WidthSpec(60, 60)),
    "mlp-narrowing": MLPSpec(depth=5, input_dim=80, width=specs.WidthSpec(10, 70)),
}
JACOBIAN = CASES + [(n, i) for n in MORE for i in ("proposed", "he", "pytorch-orthogonal")]


@pytest.mark.parametrize("net,init", JACOBIAN)
def test_the_graph_folds_the_jacobian_spectrum_as_the_plan_does(net, init):
    """The Jacobian's moments as node laws (``maps.free.fold_jacobian``: a weight layer's
    mean-squared row norm and S-transform, a ReLU's (1/2, 1/2), a block's free sum) against the
    plan fold's ``predict_jacobian``: the mean and variance of J J^T's eigenvalues to rounding,
    and where neither derives the variance (a conv, a calibrated layer) the same words and the
    same mean from the backward map."""
    steps = kinds.get("mlp").plan(MORE[net], 0).steps if net in MORE else _steps(net)
    scheme = inits.get(init)
    want, got = plans.predict_jacobian(steps, scheme), graphs.graph_jacobian(steps, scheme)
    assert got.why == want.why
    assert got.mean == pytest.approx(want.mean, rel=1e-12, nan_ok=True)
    if want.variance is None:
        assert got.variance is None and want.why
    else:
        assert got.variance == pytest.approx(want.variance, rel=1e-12)


def test_the_jacobian_comparison_can_fail():
    """A block's law read with the branch's variance not corrected for the fork's (its node's
    variance as is) moves the deep ResNet's variance: the comparison above would see it."""
    from sigprop import theory
    from sigprop.maps import structure

    steps, scheme = _steps("resnet"), inits.get("he")
    want = plans.predict_jacobian(steps, scheme).variance
    real = theory.block_variance
    try:
        structure.theory.block_variance = lambda a, v, *rest: real(a, v + 1.0, *rest)
        assert graphs.graph_jacobian(steps, scheme).variance != pytest.approx(want, rel=1e-3)
    finally:
        structure.theory.block_variance = real


def test_the_graph_fold_carries_a_deep_plans_scale_as_a_logarithm():
    """The WN MLP with He's g = 1 halves its power a layer: at depth 1200 the plan fold, carrying
    the energy's ln, predicts the forward RMS ratio 2^-600 = 10^-180.6; the plain graph fold's
    per-element q underflows to 0 past 2^-1074, and the graph fold carrying each node's scale as
    a logarithm (``maps.graph.fold_ln``, which ``graph_prediction`` reads) gives the plan fold's
    ratios at every layer, forward and backward."""
    from sigprop.maps import predict_graph

    depth = 1200
    steps = []
    for _ in range(depth):
        steps += [plans.Linear(LayerRole(100, 100), relu=True), plans.Record(pre_activation=True)]
    steps, scheme = tuple(steps), inits.get("he")
    p = plans.predict(steps, scheme)
    assert p.ln_forward[-1] == pytest.approx(-depth / 2 * math.log(2), rel=1e-12)
    g = graphs.as_graph(steps, scheme)
    assert predict_graph(g.nodes, 1.0).q[g.forward[-1]] == 0.0  # the plain fold: underflowed
    fwd, bwd = graphs.graph_prediction(steps, scheme)
    # rounding alone (closed forms both sides): at most 1200 x 2.2e-16 x |ln| <= 416 ~ 1.1e-10;
    # measured 2.8e-14 forward, 1.4e-14 backward (2.7e-11 with the quadrature's ReLU, until 0.17)
    assert fwd == pytest.approx(p.ln_forward, abs=1e-10, rel=0)
    assert bwd == pytest.approx(p.ln_backward, abs=1e-10, rel=0)


def test_the_log_fold_is_the_plain_fold_where_both_hold_and_refuses_an_op_that_does_not_scale():
    """``fold_ln`` against ``fold_graph`` on a net with biases, a batch norm, a residual sum and a
    scaled branch (every node, both ways, 1e-12 in ln), and a GELU -- whose map depends on its
    input's scale -- and a layer norm -- whose gradient reads its readers' alignments -- refused
    in one line."""
    import numpy as np

    from sigprop.maps import GraphNode, predict_graph
    from sigprop.maps.graph import fold_ln

    relu = dict(fn=graphs.RELU, params=graphs.HOMOGENEOUS)
    nodes = [
        GraphNode("x", "input", ()),
        GraphNode("fc1", "dense", (0,), forward=1.7, backward=2.1, bias=0.3),
        GraphNode("relu1", "act", (1,), **relu),
        GraphNode("fc2", "dense", (2,), forward=0.6, backward=0.5, bias=0.05),
        GraphNode("bn", "norm", (3,), forward=1.0, units=0, group=0),
        GraphNode("relu2", "act", (4,), **relu),
        GraphNode("alpha", "scale", (5,), forward=0.25),
        GraphNode("add", "add", (2, 6)),
        GraphNode("out", "output", (7,)),
    ]
    plain, log = predict_graph(nodes, 0.8, 0.0, 0.3), fold_ln(nodes, 0.8, 0.3)
    assert log.ln_q == pytest.approx([math.log(v) for v in plain.q], abs=1e-12, rel=0)
    assert log.ln_r == pytest.approx([math.log(v) for v in plain.r], abs=1e-12, rel=0)
    assert log.cosine == pytest.approx([k / q for k, q in zip(plain.shared, plain.q)], abs=1e-12, rel=0)
    gelu = (lambda z: z * (1 + np.tanh(z)) / 2, lambda z: np.ones_like(z))
    for nd in (GraphNode("gelu", "act", (0,), fn=gelu), GraphNode("ln", "norm", (0,), units=8, group=8)):
        with pytest.raises(ValueError, match="does not say how it scales"):
            fold_ln([nodes[0], nd, GraphNode("out", "output", (1,))], 1.0)


@pytest.mark.parametrize("net,init", CASES)
@pytest.mark.parametrize("gains_at_d", [False, True])
def test_the_graph_gives_the_plan_folds_whole_prediction(net, init, gains_at_d):
    """``graphs.graph_predict`` against ``plans.predict`` (the engine's energy theory until 0.17,
    the oracle now): every Record's ratios, every block's ln branch ratio and its forward and
    backward branch-to-skip gains (the backward from what the branch and the skip gave the fork,
    ``LnFold.ln_given``), at ||x||^2 = d - 2 and at d, at the init's variance and at half it --
    to rounding (measured within 1e-15; gains relative)."""
    steps, scheme = _steps(net), inits.get(init)
    for wf in (1.0, 0.5):
        want = plans.predict(steps, scheme, gains_at_d=gains_at_d, weight_factor=wf)
        got = graphs.graph_predict(steps, scheme, weight_factor=wf, gains_at_d=gains_at_d)
        assert got.ln_forward == pytest.approx(want.ln_forward, abs=1e-13, rel=0)
        if want.ln_backward is None:
            assert got.ln_backward is None and got.ln_branch is None
        else:
            assert got.ln_backward == pytest.approx(want.ln_backward, abs=1e-13, rel=0)
            assert got.ln_branch == pytest.approx(want.ln_branch, abs=1e-13, rel=0)
        assert len(got.gains) == len(want.gains) == sum(isinstance(st, plans.Close) for st in steps)
        assert (len(got.gains) > 0) == (net not in ("mlp", "cnn"))
        for g, w in zip(got.gains, want.gains):
            assert g == pytest.approx(w, rel=1e-12, abs=1e-300)


def test_a_blocks_backward_gain_reads_what_the_branch_gave_its_fork():
    """The backward gain is the branch's share at the fork over the skip's: with the skip's and the
    branch's contributions swapped it would be the reciprocal, which the He ResNet's gains (alpha =
    1, a branch of two layers: 1/2 at the first block and growing) are not."""
    steps, scheme = _steps("resnet"), inits.get("he")
    got = graphs.graph_predict(steps, scheme).gains
    want = plans.predict(steps, scheme).gains
    assert [b for _, b in got] == pytest.approx([b for _, b in want], rel=1e-12)
    assert [1.0 / b for _, b in got] != pytest.approx([b for _, b in want], rel=1e-3)


SPREAD_NETS = {
    **{net: _steps for net in NETS},
    "resnet-bn": ResNetSpec(blocks=5, stages=1, dim=24, norm="bn", block_depth=1, inits=("he",)),
    "resnet-3": ResNetSpec(blocks=2, stages=3, dim=8, width=specs.WidthSpec(10, 30), block_depth=3),
    "wrn-bottleneck": WRNSpec(blocks=2, image=(3, 8, 8), bottleneck=True),
}


def _spread_steps(net: str):
    if net in NETS:
        return _steps(net)
    return kinds.get(net.split("-")[0]).plan(SPREAD_NETS[net], 0).steps


@pytest.mark.parametrize("net", list(SPREAD_NETS))
@pytest.mark.parametrize("orthogonal", [False, True])
@pytest.mark.parametrize("gains", [None, "given"])
def test_the_graph_folds_the_finite_width_spread_as_the_plan_does(net, orthogonal, gains):
    """The spread as node laws folded over the plan's graph (``graphs.graph_spread``) against the
    plan fold's (``plans.spread``, the engine's until 0.17, the oracle now; itself checked against
    the four recursions the kinds kept, tests/theory/closed_forms.py): every Record's cumulants
    forward and backward, every block's variances and its branch ratio's, at the proposed init's
    gains and at given ones -- equal (the same laws summed in the same order: measured 0)."""
    steps = _spread_steps(net)
    blocks = sum(isinstance(st, plans.Close) for st in steps)
    g = None if gains is None else [(0.3 + 0.1 * k, 0.5 + 0.05 * k) for k in range(blocks)]
    want, got = plans.spread(steps, orthogonal, g), graphs.graph_spread(steps, orthogonal, g)
    assert got.forward.shape == want.forward.shape and got.backward.shape == want.backward.shape
    assert got.forward == pytest.approx(want.forward, abs=1e-15, rel=0)
    assert got.backward == pytest.approx(want.backward, abs=1e-15, rel=0)
    assert len(got.block_forward) == blocks
    for a, b in ((got.block_forward, want.block_forward), (got.block_backward, want.block_backward)):
        assert a == pytest.approx(b, abs=1e-15, rel=0)
    assert got.branch == pytest.approx(want.branch, abs=1e-15, rel=0)


def test_the_spread_comparison_can_fail(monkeypatch):
    """A batch norm step's linear layer read as if a ReLU followed it (the first guess: through
    the next block's batch norm and its ReLU) leaves the layer's 2/(4 d) out of the BN net's
    backward spread at its input: the comparison above sees it (0.0208 of 0.0883)."""
    steps = _spread_steps("resnet-bn")
    want = plans.spread(steps, False).backward[0, 1]
    assert graphs.graph_spread(steps, False).backward[0, 1] == pytest.approx(want, abs=1e-15)

    def through_any_norm(self, i):
        nodes = self.g.nodes
        return any(
            nodes[r].op == "act"
            or nodes[r].op == "norm"
            and any(nodes[q].op == "act" for q in self.readers[r])
            for r in self.readers[i]
        )

    monkeypatch.setattr(graphs._SpreadLaws, "_relu_after", through_any_norm)
    got = graphs.graph_spread(steps, False).backward[0, 1]
    assert want - got == pytest.approx(2.0 / (4.0 * 24), rel=1e-12)


@pytest.mark.parametrize("net,init", JACOBIAN)
def test_the_graph_gives_the_free_density_of_a_dense_chain(net, init):
    """``graphs.graph_density`` (each weight layer's (g2, ReLU, s1, n_in, n_out) read off its node)
    against ``plans.predict_density`` (off its step): the same density where the plan is a chain
    of dense layers (the MLPs, every init with moments; the free convolution reads the same
    numbers, so the grids are equal), and none on both sides for residual blocks, convs, batch
    norm or a calibrated init."""
    steps = kinds.get("mlp").plan(MORE[net], 0).steps if net in MORE else _steps(net)
    scheme = inits.get(init)
    want, got = plans.predict_density(steps, scheme), graphs.graph_density(steps, scheme)
    assert (got is None) == (want is None)
    assert (want is not None) == (net.startswith("mlp") and init != "datadep")
    assert got == want


PAIR_CASES = [
    (net, init)
    for net in SPREAD_NETS
    for init in (NETS[net][1] if net in NETS else ("he", "proposed"))
    if net != "wrn-bn"
]


@pytest.mark.parametrize("net,init", PAIR_CASES)
@pytest.mark.parametrize("c0,batch", [(0.0, 64), (0.5, 8), (-0.3, 16)])
def test_the_graph_folds_the_pair_kernels_as_the_plan_does(net, init, c0, batch):
    """The pair kernels as node laws folded over the plan's graph (``graphs.graph_pair_kernels``:
    K_aa, K_ab, K_perp per position through each node) against the plan fold's
    ``plans.predict_correlation`` (the engine's until 0.17, the oracle now; itself checked
    against Monte Carlo, tests/theory/test_correlation_theory.py): the cosine at every Record,
    on every net -- convs' per-position kernels, the data-dependent MLP's and the BN ResNet's
    batch standardisation of pairs, skipped branches -- at three cosines and batches, to
    rounding (the same maps in the same order: measured within 1e-15)."""
    steps, scheme = _spread_steps(net), inits.get(init)
    want = plans.predict_correlation(steps, scheme, c0, batch)
    got = graphs.graph_pair_kernels(steps, scheme, c0, batch)
    assert len(got) == len(want) > 2
    assert got == pytest.approx(want, abs=1e-13, rel=0, nan_ok=True)


@pytest.mark.parametrize("net,init", [("wrn-bn", "he"), ("cnn", "datadep")])
def test_a_conv_standardised_over_the_batch_has_no_pair_kernels_either_way(net, init):
    steps, scheme = _spread_steps(net), inits.get(init)
    with pytest.raises(ValueError, match="standardised convs"):
        plans.predict_correlation(steps, scheme, 0.3, 16)
    with pytest.raises(ValueError, match="standardised convs"):
        graphs.graph_pair_kernels(steps, scheme, 0.3, 16)
