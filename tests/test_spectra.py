"""The input-output Jacobian's spectrum (sigprop/spectra.py, ``sigprop spectrum``; issue 30): the
exact Jacobian against the explicit product of the walker's layers, its mean against sigprop's
own backward ratio, the free-probability variance against simulation, and the command."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

import sigprop
from sigprop import api, kinds, plans, specs, spectra, walker
from sigprop.cli import main
from sigprop.errors import SigpropError


def test_the_jacobian_is_the_product_of_the_layers():
    """J = D_L W_L ... D_1 W_1 with w = g v/||v|| from the walker's own parameters and D_l the
    ReLU masks of the pre-activations: the exact path's Jacobian equals it to float32 rounding
    (3 layers of width 16: 1e-5)."""
    spec = api.spec("mlp", depth=3, width="16", input_dim=12, inits="proposed")
    kind = kinds.of(spec)
    plan = kind.plan(spec, 0)
    x = torch.randn(3, 12)
    fn = walker.as_function(plan.steps, kind.scheme(spec, "proposed"), x, 0, 0)
    J = spectra.jacobian(fn, x)
    assert J.shape == (3, 16, 12)
    for s in range(3):
        h, prod = x[s], torch.eye(12)
        for i in range(3):
            v, g, b = fn.params[f"{i}.v"], fn.params[f"{i}.g"], fn.params[f"{i}.b"]
            w = g.unsqueeze(1) * v / v.norm(dim=1, keepdim=True)
            a = w @ h + b
            prod = torch.diag((a > 0).float()) @ w @ prod
            h = torch.relu(a)
        assert torch.allclose(J[s], prod, atol=1e-5)


def test_mean_sigma_squared_is_the_squared_backward_ratio():
    """tr(J J^T)/n_out = E||J^T e||^2/||e||^2: on the same inputs and weights the mean of sigma^2
    equals the ResNet probe's squared backward ratio at its input (RMS over samples), up to the
    probe's random errors: per sample ||J^T e||^2/||e||^2 has relative sd sqrt(2 (1 + v)/n_out)
    (v = var/mean^2 of the eigenvalues, about 1.6 here: 0.28 at n_out = 64), 0.036 over 64
    samples; 0.15 (4 sd) is asserted."""
    options = {"blocks": 5, "dim": 64}
    got = sigprop.spectrum(
        api.spec("resnet", inits="proposed", **options), specs.SpectrumSpec(samples=64, seeds=1, device="cpu")
    )
    probe = sigprop.probe_resnet(inits="proposed", samples=64, seeds=1, device="cpu", **options)
    assert got.runs[0].to_dict()["mean"] == pytest.approx(probe.runs[0].layers[0].backward.rms ** 2, rel=0.15)
    # and the mean's prediction is the ResNet's own composed backward map
    assert got.runs[0].predicted_mean == pytest.approx(
        probe.runs[0].layers[0].backward.predicted ** 2, rel=1e-9
    )
    assert got.runs[0].predicted_variance is None and "residual blocks" in got.runs[0].why


@pytest.mark.parametrize("width", [200, 400])
@pytest.mark.parametrize("depth", [5, 10])
def test_free_probability_variance_by_simulation(width, depth):
    """var/mean^2 of the eigenvalues of J J^T for a ReLU MLP of equal widths is L(mu2/mu1^2 - 1 -
    s1) = L (orthogonal directions, s1 = 0: proposed) or 2L (Gaussian, s1 = -1:
    proposed-gaussian), and the mean prod g^2/2 = 1 (Pennington, Schoenholz & Ganguli 2018).
    The formula is the infinite-width limit: measured at widths 100-400 and depths 5-20 the
    excess grows as about L/n (1.23 against 1 at L/n = 0.2, 1.03 at 0.05), and the spread of
    the estimate over 8 samples x 4 draws is 2-7%; asserted within 0.1 + 1.5 L/n (variance) and
    0.1 + 2 L/n (mean: a draw's gain drifts as a product of L layer gains)."""
    spec = api.spec(
        "mlp", depth=depth, width=str(width), input_dim=width, inits=["proposed", "proposed-gaussian"]
    )
    r = sigprop.spectrum(spec, specs.SpectrumSpec(samples=8, seeds=4, device="cpu"))
    slack = depth / width
    for run, per_layer in zip(r.runs, (1.0, 2.0)):
        assert run.predicted_variance / run.predicted_mean**2 == pytest.approx(per_layer * depth, rel=1e-12)
        normalised = statistics.fmean(d["variance"] / d["mean"] ** 2 for d in run.draws)
        assert normalised / (per_layer * depth) == pytest.approx(1.0, abs=0.1 + 1.5 * slack)
        assert run.to_dict()["mean"] == pytest.approx(run.predicted_mean, abs=0.1 + 2 * slack)


def test_theory_says_what_it_does_not_derive():
    """Widths drawn from 150:250: the mean is prod g^2/2 = n_0/n_L for proposed (any widths);
    the variance is derived for equal widths only, and says so."""
    spec = api.spec("mlp", depth=4, inits="proposed")
    steps = kinds.of(spec).plan(spec, 0).steps
    pred = plans.predict_jacobian(steps, sigprop.inits.INITS["proposed"])
    assert pred.variance is None and "equal widths" in pred.why
    assert pred.mean == pytest.approx(500 / steps[-2].role.fan_out, rel=1e-12)


def test_spectrum_command(tmp_path, capsys):
    out = tmp_path / "s.json"
    argv = [
        "spectrum",
        "mlp",
        "--depth",
        "4",
        "--width",
        "32",
        "--input-dim",
        "32",
        "--samples",
        "2",
        "--seeds",
        "2",
    ]
    assert main([*argv, "--init", "proposed", "--format", "json", "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "sigprop.spectrum.v1" and doc["command"] == "mlp"
    run = doc["runs"][0]
    assert set(
        spectra_keys := ("mean", "variance", "sigma_max", "sigma_min", "condition", "near_one")
    ) <= set(run)
    assert len(run["draws"]) == 2 and run["predicted_variance"] == pytest.approx(
        4.0 * run["predicted_mean"] ** 2
    )
    assert sum(run["histogram"]["counts"]) + run["histogram"]["zeros"] == 2 * 2 * 32
    del spectra_keys
    assert main([*argv, "--init", "he"]) == 0
    assert "var/mean²" in capsys.readouterr().out
    # too large for the exact path: refused before anything is drawn, naming the sizes' options
    huge = ["spectrum", "mlp", "--depth", "2", "--width", "60000", "--input-dim", "60000"]
    assert main([*huge, "--path", "exact"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "n_out x n_in" in err
    assert main(huge) == 2  # auto: the weights alone do not fit either
    assert "GiB" in capsys.readouterr().err
    with pytest.raises(SigpropError, match="your own model"):
        sigprop.spectrum(api.spec("module", model=torch.nn.Linear(3, 3), input_shape=(3,)))
    assert math.isfinite(doc["runs"][0]["mean"])


def test_spectrum_against_depth_and_its_figure(tmp_path):
    """--depths: the Jacobian of every layer's output in the input, its var/mean^2 beside the
    free-probability line l (proposed) -- within 0.1 + 1.5 l/n as above --; the figure has the
    histogram (one curve per init) and the spread against depth (measured and predicted)."""
    from sigprop import plot

    spec = api.spec("mlp", depth=4, width="64", input_dim=64, inits=["proposed", "he"])
    r = sigprop.spectrum(spec, specs.SpectrumSpec(samples=8, seeds=3, device="cpu", depths=True))
    for run, per_layer in zip(r.runs, (1.0, 2.0)):
        assert [d["depth"] for d in run.depths] == [1, 2, 3, 4]
        for d in run.depths:
            predicted = d["predicted_variance"] / d["predicted_mean"] ** 2
            assert predicted == pytest.approx(per_layer * d["depth"], rel=1e-12)
            assert d["variance"] / d["mean"] ** 2 / predicted == pytest.approx(
                1, abs=0.1 + 1.5 * d["depth"] / 64
            )
    assert r.to_dict()["runs"][0]["depths"][-1]["depth"] == 4
    fig = plot.build_spectrum_figure(r)
    hist, depth_ax = fig.axes[:2]
    assert len(hist.patches) == 2 and depth_ax.get_xlabel().startswith("depth")
    assert len(depth_ax.lines) == 4  # measured and predicted per init
    plot.spectrum_figure(r, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 10_000


def test_the_lanczos_path_agrees_with_the_exact_one():
    """J^T J as an operator (one jvp and one vjp a product): sigma_max by restarted Lanczos (tol
    1e-3) and the rest by stochastic Lanczos quadrature (20 probes x 30 steps a sample), against
    the exact SVDs of the same draws and inputs.  sigma_max to 2e-3; the mean (Hutchinson's trace
    on the probes: relative sd sqrt(2 (1 + v)/(n probes)) = 0.09 a sample at v ~ 4, n = 64, so
    0.044 over 4 samples) to 0.2; the fraction of sigma^2 near one to 0.1; sigma_min reported as
    the smallest Ritz value, an upper bound of the exact one."""
    spec = api.spec("mlp", depth=4, width="64", input_dim=64, inits="proposed")
    common = {"samples": 4, "seeds": 1, "device": "cpu"}
    exact = sigprop.spectrum(spec, specs.SpectrumSpec(path="exact", **common)).runs[0].to_dict()
    res = sigprop.spectrum(spec, specs.SpectrumSpec(path="lanczos", probes=20, steps=30, **common))
    assert res.environment["path"] == "lanczos" and res.environment["products_per_sample"] == 1200
    got = res.runs[0].to_dict()
    assert got["sigma_max"] == pytest.approx(exact["sigma_max"], rel=2e-3)
    assert got["mean"] == pytest.approx(exact["mean"], rel=0.2)
    assert got["near_one"] == pytest.approx(exact["near_one"], abs=0.1)
    assert got["sigma_min"] >= exact["sigma_min"]
    with pytest.raises(SigpropError, match="exact path"):
        specs.SpectrumSpec(path="lanczos", depths=True)
