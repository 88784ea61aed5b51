"""The cost of probing a user's model (``sigprop module``; issue 29, item 7) against its floor.

The floor is the bare work a backward ratio needs: the model's forward on the batch and autograd
for the input's gradient only (weights needing no gradient), in plain torch.  sigprop adds the
hooks at the sites (one per-sample sum of squares forward and backward), the fx trace (a forward
of two samples for the shapes) and the moment maps.  Each side runs in its own process, cold
(imports excluded, the model's construction included on both sides) and then warm (the median
of the later calls), with its peak RSS.

Usage: python benchmarks/module.py [samples] [image] [threads]     (default 64 224 2)
Prints per side the cold and warm seconds, the peak RSS, and the ratios sigprop / floor.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time


def densenet():
    from monai.networks.nets import DenseNet121

    return DenseNet121(spatial_dims=2, in_channels=3, out_channels=10)


def child(side: str, samples: int, image: int, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    times = []
    for _ in range(3):
        if side == "floor":
            t0 = time.perf_counter()  # the model's construction counts on both sides
            torch.manual_seed(0)
            model = densenet()
            model.train()
            for p in model.parameters():
                p.requires_grad_(False)
            x = torch.randn(samples, 3, image, image, requires_grad=True)
            y = model(x)
            e = torch.randn_like(y)
            (g,) = torch.autograd.grad(y, x, e)
            times.append(time.perf_counter() - t0)
        else:
            import sigprop
            from sigprop import api  # noqa: F401  (imports are not the probe's time)

            t0 = time.perf_counter()
            sigprop.probe_module(
                model=densenet, input_shape=(3, image, image), samples=samples, device="cpu", threads=threads
            )
            times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"cold": times[0], "warm": sorted(times[1:])[len(times[1:]) // 2], "rss_mib": rss}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], *(int(a) for a in sys.argv[3:6]))
        return
    samples, image, threads = (int(a) for a in (sys.argv[1:] + ["64", "224", "2"][len(sys.argv) - 1 :])[:3])
    got = {}
    for side in ("floor", "sigprop"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", side, str(samples), str(image), str(threads)],
            capture_output=True,
            text=True,
            check=True,
        )
        got[side] = json.loads(out.stdout.strip().splitlines()[-1])
    f, s = got["floor"], got["sigprop"]
    print(
        f"DenseNet121 3x{image}x{image}, {samples} samples, {threads} threads: "
        f"floor cold {f['cold']:.2f} s warm {f['warm']:.2f} s peak {f['rss_mib']:.0f} MiB; "
        f"sigprop cold {s['cold']:.2f} s warm {s['warm']:.2f} s peak {s['rss_mib']:.0f} MiB; "
        f"ratio cold {s['cold'] / f['cold']:.2f}, warm {s['warm'] / f['warm']:.2f}, memory "
        f"{s['rss_mib'] / f['rss_mib']:.2f}"
    )


if __name__ == "__main__":
    main()
