"""The floor: only the unavoidable work of a probe on given shapes, nothing else.

Fully connected (``floor``, ``limit``):
Weight generation (a Gaussian matrix made Haar-orthogonal, as the proposed init, by the cheapest
method known here: Householder reflectors drawn directly, sigprop/kernels/haar.py -- the same as sigprop
uses, so sigprop is not credited for it; a QR would cost ~2.8 ms more per 512^2 layer), forward matmuls +
ReLU with the masks
kept as bool, the backward matmuls through the masks, and one norm per layer and sample in each
direction, accumulated on the device.  No statistics, no theory, no output beyond one line.
Usage: python floor.py L n N [seeds] [device]

Conv nets (``conv_floor``; issue 28, item 7): the WRN in plain torch with weights that need no
gradient -- its kernels drawn as sigprop draws the proposed init (Haar-orthogonal rows, gain
sqrt(2 c_in/c_out)), convs and ReLUs forward, the states kept -- and
``torch.autograd.grad(top, states, grad_outputs=e)``: the gradient with respect to every state,
never the weights', one norm per sample and state.  ``python floor.py conv N k samples draws``
times it against ``sigprop.probe`` in one process, cold (the first call) and warm (the next),
and prints the ratios -- against the floor in PyTorch's default layout (NCHW) and in channels
last, the layout of sigprop's conv states (the same convolution kernels: the fair floor of the
bookkeeping).
"""

import sys
import time

import torch

from sigprop.kernels.haar import orthogonalize  # imports torch only


def _run(L: int, n: int, N: int, dev, weights_of) -> None:
    """One probe's unavoidable work: x and e drawn, L layers forward (matmul, ReLU, mask kept as
    bool, one norm per sample), the backward pass through the transposed weights and the masks,
    one host sync at the end.  ``weights_of()`` yields the L weight matrices, drawn as it goes."""
    x = torch.randn(N, n, device=dev)
    e = torch.randn(N, n, device=dev)
    norms_f = torch.empty(L, N, device=dev)
    norms_b = torch.empty(L, N, device=dev)
    weights, masks = [], []
    h = x
    for l, w in enumerate(weights_of()):
        a = h @ w.T
        masks.append(a > 0)
        h = torch.relu(a)
        nrm = torch.linalg.vector_norm(h, dim=1)
        norms_f[l] = nrm
        h = h / nrm.clamp_min(1e-30).unsqueeze(1)
        weights.append(w)
    d = e
    for l in range(L - 1, -1, -1):
        d = (d @ weights[l]) * masks[l - 1] if l > 0 else d @ weights[l]
        nrm = torch.linalg.vector_norm(d, dim=1)
        norms_b[l] = nrm
        d = d / nrm.clamp_min(1e-30).unsqueeze(1)
    float(norms_f.sum() + norms_b.sum())  # one host sync at the end


def floor(L: int, n: int, N: int, seeds: int = 1, device: str = "cpu") -> float:
    """Run the floor (one orgqr Haar draw per layer); returns its compute seconds."""
    dev = torch.device(device)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(seeds):
            _run(
                L,
                n,
                N,
                dev,
                lambda: (orthogonalize(torch.randn(n, n, device=dev)) * 2**0.5 for _ in range(L)),
            )
    return time.perf_counter() - t0


def limit(L: int, n: int, N: int, device: str = "cpu", chunk: int = 32) -> float:
    """The limit line of issue 16: the same work with Haar weights generated ``chunk`` layers at a
    time by the batched UT transform (sigprop/kernels/haar.py, GEMM speed on a GPU) and bare matmuls:
    no bookkeeping, no log-space, masks as bool, weights kept.  Returns compute seconds."""
    from sigprop.kernels.haar import orthogonalize_batched

    dev = torch.device(device)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.no_grad():
        _run(
            L,
            n,
            N,
            dev,
            lambda: (
                w
                for l0 in range(0, L, chunk)
                for w in orthogonalize_batched(torch.randn(min(chunk, L - l0), n, n, device=dev)) * 2**0.5
            ),
        )
    return time.perf_counter() - t0


def conv_floor(
    N: int, k: int, samples: int, draws: int = 1, image=(3, 32, 32), seed: int = 0, channels_last=False
) -> float:
    """The WRN's unavoidable work for ``draws`` weight draws (each: draw the kernels, forward,
    autograd for the states' gradients, norms); returns seconds.  ``channels_last``: the input
    and the kernels in torch.channels_last memory format (then every activation and gradient is
    too), the layout sigprop's walker holds conv states in -- the floor of the same kernels."""
    import torch.nn.functional as F

    from sigprop import inits, plans
    from sigprop.kinds import wrn

    steps = wrn.steps(image, N, k)
    tree = plans.nest(steps)
    gen = torch.Generator().manual_seed(seed)

    def kernel(st):
        w = orthogonalize(torch.randn(st.role.fan_out, st.role.fan_in, generator=gen))
        w = w * inits.proposed_gain_sq(st.role) ** 0.5
        w = w.reshape(st.role.fan_out, st.shape_in[0], st.kernel, st.kernel)
        return w.contiguous(memory_format=torch.channels_last) if channels_last else w

    t0 = time.perf_counter()
    x = torch.randn(samples, *image, generator=gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    for _ in range(draws):
        stem = tree[1]
        blocks = [it for it in tree[3:] if isinstance(it, tuple)]
        w0 = kernel(stem)
        ws = [
            (
                [kernel(st) for st in inner],
                None if close.projection is None else kernel(close.projection),
                close,
            )
            for inner, close in blocks
        ]
        xs = x.clone().requires_grad_(True)
        h = F.conv2d(xs, w0, stride=stem.stride, padding=stem.padding)
        states = [xs, h]
        for (kernels, proj, close), (inner, _) in zip(ws, blocks):
            z = h
            for w, st in zip(kernels, inner):
                z = F.conv2d(z, w, stride=st.stride, padding=st.padding)
                z = torch.relu(z) if st.relu else z
            skip = h if proj is None else F.conv2d(h, proj, stride=close.projection.stride)
            h = skip + inits.get("proposed").alpha(close.blocks_in_stage) * z
            states.append(h)
        e = torch.randn(h.shape, generator=gen)
        grads = torch.autograd.grad(h, states, grad_outputs=e)
        fwd = torch.stack([s.detach().flatten(1).norm(dim=1) for s in states])
        bwd = torch.stack([g.flatten(1).norm(dim=1) for g in grads])
        float(fwd.sum() + bwd.sum())
    return time.perf_counter() - t0


def conv_main(N: int, k: int, samples: int, draws: int, rounds: int = 5) -> None:
    """Cold and warm calls of sigprop (``api.probe``: walks, statistics, theory) and of the two
    floors -- PyTorch's default layout (NCHW, the plain script of issue 28) and channels last
    (the layout sigprop's convs run in) -- in this process, interleaved: the first call of each
    is its cold one; every later round times the three back to back and a warm ratio is the
    median [min-max] of the rounds' ratios (this machine's speed drifts by 10-20% over minutes)."""
    from sigprop import api, specs

    spec = api.spec("wrn", blocks=N, widen=k, inits="proposed")
    probe = specs.ProbeSpec(samples=samples, seeds=draws, device="cpu", threads=torch.get_num_threads())

    def sigprop_call() -> float:
        t0 = time.perf_counter()
        api.probe(spec, probe)
        return time.perf_counter() - t0

    floor_cl = lambda: conv_floor(N, k, samples, draws, channels_last=True)
    runs = [(sigprop_call(), conv_floor(N, k, samples, draws), floor_cl()) for _ in range(rounds)]
    print(
        f"WRN N={N} k={k} samples={samples} draws={draws}, {torch.get_num_threads()} threads: "
        f"sigprop cold {runs[0][0]:.2f} s, warm {min(r[0] for r in runs[1:]):.2f} s (best)"
    )
    for j, name in ((1, "floor (NCHW)"), (2, "floor (channels last)")):
        warm = sorted(r[0] / r[j] for r in runs[1:])
        print(
            f"  {name}: cold {runs[0][j]:.2f} s, ratio {runs[0][0] / runs[0][j]:.2f}; warm "
            f"{min(r[j] for r in runs[1:]):.2f} s (best), ratio {warm[len(warm) // 2]:.2f} "
            f"[{warm[0]:.2f}-{warm[-1]:.2f}] over {rounds - 1} rounds"
        )


def main() -> None:
    if sys.argv[1] == "conv":
        conv_main(*(int(a) for a in sys.argv[2:6]))
        return
    L, n, N = (int(a) for a in sys.argv[1:4])
    seeds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    print(f"floor L={L} n={n} N={N} seeds={seeds} compute {floor(L, n, N, seeds, device):.2f}s")


if __name__ == "__main__":
    main()
