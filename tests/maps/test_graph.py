"""The fold of the moment maps (sigprop/maps/graph.py) on graphs built by hand, against closed
forms written here: a dense layer scales q by its ||W||^2 / c_out, a ReLU of a centred Gaussian
halves q (and E[phi'^2] = 1/2 halves r), a residual sum adds its paths both ways, a
concatenation keeps its parts' shares, and ``weight_factor`` scales every weight layer's
variance as a layer's ||W||^2 would, both ways.  The maps and their fold import no torch."""

import math
import subprocess
import sys

import numpy as np
import pytest

from sigprop.maps.graph import GraphNode, predict_graph

#: a ReLU and its derivative as the maps read an activation (numpy, float64)
RELU = (
    lambda z: np.maximum(np.asarray(z, dtype=np.float64), 0.0),
    lambda z: (np.asarray(z, dtype=np.float64) > 0.0).astype(np.float64),
)


def test_the_maps_and_their_fold_import_no_torch():
    """sigprop/maps/ is below the plans (no torch): importing it registers every built-in map and
    a hand-built chain folds there, torch never loaded."""
    code = (
        "import sys, numpy as np; from sigprop import maps\n"
        "relu = (lambda z: np.maximum(z, 0.0), lambda z: (np.asarray(z) > 0.0) * 1.0)\n"
        "nodes = [maps.GraphNode('x', 'input', ()), maps.GraphNode('fc', 'dense', (0,), forward=2.0),\n"
        "         maps.GraphNode('relu', 'act', (1,), fn=relu), maps.GraphNode('out', 'output', (2,))]\n"
        "p = maps.predict_graph(nodes, 1.5)\n"
        "print('torch' in sys.modules, len(list(maps.MAPS.items())), round(p.q[2], 9))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "False" and int(out[1]) >= 21 and float(out[2]) == pytest.approx(1.5)


def _chain(f1: float, f2: float, b1: float = 1.0, b2: float = 1.0) -> list[GraphNode]:
    return [
        GraphNode("x", "input", ()),
        GraphNode("fc1", "dense", (0,), forward=f1, backward=b1),
        GraphNode("relu", "act", (1,), fn=RELU),
        GraphNode("fc2", "dense", (2,), forward=f2, backward=b2),
        GraphNode("out", "output", (3,)),
    ]


def test_dense_relu_dense_is_the_product_of_its_maps():
    p = predict_graph(_chain(2.0, 3.0, 0.5, 4.0), 1.5)
    assert p.q[1] == pytest.approx(3.0)  # 2 x 1.5
    assert p.q[2] == pytest.approx(1.5, rel=1e-9)  # a centred Gaussian through a ReLU: q/2
    assert p.q[3] == pytest.approx(4.5, rel=1e-9)
    assert p.r[3] == pytest.approx(1.0) and p.r[2] == pytest.approx(4.0)
    assert p.r[1] == pytest.approx(2.0, rel=1e-9)  # E[phi'^2] = 1/2
    assert p.r[0] == pytest.approx(1.0, rel=1e-9)
    assert p.unmapped == ""


def test_weight_factor_scales_every_weight_layer_both_ways():
    base, up = predict_graph(_chain(2.0, 3.0), 1.0), predict_graph(_chain(2.0, 3.0), 1.0, weight_factor=2.0)
    assert up.q[3] == pytest.approx(4.0 * base.q[3], rel=1e-9)  # two layers forward
    assert up.r[0] == pytest.approx(4.0 * base.r[0], rel=1e-9)  # and back


def test_a_residual_sum_adds_its_paths_both_ways():
    nodes = [
        GraphNode("x", "input", ()),
        GraphNode("fc", "dense", (0,), forward=0.25, backward=0.25),
        GraphNode("add", "add", (0, 1)),
        GraphNode("out", "output", (2,)),
    ]
    p = predict_graph(nodes, 1.0)
    assert p.q[2] == pytest.approx(1.25)  # independent centred paths: second moments add
    assert p.r[0] == pytest.approx(1.25)  # the skip's 1 and the branch's 1/4


def test_an_unmapped_op_cuts_the_theory_from_there_on_and_is_named():
    nodes = _chain(2.0, 3.0)
    nodes[2] = GraphNode("odd", "unknown", (1,), why="MyOp")
    p = predict_graph(nodes, 1.0)
    assert p.unmapped == "MyOp" and p.q[1] == pytest.approx(2.0) and p.q[3] is None
    assert p.r[0] is None


def test_a_concatenation_keeps_each_parts_share():
    nodes = [
        GraphNode("x", "input", ()),
        GraphNode("a", "dense", (0,), forward=1.0),
        GraphNode("b", "dense", (0,), forward=4.0),
        GraphNode("cat", "cat", (1, 2), shares=(0.25, 0.75)),
        GraphNode("out", "output", (3,)),
    ]
    p = predict_graph(nodes, 1.0)
    assert p.q[3] == pytest.approx(0.25 * 1.0 + 0.75 * 4.0)
    assert math.isfinite(p.r[0])
