"""A plan's memory estimate (``plans.memory``, from its steps) beside what a probe's walk
allocates, measured in one run: ``LiveBytes``, a TorchDispatchMode, counts the bytes of the live
storages the ops create on the CPU (a view once; a storage freed when its last tensor dies) and
keeps their peak -- the tensors a device walk allocates too, so the CPU proxy of a GPU's peak
(cuDNN's and cuBLAS's workspaces and a CUDA graph's pools aside).  Per net, stored and streamed:
the peak, the estimate, and their ratio, which must be >= 1 (the estimate decides streaming and
refuses what does not fit) and not far above it.  tests/kinds/test_memory.py holds the same on
small nets.  With ``--device cuda`` the peak is the device's own (``torch.cuda.max_memory_allocated``
above what was allocated before the probe: cuDNN's workspaces and the CUDA graphs' pools
included), beside the estimate with the graph pools the engine adds (``graph_pool_bytes``) --
benchmarks/gpu.py's line 6.
Usage: python benchmarks/memory.py [--samples-scale 1] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """The bytes of the storages the ops create that are still referenced, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}
        self.now = self.peak = 0

    def _release(self, ptr: int) -> None:
        held = self.live.get(ptr)
        if held is not None:
            held[1] -= 1
            if held[1] == 0:
                self.now -= held[0]
                del self.live[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr == 0:
                continue
            if ptr not in self.live:
                self.live[ptr] = [storage.nbytes(), 0]
                self.now += storage.nbytes()
                self.peak = max(self.peak, self.now)
            self.live[ptr][1] += 1
            weakref.finalize(t, self._release, ptr)
        return out


def measured(spec, samples: int, stream: bool, device: str = "cpu") -> tuple[int, int]:
    """(the walk's peak bytes, the estimate the engine holds it to) for one draw of ``spec``'s
    inits: on the CPU the live storages its ops create (``LiveBytes``), on a GPU the device's
    peak above what was allocated before, beside the kind's estimate plus the graph pools."""
    from sigprop import engines, kinds, run, specs
    from sigprop.kernels import device as dev

    probe = specs.ProbeSpec(samples=samples, seeds=1, device=device, stream=stream)
    kind = kinds.of(spec)
    mem = kind.memory(spec, probe, 4, 10**13, lambda *a, **k: None)
    need = mem.need
    if device.startswith("cuda"):
        if dev.use_graphs(probe.graphs, torch.device(device)) and kind.graphs(spec):
            s = mem.steps
            need += engines.plan.graph_pool_bytes(s.biggest, s.widest, samples, 4, layers=s.layers)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run.measure(spec, probe)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before, need
    with LiveBytes() as live:
        run.measure(spec, probe)
    return live.peak, need


def main() -> None:
    from sigprop import specs
    from sigprop.kinds.cnn import CNNSpec
    from sigprop.kinds.mlp import MLPSpec
    from sigprop.kinds.resnet import ResNetSpec
    from sigprop.kinds.wrn import WRNSpec

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples-scale", type=float, default=1.0)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.device.startswith("cuda"):
        print(f"device {args.device} ({torch.cuda.get_device_name()})", flush=True)
    nets = [
        ("mlp 20 x 1024", MLPSpec(depth=20, input_dim=1024, width=specs.WidthSpec(1024, 1024)), 256),
        ("mlp 50 x 128:512", MLPSpec(depth=50, input_dim=100, width=specs.WidthSpec(128, 512)), 64),
        ("mlp 50 x 128:512", MLPSpec(depth=50, input_dim=100, width=specs.WidthSpec(128, 512)), 4),
        ("resnet 20 blocks", ResNetSpec(blocks=20, inits=("proposed",)), 256),
        ("resnet bn 20 blocks", ResNetSpec(blocks=20, norm="bn", inits=("he",)), 128),
        ("cnn 10 x 64, 32 x 32", CNNSpec(depth=10, channels=64, inits=("proposed",)), 16),
        ("wrn N 1 k 2", WRNSpec(blocks=1, widen=2, inits=("proposed",)), 16),
        ("wrn bottleneck N 1", WRNSpec(blocks=1, widen=1, bottleneck=True, inits=("proposed",)), 8),
    ]
    print(f"{'net':22s} {'samples':>7s} {'stream':>6s} {'peak MiB':>9s} {'estimate MiB':>12s} {'ratio':>6s}")
    for name, spec, samples in nets:
        samples = max(2, int(samples * args.samples_scale))
        for stream in (False, True):
            peak, need = measured(spec, samples, stream, args.device)
            mib = f"{peak / 2**20:9.2f} {need / 2**20:12.2f}"
            print(f"{name:22s} {samples:7d} {stream!s:>6s} {mib} {need / peak:6.2f}")


if __name__ == "__main__":
    main()
