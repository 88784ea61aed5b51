"""Numbers do not move: the JSON of a grid of probes, written once and compared bit for bit later
(issue 17's refactor check; any change that must not move a number).

Run it on the commit before a change (``--out before.json``) and after it on the same machine
(``--compare before.json``): every leaf of every result document must be identical (exact float
comparison, ``results.compare_documents``; the environment record and timings are left out;
keys the old documents lack -- a new option's default -- are listed as additions, not failures).
Bit-identity is only promised on one machine: other CPUs may sum in another order.
The grid covers the MLP (fixed and random widths, every MLP init), the ResNet (stages, block
depth, projection, every ResNet init), the BN ResNet and ``--norm none``, each stored and
streamed, with one draw and with three batched draws; float64 and float32.
Usage: python benchmarks/golden.py --out FILE | --compare FILE
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from sigprop import api, inits, specs
from sigprop.results import compare_documents


def grid():
    for stream in (False, True):
        for seeds in (1, 3):
            for dtype in ("float64", "float32"):
                probe = specs.ProbeSpec(samples=16, seed=7, seeds=seeds, device="cpu", dtype=dtype, stream=stream, threads=1)
                yield f"mlp fixed {dtype} stream={stream} seeds={seeds}", specs.MLPSpec(
                    depth=6, input_dim=20, width=specs.WidthSpec(24, 24), inits=tuple(inits.names("mlp"))), probe
                yield f"mlp random {dtype} stream={stream} seeds={seeds}", specs.MLPSpec(
                    depth=5, input_dim=12, width=specs.WidthSpec(8, 30), inits=("proposed", "datadep", "pytorch")), probe
                yield f"resnet stages {dtype} stream={stream} seeds={seeds}", specs.ResNetSpec(
                    blocks=3, stages=2, dim=12, width=specs.WidthSpec(6, 14), block_depth=2, inits=tuple(inits.names("resnet"))), probe
                yield f"resnet bn {dtype} stream={stream} seeds={seeds}", specs.ResNetSpec(blocks=4, dim=10, norm="bn", inits=("he",)), probe
                yield f"resnet none {dtype} stream={stream} seeds={seeds}", specs.ResNetSpec(
                    blocks=3, dim=10, width=specs.WidthSpec(8, 8), norm="none", inits=("he", "skipinit")), probe
                yield f"cnn {dtype} stream={stream} seeds={seeds}", specs.CNNSpec(
                    depth=4, channels=5, image=(2, 7, 6), strided=2, inits=tuple(inits.names("cnn"))), probe


def engine_arrays() -> dict:
    """The engine's raw ln-ratio arrays on the paths a CPU probe never takes: Haar directions
    orthogonalized in chunks of layers (CUDA's path, forced with ``BATCHED_HAAR = "always"``) and
    steps run through the replay plumbing (``replay.Emulated``), stored and streamed."""
    from sigprop import engine, nets, replay

    out = {}
    x, e = engine.probe_inputs(3, 8, 10, 16, "cpu", torch.float64)
    saved = engine.BATCHED_HAAR
    try:
        for haar in ("always", "never"):
            engine.BATCHED_HAAR = haar
            for stream in (False, True):
                for name in ("proposed", "datadep", "he"):
                    f, b, _ = engine.mlp_batch(inits.get(name), [10, 16, 16, 16, 16, 16, 16], x, e, 5, [0, 2],
                                               stream=stream, runner=replay.Emulated())
                    out[f"mlp {haar} {stream} {name}"] = {"fwd": f.tolist(), "bwd": b.tolist()}
                plan = nets.resnet_plan(10, 2, 2, 1, [7, 9, 8, 6])
                xr, er = engine.probe_inputs(3, 8, 10, 20, "cpu", torch.float64)
                for name in ("proposed", "datadep"):
                    r, _ = engine.resnet_batch(inits.get(name), plan, xr, er, 3, [0, 2], stream=stream, runner=replay.Emulated())
                    out[f"resnet {haar} {stream} {name}"] = {"fwd": r.ln_fwd.tolist(), "bwd": r.ln_bwd.tolist(),
                                                            "branch": r.ln_branch.tolist()}
    finally:
        engine.BATCHED_HAAR = saved
    return out


def documents() -> dict:
    torch.set_num_threads(1)
    out = {}
    for name, spec, probe in grid():
        doc = api.probe(spec, probe).to_dict()
        doc.pop("environment")
        out[name] = doc
    out["engine"] = engine_arrays()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--out")
    group.add_argument("--compare")
    args = ap.parse_args()
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
    # not a moved number; it is listed, and only a changed leaf fails
    added = [d for d in diffs if d[1] is None]
    changed = [d for d in diffs if d[1] is not None]
    print(f"{count} numbers compared over {len(docs)} documents: {len(changed)} differ; {len(added)} keys added")
    for path, a, b in changed[:20]:
        print(f"  {path}: {a!r} -> {b!r}")
    for key in sorted({path.split(".")[-1] for path, _, _ in added}):
        print(f"  added: {key}")
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
