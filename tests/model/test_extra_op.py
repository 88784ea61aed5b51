"""A traced op is one file (issue 38, item 3): a custom activation module, SquarePlus
(phi(z) = (z + sqrt(z^2 + 4)) / 2), whose matching, node and forward and backward moment maps
are declared here and nowhere in the package, registered for the test only.  Before: torch.fx
traces into its forward, meets a product of two states and the theory column is empty from the
first activation on.  After: the CLI's JSON carries a prediction at every site, and it agrees
with the measurement as the built-in activations' do."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest

from sigprop import maps
from sigprop.cli import main
from sigprop.model import ops

B = 4.0
#: probabilists' Gauss-Hermite nodes and weights (weights summing to 1): E[f(Z)], Z ~ N(0, 1)
Z, W = np.polynomial.hermite_e.hermegauss(80)
W = W / W.sum()


def phi(z):
    return 0.5 * (z + np.sqrt(z * z + B))


def dphi(z):
    return 0.5 * (1.0 + z / np.sqrt(z * z + B))


def _moments(f, g, mean: float, q: float, shared: float) -> tuple[float, float, float]:
    """E[f(z)], E[f(z) g(z)] and E[f(z_a) g(z_b)] for z ~ N(mean, q - mean^2) and z_a, z_b
    sharing the offset of covariance shared - mean^2 (nested Gauss-Hermite: the shared part
    outside, each sample's own inside) -- the test's own quadrature, not sigprop.theory's."""
    var = max(q - mean * mean, 0.0)
    cov = min(max(shared - mean * mean, 0.0), var)
    z = mean + math.sqrt(var) * Z
    own = math.sqrt(var - cov)
    inner = lambda fn: np.array([W @ fn(mean + math.sqrt(cov) * u + own * Z) for u in Z])
    return float(W @ f(z)), float(W @ (f(z) * g(z))), float(W @ (inner(f) * inner(g)))


def _forward(nd, i, fold):
    """Per part of the input: the output's mean, second moment and shared moment; the
    derivative's second moment and shared moment kept for the backward."""
    out, kept = [], []
    for s in fold.states[nd.inputs[0]]:
        m1, q1, k1 = _moments(phi, phi, s.mean, s.q, s.shared)
        _, d2, dk = _moments(dphi, dphi, s.mean, s.q, s.shared)
        out.append(maps.Part(s.share, q1, m1, k1, s.profile))
        kept.append((d2, dk))
    fold.states[i], fold.derivative[i] = out, kept


def _backward(nd, i, grads, fold):
    """The gradient through phi': r E[phi'^2], rk E[phi'(z_a) phi'(z_b)]."""
    fold.give(
        nd.inputs[0], [(r * d2, rk * dk, p) for (r, rk, p), (d2, dk) in zip(grads, fold.derivative[i])], i
    )


NETS = """
import torch
import torch.nn as nn


class SquarePlus(nn.Module):
    def forward(self, z):
        return 0.5 * (z + torch.sqrt(z * z + 4.0))


def make(width=256, depth=4):
    layers = [nn.Linear(64, width)]
    for _ in range(depth):
        layers += [SquarePlus(), nn.Linear(width, width)]
    return nn.Sequential(*layers)
"""


@pytest.fixture
def nets(tmp_path):
    (tmp_path / "squareplus_nets.py").write_text(textwrap.dedent(NETS))
    return tmp_path / "squareplus_nets.py"


def _probe(path, tmp_path) -> dict:
    out = tmp_path / "r.json"
    argv = ["module", f"{path}:make", "--input-shape", "64", "--init", "as-is", "--init", "proposed"]
    assert main([*argv, "--samples", "64", "--seeds", "2", "--format", "json", "--output", str(out)]) in (
        0,
        1,
    )
    return json.loads(out.read_text())


def test_a_custom_activation_registered_from_outside_gets_its_theory(nets, tmp_path):
    path = nets
    before = _probe(path, tmp_path)
    # torch.fx traces into SquarePlus: z * z, a product of a state with itself, no map from the
    # first one on; the note names where (the module's path, the op)
    assert any(
        "a product of a state with itself (1: operator.mul)" in n for n in before["config"]["theory_notes"]
    ), before["config"]["theory_notes"]
    assert all(l["forward"]["predicted"] is None for l in before["runs"][0]["layers"][1:])

    # the CLI loads the file as a module of its own: its class is matched by name
    ours = lambda m: type(m).__name__ == "SquarePlus"
    op = ops.TracedOp(
        "act",  # the init's roles read it as an activation
        lambda gm, n: n.op == "call_module" and ours(gm.get_submodule(n.target)),
        lambda t, n: maps.GraphNode(t.label(n), "squareplus", t.inputs(n)),
        keep=ours,
    )
    ops.register(op, first=True)
    maps.map_op("squareplus", _forward, _backward)
    try:
        after = _probe(path, tmp_path)
    finally:
        ops.unregister(op)
        del maps.MAPS["squareplus"]
    assert not any("product" in n for n in after["config"].get("theory_notes", []))
    for run in after["runs"]:
        layers = run["layers"]
        assert len(layers) == len(before["runs"][0]["layers"])
        for l in layers:
            for way in ("forward", "backward"):
                got = l[way]
                assert got["predicted"] is not None, (run["init"], l["site"], way)
                # the prediction against the measurement as the probe's own verdict reads it
                assert got["agreement"]["agrees"] is not False, (run["init"], l["site"], way, got)
        # the end-to-end theory checks: the measurement inside the band of the test's maps, or
        # the band too wide to be a test (the probe's own call) -- never a missing map
        for c in (c for c in run["checks"] if c["verdict"] == "theory"):
            if c["low"] is None:
                assert c["note"].startswith("not a test: the band"), (run["init"], c)
            else:
                assert c["passed"] and c["low"] <= c["measured"] <= c["high"], (run["init"], c)
    # and the map is the test's: the first activation's forward ratio is its quadrature's, to
    # the finite-width spread (sqrt(q'/q_in) for the measured pre-activation moments)
    assert after["runs"][1]["layers"][1]["forward"]["rms"] == pytest.approx(
        after["runs"][1]["layers"][1]["forward"]["predicted"], rel=0.1
    )
