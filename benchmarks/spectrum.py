"""The cost of the exact Jacobian spectrum (``sigprop spectrum``; issue 30, item 5) in units of
its floor: one forward and one backward of the same net on the same N inputs (autograd on the
walker's composed units, ``walker.as_function``), against the exact path's n_out reverse
products a sample (``torch.func.jacrev``, vectorised) and its SVDs; and for a user's model (the
module kind: the same layers as an ``nn.Sequential``, ``model.functions.model_jacobians``, one sample at
a time) against its own floor and the naive peer, ``torch.autograd.functional.jacobian`` per
sample (one backward per output).

Usage: python benchmarks/spectrum.py [depth] [width] [samples] [threads]   (default 20 256 8 2)
Prints the seconds of the floor, the Jacobians and the SVDs (median of 5 warm calls), and the
ratio Jacobians/floor beside n_out, the products the exact path takes per sample.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from sigprop import api, kinds, spectra, walker
from sigprop.model import functions


def median_seconds(fn, rounds: int = 5) -> float:
    fn()  # warm
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(depth: int = 20, width: int = 256, samples: int = 8, threads: int = 2) -> None:
    torch.set_num_threads(threads)
    spec = api.spec("mlp", depth=depth, width=str(width), input_dim=width, inits="proposed")
    kind = kinds.of(spec)
    plan = kind.plan(spec, 0)
    x = torch.randn(samples, width)
    fn = walker.as_function(plan.steps, kind.scheme(spec, "proposed"), x, 0, 0)

    def floor():
        xr = x.clone().requires_grad_(True)
        y = fn.forward(fn.params, xr)
        torch.autograd.grad(y, xr, torch.ones_like(y))

    J = spectra.jacobian(fn, x)
    t_floor = median_seconds(floor)
    t_jac = median_seconds(lambda: spectra.jacobian(fn, x))
    t_svd = median_seconds(lambda: spectra.eigenvalues(J))
    print(
        f"mlp depth {depth} width {width}, {samples} samples, {threads} threads: floor (1 fwd+bwd) "
        f"{t_floor * 1e3:.2f} ms; Jacobians {t_jac * 1e3:.1f} ms = {t_jac / t_floor:.0f}x the floor "
        f"for {J.shape[1]} reverse products a sample ({t_jac / t_floor / J.shape[1]:.2f}x per product); "
        f"SVDs {t_svd * 1e3:.1f} ms"
    )
    layers = []
    for i in range(depth):
        lin = torch.nn.Linear(width, width)
        with torch.no_grad():
            w = fn.params[f"{i}.g"].unsqueeze(1) * fn.params[f"{i}.v"]
            lin.weight.copy_(w / fn.params[f"{i}.v"].norm(dim=1, keepdim=True))
            lin.bias.copy_(fn.params[f"{i}.b"])
        layers += [lin, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).requires_grad_(False)

    def model_floor():
        xr = x.clone().requires_grad_(True)
        y = model(xr)
        torch.autograd.grad(y, xr, torch.ones_like(y))

    def naive():
        return [torch.autograd.functional.jacobian(model, x[i]) for i in range(samples)]

    Jm = functions.model_jacobians(model, x)
    assert torch.allclose(Jm, J, rtol=1e-4, atol=1e-5)  # the same Jacobians
    t_mfloor = median_seconds(model_floor)
    t_model = median_seconds(lambda: functions.model_jacobians(model, x))
    t_naive = median_seconds(naive, rounds=1)
    print(
        f"as a model: floor {t_mfloor * 1e3:.2f} ms; Jacobians {t_model * 1e3:.1f} ms = "
        f"{t_model / t_mfloor:.0f}x its floor; the naive peer (autograd.functional.jacobian a sample) "
        f"{t_naive * 1e3:.0f} ms = {t_naive / t_model:.1f}x sigprop's"
    )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
