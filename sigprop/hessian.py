"""Curvature at initialization (issue 19; Arpit et al. 2019, section 5.3, Table 2): the Hessian
of a 10-way cross-entropy loss with respect to every trainable parameter of the net at init.

One source of truth for the network: the net is the probe's plan, compiled into the walker's units,
and its weights are the probe's own draw -- the walker runs the plan once on the data and keeps
each unit's parameters (a data-dependent init is calibrated on that data, as the paper's is on its
batch) -- and each unit is itself a differentiable function of its trainable parameters
(``unit.apply``, no ladder here): per WN layer g, v and b (b = 0 at init; Salimans & Kingma 2016, eq. 2),
per plain layer W and b, per batch norm (the BN ResNet's, the BN WRN's convs) its affine gamma = 1, beta = 0,
plus a
10-way linear head after the last state (conv nets: after global average pooling).  The head is, by
default, the paper's: a plain nn.Linear at PyTorch's default init (W, b ~ U(+-1/sqrt(n_in))), the
same for every init under test, as in the authors' code (Arpit et al. 2019, section 5); with
``head="init"`` it is drawn by the init under test with gain 1 (role ``linear``; a data-dependent
head standardised on the features), which docs/theory.md section 12 uses to show how much of
the curvature the head sets.

The curvature: Hessian-vector products by double backward (the gradient's graph is built once
and reused), the largest-magnitude eigenvalue by restarted Lanczos (``largest_eigenvalue``:
stopped when its residual ||Hy - ly||/|l| is at most ``tol``, or after ``iters`` products, the
residual reported either way), the top-k by Lanczos (``scipy.sparse.linalg.eigsh`` on the HVP), the trace by
Hutchinson's estimator with Rademacher probes (mean and standard error).  A non-finite HVP is
reported as ``diverged`` (Table 2's N/A), not raised; a search that does not converge within its
budget as ``not converged``, with its residual.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from scipy.sparse.linalg import LinearOperator, eigsh

from sigprop import inits, walker
from sigprop.inits import LayerRole
from sigprop.kernels import ops, sampling
from sigprop.kernels.logspace import LayerParams

CLASSES = 10
#: a product's time against the setup's (``HVP.guess``): the gradient with its graph, or the loss
#: alone over minibatches (the upper ends of the ratios measured)
PRODUCT_PER_GRADIENT = 2.0
PRODUCT_PER_LOSS = 15.0
#: the head's generator id: beyond every plan's layer ids
HEAD_LAYER = 2**40


@dataclass
class Model:
    """The probe's net at init as a differentiable function: ``params`` (name -> leaf tensor,
    one draw) and ``loss(params, x, y)``."""

    units: list
    params: dict
    loss: Callable = field(repr=False)
    #: a model's parameters that do not reach the loss (a head its forward never calls, a side
    #: output): left out of the Hessian, named
    left_out: list = field(default_factory=list)


def build(steps, scheme, space: str, x: torch.Tensor, seed: int, draw: int, head: str = "pytorch") -> Model:
    """The net of the plan ``steps`` under ``scheme``, draw ``draw``: the walker draws (and, for a
    data-dependent init, calibrates on x) the weights exactly as the probe does, and the units it
    walked are the function -- each unit's ``apply`` over its ``parameters`` (sigprop/walker/),
    ``u_i.apply(p_i, h)`` composed; the head (``specs.HEADS``) is drawn from its own generator."""
    fn = walker.as_function(steps, scheme, x, seed, draw, space)
    units, params, last = fn.units, dict(fn.params), fn.shape_out
    conv = len(last) == 3  # a conv net's last state is globally average-pooled into the head
    head_scheme = scheme if head == "init" else inits.INITS["pytorch"]
    params.update(
        _head(
            head_scheme,
            head == "init" and scheme.normalized,
            LayerRole(last[0], CLASSES, "linear"),
            seed,
            draw,
            x.device,
            x.dtype,
        )
    )

    def features(p: dict, xb: torch.Tensor) -> torch.Tensor:
        """The net's last state (conv nets: globally average-pooled): the head's input."""
        h = fn.forward(p, xb)
        return h.reshape(h.shape[0], last[0], -1).mean(dim=-1) if conv else h

    def loss(p: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(features(p, xb) @ ops.weight(p["head.v"], p.get("head.g")).T + p["head.b"], yb)

    calibrate = sampling.calibration(scheme)
    if (
        head == "init" and calibrate is not None
    ):  # the data-dependent head: standardised on the data's features
        with torch.no_grad():
            feats = features(params, x)
            v = params["head.v"]
            t = feats @ v.T / torch.linalg.vector_norm(v, dim=1)
            cal = calibrate(LayerParams(v=v, g=params["head.g"], bias=params["head.b"], scale=None), t)
            params["head.g"], params["head.b"] = cal.g, cal.bias
    return Model(units, params, loss)


def _head(scheme, normalized: bool, role: LayerRole, seed: int, draw: int, device, dtype) -> dict:
    """The head's parameters drawn by ``scheme``: WN (g, v, b) when ``normalized``, else plain W = v, b
    (``pytorch``'s g = ||v|| makes its effective weight v itself: nn.Linear's default)."""
    gen = sampling.layer_generator(seed, draw, HEAD_LAYER, device)
    lp = sampling.sample(scheme, role, gen, device, dtype)
    out = {
        "head.v": lp.v.detach().clone(),
        "head.b": (lp.bias if lp.bias is not None else torch.zeros(role.fan_out, device=device, dtype=dtype))
        .detach()
        .clone(),
    }
    if normalized and lp.g is not None:
        out["head.g"] = lp.g.detach().clone()
    return out


def parameter_count(steps, scheme, head: str = "pytorch") -> int:
    """The trainable parameters ``build`` gives the net under ``scheme`` (WN g, v, b per layer; plain
    W and b; BN's gamma and beta; the 10-way head), counted from the plan without drawing them:
    what ``--top`` is bounded by and the Lanczos memory is estimated from."""
    units, _ = walker.compile_plan(steps, scheme)
    features = units[-1].shape_out[0]
    total = sum(u.parameter_count(scheme.normalized) for u in units)
    return total + features * CLASSES + CLASSES * (1 + (head == "init" and bool(scheme.normalized)))


# --------------------------------------------------------------------------------------------
# Hessian-vector products and the estimators
# --------------------------------------------------------------------------------------------
class HVP:
    """v -> H v for the loss at the model's parameters, flat vectors [P].  Whole data
    (``batch_size`` None or >= N): the gradient's graph is built once (create_graph) and each
    product is one more backward through it.  Minibatches of ``batch_size``: the loss is the
    sample-weighted mean of the minibatches' mean losses, and each product sums their products,
    rebuilding one minibatch's graph at a time (the authors' code does the same; memory of one
    minibatch)."""

    def __init__(self, model: Model, x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None) -> None:
        self.names = list(model.params)
        self.leaves = [model.params[n].detach().clone().requires_grad_(True) for n in self.names]
        self.shapes = [t.shape for t in self.leaves]
        self.size = sum(t.numel() for t in self.leaves)
        self.calls = 0
        #: called after every product (the driver's progress: products are the run's unit of time)
        self.tick: Callable[[], None] | None = None
        self._loss = model.loss
        n = x.shape[0]
        t0 = time.perf_counter()
        if batch_size is None or batch_size >= n:
            loss = self._loss(self._params(), x, y)
            self.loss = float(loss.detach())
            self.grads = torch.autograd.grad(loss, self.leaves, create_graph=True)
            self.batches = None
        else:
            self.batches = [
                (x[i : i + batch_size], y[i : i + batch_size], min(batch_size, n - i) / n)
                for i in range(0, n, batch_size)
            ]
            with torch.no_grad():
                self.loss = float(sum(w * self._loss(self._params(), xb, yb) for xb, yb, w in self.batches))
        #: a rough guess of one product's seconds before any runs, from what the setup just timed:
        #: the gradient with its graph (a product is one more backward through it: 1.3-1.9x the
        #: gradient's time measured on MLP, ResNet, CNN and WRN on a 2-core CPU), or the loss alone
        #: over the minibatches (a product is a forward and two backwards a minibatch: 8-15x)
        ratio = PRODUCT_PER_GRADIENT if self.batches is None else PRODUCT_PER_LOSS
        self.guess = (time.perf_counter() - t0) * ratio

    def _params(self) -> dict:
        return dict(zip(self.names, self.leaves))

    @property
    def device(self) -> torch.device:
        return self.leaves[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.leaves[0].dtype

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        out = self._product(v)
        self.calls += 1
        if self.tick is not None:
            self.tick()
        return out

    def _product(self, v: torch.Tensor) -> torch.Tensor:
        parts, k = [], 0
        for sh in self.shapes:
            n = math.prod(sh)
            parts.append(v[k : k + n].reshape(sh))
            k += n
        if self.batches is None:
            return self._flat(
                torch.autograd.grad(
                    self.grads, self.leaves, grad_outputs=parts, retain_graph=True, allow_unused=True
                ),
                v,
            )
        total = torch.zeros_like(v)
        for xb, yb, w in self.batches:
            grads = torch.autograd.grad(
                w * self._loss(self._params(), xb, yb), self.leaves, create_graph=True
            )
            total += self._flat(
                torch.autograd.grad(grads, self.leaves, grad_outputs=parts, allow_unused=True), v
            )
        return total

    def _flat(self, hv, v: torch.Tensor) -> torch.Tensor:
        return torch.cat(
            [
                (torch.zeros(math.prod(sh), device=v.device, dtype=v.dtype) if h is None else h.reshape(-1))
                for h, sh in zip(hv, self.shapes)
            ]
        )

    def dense(self) -> torch.Tensor:
        """The whole Hessian [P, P] (tests and tiny nets only)."""
        eye = torch.eye(self.size, dtype=self.dtype, device=self.device)
        return torch.stack([self(eye[i]) for i in range(self.size)])


@dataclass
class EigenResult:
    """The largest-magnitude eigenvalue: its value (None: diverged), the Hessian-vector products
    spent, the relative residual ||H y - l y||/|l| of its unit Ritz vector y (computed with one
    more product, not estimated), and the status: "converged" (residual <= tol), "not converged"
    (the budget ran out: still the best Ritz value, with its residual) or "diverged"."""

    eigenvalue: float | None
    iterations: int
    residual: float | None
    status: str


#: Lanczos basis size before a restart: memory of ``LANCZOS_BASIS`` parameter vectors
LANCZOS_BASIS = 20


def largest_eigenvalue(
    hvp, gen: torch.Generator, iters: int = 100, tol: float = 1e-3, basis: int = LANCZOS_BASIS
) -> EigenResult:
    """The largest-magnitude eigenvalue of the symmetric operator ``hvp`` (``HVP``, or any object
    with ``size``, ``device``, ``dtype`` and ``__call__``) by explicitly restarted Lanczos with full
    reorthogonalisation (Golub & Van Loan 2013, section 10.1).

    From a Gaussian start v: H v gives the Rayleigh quotient l = v.Hv and the relative residual
    r = ||Hv - l v||/|l|; stop when r <= tol -- an eigenvalue of H then lies within tol |l| of l
    (Bauer-Fike for a symmetric matrix), so a close second eigenvalue (lambda2/lambda1 = 0.999)
    cannot end the search early the way a test on the change of the Rayleigh quotient did
    (sigprop 0.7.0's power iteration: 4.895 reported "converged" where the top eigenvalue was
    5.068).  Otherwise a Lanczos cycle from v (its first product is the one just made) of at most
    ``basis`` vectors, ended early when the Lanczos estimate |beta_k s_k| of the largest-magnitude
    Ritz pair's residual meets the tolerance; its Ritz vector becomes v, whose product is the next
    check.  ``iters`` caps the products (the checks included): when it is spent the last checked
    Ritz pair is reported "not converged" with its residual.  A non-finite product: "diverged"."""
    dev, dtype = hvp.device, hvp.dtype
    v = torch.randn(hvp.size, generator=gen, device=gen.device, dtype=torch.float64).to(
        device=dev, dtype=dtype
    )
    v = v / torch.linalg.vector_norm(v)
    calls = 0

    def product(u: torch.Tensor) -> torch.Tensor | None:
        nonlocal calls
        calls += 1
        out = hvp(u)
        return out if bool(torch.isfinite(out).all()) else None

    while True:
        hv = product(v)
        if hv is None:
            return EigenResult(None, calls, None, "diverged")
        lam = float(torch.dot(v, hv))
        miss = float(torch.linalg.vector_norm(hv - lam * v))
        if miss == 0.0:  # v is an eigenvector (H v = 0 included)
            return EigenResult(lam, calls, 0.0, "converged")
        residual = miss / abs(lam) if lam != 0.0 else math.inf
        if residual <= tol or calls >= iters:
            return EigenResult(lam, calls, residual, "converged" if residual <= tol else "not converged")
        V, alpha, beta, w = [v], [], [], hv
        for j in range(basis):
            if j > 0:
                w = product(V[j])
                if w is None:
                    return EigenResult(None, calls, None, "diverged")
            alpha.append(float(torch.dot(w, V[j])))
            Q = torch.stack(V)
            for _ in range(2):  # full reorthogonalisation, twice ("twice is enough")
                w = w - Q.T @ (Q @ w)
            b = float(torch.linalg.vector_norm(w))
            vals, vecs = np.linalg.eigh(np.diag(alpha) + np.diag(beta, 1) + np.diag(beta, -1))
            i = int(np.argmax(np.abs(vals)))
            theta, s = float(vals[i]), vecs[:, i]
            if (
                abs(b * s[-1]) <= tol * abs(theta)
                or b <= 1e-12 * abs(theta)
                or calls >= iters - 1
                or j == basis - 1
            ):
                break
            beta.append(b)
            V.append(w / b)
        v = torch.as_tensor(s, device=dev, dtype=dtype) @ torch.stack(V)
        v = v / torch.linalg.vector_norm(v)


def planned_products(hs, layers: int, size: int) -> int:
    """The Hessian-vector products one draw takes at most, as ``hs`` asks (the run's estimate and
    its progress count them): --iters for the largest eigenvalue (fewer when it converges), --top's
    ARPACK basis twice over (its restarts vary), --trace's probes, --density's probes x steps and
    --per-layer's --iters a layer."""
    n = hs.iters + hs.trace + (hs.probes * hs.steps if hs.density else 0)
    n += 2 * arpack_basis(hs.top, size) if hs.top else 0
    return n + (hs.iters * layers if hs.per_layer else 0)


def arpack_basis(k: int, size: int) -> int:
    """The Lanczos basis ``eigsh`` keeps for the top k of a [size, size] operator (its default ncv):
    the float64 vectors it holds, and the fewest Hessian-vector products it can take."""
    return min(size, max(2 * k + 1, 20))


def lanczos_top(hvp, k: int, tol: float = 1e-4, seed: int = 0, vectors: bool = False):
    """The k largest-magnitude eigenvalues by implicitly restarted Lanczos (ARPACK through
    ``scipy.sparse.linalg.eigsh``, basis ``arpack_basis``) on the HVP, in decreasing magnitude;
    k < size (the caller refuses more).  ``vectors``: (values, their unit Ritz vectors as tensors
    on the operator's device) instead."""
    dev, dtype = hvp.device, hvp.dtype
    op = LinearOperator(
        (hvp.size, hvp.size),
        dtype=np.float64,
        matvec=lambda v: (
            hvp(torch.as_tensor(np.ravel(v), device=dev, dtype=dtype)).detach().cpu().double().numpy()
        ),
    )
    v0 = np.random.default_rng(seed).standard_normal(hvp.size)
    got = eigsh(
        op, k=k, which="LM", tol=tol, v0=v0, ncv=arpack_basis(k, hvp.size), return_eigenvectors=vectors
    )
    if not vectors:
        return sorted((float(v) for v in got), key=abs, reverse=True)
    vals, vecs = got
    order = sorted(range(len(vals)), key=lambda i: abs(vals[i]), reverse=True)
    return [float(vals[i]) for i in order], [
        torch.as_tensor(vecs[:, i], device=dev, dtype=dtype) for i in order
    ]


def hutchinson_trace(hvp, probes: int, gen: torch.Generator) -> tuple[float, float | None]:
    """tr H ~ mean of z.H z over Rademacher z (Hutchinson 1989): (estimate, standard error; None
    with one probe, which has no spread to estimate it from)."""
    dev, dtype = hvp.device, hvp.dtype
    vals = []
    for _ in range(probes):
        z = (torch.randint(0, 2, (hvp.size,), generator=gen, device=gen.device) * 2 - 1).to(
            device=dev, dtype=dtype
        )
        vals.append(float(torch.dot(z, hvp(z))))
    arr = np.array(vals)
    return float(arr.mean()), float(arr.std(ddof=1) / math.sqrt(probes)) if probes > 1 else None


class Block:
    """The diagonal block of ``hvp`` on one layer's parameters (``names``, a slice of the flat
    vector): u -> (H [u on the block, 0 elsewhere]) restricted to the block; the operator
    ``largest_eigenvalue`` reads (``size``, ``device``, ``dtype``, a call)."""

    def __init__(self, hvp, start: int, stop: int) -> None:
        self.hvp, self.start, self.stop = hvp, start, stop
        self.size = stop - start
        self.device, self.dtype = hvp.device, hvp.dtype

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        v = torch.zeros(self.hvp.size, device=u.device, dtype=u.dtype)
        v[self.start : self.stop] = u
        return self.hvp(v)[self.start : self.stop]


def layer_blocks(hvp) -> list[tuple[str, int, int]]:
    """The flat vector's layers, in order: (layer, start, stop), a layer's parameters being those
    whose names share everything but the last part (``3.v``, ``3.g``, ``3.b`` -> layer ``3``; a
    residual block's ``5.1.v`` -> ``5.1``; the head's ``head``; a model's
    ``conv1.parametrizations.weight.original0`` -> ``conv1``)."""
    out: list[list] = []
    k = 0
    for name, sh in zip(hvp.names, hvp.shapes):
        # a model's weight normalization keeps g and v in LAYER.parametrizations.weight.original0/1
        stripped = re.sub(r"\.?parametrizations\.[^.]+\.original\d+$", "", name)
        if stripped != name:
            layer = stripped or "(model)"
        else:  # a model's root module's own parameters: "(model)"
            layer = name.rsplit(".", 1)[0] if "." in name else "(model)"
        n = math.prod(sh)
        if out and out[-1][0] == layer:
            out[-1][2] = k + n
        else:
            out.append([layer, k, k + n])
        k += n
    return [tuple(b) for b in out]


@dataclass
class Density:
    """Stochastic Lanczos quadrature of the Hessian's eigenvalue density: per probe the Gauss
    nodes (Ritz values) and their weights, which sum to 1; ``products`` Hessian-vector products
    spent."""

    nodes: list[list[float]]
    weights: list[list[float]]
    products: int

    @property
    def trace(self) -> float:
        """size x the mean over probes of sum_k w_k theta_k = z.Hz/||z||^2: Hutchinson's estimate
        on the same probes (set by the caller's ``size``)."""
        return self.size * float(np.mean([np.dot(w, t) for w, t in zip(self.weights, self.nodes)]))

    size: int = 0


def slq(hvp, probes: int, steps: int, gen: torch.Generator) -> Density:
    """Stochastic Lanczos quadrature (Lin, Saad & Yang 2016; Ghorbani, Krishnan & Xiao 2019): per
    Rademacher probe z (unit length), ``steps`` Lanczos steps with full reorthogonalisation build
    the tridiagonal T; its eigenpairs (theta_k, y_k) are the nodes and weights y_k[0]^2 of the
    Gauss quadrature of the spectral measure of H seen from z, sum_i (z.q_i)^2 delta(lambda -
    lambda_i), whose mean over z is the density (1/P) sum_i delta(lambda - lambda_i).  A step
    whose residual vanishes (an invariant subspace) ends the probe early: T is then exact."""
    dev, dtype = hvp.device, hvp.dtype
    nodes, weights, products = [], [], 0
    for _ in range(probes):
        z = (torch.randint(0, 2, (hvp.size,), generator=gen, device=gen.device) * 2 - 1).to(
            device=dev, dtype=dtype
        )
        V = [z / torch.linalg.vector_norm(z)]
        alpha: list[float] = []
        beta: list[float] = []
        for j in range(steps):
            w = hvp(V[j])
            products += 1
            alpha.append(float(torch.dot(w, V[j])))
            Q = torch.stack(V)
            for _ in range(2):  # full reorthogonalisation, twice
                w = w - Q.T @ (Q @ w)
            b = float(torch.linalg.vector_norm(w))
            scale = max(abs(a) for a in alpha) or 1.0
            if j == steps - 1 or b <= 1e-10 * scale:
                break
            beta.append(b)
            V.append(w / b)
        vals, vecs = np.linalg.eigh(np.diag(alpha) + np.diag(beta, 1) + np.diag(beta, -1))
        nodes.append([float(v) for v in vals])
        weights.append([float(v) for v in vecs[0] ** 2])
    return Density(nodes, weights, products, hvp.size)


def data(seed: int, samples: int, shape, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data: x ~ N(0, I) (the probe's inputs, ``sampling.probe_inputs``) and labels
    uniform over the 10 classes from their own stream."""
    x, _ = sampling.probe_inputs(seed, samples, math.prod(shape), 1, device, dtype)
    return x, sampling.labels(seed, samples, CLASSES, device)
