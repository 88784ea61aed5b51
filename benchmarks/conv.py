"""The WRN probe (``sigprop wrn``, issue 18) against its floor and the naive autograd peer on the
same shapes, each program its own process (wall time and peak RSS, import included), rounds
interleaved; prints times, memories and ratios, never asserts.

* floor: only the unavoidable work -- per block the kernels drawn (Gaussian made Haar-orthogonal
  by sigprop/kernels/haar.py, as the proposed init, times its gain), conv -> ReLU (mask kept as bool) ->
  conv, the skip (identity or the 1 x 1 stride-2 projection), one norm per sample and state;
  backward the conv input-gradients through the masks; masks and kernels kept.
* peer: what a user writes first -- nn.Conv2d layers under weight_norm, the whole forward in the
  autograd graph with retain_grad on every block output, one backward of sum(e * h).
* sigprop: ``sigprop wrn --init proposed`` (the JSON written to /dev/null), the same threads.

Usage: python benchmarks/conv.py [--quick] [--repeat 3]     (or: conv.py floor|peer N k samples)
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable


def _plan(N: int, k: int):
    from sigprop.kinds import wrn  # imported in the child process that is timed

    return wrn.steps((3, 32, 32), N, k)


def floor(N: int, k: int, samples: int) -> float:
    import torch
    import torch.nn.functional as F

    from sigprop import inits, plans
    from sigprop.kernels.haar import orthogonalize

    t0 = time.perf_counter()
    torch.manual_seed(0)
    steps = _plan(N, k)

    def kernel(st):
        g = (
            orthogonalize(torch.randn(st.role.fan_out, st.role.fan_in))
            * inits.proposed_gain_sq(st.role) ** 0.5
        )
        return g.reshape(st.role.fan_out, st.shape_in[0], st.kernel, st.kernel)

    def conv(w, st, h):
        return F.conv2d(h, w, stride=st.stride, padding=st.padding)

    with torch.no_grad():
        x = torch.randn(samples, 3, 32, 32)
        tree = plans.nest(steps)
        stem = tree[1]
        w0 = kernel(stem)
        h = conv(w0, stem, x)
        kept, norms = [], []
        for item in tree[3:]:
            if not isinstance(item, tuple):
                continue
            inner, close = item
            ws = [kernel(st) for st in inner]
            wp = None if close.projection is None else kernel(close.projection)
            a = torch.relu(conv(ws[0], inner[0], h))
            mask = a > 0
            f = conv(ws[1], inner[1], a)
            h = (h if wp is None else conv(wp, close.projection, h)) + f
            n = torch.linalg.vector_norm(h.flatten(1), dim=1)
            norms.append(n)
            h = h / n[:, None, None, None]
            kept.append((inner, close, ws, wp, mask))
        d = torch.randn_like(h)
        for inner, close, ws, wp, mask in reversed(kept):
            z = (
                torch.nn.grad.conv2d_input(
                    mask.shape, ws[1], d, stride=inner[1].stride, padding=inner[1].padding
                )
                * mask
            )
            z = torch.nn.grad.conv2d_input(
                (d.shape[0], *inner[0].shape_in), ws[0], z, stride=inner[0].stride, padding=inner[0].padding
            )
            s = (
                d
                if wp is None
                else torch.nn.grad.conv2d_input((d.shape[0], *close.projection.shape_in), wp, d, stride=2)
            )
            d = s + z
            n = torch.linalg.vector_norm(d.flatten(1), dim=1)
            norms.append(n)
            d = d / n[:, None, None, None]
        float(torch.stack(norms).sum())
    return time.perf_counter() - t0


def peer(N: int, k: int, samples: int) -> float:
    import torch
    from torch.nn.utils.parametrizations import weight_norm

    from sigprop import inits, plans

    t0 = time.perf_counter()
    torch.manual_seed(0)
    steps = _plan(N, k)

    def layer(st):
        c = torch.nn.Conv2d(st.shape_in[0], st.role.fan_out, st.kernel, st.stride, st.padding, bias=False)
        torch.nn.init.orthogonal_(c.weight)
        c = weight_norm(c)
        with torch.no_grad():
            c.parametrizations.weight.original0.fill_(inits.proposed_gain_sq(st.role) ** 0.5)
        return c

    tree = plans.nest(steps)
    stem = layer(tree[1])
    blocks = [
        ([layer(st) for st in it[0]], None if it[1].projection is None else layer(it[1].projection))
        for it in tree[3:]
        if isinstance(it, tuple)
    ]
    x = torch.randn(samples, 3, 32, 32)
    h = stem(x)
    hs = [h]
    h.retain_grad()
    for convs, proj in blocks:
        f = convs[1](torch.relu(convs[0](h)))
        h = (h if proj is None else proj(h)) + f
        h.retain_grad()
        hs.append(h)
    e = torch.randn_like(h)
    (h * e).sum().backward()
    fwd = torch.stack([t.flatten(1).norm(dim=1) for t in hs]) / x.flatten(1).norm(dim=1)
    bwd = torch.stack([t.grad.flatten(1).norm(dim=1) for t in hs]) / e.flatten(1).norm(dim=1)
    float((fwd.sum() + bwd.sum()).detach())
    return time.perf_counter() - t0


def measure(cmd: list[str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode().strip().splitlines()[-1:]}")
    return wall, usage.ru_maxrss / 1024.0


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("floor", "peer"):
        N, k, samples = (int(a) for a in sys.argv[2:5])
        print(f"{sys.argv[1]} {(floor if sys.argv[1] == 'floor' else peer)(N, k, samples):.2f}s")
        return
    import torch

    quick = "--quick" in sys.argv
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch "
        f"{torch.__version__}, "
        f"threads {torch.get_num_threads()}; {repeat} interleaved rounds"
    )
    cases = [(2, 1, 32)] if quick else [(16, 1, 100), (166, 1, 32)]
    for N, k, samples in cases:
        progs = {
            "sigprop": [
                PY,
                "-m",
                "sigprop",
                "wrn",
                "--blocks",
                str(N),
                "--widen",
                str(k),
                "--samples",
                str(samples),
                "--init",
                "proposed",
                "--device",
                "cpu",
                "--threads",
                str(torch.get_num_threads()),
                "--format",
                "json",
                "--output",
                os.devnull,
            ],
            "floor": [PY, __file__, "floor", str(N), str(k), str(samples)],
            "peer": [PY, __file__, "peer", str(N), str(k), str(samples)],
        }
        rounds = [{key: measure(cmd) for key, cmd in progs.items()} for _ in range(repeat)]
        t = {key: statistics.median(r[key][0] for r in rounds) for key in progs}
        m = {key: max(r[key][1] for r in rounds) for key in progs}
        per = lambda a, b: sorted(r[a][0] / r[b][0] for r in rounds)
        fmt = lambda xs: f"{statistics.median(xs):.2f} [{xs[0]:.2f}-{xs[-1]:.2f}]"
        print(
            f"WRN N={N} k={k} samples={samples}: sigprop {t['sigprop']:.2f}s {m['sigprop']:.0f} MiB, floor "
            f"{t['floor']:.2f}s "
            f"{m['floor']:.0f} MiB, peer {t['peer']:.2f}s {m['peer']:.0f} MiB; sigprop/floor "
            f"{fmt(per('sigprop', 'floor'))}, "
            f"sigprop/peer {fmt(per('sigprop', 'peer'))}, RSS/peer {m['sigprop'] / m['peer']:.2f}"
        )


if __name__ == "__main__":
    main()
