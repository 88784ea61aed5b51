"""The input-output Jacobian's spectrum (sigprop/spectra.py, ``sigprop spectrum``; issue 30): the
exact Jacobian against the explicit product of the walker's layers, its mean against sigprop's
own backward ratio, the free-probability variance against simulation, and the command."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
import torch

import sigprop
from sigprop import api, kinds, plans, specs, spectra, walker
from sigprop.cli import main
from sigprop.errors import SigpropError
from sigprop.model import functions
from sigprop.model.build import build, prepare
from sigprop.model.init import init_


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
    assert got.runs[0].predicted_variance is not None and not got.runs[0].why


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
        # the whole density: the measured eigenvalues' distribution above 1e-4 (below it float32's
        # Jacobian rounds them) against the free-probability density's, Kolmogorov-Smirnov
        distance, count = _ks_above(run, -4.0)
        assert distance < 1.63 / math.sqrt(count)  # iid samples' 99% bound; measured 0.004-0.010


def _normalised(run) -> float:
    """var/mean^2 of the eigenvalues, averaged over the draws."""
    return statistics.fmean(d["variance"] / d["mean"] ** 2 for d in run.draws)


@pytest.mark.parametrize("width", ["100:300", "300:500"])
@pytest.mark.parametrize("depth", [5, 10])
def test_unequal_widths_by_simulation(width, depth):
    """Widths drawn per layer: each layer adds ratio * v + (mu2/mu1^2 - 1) + max(r - 1, 0) - s1
    min(r, 1) (r = n_l/n_{l-1}; ``theory.chain_variance``).  Measured 1.03-1.06 of the
    prediction at these sizes; asserted, as for equal widths, within 0.1 + 1.5 L/n with n the
    narrowest width a layer may have.  The density of S(w) = prod_l S_l(rho_l w) against the
    measured distribution: Kolmogorov-Smirnov 0.005-0.024 measured."""
    spec = api.spec("mlp", depth=depth, width=width, input_dim=200, inits=["proposed", "proposed-gaussian"])
    r = sigprop.spectrum(spec, specs.SpectrumSpec(samples=8, seeds=4, device="cpu"))
    slack = depth / int(width.split(":")[0])
    for run in r.runs:
        assert run.predicted_variance is not None
        predicted = run.predicted_variance / run.predicted_mean**2
        assert _normalised(run) / predicted == pytest.approx(1.0, abs=0.1 + 1.5 * slack)
        distance, count = _ks_above(run, -4.0)  # the whole density, as for equal widths
        assert distance < 1.63 / math.sqrt(count)


@pytest.mark.parametrize("dim", [64, 256])
@pytest.mark.parametrize("blocks", [5, 20])
def test_resnet_variance_by_simulation(blocks, dim):
    """The paper's ResNet (hidden widths 150:250): each block I + A adds (2a + a^2 v_A)/(1 + a)^2
    (a the branch's mean, alpha^2 g^2/2 g^2 = 1/B for proposed, 1/2 for he's g = 1, v_A its
    normalised variance; ``theory.block_variance``), bounded in depth for proposed (about 2), linear
    for he.  Measured 1.01-1.14 of the prediction, the excess growing with v/n as for the MLP (its
    v is L); asserted within 0.1 + 1.5 v/n, v the predicted normalised variance.  The mean within
    the same tolerance."""
    spec = api.spec("resnet", blocks=blocks, dim=dim, inits=["proposed", "he"])
    r = sigprop.spectrum(spec, specs.SpectrumSpec(samples=4, seeds=4, device="cpu"))
    for run in r.runs:
        predicted = run.predicted_variance / run.predicted_mean**2
        slack = 0.1 + 1.5 * predicted / dim
        assert _normalised(run) / predicted == pytest.approx(1.0, abs=slack)
        assert run.to_dict()["mean"] / run.predicted_mean == pytest.approx(1.0, abs=slack)
    proposed, he = (run.predicted_variance / run.predicted_mean**2 for run in r.runs)
    assert proposed < 2.0 < blocks * 0.5 < he


def _ks_above(run, cut: float) -> tuple[float, int]:
    """The Kolmogorov-Smirnov distance, at the histogram's bin edges above log10 sigma^2 = ``cut``,
    between the measured eigenvalues there and the predicted density there; and their count."""
    h = run.histogram
    k0 = next(k for k, e in enumerate(h["log10_edges"]) if e >= cut)
    edges, counts = h["log10_edges"][k0:], h["counts"][k0:]
    measured = [0.0]
    for c in counts:
        measured.append(measured[-1] + c / sum(counts))
    pd = run.predicted_density
    pts = [(x, y) for x, y in zip(pd["log10_lambda"], pd["per_log10"]) if x >= edges[0]]
    cum = [0.0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        cum.append(cum[-1] + 0.5 * (y0 + y1) * (x1 - x0))
    xs = [p[0] for p in pts]
    theory_cdf = [float(np.interp(e, xs, cum)) / cum[-1] for e in edges]
    return max(abs(a - b) for a, b in zip(measured, theory_cdf)), sum(counts)


@pytest.mark.parametrize(
    "depth, width, n0",
    [(5, "64", 64), (10, "64", 64), (20, "64", 64), (10, "150:250", 500), (10, "100:400", 400)],
)
@pytest.mark.parametrize("direction", ["proposed", "proposed-gaussian"])
def test_free_probability_density_has_the_formulas_moments(depth, width, n0, direction):
    """The density solved from the S-transform fixed point (``theory.free_density``) has the
    mean and the normalised variance of the independent recursion (``theory.chain_variance``:
    L or 2L at equal widths; checked by simulation above) -- its moments by the trapezoid rule on
    its grid: 1.5% (measured 0.1-1.5%) --, the mass at zero 1 - rank/n_L (1/2 at equal widths),
    and the rest within the grid but for the tail below 1e-8 (mass over 0.3 here)."""
    spec = api.spec("mlp", depth=depth, width=width, input_dim=n0, inits=direction)
    steps = kinds.of(spec).plan(spec, 0).steps
    scheme = sigprop.inits.INITS[direction]
    d = plans.predict_density(steps, scheme)
    x, y = np.asarray(d.log10_lambda), np.asarray(d.per_log10)
    lam = 10.0**x
    m1, m2 = np.trapezoid(y * lam, x), np.trapezoid(y * lam * lam, x)
    pred = plans.predict_jacobian(steps, scheme)
    assert m1 == pytest.approx(pred.mean, rel=0.015)
    assert (m2 - m1 * m1) == pytest.approx(pred.variance, rel=0.015)
    widths = [st.role.fan_out for st in plans.layers(steps)]
    assert d.zeros == pytest.approx(1 - min(n0, min(widths) / 2) / widths[-1], abs=1e-12)
    assert 0.3 < d.continuous <= 1 - d.zeros


@pytest.mark.parametrize("stages, dim", [(2, 64), (3, 32)])
def test_resnet_with_projection_shortcuts_by_simulation(stages, dim):
    """Stages that double the width open with a WN projection S: the block (S + A)(S + A)^T, in
    the output space, has [r g^2 (1 + v_S) + 2 r g^2 a + 2 g^2 a + a^2 (1 + v_A)]/(g^2 + a)^2 - 1
    (r = 2, g^2 = 1/2, v_S = 0 for orthogonal directions and 1/r for Gaussian ones;
    ``theory.block_variance``), composed as a layer of ratio r.  Measured 0.99-1.07 of the
    prediction at 5 blocks a stage (1.23 for he at 10 blocks, d = 64, where v = 21); asserted
    within 0.1 + 1.5 v/d as for one stage, d the first stage's width."""
    spec = api.spec("resnet", blocks=5, stages=stages, dim=dim, inits=["proposed", "proposed-gaussian", "he"])
    r = sigprop.spectrum(spec, specs.SpectrumSpec(samples=4, seeds=4, device="cpu"))
    for run in r.runs:
        assert run.predicted_variance is not None, run.why
        predicted = run.predicted_variance / run.predicted_mean**2
        slack = 0.1 + 1.5 * predicted / dim
        assert _normalised(run) / predicted == pytest.approx(1.0, abs=slack)
        assert run.to_dict()["mean"] / run.predicted_mean == pytest.approx(1.0, abs=slack)


def test_theory_says_what_it_does_not_derive():
    """Convolutions and batch norm: the mean from the backward map where it has one, and the
    variance not derived, said with the step that stops it."""
    for command, options, why in (
        ("cnn", {"depth": 3, "channels": 8, "image": "3x8x8"}, "convolutions"),
        ("resnet", {"blocks": 2, "dim": 16, "norm": "bn"}, "batch norm"),
    ):
        spec = api.spec(command, **options)
        kind = kinds.of(spec)
        name = kind.inits(spec)[0]
        pred = plans.predict_jacobian(kind.plan(spec, 0).steps, kind.scheme(spec, name))
        assert pred.variance is None and why in pred.why


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
    # (2 x 200000^2 float32 weights: 640 GB drawn and kept, more than any one machine or GPU)
    huge = ["spectrum", "mlp", "--depth", "2", "--width", "200000", "--input-dim", "200000"]
    assert main([*huge, "--path", "exact"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "n_out x n_in" in err
    assert main(huge) == 2  # auto: the weights alone do not fit either
    assert "GiB" in capsys.readouterr().err
    with pytest.raises(SigpropError, match="several as-is draws"):  # one instance, three draws
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


# --------------------------------------------------------------------------------------------
# the user's own model (the module kind)
# --------------------------------------------------------------------------------------------
def _wn_mlp() -> torch.nn.Sequential:
    from torch.nn.utils.parametrizations import weight_norm

    return torch.nn.Sequential(
        weight_norm(torch.nn.Linear(12, 20)), torch.nn.ReLU(), weight_norm(torch.nn.Linear(20, 16))
    )


def _bn_net() -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 10)
    )


def _module_spec(factory, inits=("as-is", "proposed")):
    return sigprop.kinds.module.ModuleSpec(model=factory, input_shape=(12,), inits=tuple(inits))


def test_a_models_spectrum_is_its_own_jacobian():
    """The module kind reads J through the model's own forward: each draw's eigenvalues equal
    those of torch.autograd.functional.jacobian of the same draw (rebuilt, the same init applied)
    at the same inputs (float32 Jacobians, float64 SVD: 1e-5 relative)."""
    ss = specs.SpectrumSpec(samples=3, seeds=2, device="cpu")
    got = sigprop.spectrum(_module_spec(_wn_mlp), ss)
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(specs.derive_seed(0, specs.STREAM_INPUTS)))
    for run in got.runs:
        scheme = kinds.get("module").scheme(_module_spec(_wn_mlp), run.init)
        for d in run.draws:
            model = build(_wn_mlp, 0, d["draw"])
            init_(model, scheme, 0, d["draw"], batch=x)
            model = prepare(model, "cpu", torch.float32)
            J = torch.stack([torch.autograd.functional.jacobian(lambda z: model(z), x[i]) for i in range(3)])
            lam = spectra.eigenvalues(J)
            assert d["mean"] == pytest.approx(float(lam.mean()), rel=1e-5)
            assert d["variance"] == pytest.approx(float(lam.var()), rel=1e-5)
            assert d["sigma_max"] == pytest.approx(float(math.sqrt(lam.max())), rel=1e-5)
        assert run.predicted_variance is None and "not derived" in run.why
    assert got.environment["output_units"] == 16 and got.environment["path"] == "exact"


def test_a_batch_norm_models_jacobian_holds_the_batch():
    """In training mode a batch norm normalises by the batch: sample i's J is d y_i / d x_i of the
    batch map (the others held), which the full Jacobian of the batch map gives as its diagonal
    blocks (autograd, 1e-5); the lanczos path's operator J^T J is the same (its columns: 1e-4),
    and its sigma_max the exact one."""
    ss = specs.SpectrumSpec(samples=4, seeds=1, device="cpu")
    got = sigprop.spectrum(_module_spec(_bn_net, ["proposed"]), ss)
    x = torch.randn(4, 12, generator=torch.Generator().manual_seed(specs.derive_seed(0, specs.STREAM_INPUTS)))
    model = build(_bn_net, 0, 0)
    init_(model, kinds.get("module").scheme(_module_spec(_bn_net), "proposed"), 0, 0, batch=x)
    model = prepare(model, "cpu", torch.float32)
    full = torch.autograd.functional.jacobian(lambda xb: model(xb), x)  # [4, 10, 4, 12]
    J = torch.stack([full[i, :, i, :] for i in range(4)])
    lam = spectra.eigenvalues(J)
    assert got.runs[0].draws[0]["mean"] == pytest.approx(float(lam.mean()), rel=1e-5)
    assert got.runs[0].draws[0]["variance"] == pytest.approx(float(lam.var()), rel=1e-5)
    functional = functions.functional(model)
    for i in range(4):  # the operator J^T J of the lanczos path, column by column
        gram = spectra.Gram(functions.model_function(functional, x, i), x[i])
        JtJ = torch.stack([gram(torch.eye(12)[k]) for k in range(12)], 1)
        assert torch.allclose(JtJ, J[i].T @ J[i], rtol=1e-4, atol=1e-5)
    lz = sigprop.spectrum(
        _module_spec(_bn_net, ["proposed"]),
        specs.SpectrumSpec(samples=4, seeds=1, device="cpu", path="lanczos", probes=4, steps=12),
    )
    assert lz.environment["path"] == "lanczos"
    assert lz.runs[0].draws[0]["sigma_max"] == pytest.approx(got.runs[0].draws[0]["sigma_max"], rel=1e-3)


def test_a_models_spectrum_refuses_what_it_cannot_read(tmp_path, capsys):
    """Token ids have no Jacobian, a forward of several inputs has no single one, the spectrum
    against depth reads sigprop's own states: one line naming the option, exit 2."""
    with pytest.raises(SigpropError) as err:
        sigprop.spectrum(
            sigprop.kinds.module.ModuleSpec(model=_wn_mlp, input_shape=(12,), vocab=50),
            specs.SpectrumSpec(samples=2, seeds=1),
        )
    assert err.value.field == "vocab"
    with pytest.raises(SigpropError) as err:
        sigprop.spectrum(_module_spec(_wn_mlp), specs.SpectrumSpec(samples=2, seeds=1, depths=True))
    assert err.value.field == "depths"
    nets = tmp_path / "nets.py"
    nets.write_text(
        "import torch.nn as nn\n\ndef net():\n    return nn.Sequential(nn.Linear(6, 6), nn.ReLU())\n"
    )
    assert main(["spectrum", "module", f"{nets}:net", "--input-shape", "6;6", "--samples", "2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--input-shape" in lines[0] and "one input" in lines[0]
    assert (
        main(["spectrum", "module", f"{nets}:net", "--input-shape", "6", "--samples", "2", "--seeds", "1"])
        == 0
    )
    assert "theory: the variance of a model's spectrum is not derived" in capsys.readouterr().out


def test_the_extreme_singular_values_agree_across_paths_and_batches(capsys):
    """--top K: the K largest and smallest singular values (mean over samples) from the exact SVD
    and from Lanczos on the smaller Gram operator (the smallest as c minus the largest of c I - G)
    agree on a ResNet whose J is invertible (1e-3: Lanczos' tolerance); --batch-size gives the
    same Jacobians in chunks (float32 rounding, 1e-6); more than J has is refused naming --top."""
    spec = api.spec("resnet", blocks=3, dim=24, width="20:30", inits="proposed")
    exact = sigprop.spectrum(spec, specs.SpectrumSpec(samples=4, seeds=1, device="cpu", top=3))
    lz = sigprop.spectrum(
        spec, specs.SpectrumSpec(samples=4, seeds=1, device="cpu", top=3, path="lanczos", steps=24)
    )
    e, z = exact.runs[0].draws[0], lz.runs[0].draws[0]
    assert e["top"] == pytest.approx(z["top"], rel=1e-3) and e["top"] == sorted(e["top"], reverse=True)
    assert e["bottom"] == pytest.approx(z["bottom"], rel=1e-3) and e["bottom"] == sorted(e["bottom"])
    assert e["top"][0] <= e["sigma_max"] * (1 + 1e-12)  # a mean over samples of each one's largest
    chunked = sigprop.spectrum(
        spec, specs.SpectrumSpec(samples=4, seeds=1, device="cpu", top=3, batch_size=3)
    )
    assert chunked.runs[0].draws[0]["mean"] == pytest.approx(e["mean"], rel=1e-6)
    assert chunked.runs[0].draws[0]["bottom"] == pytest.approx(e["bottom"], rel=1e-5)
    for path, most in (("exact", 24), ("lanczos", 23)):
        with pytest.raises(SigpropError, match=f"at most {most}") as err:
            sigprop.spectrum(spec, specs.SpectrumSpec(samples=2, seeds=1, top=most + 1, path=path))
        assert err.value.field == "top"
    argv = [
        "spectrum",
        "resnet",
        "--blocks",
        "2",
        "--dim",
        "12",
        "--width",
        "8:10",
        "--seeds",
        "1",
        "--samples",
        "2",
    ]
    assert main([*argv, "--top", "2"]) == 0
    assert "largest σ" in capsys.readouterr().out
    assert main([*argv, "--path", "lanczos", "--probes", "1", "--steps", "4"]) == 0
    assert "--probes 1: the density is one probe's quadrature" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command, options",
    [
        ("resnet", {"norm": "bn", "blocks": 2, "dim": 12}),
        ("wrn", {"norm": "bn", "blocks": 1, "image": "3x4x4"}),
    ],
)
def test_a_batch_norm_nets_jacobian_holds_the_batch(command, options):
    """sigprop's own batch-normalized nets (De & Smith's ResNet, the BN WRN) normalise over the
    probe batch: each sample's J is d y_i/d x_i of the batch map, the other samples held -- the
    diagonal blocks of autograd's Jacobian of the whole batch's forward (1e-5); a sample alone
    would be another net (its own statistics), or none (a dense batch norm of one row)."""
    spec = api.spec(command, **options)
    kind = kinds.of(spec)
    plan = kind.plan(spec, 0)
    assert plans.batch_dependent(plan.steps)
    name = kind.inits(spec)[0]
    x = torch.randn(3, math.prod(plans.input_shape(plan.steps)))
    fn = walker.as_function(plan.steps, kind.scheme(spec, name), x, 0, 0, kind.space(spec))
    J = spectra.jacobian(fn, x, together=True)
    full = torch.autograd.functional.jacobian(lambda xb: fn.forward(fn.params, xb).reshape(3, -1), x)
    for i in range(3):
        assert torch.allclose(J[i], full[i, :, i, :], rtol=1e-4, atol=1e-5)
    got = sigprop.spectrum(spec, specs.SpectrumSpec(samples=3, seeds=1, device="cpu"))
    assert math.isfinite(got.runs[0].draws[0]["mean"])
    assert got.runs[0].predicted_variance is None and "not derived" in got.runs[0].why


def test_at_chosen_depths_is_depths_there(capsys):
    """--at 2,6: the Jacobian of the input to those recorded states only, the same numbers as
    --depths gives there (the same draws and inputs); a depth beyond the net, a bad list, or both
    options: one line naming --at, exit 2."""
    spec = api.spec("resnet", blocks=6, dim=16, width="12:16", inits="proposed")
    every = sigprop.spectrum(spec, specs.SpectrumSpec(samples=3, seeds=1, device="cpu", depths=True))
    some = sigprop.spectrum(spec, specs.SpectrumSpec(samples=3, seeds=1, device="cpu", at=(2, 6)))
    want = {d["depth"]: d for d in every.runs[0].depths}
    assert [d["depth"] for d in some.runs[0].depths] == [2, 6]
    for d in some.runs[0].depths:
        assert d == pytest.approx(want[d["depth"]], rel=1e-12)
    argv = [
        "spectrum",
        "resnet",
        "--blocks",
        "6",
        "--dim",
        "16",
        "--width",
        "12",
        "--samples",
        "2",
        "--seeds",
        "1",
    ]
    for extra, words in (
        (["--at", "7"], "at most 6"),
        (["--at", "2,x"], "expected depths"),
        (["--at", "0"], "expected depths >= 1"),
        (["--at", "2", "--depths"], "give one of them"),
    ):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--at" in err[0] and words in err[0]


def _plain_mlp() -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 128, bias=False),
        torch.nn.ReLU(),
    )


def test_a_models_predicted_mean_is_its_traced_graphs():
    """A model's mean sigma^2 is predicted by its traced graph's backward map (``predict_graph``:
    r at the input times n_in/n_out): for a bias-free ReLU MLP under proposed, prod g^2/2 = n_0/n_L
    = 1/2 (1e-3: the graph starts from the inputs' measured mean, not 0; measured 3e-8), and the
    measurement within
    0.1 + 2 L/n of it, as for sigprop's own MLP; the variance is not derived, and the note says so."""
    spec = sigprop.kinds.module.ModuleSpec(model=_plain_mlp, input_shape=(64,), inits=("proposed",))
    got = sigprop.spectrum(spec, specs.SpectrumSpec(samples=16, seeds=2, device="cpu"))
    run = got.runs[0]
    assert run.predicted_mean == pytest.approx(0.5, rel=1e-3)
    assert run.to_dict()["mean"] == pytest.approx(run.predicted_mean, abs=0.1 + 2 * 3 / 128)
    assert run.predicted_variance is None and "the mean is its traced graph's" in run.why


def test_the_lanczos_path_finds_a_rank_deficient_jacobians_zeros():
    """Issue 37, item 14: a ReLU output makes J rank-deficient (its smallest singular values are
    0, repeated).  0.10.1 read them as c minus ARPACK's Ritz values of c I - G, off by its
    tolerance times c: 0.0002-0.042 (1% of sigma_max).  One at a time with the found ones
    projected out, each as ||J v||^2 of its Ritz vector: within 1e-3 of sigma_max of the exact
    SVD's, sample by sample (measured 1.2e-4 at worst over 24 samples)."""
    from sigprop import hessian as H

    for seed in range(2):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48), torch.nn.ReLU()
        )
        for p in net.parameters():
            p.requires_grad_(False)
        for xi in torch.randn(3, 32):
            f = lambda z: net(z.unsqueeze(0)).reshape(-1)
            J = torch.func.jacrev(f)(xi).double()
            exact = np.sqrt(np.clip(np.linalg.eigvalsh((J.T @ J).numpy()), 0.0, None))
            assert exact[:3].max() < 1e-6 * exact[-1]  # three zeros at least: rank-deficient
            g = spectra.Gram(f, xi)
            c = 1.01 * H.lanczos_top(g, 1)[0]
            low = np.sqrt(spectra._smallest(g, c, 3, H.lanczos_top))
            assert np.abs(low - exact[:3]).max() < 1e-3 * exact[-1]


def test_the_spectrum_records_the_drawn_widths():
    """Issue 37, item 14: --width LO:HI draws each layer's width; the record holds them."""
    r = sigprop.spectrum(
        api.spec("mlp", depth=3, width="8:16", input_dim=8, inits="proposed"),
        specs.SpectrumSpec(samples=2, seeds=1, device="cpu"),
    )
    widths = r.config["widths"]
    assert len(widths) == 4 and widths[0] == 8 and all(8 <= w <= 16 for w in widths[1:])


def test_a_models_spectrum_says_its_own_theory(tmp_path, capsys):
    """Issue 37, item 14: `spectrum module` printed the free-probability footnote of sigprop's own
    nets; a model's theory is its traced graph's mean, said as such."""
    nets = tmp_path / "nets.py"
    nets.write_text(
        "import torch.nn as nn\n\ndef net():\n    return nn.Sequential(nn.Linear(6, 6), nn.ReLU())\n"
    )
    assert (
        main(["spectrum", "module", f"{nets}:net", "--input-shape", "6", "--samples", "2", "--seeds", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "the traced graph's backward map at the input" in out and "Pennington" not in out
