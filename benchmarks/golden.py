"""Numbers do not move: the JSON of a grid of probes, written once and compared bit for bit later
(issue 17's refactor check; any change that must not move a number).

Run it on the commit before a change (``--out before.json``) and after it on the same machine
(``--compare before.json``): every leaf of every result document must be identical (exact float
comparison, ``results.compare_documents``; the environment record and timings are left out;
keys the old documents lack -- a new option's default -- are listed as additions, not failures),
except predictions and the bands built on them, which may move by ``PREDICTION_RTOL`` (a
composed moment map rounds differently from the closed form it replaced).
Bit-identity is only promised on one machine and one environment: other CPUs may sum in another
order, and so may scipy's BLAS with another thread count (ARPACK's ``--top`` eigenvalues moved by
1e-15 between a before-file written without OMP_NUM_THREADS and a run with OMP_NUM_THREADS=1):
write and compare with the same environment.
The grid covers the MLP (fixed and random widths, every MLP init), the ResNet (stages, block
depth, projection, every ResNet init), the BN ResNet and ``--norm none``, the CNN and the WRN
(basic, bottleneck, ``--norm none`` and ``bn``), each stored and streamed, with one draw and
with three batched draws; float64 and float32; input pairs of two cosines through every net
kind; the curvature (largest eigenvalue, top 2, trace) of every net kind, whole and in
minibatches, with either head; users' models (an MLP, a BN conv net with a residual add and
pooling, a concatenating stack, LayerNorm/GELU, a side head) probed at auto and leaf sites
with three inits, their spectra and curvature; and the spectrum of the MLP, ResNet and CNN,
exact (with --depths and --top) and by Lanczos.
A change of kernels (issue 28's item 7: WN's scale folded into the conv kernels, the transposed
conv for the backward) rounds float arithmetic differently, so it cannot be bit-identical; with
``--kernels`` a measured leaf may then move by KERNEL_LAYERS rounding units of its dtype (u =
2^-24 for float32, 2^-53 for float64) relative: a reordered product of L layers moves each
layer's output by about one rounding, and the relative changes add over the depth (at most
KERNEL_LAYERS = 16 convs in the grid's deepest net, the WRN of two blocks a stage with its
projections). Spreads (std, draw_std and their log10) are listed, not gated: a spread s of
values near m moves by the values' absolute change, L u m, which is L u m / s relative -- large
where the draws agree closely. Measured at 0.8.0 on the 2-core development machine: the ratios
moved by at most 9.7e-8 (1.6 u) in float32 and 1.0e-15 (9 u) in float64 (docs/benchmarks.md).
``--fuse`` (issue 41) runs the probes of sigprop's nets with their layers' bookkeeping compiled
(kernels/fused.py); compared with ``--kernels`` against an eager file, its row norms' reordered
sums must stay within the same rounding units.
Usage: python benchmarks/golden.py --out FILE | --compare FILE [--kernels] [--fuse]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

import torch

from sigprop import inits, run, specs, walker
from sigprop.kinds import mlp, resnet
from sigprop.kinds.cnn import CNNSpec
from sigprop.kinds.mlp import MLPSpec
from sigprop.kinds.resnet import ResNetSpec
from sigprop.kinds.wrn import WRNSpec
from sigprop.results import compare_documents

#: the CNN's inits as 0.7's registry listed them (unnormalized-he is defined for the CNN since 0.8)
CNN_INITS = (
    "proposed",
    "proposed-gaussian",
    "he",
    "pytorch",
    "pytorch-he",
    "pytorch-orthogonal",
    "datadep",
    "delta-orthogonal",
)


#: ``--fuse``: the plan kinds' probes with their layers' bookkeeping compiled (kernels/fused.py;
#: users' models run their own layers): compared with ``--kernels`` against an eager file
FUSE = False


def grid():
    for stream in (False, True):
        for seeds in (1, 3):
            for dtype in ("float64", "float32"):
                probe = specs.ProbeSpec(
                    samples=16,
                    seed=7,
                    seeds=seeds,
                    device="cpu",
                    dtype=dtype,
                    stream=stream,
                    threads=1,
                    fuse=FUSE,
                )
                yield (
                    f"mlp fixed {dtype} stream={stream} seeds={seeds}",
                    MLPSpec(
                        depth=6, input_dim=20, width=specs.WidthSpec(24, 24), inits=tuple(inits.names(()))
                    ),
                    probe,
                )
                yield (
                    f"mlp random {dtype} stream={stream} seeds={seeds}",
                    MLPSpec(
                        depth=5,
                        input_dim=12,
                        width=specs.WidthSpec(8, 30),
                        inits=("proposed", "datadep", "pytorch"),
                    ),
                    probe,
                )
                yield (
                    f"resnet stages {dtype} stream={stream} seeds={seeds}",
                    ResNetSpec(
                        blocks=3,
                        stages=2,
                        dim=12,
                        width=specs.WidthSpec(6, 14),
                        block_depth=2,
                        inits=tuple(inits.names({"blocks"})),
                    ),
                    probe,
                )
                yield (
                    f"resnet bn {dtype} stream={stream} seeds={seeds}",
                    ResNetSpec(blocks=4, dim=10, norm="bn", inits=("he",)),
                    probe,
                )
                yield (
                    f"resnet none {dtype} stream={stream} seeds={seeds}",
                    ResNetSpec(
                        blocks=3, dim=10, width=specs.WidthSpec(8, 8), norm="none", inits=("he", "skipinit")
                    ),
                    probe,
                )
                yield (
                    f"cnn {dtype} stream={stream} seeds={seeds}",
                    CNNSpec(depth=4, channels=5, image=(2, 7, 6), strided=2, inits=CNN_INITS),
                    probe,
                )
                yield (
                    f"wrn {dtype} stream={stream} seeds={seeds}",
                    WRNSpec(
                        blocks=2,
                        image=(2, 8, 8),
                        inits=tuple(n for n in inits.names({"blocks", "taps"}) if inits.get(n).normalized),
                    ),
                    probe,
                )
                yield (
                    f"wrn none {dtype} stream={stream} seeds={seeds}",
                    WRNSpec(blocks=1, image=(2, 6, 6), norm="none", inits=("he", "skipinit-sqrt")),
                    probe,
                )
                yield (
                    f"wrn bottleneck {dtype} stream={stream} seeds={seeds}",
                    WRNSpec(blocks=1, image=(2, 8, 8), bottleneck=True, inits=("proposed", "datadep")),
                    probe,
                )
                yield (
                    f"wrn bn {dtype} stream={stream} seeds={seeds}",
                    WRNSpec(blocks=1, image=(2, 6, 6), norm="bn", inits=("he",)),
                    probe,
                )


def correlation_grid():
    """Every net kind with input pairs of two cosines (the correlation observer and its theory)."""
    for dtype in ("float64", "float32"):
        probe = specs.ProbeSpec(
            samples=8,
            seed=5,
            seeds=2,
            device="cpu",
            dtype=dtype,
            correlations=(0.0, 0.5),
            pairs=6,
            threads=1,
            fuse=FUSE,
        )
        yield (
            f"corr mlp {dtype}",
            MLPSpec(
                depth=5, input_dim=12, width=specs.WidthSpec(10, 14), inits=("proposed", "pytorch", "datadep")
            ),
            probe,
        )
        yield (
            f"corr resnet {dtype}",
            ResNetSpec(blocks=3, dim=12, width=specs.WidthSpec(8, 8), inits=("proposed", "he", "datadep")),
            probe,
        )
        yield f"corr resnet bn {dtype}", ResNetSpec(blocks=3, dim=10, norm="bn", inits=("he",)), probe
        yield (
            f"corr cnn {dtype}",
            CNNSpec(
                depth=3,
                channels=4,
                image=(2, 6, 6),
                strided=1,
                inits=("proposed", "delta-orthogonal", "pytorch"),
            ),
            probe,
        )
        yield (
            f"corr wrn {dtype}",
            WRNSpec(blocks=1, image=(2, 8, 8), inits=("proposed", "stage-hanin")),
            probe,
        )


def hessian_grid():
    """The curvature of every net kind: the largest eigenvalue, Lanczos' top 2 and Hutchinson's trace."""
    for dtype in ("float64", "float32"):
        hs = specs.HessianSpec(
            samples=12, seeds=2, device="cpu", dtype=dtype, iters=40, top=2, trace=3, threads=1
        )
        yield (
            f"hessian mlp {dtype}",
            MLPSpec(
                depth=3, input_dim=6, width=specs.WidthSpec(5, 7), inits=("proposed", "pytorch-he", "datadep")
            ),
            hs,
        )
        yield (
            f"hessian resnet {dtype}",
            ResNetSpec(blocks=2, dim=6, width=specs.WidthSpec(5, 5), inits=("proposed", "skipinit-sqrt")),
            hs,
        )
        yield f"hessian resnet bn {dtype}", ResNetSpec(blocks=2, dim=6, norm="bn", inits=("he",)), hs
        yield (
            f"hessian cnn {dtype}",
            CNNSpec(depth=2, channels=3, image=(2, 5, 5), strided=1, inits=("proposed", "pytorch")),
            hs,
        )
        yield (
            f"hessian wrn {dtype}",
            WRNSpec(blocks=1, image=(2, 4, 4), inits=("proposed", "stage-hanin")),
            hs,
        )
        yield f"hessian wrn bn {dtype}", WRNSpec(blocks=1, image=(2, 4, 4), norm="bn", inits=("he",)), hs
        yield (
            f"hessian mlp head-init {dtype}",
            MLPSpec(depth=2, input_dim=5, width=specs.WidthSpec(4, 4), inits=("proposed", "datadep")),
            replace(hs, head="init", batch_size=5),
        )


def _models():
    """Small users' models for the module kind's documents: an MLP, a batch-normalised conv net
    with a residual add and pooling, a dense (concatenating) stack, a LayerNorm/GELU net, a
    side head (a dict output)."""
    import torch.nn as nn

    class Res(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(2, 6, 3, padding=1)
            self.bn = nn.BatchNorm2d(6)
            self.c1, self.c2 = nn.Conv2d(6, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1)
            self.pool = nn.AvgPool2d(2)
            self.head = nn.Linear(6 * 3 * 3, 5)

        def forward(self, x):
            h = torch.relu(self.bn(self.stem(x)))
            h = h + self.c2(torch.relu(self.c1(h)))
            return self.head(self.pool(h).flatten(1))

    class Dense(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.ModuleList(nn.Conv2d(3 * (i + 1), 3, 3, padding=1) for i in range(3))

        def forward(self, x):
            feats = [x]
            for conv in self.convs:
                feats.append(torch.relu(conv(torch.cat(feats, 1))))
            return torch.cat(feats, 1)

    class Side(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU())
            self.out, self.side = nn.Linear(12, 6), nn.Linear(12, 1)

        def forward(self, x):
            h = self.body(x)
            return {"y": self.out(h), "aux": self.side(h).detach()}

    return {
        "mlp": (
            lambda: nn.Sequential(
                nn.Linear(8, 10), nn.ReLU(), nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 6)
            ),
            (8,),
        ),
        "res": (Res, (2, 6, 6)),
        "dense": (Dense, (3, 5, 5)),
        "ln": (lambda: nn.Sequential(nn.Linear(8, 12), nn.LayerNorm(12), nn.GELU(), nn.Linear(12, 8)), (8,)),
        "side": (Side, (8,)),
    }


def module_documents() -> dict:
    """The module kind's probe (as-is, proposed, datadep; leaves and auto sites), spectrum
    (exact; lanczos with --top) and curvature, and the spectrum of sigprop's own nets."""
    from sigprop import api
    from sigprop.kinds.module import ModuleSpec

    out = {}
    for dtype in ("float64", "float32"):
        probe = specs.ProbeSpec(samples=6, seed=3, seeds=2, device="cpu", dtype=dtype, threads=1)
        for name, (factory, shape) in _models().items():
            for sites in ("auto", "leaves"):
                spec = ModuleSpec(
                    model=factory, input_shape=shape, sites=sites, inits=("as-is", "proposed", "datadep")
                )
                out[f"module {name} {sites} {dtype}"] = _strip(run.probe(spec, probe).to_dict())
            ss = specs.SpectrumSpec(samples=3, seeds=1, device="cpu", dtype=dtype, threads=1)
            spec = ModuleSpec(model=factory, input_shape=shape, inits=("as-is", "proposed"))
            out[f"spectrum module {name} {dtype}"] = _strip(run.spectrum(spec, ss).to_dict())
            hs = specs.HessianSpec(
                samples=8, seeds=1, device="cpu", dtype=dtype, iters=20, top=2, trace=2, threads=1
            )
            out[f"hessian module {name} {dtype}"] = _strip(run.curvature(spec, hs).to_dict())
        lz = specs.SpectrumSpec(
            samples=2, seeds=1, device="cpu", dtype=dtype, threads=1, path="lanczos", steps=8, top=2
        )
        for kind, options in (
            ("mlp", {"depth": 4, "width": "6:10", "input_dim": 8}),
            ("resnet", {"blocks": 2, "dim": 8, "width": "6"}),
            ("cnn", {"depth": 3, "channels": 3, "image": "2x5x5"}),
        ):
            spec = api.spec(kind, inits=("proposed", "he"), **options)
            exact = specs.SpectrumSpec(
                samples=3, seeds=2, device="cpu", dtype=dtype, threads=1, depths=True, top=1
            )
            out[f"spectrum {kind} exact {dtype}"] = _strip(run.spectrum(spec, exact).to_dict())
            out[f"spectrum {kind} lanczos {dtype}"] = _strip(run.spectrum(spec, lz).to_dict())
    return out


def _strip(doc):
    """A document without what may differ between two runs of the same numbers: the environment
    record and timings."""
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in ("environment", "seconds")}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


def engine_arrays() -> dict:
    """The walker's raw ln-ratio arrays on the paths a CPU probe never takes: Haar directions
    orthogonalized in chunks of layers (CUDA's path, forced with ``BATCHED_HAAR = "always"``) and
    steps run through the replay plumbing (``replay.Emulated``), stored and streamed."""
    from sigprop.kernels import replay, sampling
    from sigprop.observers.ratios import BackwardRatio, BranchRatio, ForwardRatio

    def walk(steps, scheme, x, e, seed, stream, observers):
        units, record_input = walker.compile_plan(steps, scheme)
        return walker.walk(
            units,
            scheme,
            x,
            e,
            seed,
            [0, 2],
            observers,
            record_input,
            stream=stream,
            runner=replay.Emulated(),
        ).observed

    out = {}
    x, e = sampling.probe_inputs(3, 8, 10, 16, "cpu", torch.float64)
    saved = sampling.BATCHED_HAAR
    try:
        for haar in ("always", "never"):
            sampling.BATCHED_HAAR = haar
            for stream in (False, True):
                for name in ("proposed", "datadep", "he"):
                    o = walk(
                        mlp.steps([10, 16, 16, 16, 16, 16, 16]),
                        inits.get(name),
                        x,
                        e,
                        5,
                        stream,
                        [ForwardRatio(), BackwardRatio()],
                    )
                    out[f"mlp {haar} {stream} {name}"] = {"fwd": o["fwd"].tolist(), "bwd": o["bwd"].tolist()}
                plan = resnet.resnet_plan(10, 2, 2, 1, [7, 9, 8, 6])
                xr, er = sampling.probe_inputs(3, 8, 10, 20, "cpu", torch.float64)
                for name in ("proposed", "datadep"):
                    o = walk(
                        plan.steps,
                        inits.get(name),
                        xr,
                        er,
                        3,
                        stream,
                        [ForwardRatio(), BackwardRatio(), BranchRatio()],
                    )
                    out[f"resnet {haar} {stream} {name}"] = {
                        "fwd": o["fwd"].tolist(),
                        "bwd": o["bwd"].tolist(),
                        "branch": o["branch"].tolist(),
                    }
    finally:
        sampling.BATCHED_HAAR = saved
    return out


def documents() -> dict:
    torch.set_num_threads(1)
    out = {}
    for name, spec, probe in [*grid(), *correlation_grid()]:
        out[name] = _strip(run.probe(spec, probe).to_dict())
    for name, spec, hs in hessian_grid():
        out[name] = _strip(run.curvature(spec, hs).to_dict())
    out["engine"] = engine_arrays()
    out.update(module_documents())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--out")
    group.add_argument("--compare")
    ap.add_argument("--kernels", action="store_true", help="measured leaves within KERNEL_LAYERS u")
    ap.add_argument("--fuse", action="store_true", help="the probes of sigprop's nets with --fuse")
    args = ap.parse_args()
    global FUSE
    FUSE = args.fuse
    docs = json.loads(json.dumps(documents()))  # as a stored document reads back (tuples are lists)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(docs, fh)
        print(f"wrote {len(docs)} documents to {args.out}")
        return
    with open(args.compare) as fh:
        old = json.load(fh)
    count, diffs = compare_documents(old, docs)
    # a key the old documents lack is an addition (a new option's default, a new measurement),
    # not a moved number; it is listed, and only a changed leaf fails -- except a prediction
    # (a band, a predicted value), which a composed map may round differently from a closed
    # form: within PREDICTION_RTOL relative it is counted, not failed
    added = [d for d in diffs if d[1] is None]
    rounded = [d for d in diffs if d[1] is not None and _prediction(d[0]) and _close(d[0], d[1], d[2])]
    changed = [d for d in diffs if d[1] is not None and d not in rounded]
    if args.kernels:  # a kernel change: measured leaves within KERNEL_LAYERS rounding units
        changed = [d for d in changed if not _within_kernel_rounding(*d)]
    print(
        f"{count} numbers compared over {len(docs)} documents: {len(changed)} differ; {len(rounded)} "
        f"predictions within "
        f"{PREDICTION_RTOL:g} relative; {len(added)} keys added"
    )
    for path, a, b in changed[:20]:
        print(f"  {path}: {a!r} -> {b!r}")
    where: dict[tuple[str, str], list] = {}
    for path, a, b in changed:  # which documents and inits the changes are in, and how far
        doc, rest = path.split(".", 1)
        run = rest.split("]")[0].split("[")[-1] if rest.startswith("runs[") else ""
        init = old[doc]["runs"][int(run)]["init"] if run.isdigit() else rest.split(".")[0]
        key = (doc.split(" float")[0].split(" stream")[0], init)
        where.setdefault(key, [0, 0.0, 0.0])
        where[key][0] += 1
        dtype = 1 if "float32" in doc else 2
        where[key][dtype] = max(where[key][dtype], _relative(path, a, b))
    for (doc, init), (n, r32, r64) in sorted(where.items()):
        print(f"  changed in {doc!r} / {init}: {n}, largest relative change float32 {r32:.1e}, f64 {r64:.1e}")
    for key in sorted({path.split(".")[-1] for path, _, _ in added}):
        print(f"  added: {key}")
    sys.exit(1 if changed else 0)


#: how far a prediction (a composed moment map, a band built on it) may move from the document
#: of the closed forms it replaced: float64 rounding of a different order of the same sums
PREDICTION_RTOL = 1e-12


def _prediction(path: str) -> bool:
    key = path.split(".")[-1].split("[")[0]
    return "predicted" in key or key in (
        "low",
        "high",
        "log10_low",
        "log10_high",
        "forward_band",
        "backward_band",
        # the shifts of the prediction with every weight layer's variance halved and doubled (the
        # ``theory`` verdict's alternatives): three predictions' differences
        "log10_separation",
    )


#: the grid's deepest conv net, in layers: how many roundings a kernel change may add up
KERNEL_LAYERS = 16
SPREADS = ("std", "draw_std", "log10_std", "log10_draw_std")


def _within_kernel_rounding(path: str, a, b) -> bool:
    key = path.split(".")[-1].split("[")[0]
    if key in SPREADS:
        return True
    u = 2.0**-24 if "float32" in path.split(".")[0] else 2.0**-53
    return _relative(path, a, b) <= KERNEL_LAYERS * u


def _relative(path: str, a, b) -> float:
    """How far a leaf moved, relative (for a log10 value: the absolute change in decades, times
    ln 10, the relative change of the ratio it stands for; for the engine's ln arrays and for a
    mean cosine the absolute change); inf for a leaf that is not a number."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        return float("inf")
    if path.split(".")[-1].startswith("log10"):
        return abs(a - b) * math.log(10)
    if path.startswith("engine."):  # the walker's raw arrays are natural logs of ratios
        return abs(a - b)
    if ".correlation[" in path and path.split(".")[-1] in ("mean", "end_mean"):
        return abs(a - b)  # a cosine: its rounding is absolute (of rows of norm 1), near 0 as anywhere
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def _close(path: str, a, b) -> bool:
    """Within PREDICTION_RTOL relative -- for a log10 value, that much of a decade absolute (the
    relative error of the ratio it stands for)."""
    if (
        not (isinstance(a, (int, float)) and isinstance(b, (int, float)))
        or isinstance(a, bool)
        or isinstance(b, bool)
    ):
        return False
    if path.split(".")[-1].startswith("log10"):
        return abs(a - b) <= PREDICTION_RTOL
    return abs(a - b) <= PREDICTION_RTOL * max(abs(a), abs(b))


if __name__ == "__main__":
    main()
